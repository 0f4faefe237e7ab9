// The FP4 GEMM's AVX2 rows for 2..63 tokens, and the row decode for 64 and
// more (compiled with -mavx2 -mfma; called only where the CPU has them,
// src/backend/cpu/fp4_gemm.cpp; one token takes the int4 integer GEMV). Eight
// codes decode in five operations, exactly to the format's fl(e2m1(code)·s):
//  - the row's four bytes, broadcast, shifted right by 0, 4, …, 28 per lane,
//    put code i in lane i's low bits (element 2j is byte j's low nibble);
//  - vpermps reads only an index's low three bits, so it looks the magnitude
//    up in the eight values {0, ½, 1, 1½, 2, 3, 4, 6} times s (each fl(v·s))
//    with no mask;
//  - the code's bit 3, shifted to bit 31, is the sign: fl(−v·s) = −fl(v·s).
// The scaled table is made once per group (16..128 weights).
#include <immintrin.h>

#include "backend/cpu/fp4_rows.h"

namespace nibble::cpu::fp4k {
namespace {

struct Decoder {
  __m256 lut;  // the eight magnitudes times the group's scale
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
  void scale(float s) {
    lut = _mm256_mul_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), _mm256_set1_ps(s));
  }
  // Codes k .. k + 7 of a row (k even): bytes k/2 .. k/2 + 3.
  __m256 operator()(const uint8_t* row, int64_t k) const {
    int32_t u;
    __builtin_memcpy(&u, row + k / 2, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(u), shifts);
    const __m256 mag = _mm256_permutevar8x32_ps(lut, v);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 28), sign)));
  }
};

inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// One weight row against rows m0 .. m0 + R - 1 of x: each chunk of 8 weights
// decoded once for the R rows; the last group's K % 8 tail through the scalar decode.
template <int R>
void row_tile(const Problem& p, int64_t n, int64_t m0, float* y) {
  const uint8_t* q = p.q + n * ((p.K + 1) / 2);
  const int64_t G = int64_t{1} << p.shift, groups = (p.K + G - 1) / G;
  const int64_t s0 = n * groups;
  const int64_t k8 = p.K / 8 * 8;
  Decoder dec;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    dec.scale(scale_at(p.s, s0 + g));
    const int64_t end = min64(k8, (g + 1) * G);
    for (int64_t k = g * G; k < end; k += 8) {
      const __m256 w = dec(q, k);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(p.x + (m0 + r) * p.K + k), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float t = hsum(acc[r]);
    for (int64_t k = k8; k < p.K; ++k) t += weight(q, p.s, s0, k, p.shift) * p.x[(m0 + r) * p.K + k];
    y[(m0 + r) * p.N + n] = t;
  }
}

}  // namespace

void decode_row_avx2(const Problem& p, int64_t n, float* out) {
  const uint8_t* q = p.q + n * ((p.K + 1) / 2);
  const int64_t G = int64_t{1} << p.shift, groups = (p.K + G - 1) / G, s0 = n * groups;
  const int64_t k8 = p.K / 8 * 8;
  Decoder dec;
  for (int64_t g = 0; g < groups; ++g) {
    dec.scale(scale_at(p.s, s0 + g));
    const int64_t end = min64(k8, (g + 1) * G);
    for (int64_t k = g * G; k < end; k += 8) _mm256_storeu_ps(out + k, dec(q, k));
  }
  for (int64_t k = k8; k < p.K; ++k) out[k] = weight(q, p.s, s0, k, p.shift);
}

void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y) {
  for (int64_t n = n0; n < n1; ++n) {
    int64_t m = 0;
    for (; m + 8 <= p.M; m += 8) row_tile<8>(p, n, m, y);
    for (; m + 4 <= p.M; m += 4) row_tile<4>(p, n, m, y);
    switch (p.M - m) {
      case 3: row_tile<3>(p, n, m, y); break;
      case 2: row_tile<2>(p, n, m, y); break;
      case 1: row_tile<1>(p, n, m, y); break;
      default: break;
    }
  }
}

}  // namespace nibble::cpu::fp4k
