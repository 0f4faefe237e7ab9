// The 8-bit-code GEMM's per-ISA rows (src/backend/cpu/int8_gemm.cpp drives
// them; int8_avx2.cpp has its own -m flags). As int4_isa.h says, a function
// both sides call must not be an inline one with external linkage (the linker
// may keep the ISA file's copy for every caller): the helpers here are static,
// a copy per file, each compiled with that file's flags.
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"

namespace nibble::cpu::int8k {

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ, Ŵ[n, k] = fl(value(code[n, k])·scale(n, k)) (UInt8: + min(n, k), rounded again).
struct Problem {
  Code8 kind;
  const float* x;
  int64_t M;
  const uint8_t* q;  // [N, K]
  const float* s;    // [N] (scale_stride 1), [1] (0), or [N, ceil(K/group)] (group > 0)
  int64_t scale_stride;
  int64_t N, K;
  int64_t group;  // 0: one scale per row or tensor; else a multiple of 8
  const float* m = nullptr;  // UInt8's mins, laid out as the group scales; nullptr for every other kind
  // UInt8 at one token (M = 1): x's sum over each group's inputs below K / 8 · 8, in k order (gemm_code8_isa computes it), for the
  // factored dot product; nullptr elsewhere.
  const float* xs = nullptr;
};

// Row n's scales: segment j (inputs from j·seg_len(p), seg_len(p) of them, the last one cut at K) has scale
// row_scales(p, n)[j·seg_step(p)]; one segment per group, or the whole row.
static inline int64_t seg_len(const Problem& p) { return p.group ? p.group : p.K; }
static inline int64_t seg_step(const Problem& p) { return p.group ? 1 : 0; }
static inline const float* row_scales(const Problem& p, int64_t n) {
  return p.group ? p.s + n * ((p.K + p.group - 1) / p.group) : p.s + n * p.scale_stride;
}
// Row n's mins (UInt8), indexed as its scales.
static inline const float* row_mins(const Problem& p, int64_t n) { return p.m + (row_scales(p, n) - p.s); }
// The scale of row n's input k.
static inline float scale(const Problem& p, int64_t n, int64_t k) {
  return row_scales(p, n)[k / seg_len(p) * seg_step(p)];
}
// Weight (n, k) as the format decodes it (the scalar reference and the vector rows' K % 8 tails).
static inline float weight(const Problem& p, int64_t n, int64_t k) {
  const float w = code8_value(p.kind, p.q[n * p.K + k]) * scale(p, n, k);
  return p.m ? w + row_mins(p, n)[k / seg_len(p) * seg_step(p)] : w;
}

// Rows n0 .. n1 - 1 of y's columns (every m < M): each weight decoded once for
// a tile of up to 4 rows of x and fused-multiply-added in fp32.
void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y);

}  // namespace nibble::cpu::int8k
