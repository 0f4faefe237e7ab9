// The 8-bit-code GEMM's per-ISA rows (src/backend/cpu/int8_gemm.cpp drives
// them; int8_avx2.cpp has its own -m flags).
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"

namespace nibble::cpu::int8k {

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ, Ŵ[n, k] = fl(value(code[n, k])·s[n·scale_stride]).
struct Problem {
  Code8 kind;
  const float* x;
  int64_t M;
  const uint8_t* q;  // [N, K]
  const float* s;    // [N] (scale_stride 1) or [1] (0)
  int64_t scale_stride;
  int64_t N, K;
};

// Rows n0 .. n1 - 1 of y's columns (every m < M): each weight decoded once for
// a tile of up to 4 rows of x and fused-multiply-added in fp32.
void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y);

}  // namespace nibble::cpu::int8k
