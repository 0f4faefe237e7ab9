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

// attention_row for a head size HD known at compile time (0: any, hd), out[] summed in registers: the same
// arithmetic in the same order either way.
template <int64_t HD>
NIBBLE_INLINE void row(const float* q, int64_t hd, float scale, const AttentionRun* runs, int nruns, int64_t stride,
                float* scores, float* out) {
  if constexpr (HD > 0) hd = HD;
  float mx = -INFINITY;
  int64_t k = 0;
  for (int r = 0; r < nruns; ++r)
    for (int64_t t = 0; t < runs[r].rows; ++t, ++k) {
      scores[k] = dot_lanes<HD>(q, runs[r].keys + t * stride, hd) * scale;
      mx = std::max(mx, scores[k]);
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
