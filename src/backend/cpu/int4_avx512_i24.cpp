// The int4_asym M = 1 GEMV with AVX-512 VNNI (compiled with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq -mavx512vnni -mfma; called only when the CPU has them).
// The AVX2 version (int4_avx2_i24.cpp) explains the arithmetic; the activation
// layout is int4_isa.h's QActivations in quads (U = 4). Everything here is in an
// anonymous namespace or is the entry point, and no standard-library inline
// function is used: see the note at the top of int4_isa.h.
//
// Per quad (128 inputs, 64 qweight bytes, one load): three ops split the
// nibbles, and six vpdpbusd (64 code·byte products each, summed in fours into
// int32 lanes) give A, B, C of the AVX2 kernel directly in int32 (|A| ≤ 8·15·128,
// no int16 stage); 65536·A + 256·B + C in fp32, times s·d of the lane's group.
// A quad is one group at G = 128, two at G = 64 (lanes 0-7, 8-15), four at
// G = 32 (lanes in fours): the scale vector is a permute of the quad's s·d values.
#include <immintrin.h>

// GCC 12's AVX-512 headers build their "undefined" pass-through vectors as
// `__m256d __Y = __Y;`, which -Wmaybe-uninitialized reports: a false positive.
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

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// bf16 -> fp32 for 16 values.
inline __m512 bf16x16(const uint16_t* h) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h))), 16));
}

// Entries i .. i + 15 of a scales or mins array (int4_isa.h: bf16 bits, or fp32 with f32_params).
inline __m512 params16(const void* a, bool f32, int64_t i) {
  return f32 ? _mm512_loadu_ps(static_cast<const float*>(a) + i) : bf16x16(static_cast<const uint16_t*>(a) + i);
}

// Entry i of a scales or mins array (int4_isa.h: bf16 bits, or fp32 with f32_params).
inline float param(const void* a, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(a)[i] : bf16(static_cast<const uint16_t*>(a)[i]);
}

// The 64 bytes of quad qd of a row, or a zero-padded copy in tmp when the row ends inside them.
inline const uint8_t* quad_bytes(const uint8_t* row, int64_t qd, int64_t row_bytes, uint8_t* tmp) {
  const int64_t b0 = qd * kQuadBytes;
  if (b0 + kQuadBytes <= row_bytes) return row + b0;
  for (int64_t i = 0; i < kQuadBytes; ++i) tmp[i] = b0 + i < row_bytes ? row[b0 + i] : 0;
  return tmp;
}

// 65536·A + 256·B + C for one quad of weights w and its activation bytes q.
inline __m512 quad_dot(const uint8_t* w, const int8_t* q) {
  const __m512i mask = _mm512_set1_epi8(0x0F);
  const __m512i v = _mm512_loadu_si512(w);
  const __m512i lo = _mm512_and_si512(v, mask), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  const __m512i* x = reinterpret_cast<const __m512i*>(q);
  const __m512i zero = _mm512_setzero_si512();
  const __m512i A = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, _mm512_load_si512(x)), hi, _mm512_load_si512(x + 1));
  const __m512i B = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, _mm512_load_si512(x + 2)), hi, _mm512_load_si512(x + 3));
  const __m512i C = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(zero, lo, _mm512_load_si512(x + 4)), hi, _mm512_load_si512(x + 5));
  // |256·B + C| < 2^23 converts exactly; the FMA rounds once.
  return _mm512_fmadd_ps(_mm512_cvtepi32_ps(A), _mm512_set1_ps(65536.0f),
                         _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(B, 8), C)));
}

// GPQ: groups per quad (G = 128: 1, 64: 2, 32: 4).
template <int GPQ>
void gemv(const Problem& p, const QActivations& a, int64_t q0, int64_t q1, int64_t n0, int64_t n1, bool accumulate,
          float* y) {
  constexpr int64_t kGroupsPerBlock = kMaxBlockChunks;  // G = 32 over the largest block
  const int64_t full = p.row_bytes / kQuadBytes;        // quads that need no padded copy
  const int64_t g0 = q0 * GPQ, ng = min64(q1 * GPQ, p.groups) - g0;
  // Lane -> the quad's group: lanes in 16/GPQ's.
  const __m512i lane_group = _mm512_srli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                               GPQ == 1 ? 4 : GPQ == 2 ? 3 : 2);
  alignas(64) float sd[kGroupsPerBlock + 16];
  alignas(64) uint8_t tmp[kQuadBytes];
  const float* d = a.d + g0;
  const float* xs = a.xsum + g0;
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* w = p.qweight + n * p.row_bytes;
    const int64_t r = n * p.groups + g0;  // the row's first group of the block
    // s·d per group, and Σ_g m_g·Σx_g (16 groups at a time).
    __m512 mp = _mm512_setzero_ps();
    float min_part = 0.0f;
    int64_t g = 0;
    for (; g + 16 <= ng; g += 16) {
      _mm512_store_ps(sd + g, _mm512_mul_ps(params16(p.scales, p.f32_params, r + g), _mm512_loadu_ps(d + g)));
      mp = _mm512_fmadd_ps(params16(p.mins, p.f32_params, r + g), _mm512_loadu_ps(xs + g), mp);
    }
    for (; g < ng; ++g) {
      sd[g] = param(p.scales, p.f32_params, r + g) * d[g];
      min_part += param(p.mins, p.f32_params, r + g) * xs[g];
    }
    for (int k = 0; k < 4; ++k) sd[ng + k] = 0.0f;  // a last quad's missing groups
    __m512 t0 = _mm512_setzero_ps(), t1 = t0;
    int64_t qd = q0;
    for (; qd + 2 <= q1 && qd + 2 <= full; qd += 2) {
      _mm_prefetch(reinterpret_cast<const char*>(w + qd * kQuadBytes) + kPrefetchBytes, _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + qd * kQuadBytes) + kPrefetchBytes + 64, _MM_HINT_T0);
      const int64_t o = (qd - q0) * GPQ;
      __m512 s0, s1;
      if constexpr (GPQ == 1) {
        s0 = _mm512_set1_ps(sd[o]);
        s1 = _mm512_set1_ps(sd[o + 1]);
      } else {
        s0 = _mm512_permutexvar_ps(lane_group, _mm512_castps128_ps512(_mm_loadu_ps(sd + o)));
        s1 = _mm512_permutexvar_ps(lane_group, _mm512_castps128_ps512(_mm_loadu_ps(sd + o + GPQ)));
      }
      t0 = _mm512_fmadd_ps(quad_dot(w + qd * kQuadBytes, a.q + qd * kQuadQBytes), s0, t0);
      t1 = _mm512_fmadd_ps(quad_dot(w + (qd + 1) * kQuadBytes, a.q + (qd + 1) * kQuadQBytes), s1, t1);
    }
    for (; qd < q1; ++qd) {  // an odd last quad, and the row's padded tail
      const int64_t o = (qd - q0) * GPQ;
      const __m512 s0 = GPQ == 1 ? _mm512_set1_ps(sd[o])
                                 : _mm512_permutexvar_ps(lane_group, _mm512_castps128_ps512(_mm_loadu_ps(sd + o)));
      t0 = _mm512_fmadd_ps(
          quad_dot(qd < full ? w + qd * kQuadBytes : quad_bytes(w, qd, p.row_bytes, tmp), a.q + qd * kQuadQBytes),
          s0, t0);
    }
    const float v = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(t0, t1), mp)) + min_part;
    y[n] = accumulate ? y[n] + v : v;
  }
}

}  // namespace

void rows_avx512_i24(const Problem& p, const QActivations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                     bool accumulate, float* y) {
  const int64_t q0 = c0 / 4, q1 = (c1 + 3) / 4;  // c0 is a multiple of 4 (int4_isa.h)
  switch (p.group_size) {
    case 32: gemv<4>(p, a, q0, q1, n0, n1, accumulate, y); break;
    case 64: gemv<2>(p, a, q0, q1, n0, n1, accumulate, y); break;
    default: gemv<1>(p, a, q0, q1, n0, n1, accumulate, y); break;
  }
}

}  // namespace nibble::cpu::int4
