// The CPU kernels' instruction sets this machine can run, for the tests that
// hold every one of them to the scalar reference (test_int4_kernels.cpp,
// test_int8_kernels.cpp).
#pragma once

#include <vector>

#include "backend/cpu/kernels.h"

namespace nibble::test {

inline std::vector<cpu::Isa> isas_to_test() {
  std::vector<cpu::Isa> v;
  for (cpu::Isa i : {cpu::Isa::Scalar, cpu::Isa::Avx2, cpu::Isa::Avx512})
    if (cpu::isa_supported(i)) v.push_back(i);
  return v;
}

}  // namespace nibble::test
