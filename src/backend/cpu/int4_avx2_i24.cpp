// int4_asym GEMV/GEMM with integer dot products, for AVX2 (compiled with -mavx2
// -mfma; called only when the CPU has them). The design is in int4_gemm.cpp, the
// activation layout in int4_isa.h (QActivations). Everything here is in an
// anonymous namespace or is the entry point, and no standard-library inline
// function is used: see the note at the top of int4_isa.h.
//
// Per group g of a weight row, with x_i = d_g·(65536·a_i + 256·b_i + c_i) (int4_isa.h):
//   Σ_i x_i·(code_i·s + m) = s·d_g·(65536·A + 256·B + C) + m·Σ_i x_i,
// A = Σ code_i·a_i, B = Σ code_i·b_i, C = Σ code_i·c_i. vpmaddubsw multiplies 32
// unsigned bytes (the codes, 0..15) by 32 signed bytes and adds adjacent pairs into
// 16 int16 lanes: 32 multiply-adds in one instruction, where the fp32 kernel needs
// a convert and an FMA per 8. A lane's pair is at most 2·15·128 = 3840 in
// magnitude, so up to 8 of them add in int16 without overflow (a group of 128 adds
// 4); vpmaddwd by ones widens to int32 once per group, and two converts and two
// FMAs per group apply 65536 and s·d_g. Per 64 weights: one 32-byte load, three ops
// to split the nibbles, six vpmaddubsw (their activation operands straight from
// L1), six int16 adds.
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

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// bf16 -> fp32 for 8 values: the bf16 bits are the top half of the fp32.
inline __m256 bf16x8(const uint16_t* h) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h))), 16));
}

// Entries i .. i + 7 of a scales or mins array (int4_isa.h: bf16 bits, or fp32 with f32_params).
inline __m256 params8(const void* a, bool f32, int64_t i) {
  return f32 ? _mm256_loadu_ps(static_cast<const float*>(a) + i) : bf16x8(static_cast<const uint16_t*>(a) + i);
}

// Entry i of a scales or mins array (int4_isa.h: bf16 bits, or fp32 with f32_params).
inline float param(const void* a, bool f32, int64_t i) {
  return f32 ? static_cast<const float*>(a)[i] : bf16(static_cast<const uint16_t*>(a)[i]);
}

// The 32 bytes of pair pr of a row (chunks 2pr, 2pr + 1), or a zero-padded copy in
// tmp when the row ends inside them.
inline const uint8_t* pair_bytes(const uint8_t* row, int64_t pr, int64_t row_bytes, uint8_t* tmp) {
  const int64_t b0 = pr * kPairBytes;
  if (b0 + kPairBytes <= row_bytes) return row + b0;
  for (int64_t i = 0; i < kPairBytes; ++i) tmp[i] = b0 + i < row_bytes ? row[b0 + i] : 0;
  return tmp;
}

// One pair's codes: lo = the low nibbles (even inputs), hi = the high ones, as bytes.
struct Nibbles {
  __m256i lo, hi;
};
// E2M1: each code c as 2·e2m1(c) + 12 (int4_isa.h, Problem::e2m1), one vpshufb per 32 codes.
template <bool E2M1 = false>
inline Nibbles split_pair(const uint8_t* b) {
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i lo = _mm256_and_si256(v, mask), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
  if constexpr (!E2M1) {
    return {lo, hi};
  } else {
    const __m256i lut = _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,  //
                                         12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
    return {_mm256_shuffle_epi8(lut, lo), _mm256_shuffle_epi8(lut, hi)};
  }
}

// A group's (or pair's) int16 partial sums of code·a, code·b, code·c.
struct Sums {
  __m256i a, b, c;
};
inline Sums zero_sums() { return {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256()}; }

// Adds one pair's products for the activation pair at q (its 192 bytes).
inline void pair_dot(const Nibbles& w, const int8_t* q, Sums& s) {
  const __m256i* v = reinterpret_cast<const __m256i*>(q);
  s.a = _mm256_add_epi16(s.a, _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, _mm256_load_si256(v)),
                                               _mm256_maddubs_epi16(w.hi, _mm256_load_si256(v + 1))));
  s.b = _mm256_add_epi16(s.b, _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, _mm256_load_si256(v + 2)),
                                               _mm256_maddubs_epi16(w.hi, _mm256_load_si256(v + 3))));
  s.c = _mm256_add_epi16(s.c, _mm256_add_epi16(_mm256_maddubs_epi16(w.lo, _mm256_load_si256(v + 4)),
                                               _mm256_maddubs_epi16(w.hi, _mm256_load_si256(v + 5))));
}

// The sums of one whole group of PPG = 1 or 2 pairs (w: its weight bytes, q: its
// activation bytes), as one tree of adds with no accumulator to start from zero.
template <int PPG, bool E2M1>
inline Sums group_sums(const uint8_t* w, const int8_t* q) {
  const __m256i* v = reinterpret_cast<const __m256i*>(q);
  const Nibbles k0 = split_pair<E2M1>(w);
  Sums s{_mm256_add_epi16(_mm256_maddubs_epi16(k0.lo, _mm256_load_si256(v)),
                          _mm256_maddubs_epi16(k0.hi, _mm256_load_si256(v + 1))),
         _mm256_add_epi16(_mm256_maddubs_epi16(k0.lo, _mm256_load_si256(v + 2)),
                          _mm256_maddubs_epi16(k0.hi, _mm256_load_si256(v + 3))),
         _mm256_add_epi16(_mm256_maddubs_epi16(k0.lo, _mm256_load_si256(v + 4)),
                          _mm256_maddubs_epi16(k0.hi, _mm256_load_si256(v + 5)))};
  if constexpr (PPG == 2) pair_dot(split_pair<E2M1>(w + kPairBytes), q + kPairQBytes, s);
  return s;
}

// 65536·A + 256·B + C per int32 lane, in fp32. |256·B + C| < 2^23 converts
// exactly; |A| < 2^15, so the FMA rounds once.
inline __m256 combine(const Sums& s) {
  const __m256i ones = _mm256_set1_epi16(1);
  const __m256i bc =
      _mm256_add_epi32(_mm256_slli_epi32(_mm256_madd_epi16(s.b, ones), 8), _mm256_madd_epi16(s.c, ones));
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(s.a, ones)), _mm256_set1_ps(65536.0f),
                         _mm256_cvtepi32_ps(bc));
}

// Rows [n0, n1) of y for one activation row over pairs [p0, p1). PPG: pairs per
// group (G = 64: 1, G = 128: 2); 0 means G = 32, a group per chunk: the two 128-bit
// halves of a pair then belong to two groups, and the pair's scale vector holds
// s·d of one group in its low four lanes and of the next in its high four.
// E2M1: FP4 codes and fp32 scales (int4_isa.h, Problem::e2m1), the pair (s/2, −6·s).
// PPG = -1: G = 16 (E2M1 only), four groups per pair, d_g per chunk (int4_isa.h).
template <int PPG, bool E2M1>
void gemv(const Problem& p, const QActivations& a, int64_t p0, int64_t p1, int64_t n0, int64_t n1, bool accumulate,
          float* y) {
  static_assert(PPG >= 0 || E2M1, "groups of 16 are for FP4 codes only");
  constexpr int64_t kGroupsPerBlock = (PPG < 0 ? 4 : 2) * kMaxBlockChunks;  // G = 16 / 32 over the largest block
  const int64_t full = p.row_bytes / kPairBytes;                             // pairs that need no padded copy
  constexpr int64_t ppg = PPG <= 0 ? 1 : PPG;
  // Groups covered: G = 16 → chunks [2p0, 2p1) twice over; G = 32 → those chunks; otherwise pairs / PPG.
  const int64_t g0 = PPG < 0 ? 4 * p0 : PPG == 0 ? 2 * p0 : p0 / ppg;
  const int64_t g1 = min64(PPG < 0 ? 4 * p1 : PPG == 0 ? 2 * p1 : (p1 + ppg - 1) / ppg, p.groups);
  const int64_t ng = g1 - g0;
  alignas(32) float sd[kGroupsPerBlock + 8];
  alignas(32) uint8_t tmp[kPairBytes];
  const float* d = a.d + (PPG < 0 ? g0 / 2 : g0);
  const float* xs = a.xsum + g0;
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);  // G = 16: entry j for lanes 2j, 2j + 1
  for (int64_t n = n0; n < n1; ++n) {
    const uint8_t* w = p.qweight + n * p.row_bytes;
    const int64_t r = n * p.groups + g0;  // the row's first group of the block
    // s·d per group, and Σ_g m_g·Σx_g (8 groups at a time).
    __m256 mp = _mm256_setzero_ps();
    float min_part = 0.0f;
    int64_t g = 0;
    if constexpr (E2M1) {
      const float* sc = static_cast<const float*>(p.scales) + r;
      const uint8_t* sb = static_cast<const uint8_t*>(p.scales) + r;  // with a scale table
      const float* tb = p.scale_table;
      for (; g + 8 <= ng; g += 8) {
        const __m256 s8 =
            tb ? _mm256_i32gather_ps(tb, _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sb + g))),
                                     4)
               : _mm256_loadu_ps(sc + g);
        const __m256 d8 = PPG < 0 ? _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(d + g / 2)), dup)
                                  : _mm256_loadu_ps(d + g);
        _mm256_store_ps(sd + g, _mm256_mul_ps(_mm256_mul_ps(s8, _mm256_set1_ps(0.5f)), d8));
        mp = _mm256_fmadd_ps(_mm256_mul_ps(s8, _mm256_set1_ps(-6.0f)), _mm256_loadu_ps(xs + g), mp);
      }
      for (; g < ng; ++g) {
        const float sg = tb ? tb[sb[g]] : sc[g];
        sd[g] = sg * 0.5f * d[PPG < 0 ? g / 2 : g];
        min_part += sg * -6.0f * xs[g];
      }
    } else {
      for (; g + 8 <= ng; g += 8) {
        _mm256_store_ps(sd + g, _mm256_mul_ps(params8(p.scales, p.f32_params, r + g), _mm256_loadu_ps(d + g)));
        mp = _mm256_fmadd_ps(params8(p.mins, p.f32_params, r + g), _mm256_loadu_ps(xs + g), mp);
      }
      for (; g < ng; ++g) {
        sd[g] = param(p.scales, p.f32_params, r + g) * d[g];
        min_part += param(p.mins, p.f32_params, r + g) * xs[g];
      }
    }
    for (int k = 0; k < 4; ++k) sd[ng + k] = 0.0f;  // a last pair's missing groups (G = 16, 32)
    // Two running totals: independent dependency chains, in registers.
    __m256 t0 = _mm256_setzero_ps(), t1 = t0;
    if constexpr (PPG < 0) {
      for (int64_t pr = p0; pr < p1; ++pr) {
        if ((pr & 1) == 0)
          _mm_prefetch(reinterpret_cast<const char*>(w + pr * kPairBytes) + kPrefetchBytes, _MM_HINT_T0);
        const Nibbles k = split_pair<E2M1>(pr < full ? w + pr * kPairBytes : pair_bytes(w, pr, p.row_bytes, tmp));
        Sums sm = zero_sums();
        pair_dot(k, a.q + pr * kPairQBytes, sm);
        const __m256 s4 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sd + 4 * (pr - p0))), dup);
        if (pr & 1)
          t1 = _mm256_fmadd_ps(combine(sm), s4, t1);
        else
          t0 = _mm256_fmadd_ps(combine(sm), s4, t0);
      }
    } else if constexpr (PPG == 0) {
      const __m256i halves = _mm256_set_epi32(1, 1, 1, 1, 0, 0, 0, 0);
      for (int64_t pr = p0; pr < p1; ++pr) {
        if ((pr & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + pr * kPairBytes) + kPrefetchBytes, _MM_HINT_T0);
        const Nibbles k = split_pair<E2M1>(pr < full ? w + pr * kPairBytes : pair_bytes(w, pr, p.row_bytes, tmp));
        Sums sm = zero_sums();
        pair_dot(k, a.q + pr * kPairQBytes, sm);
        const __m256 s2 = _mm256_permutevar8x32_ps(
            _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(sd + 2 * (pr - p0))))),
            halves);
        if (pr & 1)
          t1 = _mm256_fmadd_ps(combine(sm), s2, t1);
        else
          t0 = _mm256_fmadd_ps(combine(sm), s2, t0);
      }
    } else {
      int64_t gi = 0;
      // Whole groups, two at a time.
      for (; gi + 2 <= ng; gi += 2) {
        const int64_t pb = (g0 + gi) * PPG;
        if (pb + 2 * PPG > full || pb + 2 * PPG > p1) break;
        // One prefetch per 64-byte line: two groups are one line (G = 64) or two (G = 128).
        _mm_prefetch(reinterpret_cast<const char*>(w + pb * kPairBytes) + kPrefetchBytes, _MM_HINT_T0);
        if constexpr (PPG == 2)
          _mm_prefetch(reinterpret_cast<const char*>(w + pb * kPairBytes) + kPrefetchBytes + 64, _MM_HINT_T0);
        const Sums s0 = group_sums<PPG, E2M1>(w + pb * kPairBytes, a.q + pb * kPairQBytes);
        t0 = _mm256_fmadd_ps(combine(s0), _mm256_broadcast_ss(sd + gi), t0);
        const Sums s1 = group_sums<PPG, E2M1>(w + (pb + PPG) * kPairBytes, a.q + (pb + PPG) * kPairQBytes);
        t1 = _mm256_fmadd_ps(combine(s1), _mm256_broadcast_ss(sd + gi + 1), t1);
      }
      // The rest: a last odd group, a ragged group, the row's padded tail.
      for (; gi < ng; ++gi) {
        const int64_t pb = (g0 + gi) * PPG;
        Sums sm = zero_sums();
        for (int64_t pr = pb; pr < min64(pb + PPG, p1); ++pr)
          pair_dot(split_pair<E2M1>(pr < full ? w + pr * kPairBytes : pair_bytes(w, pr, p.row_bytes, tmp)),
                   a.q + pr * kPairQBytes, sm);
        t0 = _mm256_fmadd_ps(combine(sm), _mm256_broadcast_ss(sd + gi), t0);
      }
    }
    const float v = hsum(_mm256_add_ps(_mm256_add_ps(t0, t1), mp)) + min_part;
    y[n] = accumulate ? y[n] + v : v;
  }
}

}  // namespace

// Pack the low byte of each int32 lane of lo (8 values) and hi (8 more) into 16 bytes at out.
static inline void store_bytes16(__m256i lo, __m256i hi, int8_t* out) {
  const __m256i pick = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,  //
                                        0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i order = _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0);
  const __m256i a = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(lo, pick), order);  // 8 bytes in the low 64 bits
  const __m256i b = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(hi, pick), order);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                   _mm_unpacklo_epi64(_mm256_castsi256_si128(a), _mm256_castsi256_si128(b)));
}

// 16 scaled values of one chunk's inputs of one parity (even or odd), rounded to
// nearest even (the MXCSR default), split into the a, b, c bytes (int4_isa.h) and
// stored at out, out + part, out + 2·part.
static inline void quantize16(__m256 v0, __m256 v1, int8_t* out, int64_t part) {
  const __m256i r128 = _mm256_set1_epi32(128);
  __m256i x[2] = {_mm256_cvtps_epi32(v0), _mm256_cvtps_epi32(v1)};
  __m256i a[2], b[2], c[2];
  for (int k = 0; k < 2; ++k) {
    const __m256i t = _mm256_srai_epi32(_mm256_add_epi32(x[k], r128), 8);
    c[k] = _mm256_sub_epi32(x[k], _mm256_slli_epi32(t, 8));
    a[k] = _mm256_srai_epi32(_mm256_add_epi32(t, r128), 8);
    b[k] = _mm256_sub_epi32(t, _mm256_slli_epi32(a[k], 8));
  }
  store_bytes16(a[0], a[1], out);
  store_bytes16(b[0], b[1], out + part);
  store_bytes16(c[0], c[1], out + 2 * part);
}

void prepare_avx2_i24(const float* xm, const Problem& p, const QActivations& qa, int unit) {
  int8_t* q = const_cast<int8_t*>(qa.q);
  float* d = const_cast<float*>(qa.d);
  float* xsum = const_cast<float*>(qa.xsum);
  const int64_t units = (p.chunks + unit - 1) / unit, ubytes = unit * kChunkQBytes;
  for (int64_t i = 0; i < units * ubytes; ++i) q[i] = 0;
  d[p.groups] = 0.0f;
  const __m256 sign = _mm256_set1_ps(-0.0f);
  alignas(32) float buf[kChunk];
  for (int64_t g = 0; g < p.groups; ++g) {
    const int64_t i0 = g * p.group_size, i1 = min64(p.K, i0 + p.group_size);
    // max |x| and Σx over the group (fp32, left to right within each of 8 lanes).
    __m256 mx = _mm256_setzero_ps(), sm = _mm256_setzero_ps();
    int64_t i = i0;
    for (; i + 8 <= i1; i += 8) {
      const __m256 v = _mm256_loadu_ps(xm + i);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v));
      sm = _mm256_add_ps(sm, v);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, mx);
    float amax = 0.0f;
    for (int k = 0; k < 8; ++k) amax = amax > lanes[k] ? amax : lanes[k];
    float sum = hsum(sm);
    for (; i < i1; ++i) {
      const float ax = xm[i] < 0 ? -xm[i] : xm[i];
      amax = amax > ax ? amax : ax;
      sum += xm[i];
    }
    xsum[g] = sum;
    if (!(sum - sum == 0.0f)) {  // a NaN or an infinity (or Σx overflowed): the caller reports it
      d[g] = sum - sum;            // NaN
      continue;
    }
    if (amax == 0.0f) {  // d = 0 and zero bytes: the group contributes its min term only
      d[g] = 0.0f;
      continue;
    }
    // d = 2^shift, the smallest power of two with amax / d ≤ kQMax: from amax's
    // exponent field (amax is normal here or a subnormal, handled by the loop).
    uint32_t bits;
    __builtin_memcpy(&bits, &amax, 4);
    int shift = static_cast<int>(bits >> 23) - 127 - 22;  // amax / 2^shift in [2^22, 2^23)
    if ((bits >> 23) == 0) shift = -149;  // subnormal: x / 2^-149 is an integer ≤ 2^23 already
    auto pow2 = [](int e) {
      // 2^e for e in [-149, 127] as fp32 (subnormal below -126).
      if (e < -126) {
        const uint32_t b = 1u << (e + 149);
        float f;
        __builtin_memcpy(&f, &b, 4);
        return f;
      }
      const uint32_t b = static_cast<uint32_t>(e + 127) << 23;
      float f;
      __builtin_memcpy(&f, &b, 4);
      return f;
    };
    while (amax / pow2(shift) > static_cast<float>(kQMax)) ++shift;
    d[g] = pow2(shift);
    // 1/d = 2^-shift, as two exact power-of-two factors when it exceeds fp32's range.
    const int e1 = -shift < 127 ? -shift : 127;
    const __m256 inv1 = _mm256_set1_ps(pow2(e1)), inv2 = _mm256_set1_ps(pow2(-shift - e1));
    // Chunk by chunk (a group is whole chunks; the last one may be short).
    for (int64_t c = i0 / kChunk; c * kChunk < i1; ++c) {
      const int64_t e0 = c * kChunk, n = min64(kChunk, i1 - e0);
      for (int64_t k = 0; k < kChunk; ++k) buf[k] = k < n ? xm[e0 + k] : 0.0f;
      for (int k = 0; k < kChunk; k += 8)
        _mm256_store_ps(buf + k, _mm256_mul_ps(_mm256_mul_ps(_mm256_load_ps(buf + k), inv1), inv2));
      // Even and odd inputs: shuffle_ps picks (0,2 | 4,6) of each 128-bit half of
      // two vectors, and the 64-bit permute puts the halves in order.
      __m256 ev[2], od[2];
      for (int h = 0; h < 2; ++h) {
        const __m256 v0 = _mm256_load_ps(buf + 16 * h), v1 = _mm256_load_ps(buf + 16 * h + 8);
        ev[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0x88)), 0xD8));
        od[h] = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(v0, v1, 0xDD)), 0xD8));
      }
      int8_t* out = q + (c / unit) * ubytes + (c % unit) * 16;
      quantize16(ev[0], ev[1], out, 32 * unit);
      quantize16(od[0], od[1], out + 16 * unit, 32 * unit);
    }
  }
}

void rows_avx2_i24(const Problem& p, const QActivations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                   bool accumulate, float* y) {
  const int64_t p0 = c0 / 2, p1 = (c1 + 1) / 2;  // c0 is even (int4_isa.h)
  switch (p.group_size * 2 + (p.e2m1 ? 1 : 0)) {
    case 33: gemv<-1, true>(p, a, p0, p1, n0, n1, accumulate, y); break;
    case 64: gemv<0, false>(p, a, p0, p1, n0, n1, accumulate, y); break;
    case 128: gemv<1, false>(p, a, p0, p1, n0, n1, accumulate, y); break;
    case 256: gemv<2, false>(p, a, p0, p1, n0, n1, accumulate, y); break;
    case 65: gemv<0, true>(p, a, p0, p1, n0, n1, accumulate, y); break;
    case 129: gemv<1, true>(p, a, p0, p1, n0, n1, accumulate, y); break;
    default: gemv<2, true>(p, a, p0, p1, n0, n1, accumulate, y); break;
  }
}

}  // namespace nibble::cpu::int4
