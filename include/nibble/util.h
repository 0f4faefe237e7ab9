// Small host utilities: progress bars, hashing, atomic small-file writes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>

namespace nibble {

// A progress bar with rate and ETA on stderr. Drawn only when `enabled` and
// stderr is a terminal; redrawn at most every 100 ms. Thread-compatible, not
// thread-safe: advance it from one thread.
class Progress {
 public:
  Progress(std::string label, int64_t total, bool enabled, std::string unit = "");
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void advance(int64_t n = 1);
  void set_note(std::string note);  // shown after the bar, e.g. the tensor name
  void finish();                    // final draw + newline (idempotent)

 private:
  void draw(bool final);
  std::string label_, unit_, note_;
  int64_t total_, done_ = 0;
  bool enabled_, finished_ = false;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

// Lower-case hex SHA-256 of bytes in memory.
std::string sha256_hex(const void* data, size_t size);
// Lower-case hex SHA-256 of a file's contents.
// `cancel`, when set and raised, stops the reading early (the result is then meaningless).
std::string sha256_file(const std::filesystem::path& path, const std::atomic<bool>* cancel = nullptr);

// Writes `content` to path.tmp, then renames it to path.
void write_file_atomic(const std::filesystem::path& path, const std::string& content);

// Formats a byte count as "1.23 MiB".
std::string human_bytes(uint64_t bytes);

// UTC time now as ISO 8601 ("2026-11-29T22:31:17Z").
std::string utc_now_iso8601();

// Call first in main(), with main's argv. OpenBLAS (a DYNAMIC_ARCH build, as Debian's) chooses its kernels from the
// CPU's model when it loads, and falls back to SSE3 ones (Prescott) on a CPU it does not know: 0.3.21 does so on
// VMs that report a generic "Intel Xeon Processor" with AVX-512. Where it did and the CPU has AVX-512 (F, CD, BW,
// DQ, VL) or AVX2 with FMA, this sets OPENBLAS_CORETYPE to SkylakeX or Haswell and runs the program again
// (execv of /proc/self/exe), since OpenBLAS reads the variable only when it loads. A set OPENBLAS_CORETYPE (the
// user's choice, or this function's before the exec) is left as it is. Returns only when nothing was re-executed.
void select_blas_kernels(char** argv);

}  // namespace nibble
