// int4_asym GEMV/GEMM kernels for AVX2 + FMA (compiled with -mavx2 -mfma -mf16c;
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

// M = 1. Per group, Σ_i x_i·(code_i·s + m) = s·Σ_i code_i·x_i + m·Σ_i x_i: the inner
// loop is one int->float convert and one FMA per 8 weights (codes 0..15 are exact
// in fp32), the group's scale is applied once to the vector partial sums, and the
// min term uses the per-group Σx prepared once per call.
void gemv(const Problem& p, const float* xp, const float* xsum, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
          bool accumulate, float* y) {
  const int64_t cpg = p.group_size / kChunk;     // chunks per group
  const int64_t full = p.row_bytes / kChunkBytes;  // chunks that need no padded copy
  alignas(16) uint8_t tmp[kChunkBytes];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = p.qweight + n * p.row_bytes;
    const uint16_t* sc = p.scales + n * p.groups;
    const uint16_t* mn = p.mins + n * p.groups;
    __m256 tot = _mm256_setzero_ps();
    float min_part = 0.0f;
    for (int64_t g = c0 / cpg; g * cpg < c1; ++g) {
      const int64_t ce = min64((g + 1) * cpg, c1);
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int64_t c = g * cpg; c < ce; ++c) {
        const Codes k = split_chunk(c < full ? q + c * kChunkBytes : chunk_bytes(q, c, p.row_bytes, tmp));
        const float* xc = xp + c * kChunk;
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.lo0), _mm256_load_ps(xc), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.lo1), _mm256_load_ps(xc + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.hi0), _mm256_load_ps(xc + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.hi1), _mm256_load_ps(xc + 24), a3);
      }
      const __m256 codes_dot_x = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      tot = _mm256_fmadd_ps(codes_dot_x, _mm256_set1_ps(bf16(sc[g])), tot);
      min_part += bf16(mn[g]) * xsum[g];
    }
    const float r = hsum(tot) + min_part;
    y[n] = accumulate ? y[n] + r : r;
  }
}

// Decodes chunks [c0, c1) of row n exactly as FORMAT.md says, w = fl(code·s + m)
// (code·s is exact, so one FMA rounds the same as the two operations), into
// out[(c - c0) * 32 ...] in xp order.
void decode_row(const Problem& p, int64_t n, int64_t c0, int64_t c1, float* out) {
  const int64_t cpg = p.group_size / kChunk, full = p.row_bytes / kChunkBytes;
  const uint8_t* q = p.qweight + n * p.row_bytes;
  alignas(16) uint8_t tmp[kChunkBytes];
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t g = c / cpg;
    const __m256 s = _mm256_set1_ps(bf16(p.scales[n * p.groups + g]));
    const __m256 m = _mm256_set1_ps(bf16(p.mins[n * p.groups + g]));
    const Codes k = split_chunk(c < full ? q + c * kChunkBytes : chunk_bytes(q, c, p.row_bytes, tmp));
    float* o = out + (c - c0) * kChunk;
    _mm256_store_ps(o, _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.lo0), s, m));
    _mm256_store_ps(o + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.lo1), s, m));
    _mm256_store_ps(o + 16, _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.hi0), s, m));
    _mm256_store_ps(o + 24, _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.hi1), s, m));
  }
}

// MT activation rows × kRowBlock decoded weight rows, over L floats: 2×4 = 8
// accumulators (enough independent FMA chains to cover FMA latency) and 4 weight
// vectors fit the 16 ymm registers; each k-step loads 4 + MT vectors for 4·MT FMAs.
template <int MT>
void micro(const float* w, int64_t L, const float* x, int64_t xs, int64_t nr, int64_t N, bool accumulate, float* y) {
  __m256 acc[MT][kRowBlock];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < kRowBlock; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int64_t k = 0; k < L; k += 8) {
    __m256 wv[kRowBlock];
    for (int j = 0; j < kRowBlock; ++j) wv[j] = _mm256_load_ps(w + j * L + k);
    for (int i = 0; i < MT; ++i) {
      const __m256 xv = _mm256_load_ps(x + i * xs + k);
      for (int j = 0; j < kRowBlock; ++j) acc[i][j] = _mm256_fmadd_ps(wv[j], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < nr; ++j) {
      const float r = hsum(acc[i][j]);
      float& out = y[i * N + j];
      out = accumulate ? out + r : r;
    }
}

// M > 1: decode kRowBlock rows once into scratch, then dot them with every activation row.
void gemm(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1, bool accumulate,
          float* scratch, float* y) {
  const int64_t L = (c1 - c0) * kChunk;
  const float* x = a.xp + c0 * kChunk;
  for (int64_t nb = n0; nb < n1; nb += kRowBlock) {
    const int64_t nr = min64(kRowBlock, n1 - nb);
    for (int64_t j = 0; j < nr; ++j) decode_row(p, nb + j, c0, c1, scratch + j * L);
    for (int64_t j = nr; j < kRowBlock; ++j)  // a short last block: rows of zeros, results dropped
      for (int64_t k = 0; k < L; ++k) scratch[j * L + k] = 0.0f;
    int64_t m = 0;
    for (; m + 2 <= a.M; m += 2)
      micro<2>(scratch, L, x + m * a.xp_stride, a.xp_stride, nr, p.N, accumulate, y + m * p.N + nb);
    if (m < a.M) micro<1>(scratch, L, x + m * a.xp_stride, a.xp_stride, nr, p.N, accumulate, y + m * p.N + nb);
  }
}

}  // namespace

void rows_avx2(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
               bool accumulate, float* scratch, float* y) {
  if (a.M == 1)
    gemv(p, a.xp, a.xsum, c0, c1, n0, n1, accumulate, y);
  else
    gemm(p, a, c0, c1, n0, n1, accumulate, scratch, y);
}

}  // namespace nibble::cpu::int4
