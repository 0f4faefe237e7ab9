// The arithmetic of next-token sampling (nibble/sampler.h), written once for
// the host and the device so that both draw the same id from the same logits:
// every float operation here is a single IEEE-rounded multiply, add or
// divide (on the device the _rn intrinsics, which the compiler never fuses
// into an FMA; the CPU library builds with -ffp-contract=off, and no FMA is
// used, which x86-64's baseline lacks), and the logarithm and exponential are
// this file's own polynomials rather than the math libraries' (whose last
// bits differ between glibc and CUDA).
//
// A draw is the Gumbel-max trick: among the kept ids, the id of the largest
// z_i = l_i / T + g_i, with g_i = -log(-log(u_i)) and u_i a uniform of 23
// bits hashed from (seed, draw, i). That samples softmax(l / T) restricted to
// the kept ids, with no sort and no normalisation, one pass over the logits.
// Ids are ordered by keys (sample_key): the value, then the smaller id first,
// so the order is total and the same everywhere.
#pragma once

#include <cstdint>
#include <cstring>

#include "nibble/hd.h"

namespace nibble::sampling {

// Mass of a logit relative to the largest, in units of 2^-40 (exact integer
// sums in any order; softmax terms below 2^-40 count as 0).
constexpr double kMassOne = 1099511627776.0;  // 2^40

NIBBLE_HD inline uint32_t f2u(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}
NIBBLE_HD inline float u2f(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}
NIBBLE_HD inline float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;  // the CPU library builds with -ffp-contract=off
#endif
}
NIBBLE_HD inline float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NIBBLE_HD inline float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
NIBBLE_HD inline float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
// The order key of value v at id i: v's bits mapped to an unsigned order
// (-0 as +0) above the inverted id, so a larger key is a larger value, or the
// same value at a smaller id. 0 (below every key) for NaN.
NIBBLE_HD inline uint64_t key(float v, int64_t i) {
  if (v != v) return 0;
  if (v == 0.0f) v = 0.0f;
  uint32_t u = f2u(v);
  u = (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  return (static_cast<uint64_t>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}
// The value of a key's high half; the id of a key, 0 for none (the largest
// of no keys: every value NaN).
NIBBLE_HD inline float key_value(uint32_t hi) { return u2f((hi & 0x80000000u) != 0 ? (hi & 0x7FFFFFFFu) : ~hi); }
NIBBLE_HD inline int32_t key_row(uint64_t k) {
  return k != 0 ? static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k)) : 0;
}

// ln 2 in two parts; the first has 16 significant bits, so its products with
// an integer below 2^8 are exact.
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;

// log(x) for a finite normal x > 0, within a few ulp.
NIBBLE_HD inline float log(float x) {
  const uint32_t b = f2u(x);
  int e = static_cast<int>(b >> 23) - 127;
  float m = u2f((b & 0x007FFFFFu) | 0x3F800000u);  // [1, 2)
  if (m > 1.41421354f) {
    m = mul(m, 0.5f);
    e += 1;
  }
  const float f = sub(m, 1.0f);  // exact
  const float s = div(f, add(f, 2.0f)), s2 = mul(s, s);  // |s| <= 0.1716
  // log(m) = 2s + s·s2·(2/3 + 2/5 s2 + 2/7 s2^2 + 2/9 s2^3 + 2/11 s2^4)
  float q = add(mul(0.18181818f, s2), 0.22222222f);
  q = add(mul(q, s2), 0.28571429f);
  q = add(mul(q, s2), 0.40000001f);
  q = add(mul(q, s2), 0.66666669f);
  const float lm = add(mul(2.0f, s), mul(s, mul(s2, q)));
  const float fe = static_cast<float>(e);
  return add(mul(fe, kLn2Hi), add(mul(fe, kLn2Lo), lm));
}

// exp(x) · 2^40 truncated to an integer, for x <= 0 (0 below -30, where it is
// under 1; NaN gives 0).
NIBBLE_HD inline uint64_t exp_mass(float x) {
  if (!(x >= -30.0f)) return 0;
  // k = round(x / ln 2) by the 1.5 · 2^23 shift (ties to even), |k| <= 44.
  const float k = sub(add(mul(x, 1.44269502f), 12582912.0f), 12582912.0f);
  float r = sub(x, mul(k, kLn2Hi));  // the product is exact
  r = sub(r, mul(k, kLn2Lo));        // |r| <= 0.35
  float p = add(mul(1.98412698e-04f, r), 1.38888889e-03f);
  p = add(mul(p, r), 8.33333377e-03f);
  p = add(mul(p, r), 4.16666679e-02f);
  p = add(mul(p, r), 1.66666672e-01f);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  const int sc = static_cast<int>(k) + 40 + 127;  // 2^(k + 40), k in [-44, 0]: a normal power of two
  const float v = mul(p, u2f(static_cast<uint32_t>(sc) << 23));
  return static_cast<uint64_t>(v);  // truncation, as __float2ull_rz
}

// The mass of logit l when the largest is lmax, at temperature t > 0.
NIBBLE_HD inline uint64_t mass(float l, float lmax, float t) {
  if (l == lmax) return static_cast<uint64_t>(kMassOne);  // also +inf against +inf
  return exp_mass(div(sub(l, lmax), t));
}

// splitmix64's finaliser.
NIBBLE_HD inline uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The Gumbel variable of id i in draw `draw` under `seed`: u = (2h + 1)·2^-24
// from 23 hashed bits h (exact in a float, never 0 or 1), g = -log(-log u).
NIBBLE_HD inline float gumbel(uint64_t seed, uint64_t draw, int64_t i) {
  const uint64_t h = mix(mix(seed + 0x9E3779B97F4A7C15ull * (draw + 1)) ^ static_cast<uint64_t>(i));
  const float u = mul(static_cast<float>(2 * (h >> 41) + 1), 5.9604645e-08f);  // 2^-24
  return -log(-log(u));
}

// The score of logit l at id i: l / t + its Gumbel variable.
NIBBLE_HD inline float score(float l, float t, uint64_t seed, uint64_t draw, int64_t i) {
  return add(div(l, t), gumbel(seed, draw, i));
}

// Top-k / top-p's check (the GPU's sample_filter_kernel): whether the draw
// over every id, d, is the draw over the kept ids too, which it is wherever
// d is kept (the draw is the largest score among the kept ids). `valid`: the
// non-NaN ids; `above`: the keys above d's; `m_above`, `m_low`, `m_all`: the
// masses (against the largest logit) of the keys above d's, of those down to
// d's own, of all. Top-k keeps d iff fewer than k keys lie above it; top-p iff
// m_above stays below top_p of the kept set's mass (the kept prefix is the
// shortest whose mass reaches that). After a top-k that cuts, the set's mass
// lies between m_low and m_all and is not known, so the answer is true only
// where m_low already decides. True: d is the draw; false: d is not kept (a
// single filter) or the check cannot tell (both).
NIBBLE_HD inline bool draw_kept(int top_k, float top_p, uint64_t valid, uint64_t above, uint64_t m_above,
                                uint64_t m_low, uint64_t m_all) {
  const bool cuts = top_k > 0 && static_cast<uint64_t>(top_k) < valid;
  if (cuts && above >= static_cast<uint64_t>(top_k)) return false;
  if (!(top_p < 1.0f)) return true;
  // As the sampler's walk compares: cum >= top_p · total, in doubles.
  return static_cast<double>(m_above) < static_cast<double>(top_p) * static_cast<double>(cuts ? m_low : m_all);
}

}  // namespace nibble::sampling
