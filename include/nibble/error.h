// nibble::Error and the check macro every host-side check goes through.
//
// Messages name the file, the tensor and the expected vs found value; the
// macro appends the source location so a user report points at the check.
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace nibble {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void fail(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace nibble

// NIBBLE_CHECK(cond, "fmt {}", args...): throws nibble::Error("msg (file:line)").
#define NIBBLE_CHECK(cond, ...)                                              \
  do {                                                                       \
    if (!(cond)) ::nibble::detail::fail(__FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

// NIBBLE_FAIL("fmt {}", args...): unconditional error.
#define NIBBLE_FAIL(...) ::nibble::detail::fail(__FILE__, __LINE__, fmt::format(__VA_ARGS__))
