// The 8-bit-code GEMM's per-ISA rows (src/backend/cpu/int8_gemm.cpp drives
// them; int8_avx2.cpp has its own -m flags).
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"

namespace nibble::cpu::int8k {

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ, Ŵ[n, k] = fl(value(code[n, k])·scale(n, k)).
struct Problem {
  Code8 kind;
  const float* x;
  int64_t M;
  const uint8_t* q;  // [N, K]
  const float* s;    // [N] (scale_stride 1), [1] (0), or [N, ceil(K/group)] (group > 0)
  int64_t scale_stride;
  int64_t N, K;
  int64_t group;  // 0: one scale per row or tensor; else a multiple of 8
  int64_t groups() const { return group ? (K + group - 1) / group : 1; }
  // The scale of row n's input k; seg_end(k): the end of the inputs that share it (k's group, or the row).
  float scale(int64_t n, int64_t k) const { return group ? s[n * groups() + k / group] : s[n * scale_stride]; }
  int64_t seg_end(int64_t k) const { return group && (k / group + 1) * group < K ? (k / group + 1) * group : K; }
};

// Rows n0 .. n1 - 1 of y's columns (every m < M): each weight decoded once for
// a tile of up to 4 rows of x and fused-multiply-added in fp32.
void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y);

}  // namespace nibble::cpu::int8k
