// The FP4 GEMM's per-ISA rows (src/backend/cpu/fp4_gemm.cpp drives them;
// fp4_avx2.cpp has its own -m flags). The helpers both sides call are static,
// a copy per file compiled with its flags (int4_isa.h, int8_rows.h).
#pragma once

#include <cstdint>

#include "backend/cpu/kernels.h"
#include "nibble/dtype.h"

namespace nibble::cpu::fp4k {

// Scale entry i (n·ceil(K/G) + g for group g of row n): f32[i], or table[codes[i]].
static inline float scale_at(const Fp4Scales& s, int64_t i) { return s.codes ? s.table[s.codes[i]] : s.f32[i]; }

// Weight k of a packed row (element 2j in byte j's low nibble) whose first group's scale is entry s0, G = 1 << shift:
// fl(e2m1(code)·s), as the formats decode it.
static inline float weight(const uint8_t* row, const Fp4Scales& s, int64_t s0, int64_t k, int shift) {
  return e2m1_to_f32(static_cast<uint8_t>(row[k / 2] >> (4 * (k & 1)))) * scale_at(s, s0 + (k >> shift));
}

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ, Ŵ[n, k] = fl(e2m1(code[n, k])·s[n, k >> shift]): codes packed two a byte (element
// 2j in the low nibble of byte j, rows of ceil(K/2) bytes), scales [N, ceil(K/G)] with G = 1 << shift ∈ {16, 32, 64, 128}.
struct Problem {
  const float* x;
  int64_t M;
  const uint8_t* q;
  Fp4Scales s;
  int64_t N, K;
  int shift;
};

// Rows n0 .. n1 - 1 of y's columns (every m < M): each weight decoded once for
// a tile of up to 8 rows of x and fused-multiply-added in fp32.
void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y);

// Row n of Ŵ into out[K], each weight fl(e2m1(code)·s) (p.x and p.M unused): the same values as decode_fp4_row.
void decode_row_avx2(const Problem& p, int64_t n, float* out);

// One token (M = 1), G ∈ {16, 32, 64, 128}, on a CPU with AVX2: the int4 integer GEMV (int4_avx2_i24.cpp,
// int4_isa.h's Problem::e2m1; driven from int4_gemm.cpp), x rounded to 24-bit fixed point per group of 32..128
// inputs (|Δx_i| ≤ max|x over the group|·2^-23) and each group's sum as s/2·Σ(2·e2m1(code) + 12)·x − 6·s·Σx.
// The pair is exact for normal scales up to 2^123 (s/2 exact, 12·s finite): below, a subnormal s/2 rounds; above,
// where weights reach 2^125, 12·s overflows (no checkpoint's weights come near either).
void gemv_integer(const float* x, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K, int group_size,
                  float* y);

}  // namespace nibble::cpu::fp4k
