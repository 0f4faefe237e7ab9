// The int8_channel_sym GEMM's AVX2 rows (compiled with -mavx2 -mfma; called only
// where the CPU has them, src/backend/cpu/int8_gemm.cpp).
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/int8_rows.h"

namespace nibble::cpu::int8k {
namespace {

// Eight codes of row q from k, decoded as FORMAT.md §7.2 says: fl(code·s).
inline __m256 decode8(const int8_t* q, __m256 s) {
  const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
  return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c)), s);
}

inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

// One weight row against rows m0 .. m0 + R - 1 of x: each chunk of 8 weights
// decoded once for the R rows.
template <int R>
void row_tile(const Problem& p, int64_t n, int64_t m0, float* y) {
  const int8_t* q = p.q + n * p.K;
  const float sv = p.s[n];
  const __m256 s = _mm256_set1_ps(sv);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t k8 = p.K / 8 * 8;
  for (int64_t k = 0; k < k8; k += 8) {
    const __m256 w = decode8(q + k, s);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(p.x + (m0 + r) * p.K + k), acc[r]);
  }
  for (int r = 0; r < R; ++r) {
    float t = hsum(acc[r]);
    for (int64_t k = k8; k < p.K; ++k) t += static_cast<float>(q[k]) * sv * p.x[(m0 + r) * p.K + k];
    y[(m0 + r) * p.N + n] = t;
  }
}

// One token: four accumulators over k, so that the FMAs of a row do not wait on
// each other.
void row_one(const Problem& p, int64_t n, float* y) {
  const int8_t* q = p.q + n * p.K;
  const float sv = p.s[n];
  const __m256 s = _mm256_set1_ps(sv);
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t k32 = p.K / 32 * 32, k8 = p.K / 8 * 8;
  int64_t k = 0;
  for (; k < k32; k += 32) {
    a0 = _mm256_fmadd_ps(decode8(q + k, s), _mm256_loadu_ps(p.x + k), a0);
    a1 = _mm256_fmadd_ps(decode8(q + k + 8, s), _mm256_loadu_ps(p.x + k + 8), a1);
    a2 = _mm256_fmadd_ps(decode8(q + k + 16, s), _mm256_loadu_ps(p.x + k + 16), a2);
    a3 = _mm256_fmadd_ps(decode8(q + k + 24, s), _mm256_loadu_ps(p.x + k + 24), a3);
  }
  for (; k < k8; k += 8) a0 = _mm256_fmadd_ps(decode8(q + k, s), _mm256_loadu_ps(p.x + k), a0);
  float t = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; k < p.K; ++k) t += static_cast<float>(q[k]) * sv * p.x[k];
  y[n] = t;
}

}  // namespace

void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y) {
  for (int64_t n = n0; n < n1; ++n) {
    if (p.M == 1) {
      row_one(p, n, y);
      continue;
    }
    int64_t m = 0;
    for (; m + 4 <= p.M; m += 4) row_tile<4>(p, n, m, y);
    switch (p.M - m) {
      case 3: row_tile<3>(p, n, m, y); break;
      case 2: row_tile<2>(p, n, m, y); break;
      case 1: row_tile<1>(p, n, m, y); break;
      default: break;
    }
  }
}

}  // namespace nibble::cpu::int8k
