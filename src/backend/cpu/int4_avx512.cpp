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

// GCC 12's AVX-512 headers build their "undefined" pass-through vectors as
// `__m256d __Y = __Y;`, which -Wmaybe-uninitialized reports at every use of
// _mm512_reduce_add_ps, _mm512_srli_epi32, ...: a false positive.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

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

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// The 16 bytes of chunk c of a row, or (for a short last chunk) a zero-padded copy in tmp.
inline const uint8_t* chunk_bytes(const uint8_t* row, int64_t c, int64_t row_bytes, uint8_t* tmp) {
  const int64_t b0 = c * kChunkBytes;
  if (b0 + kChunkBytes <= row_bytes) return row + b0;
  for (int64_t i = 0; i < kChunkBytes; ++i) tmp[i] = b0 + i < row_bytes ? row[b0 + i] : 0;
  return tmp;
}

// Group g's decode table: lane c holds fl(fl(c·s) + m), FORMAT.md's two
// operations (once per group, so an fp32 scale, whose product c·s is not exact,
// costs nothing more than a bf16 one).
inline __m512 group_table(const Problem& p, int64_t n, int64_t g) {
  const __m512 iota = _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  return _mm512_add_ps(_mm512_mul_ps(iota, _mm512_set1_ps(param(p.scales, p.f32_params, n * p.groups + g))),
                       _mm512_set1_ps(param(p.mins, p.f32_params, n * p.groups + g)));
}

// 16 bytes -> 16 dwords, each one byte (two codes).
inline __m512i load_chunk(const uint8_t* b) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b)));
}

// MT ≤ 4 activation rows at once. Per chunk of 32 weights: one zero-extend, one
// shift, two table lookups give the 32 decoded weights (two vectors, low and high
// nibbles), each used for MT FMAs. Two chunks per step (from one group, or from two
// when G = 32) into 4 accumulators per row: with MT = 1 that is still four
// independent FMA chains. For MT = 4: 16 accumulators + 4 weight vectors + tables +
// indices, of the 32 zmm registers.
template <int MT>
void rows_mt(const Problem& p, const float* x, int64_t xs, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
             bool accumulate, float* y) {
  const int64_t cpg = p.group_size / kChunk, full = p.row_bytes / kChunkBytes;
  const int shift = cpg == 1 ? 0 : cpg == 2 ? 1 : 2;  // chunk -> group
  alignas(16) uint8_t tmp[kChunkBytes];
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* q = p.qweight + n * p.row_bytes;
    __m512 acc[MT][4];
    for (int i = 0; i < MT; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = _mm512_setzero_ps();
    int64_t table_g = -1;
    __m512 table = _mm512_setzero_ps();
    auto table_of = [&](int64_t c) {  // the decode table of chunk c's group, rebuilt when the group changes
      if ((c >> shift) != table_g) {
        table_g = c >> shift;
        table = group_table(p, n, table_g);
      }
      return table;
    };
    int64_t c = c0;
    for (; c + 2 <= c1 && c + 2 <= full; c += 2) {
      if ((c & 3) == 0)  // once per 64-byte line (4 chunks)
        _mm_prefetch(reinterpret_cast<const char*>(q + c * kChunkBytes) + kPrefetchBytes, _MM_HINT_T0);
      const __m512 t0 = table_of(c), t1 = table_of(c + 1);
      const __m512i v0 = load_chunk(q + c * kChunkBytes), v1 = load_chunk(q + (c + 1) * kChunkBytes);
      const __m512 w0 = _mm512_permutexvar_ps(v0, t0);
      const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v0, 4), t0);
      const __m512 w2 = _mm512_permutexvar_ps(v1, t1);
      const __m512 w3 = _mm512_permutexvar_ps(_mm512_srli_epi32(v1, 4), t1);
      for (int i = 0; i < MT; ++i) {
        const float* xc = x + i * xs + c * kChunk;
        acc[i][0] = _mm512_fmadd_ps(w0, _mm512_load_ps(xc), acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(w1, _mm512_load_ps(xc + 16), acc[i][1]);
        acc[i][2] = _mm512_fmadd_ps(w2, _mm512_load_ps(xc + 32), acc[i][2]);
        acc[i][3] = _mm512_fmadd_ps(w3, _mm512_load_ps(xc + 48), acc[i][3]);
      }
    }
    for (; c < c1; ++c) {  // an odd last chunk, and the short tail chunk of a row
      const __m512 t = table_of(c);
      const __m512i v = load_chunk(c < full ? q + c * kChunkBytes : chunk_bytes(q, c, p.row_bytes, tmp));
      const __m512 w0 = _mm512_permutexvar_ps(v, t);
      const __m512 w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), t);
      for (int i = 0; i < MT; ++i) {
        const float* xc = x + i * xs + c * kChunk;
        acc[i][0] = _mm512_fmadd_ps(w0, _mm512_load_ps(xc), acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(w1, _mm512_load_ps(xc + 16), acc[i][1]);
      }
    }
    for (int i = 0; i < MT; ++i) {
      const float r = _mm512_reduce_add_ps(
          _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][3])));
      float& out = y[i * p.N + n];
      out = accumulate ? out + r : r;
    }
  }
}

}  // namespace

void rows_avx512(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                 bool accumulate, float* y) {
  // Tiles of 4 activation rows; the rows' weights (a task's worth) stay in L1 across tiles.
  for (int64_t m0 = 0; m0 < a.M; m0 += kMaxTileRows) {
    const float* x = a.xp + m0 * a.xp_stride;
    float* ym = y + m0 * p.N;
    switch (min64(kMaxTileRows, a.M - m0)) {
      case 4: rows_mt<4>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
      case 3: rows_mt<3>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
      case 2: rows_mt<2>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
      default: rows_mt<1>(p, x, a.xp_stride, c0, c1, n0, n1, accumulate, ym); break;
    }
  }
}

}  // namespace nibble::cpu::int4
