// One query head's attention on the CPU (kernels.h: cpu::attention_row).
//
// Built for x86-64-v1 and cloned for AVX2 and AVX-512 (GCC's target_clones: the loader picks the clone for the CPU
// it runs on). Products are never fused into FMAs here (-ffp-contract=off, CMakeLists.txt), and every sum keeps its
// order, so each clone gives the same bits: only the width of the vector code differs.

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"

namespace nibble::cpu {
namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define NIBBLE_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define NIBBLE_CLONES
#endif
// Inlined into each clone, so compiled for its instruction set.
#define NIBBLE_INLINE inline __attribute__((always_inline))

// a·b over n floats in 16 partial sums (sum j takes the products of d ≡ j mod 16, in order of d), then a fixed
// pairwise reduction.
template <int64_t N>
NIBBLE_INLINE float dot_lanes(const float* a, const float* b, int64_t n) {
  if constexpr (N > 0) n = N;  // a head size known at compile time: the loops unroll, the sums stay in registers
  constexpr int kLanes = 16;
  float p[kLanes] = {};
  int64_t d = 0;
  for (; d + kLanes <= n; d += kLanes)
    for (int j = 0; j < kLanes; ++j) p[j] += a[d + j] * b[d + j];
  for (int j = 0; d + j < n; ++j) p[j] += a[d + j] * b[d + j];
  for (int j = 0; j < 8; ++j) p[j] += p[j + 8];
  for (int j = 0; j < 4; ++j) p[j] += p[j + 4];
  for (int j = 0; j < 2; ++j) p[j] += p[j + 2];
  return p[0] + p[1];
}

#if defined(__GNUC__) && !defined(__clang__)
#define NIBBLE_DOT16 1  // __builtin_shuffle is GCC's (clang, for the fuzz build, takes dot_lanes: the same bits)
#else
#define NIBBLE_DOT16 0
#endif

#if NIBBLE_DOT16
// 16 lanes of floats (GCC's vector extension: one zmm in the AVX-512 clone, two ymm or four xmm in the others).
typedef float V16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));

NIBBLE_INLINE V16 load16(const float* p) {
  V16 v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}

// One step of dot16's reduction on two vectors: x's and y's lanes lo added to their lanes hi.
NIBBLE_INLINE V16 half(V16 x, V16 y, I16 lo, I16 hi) { return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi); }

// dot_lanes<HD> of q with 16 keys at once (HD a multiple of 16): each key's 16 partial sums in a vector, then the
// same pairwise reduction for all 16 by shuffles, (j, j + 8), (j, j + 4), (j, j + 2), (0, 1): the bits of
// dot_lanes, 16 dot products in one vector, in key order.
template <int64_t HD>
NIBBLE_INLINE V16 dot16(const float* q, const float* keys, int64_t stride) {
  V16 p[16];
  for (int t = 0; t < 16; ++t) p[t] = V16{};
  for (int64_t d = 0; d < HD; d += 16) {
    const V16 qv = load16(q + d);
    for (int t = 0; t < 16; ++t) p[t] += qv * load16(keys + t * stride + d);
  }
  // Step s halves each key's lanes: pairs of vectors (keys a, b) become one, a's sums then b's.
  const I16 lo1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const I16 hi1 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const I16 lo2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const I16 hi2 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const I16 lo3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const I16 hi3 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const I16 lo4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const I16 hi4 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  V16 a[8], b[4], c[2];
  for (int i = 0; i < 8; ++i) a[i] = half(p[2 * i], p[2 * i + 1], lo1, hi1);
  for (int i = 0; i < 4; ++i) b[i] = half(a[2 * i], a[2 * i + 1], lo2, hi2);
  for (int i = 0; i < 2; ++i) c[i] = half(b[2 * i], b[2 * i + 1], lo3, hi3);
  return half(c[0], c[1], lo4, hi4);
}

#endif  // NIBBLE_DOT16

// attention_row for a head size HD known at compile time (0: any, hd), out[] summed in registers: the same
// arithmetic in the same order either way.
template <int64_t HD>
NIBBLE_INLINE void row(const float* q, int64_t hd, float scale, const AttentionRun* runs, int nruns, int64_t stride,
                float* scores, float* out) {
  if constexpr (HD > 0) hd = HD;
  float mx = -INFINITY;
  int64_t k = 0;
  for (int r = 0; r < nruns; ++r) {
    int64_t t = 0;
#if NIBBLE_DOT16
    if constexpr (HD > 0 && HD % 16 == 0) {
      V16 m = V16{} - INFINITY;
      for (; t + 16 <= runs[r].rows; t += 16, k += 16) {
        const V16 s = dot16<HD>(q, runs[r].keys + t * stride, stride) * scale;
        __builtin_memcpy(scores + k, &s, sizeof s);
        m = s > m ? s : m;
      }
      for (int j = 0; j < 16; ++j) mx = std::max(mx, m[j]);
    }
#endif
    for (; t < runs[r].rows; ++t, ++k) {
      scores[k] = dot_lanes<HD>(q, runs[r].keys + t * stride, hd) * scale;
      mx = std::max(mx, scores[k]);
    }
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < k; ++j) sum += (scores[j] = std::exp(scores[j] - mx));
  constexpr int64_t kAcc = HD > 0 ? HD : 1;
  float acc[kAcc] = {};
  float* o = HD > 0 ? acc : out;
  std::fill_n(o, hd, 0.0f);
  k = 0;
  for (int r = 0; r < nruns; ++r)
    for (int64_t t = 0; t < runs[r].rows; ++t, ++k) {
      const float w = scores[k] / sum;
      const float* v = runs[r].values + t * stride;
      for (int64_t d = 0; d < hd; ++d) o[d] += w * v[d];
    }
  if constexpr (HD > 0) std::copy_n(acc, HD, out);
}

}  // namespace

NIBBLE_CLONES
void attention_row(const float* q, int64_t hd, float scale, const AttentionRun* runs, int nruns, int64_t stride,
                   float* scores, float* out) {
  switch (hd) {
    case 64: return row<64>(q, hd, scale, runs, nruns, stride, scores, out);
    case 128: return row<128>(q, hd, scale, runs, nruns, stride, scores, out);
    default: return row<0>(q, hd, scale, runs, nruns, stride, scores, out);
  }
}

}  // namespace nibble::cpu
