// safetensors: memory-mapped reader with the format's validation rules, and a
// streaming writer (declare every tensor, then write them in order; the file
// appears under its final name only when finished).
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian
// header length N, N bytes of JSON {name: {dtype, shape, data_offsets}, ...,
// "__metadata__": {str: str}}, then the byte buffer. Offsets are relative to
// the start of the buffer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nibble/tensor.h"

namespace nibble::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data buffer, [begin, end)
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates the file; throws nibble::Error naming the file (and
  // tensor) on any violation of the format.
  static SafetensorsFile open(const std::filesystem::path& path);
  // Parses and validates a safetensors image already in memory: `size` bytes
  // at `data`, kept alive by `owner` (may be null when the caller guarantees
  // the lifetime). `display_name` stands for the file in messages and path().
  // open() maps the file and calls this; the fuzz target calls it directly.
  static SafetensorsFile from_buffer(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                                     std::filesystem::path display_name);

  const std::filesystem::path& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // Tensors in data-offset order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  bool contains(const std::string& name) const;
  const TensorInfo& info(const std::string& name) const;  // throws if absent
  // A view into the mapping; it keeps the mapping alive.
  Tensor tensor(const std::string& name) const;
  uint64_t file_size() const { return file_size_; }

 private:
  std::filesystem::path path_;
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::shared_ptr<const void> mapping_;  // owns the mmap
  const uint8_t* buffer_ = nullptr;      // start of the data buffer
  uint64_t file_size_ = 0;
};

// Streaming writer. Usage:
//   SafetensorsWriter w(path, metadata);
//   w.declare("a", DType::F32, {4, 4}); w.declare("b", ...);
//   w.write("b", bytes_b); w.write("a", bytes_a);   // any order; laid out as declared
//   w.finish();                                       // renames path.tmp -> path
// If the writer is destroyed before finish(), the temporary file is removed.
class SafetensorsWriter {
 public:
  SafetensorsWriter(std::filesystem::path path, std::map<std::string, std::string> metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  void declare(const std::string& name, DType dtype, const Shape& shape);
  // Bytes of a declared tensor, in any order (the file's layout is the
  // declaration order); size must match. Not thread-safe.
  void write(const std::string& name, const void* data, size_t nbytes);
  void write(const std::string& name, const Tensor& t);  // contiguous, dtype/shape must match
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Writes a whole set of tensors in one call (small files, tests).
void save_safetensors(const std::filesystem::path& path,
                      const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace nibble::io
