// What every libFuzzer target here checks, in one place. A finding aborts, so
// libFuzzer keeps the input.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "nibble/error.h"
#include "nibble/tokenizer.h"

namespace fuzz {

// The target's name, for its messages (each target defines it).
extern const char* const kTarget;

// A broken invariant of the code under test.
[[noreturn]] inline void broken(const char* what) {
  std::fprintf(stderr, "%s: invariant violated: %s\n", kTarget, what);
  std::abort();
}

// A refusal must be one line that starts with `prefix` (the input's name and
// ": "; empty: any start).
inline void check_error(const nibble::Error& e, std::string_view prefix) {
  const char* m = e.what();
  if (std::strchr(m, '\n') || std::strncmp(m, prefix.data(), prefix.size()) != 0) {
    std::fprintf(stderr, "%s: bad message: %s\n", kTarget, m);
    std::abort();
  }
}

// Reads every byte, so AddressSanitizer reports a range outside the input.
inline void touch(const void* p, uint64_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  uint8_t acc = 0;
  for (uint64_t i = 0; i < n; ++i) acc ^= b[i];
  volatile uint8_t sink = acc;
  (void)sink;
}

// Removes, once per process, the scratch files and folders that earlier
// processes of this target left in /dev/shm (named <target>_<pid>...; a
// worker killed mid-input leaves its own: after a crash, or at the end of a
// -fork run). Only those whose process no longer exists are removed.
inline void sweep_stale_shm() {
  static const bool done = [] {
    const std::string prefix = std::string(kTarget) + "_";
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
      const std::string name = e.path().filename().string();
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const char* digits = name.c_str() + prefix.size();
      char* end = nullptr;
      const long pid = std::strtol(digits, &end, 10);
      if (end == digits || pid <= 0 || pid == getpid()) continue;  // another target's name, or this process
      if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;  // alive, or not ours to judge
      std::error_code rm;
      std::filesystem::remove_all(e.path(), rm);
    }
    return true;
  }();
  (void)done;
}

// A scratch path of this process in /dev/shm, for readers that open a path:
// /dev/shm/<target>_<pid><suffix>. The target removes it after each input;
// the first call sweeps what dead processes of this target left.
inline std::string shm_path(std::string_view suffix) {
  sweep_stale_shm();
  return "/dev/shm/" + std::string(kTarget) + "_" + std::to_string(getpid()) + std::string(suffix);
}

// Writes `bytes` to `path`, replacing what was there.
inline void write_file(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The input "framed" as a safetensors image: the bytes up to the first NUL
// become the header JSON and the rest the data buffer, with a correct 8-byte
// length prefix put in front. Mutating whole files almost always breaks that
// prefix; framing lets the fuzzer reach the header's contents. The vector has
// exactly the image's size, so ASan sees any read past its end.
inline std::vector<uint8_t> framed_safetensors(const uint8_t* data, size_t size) {
  const auto* nul = size ? static_cast<const uint8_t*>(std::memchr(data, 0, size)) : nullptr;
  const size_t header = nul ? static_cast<size_t>(nul - data) : size;
  const size_t rest = nul ? size - header - 1 : 0;
  std::vector<uint8_t> framed(8 + header + rest);
  for (int i = 0; i < 8; ++i) framed[i] = static_cast<uint8_t>(static_cast<uint64_t>(header) >> (8 * i));
  if (header) std::memcpy(framed.data() + 8, data, header);
  if (rest) std::memcpy(framed.data() + 8 + header, nul + 1, rest);
  return framed;
}

// Runs `parse(bytes, size)` on the input as a whole file and framed (above).
template <typename Parse>
void whole_and_framed(const uint8_t* data, size_t size, Parse parse) {
  parse(data, size);
  const std::vector<uint8_t> framed = framed_safetensors(data, size);
  parse(framed.data(), framed.size());
}

// StreamDecoder's pieces plus finish() equal decode() of the same ids: its
// documented contract.
inline void check_stream(const nibble::Tokenizer& tok, const std::vector<int32_t>& ids, bool skip) {
  const std::string whole = tok.decode(ids, skip);
  nibble::StreamDecoder sd(tok, skip);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.step(id);
  streamed += sd.finish();
  if (streamed != whole) broken("StreamDecoder's pieces differ from decode()");
}

}  // namespace fuzz
