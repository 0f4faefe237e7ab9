// int4_asym GEMM tiles (M ≥ 2) for AVX2 + FMA (compiled with -mavx2 -mfma -mf16c;
// called only when the CPU has them). The design is in int4_gemm.cpp; the data
// layout contract in int4_isa.h. Everything here is in an anonymous namespace or
// is one of the entry points, and no standard-library inline function is used:
// see the note at the top of int4_isa.h.
#include <immintrin.h>

#include "backend/cpu/int4_isa.h"

namespace nibble::cpu::int4 {
namespace {

inline float bf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}

// Entry i of a scales or mins array (int4_isa.h: bf16 bits, or fp32 with f32_params).
inline float param(const void* a, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(a)[i] : bf16(static_cast<const uint16_t*>(a)[i]);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The 16 bytes of chunk c of a row, or (for a short last chunk) a zero-padded copy in tmp.
inline const uint8_t* chunk_bytes(const uint8_t* row, int64_t c, int64_t row_bytes, uint8_t* tmp) {
  const int64_t b0 = c * kChunkBytes;
  if (b0 + kChunkBytes <= row_bytes) return row + b0;
  for (int64_t i = 0; i < kChunkBytes; ++i) tmp[i] = b0 + i < row_bytes ? row[b0 + i] : 0;
  return tmp;
}

// The 32 codes of one chunk as four 8-lane int32 vectors, in xp order:
// lo[0] = codes of inputs 0,2,..,14, lo[1] = 16,..,30, hi[0] = 1,..,15, hi[1] = 17,..,31.
struct Codes {
  __m256i lo0, lo1, hi0, hi1;
};
inline Codes split_chunk(const uint8_t* b) {
  const __m256i mask = _mm256_set1_epi32(0x0F);
  // vpmovzxbd: 8 bytes -> 8 dwords; each dword holds one byte = two codes.
  const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  const __m256i v1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8)));
  return {_mm256_and_si256(v0, mask), _mm256_and_si256(v1, mask), _mm256_srli_epi32(v0, 4),
          _mm256_srli_epi32(v1, 4)};
}

// One chunk decoded exactly as FORMAT.md says, w = fl(fl(code·s) + m), as four
// vectors in xp order. With bf16 parameters (F32 = false) code·s is exact, so one
// FMA rounds like the two operations; an fp32 scale's product is not, and is
// rounded first.
struct Weights {
  __m256 w0, w1, w2, w3;
};
template <bool F32>
inline __m256 decode8(__m256i code, __m256 s, __m256 m) {
  if constexpr (F32)
    return _mm256_add_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(code), s), m);
  else
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(code), s, m);
}
template <bool F32>
inline Weights decode_chunk(const uint8_t* b, __m256 s, __m256 m) {
  const Codes k = split_chunk(b);
  return {decode8<F32>(k.lo0, s, m), decode8<F32>(k.lo1, s, m), decode8<F32>(k.hi0, s, m),
          decode8<F32>(k.hi1, s, m)};
}

// 1 ≤ MT ≤ 4 activation rows at once (MT = 1 only for the last row of an odd M:
// M = 1 is the integer GEMV's, int4_avx2_i24.cpp): each chunk of a weight row is decoded once
// (exactly) and used for MT rows of x, so the decode (14 vector ops per 32 weights)
// is shared by 4·MT FMAs. Accumulators: 4 per row for MT = 2 (enough independent
// FMA chains), 2 per row for MT = 3, 4 (register budget: 8 + 4 weights + s, m, mask
// = 15 of the 16 ymm).
template <int MT, bool F32>
void rows_mt(const Problem& p, const float* x, int64_t xs, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
             bool accumulate, float* y) {
  constexpr int A = MT <= 2 ? 4 : 2;
  const int64_t cpg = p.group_size / kChunk, full = p.row_bytes / kChunkBytes;
  alignas(16) uint8_t tmp[kChunkBytes];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = p.qweight + n * p.row_bytes;
    __m256 acc[MT][A];
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < A; ++j) acc[i][j] = _mm256_setzero_ps();
    for (int64_t g = c0 / cpg; g * cpg < c1; ++g) {
      const __m256 s = _mm256_set1_ps(param(p.scales, F32, n * p.groups + g));
      const __m256 m = _mm256_set1_ps(param(p.mins, F32, n * p.groups + g));
      const int64_t ce = min64((g + 1) * cpg, c1);
      _mm_prefetch(reinterpret_cast<const char*>(q + g * cpg * kChunkBytes) + kPrefetchBytes, _MM_HINT_T0);
      for (int64_t c = g * cpg; c < ce; ++c) {
        const Weights w = decode_chunk<F32>(c < full ? q + c * kChunkBytes : chunk_bytes(q, c, p.row_bytes, tmp), s, m);
        for (int i = 0; i < MT; ++i) {
          const float* xc = x + i * xs + c * kChunk;
          acc[i][0] = _mm256_fmadd_ps(w.w0, _mm256_load_ps(xc), acc[i][0]);
          acc[i][1] = _mm256_fmadd_ps(w.w1, _mm256_load_ps(xc + 8), acc[i][1]);
          acc[i][A - 2] = _mm256_fmadd_ps(w.w2, _mm256_load_ps(xc + 16), acc[i][A - 2]);
          acc[i][A - 1] = _mm256_fmadd_ps(w.w3, _mm256_load_ps(xc + 24), acc[i][A - 1]);
        }
      }
    }
    for (int i = 0; i < MT; ++i) {
      __m256 t = acc[i][0];
      for (int j = 1; j < A; ++j) t = _mm256_add_ps(t, acc[i][j]);
      const float r = hsum(t);
      float& out = y[i * p.N + n];
      out = accumulate ? out + r : r;
    }
  }
}

template <bool F32>
void tiles(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1, bool accumulate,
           float* y) {
  // Tiles of 4 activation rows; the rows' weights (a task's worth) stay in L1 across tiles.
  for (int64_t m0 = 0; m0 < a.M; m0 += kMaxTileRows) {
    const float* x = a.xp + m0 * a.xp_stride;
    float* ym = y + m0 * p.N;
    switch (min64(kMaxTileRows, a.M - m0)) {
      case 4: rows_mt<4, F32>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
      case 3: rows_mt<3, F32>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
      case 2: rows_mt<2, F32>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
      default: rows_mt<1, F32>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
    }
  }
}

}  // namespace

void rows_avx2(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
               bool accumulate, float* y) {
  if (p.f32_params)
    tiles<true>(p, a, c0, c1, n0, n1, accumulate, y);
  else
    tiles<false>(p, a, c0, c1, n0, n1, accumulate, y);
}

}  // namespace nibble::cpu::int4
