// The 8-bit-code GEMM's AVX2 rows (compiled with -mavx2 -mfma -mf16c; called
// only where the CPU has them, src/backend/cpu/int8_gemm.cpp). Each kind's
// eight codes decode exactly to what the format's own decode gives:
//  - int8: sign-extend, convert, times s: fl(code·s);
//  - unsigned (int8_asym_f32): zero-extend, convert, times s, plus the group's
//    min: fl(fl(code·s) + m), two roundings as the format's decode;
//  - E5M2: the code is the high byte of an IEEE half, so (code << 8) as f16,
//    widened exactly, times s;
//  - E4M3: (code & 0x7F) << 7 is the half with E4M3's exponent and mantissa
//    fields in place (normals and subnormals alike), whose value is the
//    code's / 256 (bias 15 against 7); times 256·s (exact: a power of two)
//    gives fl(value·s). S.1111.111 (NaN) is blended in as NaN, except for
//    E4M3Finite, whose codes the caller has checked to hold none.
#include <immintrin.h>

#include <cmath>

#include "backend/cpu/int8_rows.h"

namespace nibble::cpu::int8k {
namespace {

template <Code8 C>
struct Decoder {
  __m256 s, m;
  Decoder(float sv, float mv)
      : s(_mm256_set1_ps(C == Code8::E4M3 || C == Code8::E4M3Finite ? sv * 256.0f : sv)), m(_mm256_set1_ps(mv)) {}
  __m256 operator()(const uint8_t* q) const {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    if constexpr (C == Code8::Int8) {
      return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
    } else if constexpr (C == Code8::UInt8) {
      return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b)), s), m);
    } else if constexpr (C == Code8::E5M2) {
      return _mm256_mul_ps(_mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(b), 8)), s);
    } else {
      const __m128i w = _mm_cvtepu8_epi16(b);
      const __m128i mag = _mm_and_si128(w, _mm_set1_epi16(0x7F));
      const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8));
      const __m256 v = _mm256_mul_ps(_mm256_cvtph_ps(h), s);
      if constexpr (C == Code8::E4M3Finite) return v;
      const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7F))));
      return _mm256_blendv_ps(v, _mm256_set1_ps(NAN), nan);
    }
  }
};

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float hsum(__m256 v) {
  const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 d = _mm_add_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_add_ss(d, _mm_shuffle_ps(d, d, 1)));
}

// One weight row against rows m0 .. m0 + R - 1 of x: each chunk of 8 weights
// decoded once for the R rows, segment by segment of one scale (the row, or a
// group of a multiple of 8 inputs); the K % 8 tail through the scalar decode.
template <Code8 C, int R>
void row_tile(const Problem& p, int64_t n, int64_t m0, float* y) {
  const uint8_t* q = p.q + n * p.K;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const int64_t k8 = p.K / 8 * 8;
  const float* sr = row_scales(p, n);
  const float* mr = C == Code8::UInt8 ? row_mins(p, n) : nullptr;
  const int64_t seg = seg_len(p), step = seg_step(p);
  for (int64_t k0 = 0, j = 0; k0 < k8; k0 += seg, j += step) {
    const Decoder<C> dec(sr[j], mr ? mr[j] : 0.0f);
    const int64_t end = min64(k8, k0 + seg);
    for (int64_t k = k0; k < end; k += 8) {
      const __m256 w = dec(q + k);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(w, _mm256_loadu_ps(p.x + (m0 + r) * p.K + k), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) {
    float t = hsum(acc[r]);
    for (int64_t k = k8; k < p.K; ++k) t += weight(p, n, k) * p.x[(m0 + r) * p.K + k];
    y[(m0 + r) * p.N + n] = t;
  }
}

// One token: four accumulators over k, so that the FMAs of a row do not wait on
// each other (a segment's chunks beyond a multiple of 4 go to them in turn).
template <Code8 C>
void row_one(const Problem& p, int64_t n, float* y) {
  const uint8_t* q = p.q + n * p.K;
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  const int64_t k8 = p.K / 8 * 8;
  const float* sr = row_scales(p, n);
  const int64_t seg = seg_len(p), step = seg_step(p);
  for (int64_t k0 = 0, j = 0; k0 < k8; k0 += seg, j += step) {
    const Decoder<C> dec(sr[j], 0.0f);  // no min: UInt8 takes row_one_affine
    const int64_t end = min64(k8, k0 + seg);
    int64_t k = k0;
    for (; k + 32 <= end; k += 32) {
      a0 = _mm256_fmadd_ps(dec(q + k), _mm256_loadu_ps(p.x + k), a0);
      a1 = _mm256_fmadd_ps(dec(q + k + 8), _mm256_loadu_ps(p.x + k + 8), a1);
      a2 = _mm256_fmadd_ps(dec(q + k + 16), _mm256_loadu_ps(p.x + k + 16), a2);
      a3 = _mm256_fmadd_ps(dec(q + k + 24), _mm256_loadu_ps(p.x + k + 24), a3);
    }
    for (; k < end; k += 8) {
      a0 = _mm256_fmadd_ps(dec(q + k), _mm256_loadu_ps(p.x + k), a0);
      const __m256 t = a0;
      a0 = a1, a1 = a2, a2 = a3, a3 = t;
    }
  }
  float t = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (int64_t k = k8; k < p.K; ++k) t += weight(p, n, k) * p.x[k];
  y[n] = t;
}

// The low 8 unsigned codes of c as floats.
inline __m256 codes8(__m128i c) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c)); }

// Unsigned codes with a group scale and min (int8_g{G}_asym_f32) at one token, factored: Σ_k fl(fl(q·s) + m)·x_k
// is taken as Σ_g (s_g·Σ_k∈g q_k·x_k + m_g·X_g), X_g the group's Σx (p.xs, once per call for every row): per 8
// weights a convert and an FMA, per group one FMA by s_g, and the mins' term 8 groups at a time. The K % 8 tail
// through the exact decode. The sums are not the decoded weights' (s·A and m·X are each rounded): within
// γ_{K+3}·Σ_k (|fl(q·s)·x_k| + |m·x_k|). int8_g16_asym_f32 on 4096² at one token runs 1.6-3× faster this way than
// row_one's exact decode in three alternated runs (session 86); int8_g32_sym (Q8_0) measured the same either way,
// so the signed codes keep row_one.
void row_one_affine(const Problem& p, int64_t n, float* y) {
  const uint8_t* q = p.q + n * p.K;
  const int64_t k8 = p.K / 8 * 8, G = p.group, groups = (k8 + G - 1) / G;
  const float *sr = row_scales(p, n), *mr = row_mins(p, n);
  __m256 t0 = _mm256_setzero_ps(), t1 = t0, mt = t0;
  auto group_dot = [&](int64_t k0) {
    const int64_t end = min64(k8, k0 + G);
    __m256 a = _mm256_setzero_ps(), b = a;
    int64_t k = k0;
    for (; k + 16 <= end; k += 16) {
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k));
      a = _mm256_fmadd_ps(codes8(c), _mm256_loadu_ps(p.x + k), a);
      b = _mm256_fmadd_ps(codes8(_mm_srli_si128(c, 8)), _mm256_loadu_ps(p.x + k + 8), b);
    }
    if (k < end)
      a = _mm256_fmadd_ps(codes8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k))), _mm256_loadu_ps(p.x + k), a);
    return _mm256_add_ps(a, b);
  };
  int64_t g = 0;
  if (G == 16) {  // Q6_K's groups: one 16-byte load a group, no inner loop (4096² at one token 1.57 → 1.30 ms)
    for (; g + 2 <= groups && (g + 2) * 16 <= k8; g += 2) {
      const __m128i c0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * g));
      const __m128i c1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * g + 16));
      const float* x = p.x + 16 * g;
      const __m256 a0 = _mm256_fmadd_ps(codes8(_mm_srli_si128(c0, 8)), _mm256_loadu_ps(x + 8),
                                        _mm256_mul_ps(codes8(c0), _mm256_loadu_ps(x)));
      const __m256 a1 = _mm256_fmadd_ps(codes8(_mm_srli_si128(c1, 8)), _mm256_loadu_ps(x + 24),
                                        _mm256_mul_ps(codes8(c1), _mm256_loadu_ps(x + 16)));
      t0 = _mm256_fmadd_ps(a0, _mm256_broadcast_ss(sr + g), t0);
      t1 = _mm256_fmadd_ps(a1, _mm256_broadcast_ss(sr + g + 1), t1);
    }
  }
  for (; g + 2 <= groups; g += 2) {
    t0 = _mm256_fmadd_ps(group_dot(g * G), _mm256_set1_ps(sr[g]), t0);
    t1 = _mm256_fmadd_ps(group_dot((g + 1) * G), _mm256_set1_ps(sr[g + 1]), t1);
  }
  if (g < groups) t0 = _mm256_fmadd_ps(group_dot(g * G), _mm256_set1_ps(sr[g]), t0);
  int64_t j = 0;
  for (; j + 8 <= groups; j += 8) mt = _mm256_fmadd_ps(_mm256_loadu_ps(mr + j), _mm256_loadu_ps(p.xs + j), mt);
  float t = hsum(_mm256_add_ps(_mm256_add_ps(t0, t1), mt));
  for (; j < groups; ++j) t += mr[j] * p.xs[j];
  for (int64_t k = k8; k < p.K; ++k) t += weight(p, n, k) * p.x[k];
  y[n] = t;
}

template <Code8 C>
void rows(const Problem& p, int64_t n0, int64_t n1, float* y) {
  for (int64_t n = n0; n < n1; ++n) {
    if (p.M == 1) {  // one token: unsigned codes factored, the rest decoded
      if constexpr (C == Code8::UInt8)
        row_one_affine(p, n, y);
      else
        row_one<C>(p, n, y);
      continue;
    }
    int64_t m = 0;
    // E4M3's decode (about 11 operations per 8 weights) pays for tiles of 8 rows: fp8_e4m3_channel at 16 tokens on
    // 4096² 8.98 → 7.84 ms on the 2-vCPU VM (session 85); int8's (3) did not gain. The unsigned codes' (5, and a
    // scale and min per 16 for Q6_K) do: int8_g16_asym_f32 at 16 tokens on 4096² 2.3× → 1.5× f32 (session 86).
    if constexpr (C == Code8::E4M3 || C == Code8::E4M3Finite || C == Code8::UInt8)
      for (; m + 8 <= p.M; m += 8) row_tile<C, 8>(p, n, m, y);
    for (; m + 4 <= p.M; m += 4) row_tile<C, 4>(p, n, m, y);
    switch (p.M - m) {
      case 3: row_tile<C, 3>(p, n, m, y); break;
      case 2: row_tile<C, 2>(p, n, m, y); break;
      case 1: row_tile<C, 1>(p, n, m, y); break;
      default: break;
    }
  }
}

}  // namespace

void rows_avx2(const Problem& p, int64_t n0, int64_t n1, float* y) {
  switch (p.kind) {
    case Code8::Int8: return rows<Code8::Int8>(p, n0, n1, y);
    case Code8::E4M3: return rows<Code8::E4M3>(p, n0, n1, y);
    case Code8::E4M3Finite: return rows<Code8::E4M3Finite>(p, n0, n1, y);
    case Code8::E5M2: return rows<Code8::E5M2>(p, n0, n1, y);
    case Code8::UInt8: return rows<Code8::UInt8>(p, n0, n1, y);
  }
}

}  // namespace nibble::cpu::int8k
