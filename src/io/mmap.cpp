#include "io/mmap.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "nibble/error.h"

namespace nibble::io {

namespace {

// Closes the descriptor on every path out of map_file_readonly; the mapping
// stays valid after close.
struct FdGuard {
  int fd = -1;
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

MappedFile map_file_readonly(const std::filesystem::path& path) {
  FdGuard guard;
  do {
    guard.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (guard.fd < 0 && errno == EINTR);
  NIBBLE_CHECK(guard.fd >= 0, "{}: cannot open for reading: {}", path.string(), std::strerror(errno));

  struct stat st {};
  NIBBLE_CHECK(::fstat(guard.fd, &st) == 0, "{}: cannot stat: {}", path.string(), std::strerror(errno));
  NIBBLE_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path.string());

  MappedFile m;
  m.size = static_cast<size_t>(st.st_size);
  if (m.size == 0) {
    // mmap rejects a zero length; hand back an owner that owns nothing so
    // callers need no special case beyond the size check they do anyway.
    m.owner = std::make_shared<int>(0);
    return m;
  }
  void* p = ::mmap(nullptr, m.size, PROT_READ, MAP_PRIVATE, guard.fd, 0);
  NIBBLE_CHECK(p != MAP_FAILED, "{}: cannot mmap {} bytes: {}", path.string(), m.size, std::strerror(errno));
  const size_t size = m.size;
  m.owner = std::shared_ptr<const void>(p, [size](const void* q) { ::munmap(const_cast<void*>(q), size); });
  m.data = static_cast<const uint8_t*>(p);
  return m;
}

}  // namespace nibble::io
