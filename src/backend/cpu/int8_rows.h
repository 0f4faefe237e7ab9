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
  // Row n's scales: segment j (inputs j·seg() .. j·seg() + seg() − 1, the last one cut at K) has scale
  // row_scales(n)[j·seg_step()]; one segment per group, or the whole row.
  const float* row_scales(int64_t n) const { return group ? s + n * groups() : s + n * scale_stride; }
  int64_t seg() const { return group ? group : K; }
  int64_t seg_step() const { return group ? 1 : 0; }
  // The scale of row n's input k.
  float scale(int64_t n, int64_t k) const { return row_scales(n)[k / seg() * seg_step()]; }
};

// Rows n0 .. n1 - 1 of y's columns (every m < M): each weight decoded once for
// a tile of up to 4 rows of x and fused-multiply-added in fp32.
void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y);

}  // namespace nibble::cpu::int8k
