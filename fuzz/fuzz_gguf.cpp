// libFuzzer target for the GGUF reader.
//
// Any input must either parse or throw nibble::Error with a one-line message
// that starts with the file's name; anything else (a crash, a sanitizer
// report, another exception type, a parsed file whose tensors are not inside
// it) is a bug. A parsed file is then used the way nibble uses one: every
// tensor's bytes are read (so ASan sees any offset outside the input), small
// tensors are viewed or dequantized, every metadata value is described, and
// the vocabulary is gathered; each of those may only throw a one-line Error.
//
// Each input is tried twice: as a whole file, and with 64 KiB of zeros
// appended. Mutated headers rarely describe tensors that fit the bytes left
// after them; the padding lets small tensors pass the range checks, so the
// fuzzer reaches view() and the dequantizers.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "nibble/gguf.h"

const char* const fuzz::kTarget = "fuzz_gguf";

namespace {

using fuzz::broken;

constexpr const char* kName = "fuzz-input";

void check_error(const nibble::Error& e) { fuzz::check_error(e, "fuzz-input: "); }

// Work done on a parsed file that may refuse with an Error (message checked).
template <typename F>
void may_refuse(F&& f) {
  try {
    f();
  } catch (const nibble::Error& e) {
    check_error(e);
  }
}

void use_parsed(const nibble::io::GgufFile& f, size_t size) {
  for (const auto& t : f.tensors()) {
    // The data section may start past the end of a file whose tensors are all empty (no padding after the
    // header); a tensor with bytes must lie inside the input.
    if (t.nbytes > 0 && (f.data_offset() > size || t.offset > size - f.data_offset() ||
                         t.nbytes > size - f.data_offset() - t.offset))
      broken("tensor bytes outside the input");
    if (!f.contains(t.name) || &f.info(t.name) != &t) broken("index does not match tensors()");
    fuzz::touch(f.data(t), t.nbytes);
    if (t.nbytes > (1u << 20)) continue;  // keep each run fast
    may_refuse([&] {
      const nibble::Tensor x = f.dequantize(t.name);
      if (x.numel() != t.numel()) broken("dequantize() returned the wrong element count");
    });
    may_refuse([&] {
      const nibble::Tensor x = f.view(t.name);
      if (x.nbytes() != t.nbytes) broken("view() returned the wrong byte count");
    });
  }
  for (const auto& kv : f.metadata()) {
    const std::string d = kv.second.describe();
    (void)d;
  }
  may_refuse([&] { (void)f.vocab(); });
}

void parse_one(const uint8_t* data, size_t size) {
  try {
    const auto f = nibble::io::GgufFile::from_buffer(nullptr, data, size, kName);
    use_parsed(f, size);
  } catch (const nibble::Error& e) {
    check_error(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    std::vector<uint8_t> exact(data, data + size);  // exact size: ASan sees overreads
    parse_one(exact.data(), exact.size());
  }
  std::vector<uint8_t> padded(size + (64u << 10), 0);
  if (size) std::memcpy(padded.data(), data, size);
  parse_one(padded.data(), padded.size());
  return 0;
}
