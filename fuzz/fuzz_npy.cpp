// libFuzzer target for the .npy reader (calibration token ids, `nibble` tensors
// written by write_npy): parse_npy on the input bytes.
// - It parses, or throws nibble::Error with one line that starts with the
//   input's name.
// - A parsed tensor is contiguous with numel x itemsize bytes, every one of
//   them readable (AddressSanitizer checks the reads).
// - Written back with write_npy (to /dev/shm) and read again, it comes back with
//   the same dtype, shape and bytes.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "fuzz_checks.h"
#include "nibble/npy.h"

const char* const fuzz::kTarget = "fuzz_npy";

namespace {

const std::string& roundtrip_path() {
  static const std::string path = fuzz::shm_path(".npy");
  return path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string name = "fuzz.npy";
  nibble::Tensor t;
  try {
    t = nibble::io::parse_npy(data, size, name);
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, name + ": ");
    return 0;
  }
  if (!t.is_contiguous()) fuzz::broken("a parsed tensor is not contiguous");
  fuzz::touch(t.raw(), t.nbytes());
  nibble::io::write_npy(roundtrip_path(), t);
  const nibble::Tensor back = nibble::io::read_npy(roundtrip_path());
  std::remove(roundtrip_path().c_str());
  if (back.dtype() != t.dtype() || back.shape() != t.shape() || back.nbytes() != t.nbytes() ||
      (t.nbytes() && std::memcmp(back.raw(), t.raw(), t.nbytes()) != 0))
    fuzz::broken("write_npy then read_npy changed the tensor");
  return 0;
}
