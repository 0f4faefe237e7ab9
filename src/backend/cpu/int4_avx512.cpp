// int4_asym GEMV/GEMM kernels for AVX-512 F/BW/VL/DQ (compiled with those -m
// flags; called only when the CPU has them). The design is in int4_gemm.cpp; the
// data layout contract in int4_isa.h. Everything here is in an anonymous
// namespace or is the entry point, and no standard-library inline function is
// used: see the note at the top of int4_isa.h.
//
// AVX-512 has a 16-entry in-register table lookup (vpermps: each lane picks
// table[index & 15], ignoring the index's upper bits), which is exactly one
// group's decode table: table[c] = fl(c·s + m) for c = 0..15. So the weights are
// decoded exactly as FORMAT.md says, with no masking of the nibble above:
// one zero-extend of 16 bytes gives 16 dwords b = lo | hi << 4; vpermps(b) reads
// lo, vpermps(b >> 4) reads hi.
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

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The 16 bytes of chunk c of a row, or (for a short last chunk) a zero-padded copy in tmp.
inline const uint8_t* chunk_bytes(const uint8_t* row, int64_t c, int64_t row_bytes, uint8_t* tmp) {
  const int64_t b0 = c * kChunkBytes;
  if (b0 + kChunkBytes <= row_bytes) return row + b0;
  for (int64_t i = 0; i < kChunkBytes; ++i) tmp[i] = b0 + i < row_bytes ? row[b0 + i] : 0;
  return tmp;
}

// Group g's decode table: lane c holds fl(c·s + m) (c·s is exact, so the FMA
// rounds once, like FORMAT.md's two operations).
inline __m512 group_table(const Problem& p, int64_t n, int64_t g) {
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_fmadd_ps(iota, _mm512_set1_ps(bf16(p.scales[n * p.groups + g])),
                         _mm512_set1_ps(bf16(p.mins[n * p.groups + g])));
}

// 16 bytes -> 16 dwords, each one byte (two codes).
inline __m512i load_chunk(const uint8_t* b) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
}

// M = 1: per 16 weights, a table lookup and an FMA with x (plus a shift for the
// high nibbles and the zero-extend, shared by 32 weights).
void gemv(const Problem& p, const float* xp, int64_t c0, int64_t c1, int64_t n0, int64_t n1, bool accumulate,
          float* y) {
  const int64_t cpg = p.group_size / kChunk, full = p.row_bytes / kChunkBytes;
  alignas(16) uint8_t tmp[kChunkBytes];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = p.qweight + n * p.row_bytes;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int64_t g = c0 / cpg; g * cpg < c1; ++g) {
      const __m512 table = group_table(p, n, g);
      const int64_t ce = min64((g + 1) * cpg, c1);
      int64_t c = g * cpg;
      for (; c + 2 <= ce && c + 2 <= full; c += 2) {  // two chunks: four independent FMA chains
        const __m512i v0 = load_chunk(q + c * kChunkBytes), v1 = load_chunk(q + (c + 1) * kChunkBytes);
        const float* xc = xp + c * kChunk;
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(v0, table), _mm512_load_ps(xc), a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), table), _mm512_load_ps(xc + 16), a1);
        a2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(v1, table), _mm512_load_ps(xc + 32), a2);
        a3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), table), _mm512_load_ps(xc + 48), a3);
      }
      for (; c < ce; ++c) {
        const __m512i v = load_chunk(c < full ? q + c * kChunkBytes : chunk_bytes(q, c, p.row_bytes, tmp));
        const float* xc = xp + c * kChunk;
        a0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(v, table), _mm512_load_ps(xc), a0);
        a1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table), _mm512_load_ps(xc + 16), a1);
      }
    }
    const float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    y[n] = accumulate ? y[n] + r : r;
  }
}

// Decodes chunks [c0, c1) of row n into out[(c - c0) * 32 ...] in xp order.
void decode_row(const Problem& p, int64_t n, int64_t c0, int64_t c1, float* out) {
  const int64_t cpg = p.group_size / kChunk, full = p.row_bytes / kChunkBytes;
  const uint8_t* q = p.qweight + n * p.row_bytes;
  alignas(16) uint8_t tmp[kChunkBytes];
  for (int64_t g = c0 / cpg; g * cpg < c1; ++g) {
    const __m512 table = group_table(p, n, g);
    const int64_t ce = min64((g + 1) * cpg, c1);
    for (int64_t c = g * cpg; c < ce; ++c) {
      const __m512i v = load_chunk(c < full ? q + c * kChunkBytes : chunk_bytes(q, c, p.row_bytes, tmp));
      float* o = out + (c - c0) * kChunk;
      _mm512_store_ps(o, _mm512_permutexvar_ps(v, table));
      _mm512_store_ps(o + 16, _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table));
    }
  }
}

// MT activation rows × kRowBlock decoded weight rows: 4×4 = 16 accumulators + 4
// weight vectors + 1 activation vector of the 32 zmm registers.
template <int MT>
void micro(const float* w, int64_t L, const float* x, int64_t xs, int64_t nr, int64_t N, bool accumulate, float* y) {
  __m512 acc[MT][kRowBlock];
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < kRowBlock; ++j) acc[i][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < L; k += 16) {
    __m512 wv[kRowBlock];
    for (int j = 0; j < kRowBlock; ++j) wv[j] = _mm512_load_ps(w + j * L + k);
    for (int i = 0; i < MT; ++i) {
      const __m512 xv = _mm512_load_ps(x + i * xs + k);
      for (int j = 0; j < kRowBlock; ++j) acc[i][j] = _mm512_fmadd_ps(wv[j], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < MT; ++i)
    for (int j = 0; j < nr; ++j) {
      const float r = _mm512_reduce_add_ps(acc[i][j]);
      float& out = y[i * N + j];
      out = accumulate ? out + r : r;
    }
}

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
    for (; m + 4 <= a.M; m += 4)
      micro<4>(scratch, L, x + m * a.xp_stride, a.xp_stride, nr, p.N, accumulate, y + m * p.N + nb);
    switch (a.M - m) {
      case 3: micro<3>(scratch, L, x + m * a.xp_stride, a.xp_stride, nr, p.N, accumulate, y + m * p.N + nb); break;
      case 2: micro<2>(scratch, L, x + m * a.xp_stride, a.xp_stride, nr, p.N, accumulate, y + m * p.N + nb); break;
      case 1: micro<1>(scratch, L, x + m * a.xp_stride, a.xp_stride, nr, p.N, accumulate, y + m * p.N + nb); break;
      default: break;
    }
  }
}

}  // namespace

void rows_avx512(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                 bool accumulate, float* scratch, float* y) {
  if (a.M == 1)
    gemv(p, a.xp, c0, c1, n0, n1, accumulate, y);
  else
    gemm(p, a, c0, c1, n0, n1, accumulate, scratch, y);
}

}  // namespace nibble::cpu::int4
