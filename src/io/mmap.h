// Read-only memory mapping of a whole file.
//
// The mapping is owned by a shared_ptr so that tensor views into it (see
// Tensor::view's `owner`) keep it alive after the file object that made it is
// gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>

namespace nibble::io {

struct MappedFile {
  std::shared_ptr<const void> owner;  // unmaps when the last reference goes
  const uint8_t* data = nullptr;      // null when size == 0 (mmap cannot map 0 bytes)
  size_t size = 0;
};

// Maps `path` with PROT_READ, MAP_PRIVATE. Throws nibble::Error naming the
// path and strerror when it cannot be opened, is not a regular file, or
// cannot be mapped. A zero-length file gives {non-null owner, nullptr, 0}.
MappedFile map_file_readonly(const std::filesystem::path& path);

}  // namespace nibble::io
