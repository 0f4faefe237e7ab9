// Helpers shared by the tests: where the fixtures are, temp dirs, running the CLI.
#pragma once

#include <omp.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "nibble/error.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda.h"

// Skips a GPU test where no CUDA device is visible (CI compiles them, a GPU machine runs them).
#define SKIP_WITHOUT_DEVICE() \
  if (!::nibble::cuda::device_available()) GTEST_SKIP() << "no CUDA device"
#endif

namespace nibble::test {

// n draws of N(0, sd²) from a 64-bit Mersenne twister seeded with `seed`.
inline std::vector<float> randn(int64_t n, uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

// $NIBBLE_SHARED, or ../shared beside the repo.
inline std::filesystem::path shared_dir() {
  if (const char* s = std::getenv("NIBBLE_SHARED"); s && *s) return s;
  return NIBBLE_DEFAULT_SHARED;
}
inline std::filesystem::path model_dir(const std::string& name) { return shared_dir() / "models" / name; }
inline std::filesystem::path test_data_dir() { return NIBBLE_TEST_DATA; }
inline std::filesystem::path source_dir() { return NIBBLE_SOURCE_DIR; }
// The CLI built beside the tests; NIBBLE_TEST_BIN overrides it (a bundle run elsewhere).
inline std::string nibble_bin() {
  const char* e = std::getenv("NIBBLE_TEST_BIN");
  return e && *e ? e : NIBBLE_BIN;
}

// A fresh empty directory under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& tag = "nibble-test");
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct CommandResult {
  int exit_code = 0;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs a shell command line and captures stdout and stderr.
CommandResult run_command(const std::string& cmdline);

// A whole file's bytes.
inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// The message of the nibble::Error that fn() throws, or "(no error)".
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const nibble::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// fn()'s result computed with `threads` OpenMP threads (and so OpenBLAS's
// OpenMP build's), the thread count restored after: for tests that results do
// not depend on it.
template <typename Fn>
auto with_threads(int threads, Fn&& fn) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  auto r = fn();
  omp_set_num_threads(saved);
  return r;
}

}  // namespace nibble::test
