#include "nibble/error.h"

#include <cstring>

namespace nibble::detail {

void fail(const char* file, int line, const std::string& msg) {
  // Keep only the path from src/ or include/ on: the build dir prefix is noise.
  const char* shown = file;
  for (const char* root : {"src/", "include/", "tools/"}) {
    if (const char* p = std::strstr(file, root)) { shown = p; break; }
  }
  throw Error(fmt::format("{} ({}:{})", msg, shown, line));
}

}  // namespace nibble::detail
