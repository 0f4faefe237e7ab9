// libFuzzer target for the safetensors reader.
//
// Any input must either parse or throw nibble::Error with a one-line message;
// anything else (a crash, a sanitizer report, another exception type, a
// parsed file that breaks the format's invariants) is a bug. The input is
// parsed in place through SafetensorsFile::from_buffer, so ASan sees any read
// past its end; every tensor's bytes are read to prove the offsets are in range.
//
// Each input is tried twice: as a whole file, and "framed": the bytes up to
// the first NUL become the header and the rest the data buffer, with a correct
// length prefix put in front. Mutating raw files almost always breaks the
// length prefix, so framing is what lets the fuzzer reach the tensor checks.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fuzz_checks.h"
#include "nibble/safetensors.h"

const char* const fuzz::kTarget = "fuzz_safetensors";

namespace {

using fuzz::broken;

void check_parsed(const nibble::io::SafetensorsFile& f, const uint8_t* data, size_t size) {
  if (size < 8) broken("parsed a file shorter than the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8) broken("parsed a header longer than the file");
  const uint64_t buffer_size = size - 8 - n;
  // The tensors tile the data buffer: contiguous, in order, to the end.
  uint64_t covered = 0;
  for (const auto& t : f.tensors()) {
    if (t.begin != covered || t.end < t.begin) broken("tensors do not tile the buffer");
    if (t.end - t.begin != static_cast<uint64_t>(nibble::shape_numel(t.shape)) * nibble::dtype_size(t.dtype))
      broken("byte length != numel x dtype size");
    if (!f.contains(t.name) || &f.info(t.name) != &t) broken("index does not match tensors()");
    const nibble::Tensor x = f.tensor(t.name);
    if (x.nbytes() != t.end - t.begin || x.shape() != t.shape || x.dtype() != t.dtype) broken("tensor() mismatch");
    fuzz::touch(x.raw(), x.nbytes());
    covered = t.end;
  }
  if (covered != buffer_size) broken("tensors do not cover the whole buffer");
}

void parse_one(const uint8_t* data, size_t size) {
  try {
    const auto f = nibble::io::SafetensorsFile::from_buffer(nullptr, data, size, "fuzz-input");
    check_parsed(f, data, size);
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, "fuzz-input: ");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::whole_and_framed(data, size, parse_one);
  return 0;
}
