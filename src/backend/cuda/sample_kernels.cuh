// Sampled decode on the device (src/backend/cuda/forward.cu; included there
// after forward_kernels.cuh): nibble/sampler.h's draw, bit for bit the CPU's
// (the arithmetic is nibble/sample_math.h's, shared with the host).
//
// A step at temperature > 0 ends with up to three small kernels after the
// head's logits: sample_select_kernel (only with top-k or top-p) finds the
// least key kept, sample_keys_kernel scores every kept logit and leaves each
// warp's best key in one of GemvFusion::kArgmaxKeys slots, and
// argmax_keys_kernel (the greedy head's) reads the slots back to zero and
// feeds the next step. The draw number comes from the step's position on the
// device, so steps need nothing from the host.
#pragma once

#include <cstdint>

#include "backend/cuda/forward_kernels.cuh"
#include "nibble/sample_math.h"

namespace nibble::cuda {
namespace {

// One run's sampling: SamplerConfig at temperature > 0, and the draw number
// of position 0 (the draw of a step at position p is draw_base + p, mod 2^64).
struct SampleArgs {
  float temperature = 1.0f;
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  uint64_t draw_base = 0;
};

constexpr int kSampleKeysThreads = 256, kSampleKeysBlocks = 128;

// Every kept logit's score (l / T plus its Gumbel variable) as a key; each
// warp's largest into slot (global warp) mod kArgmaxKeys by a relaxed atomic
// max. Kept: below `limit`, not NaN, key at least *lowest (null: 0).
__global__ void __launch_bounds__(kSampleKeysThreads)
    sample_keys_kernel(const float* __restrict__ l, int64_t limit, SampleArgs a, const int32_t* step,
                       const unsigned long long* lowest, unsigned long long* keys) {
  pdl_prologue();
  const uint64_t draw = a.draw_base + static_cast<uint64_t>(static_cast<int64_t>(step[1]));
  const uint64_t lo = lowest != nullptr ? *lowest : 0ull;
  uint64_t best = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < limit;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = l[i];
    const uint64_t k = sampling::key(v, i);
    if (k == 0 || k < lo) continue;
    best = max(best, sampling::key(sampling::score(v, a.temperature, a.seed, draw, i), i));
  }
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xFFFFFFFFu, best, o));
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if ((threadIdx.x & 31) == 0 && best != 0)
    asm volatile("red.relaxed.gpu.global.max.u64 [%0], %1;\n" ::"l"(keys + warp % GemvFusion::kArgmaxKeys),
                 "l"(static_cast<unsigned long long>(best))
                 : "memory");
}

constexpr int kSelectThreads = 1024, kSelectWarps = kSelectThreads / 32, kSelectBins = 256;
// Per-warp histograms of one 8-bit digit: masses (u64), then counts (u32).
constexpr size_t kSelectSmem = size_t{kSelectWarps} * kSelectBins * (8 + 4);

struct SelectShared {
  uint32_t tot_c[kSelectBins];
  uint64_t tot_m[kSelectBins];
  uint64_t red[kSelectWarps];
  uint32_t digit;
  uint64_t above_c, above_m, bin_c, r, result;
};

__device__ inline uint64_t select_block_max(uint64_t v, SelectShared& sh) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xFFFFFFFFu, v, o));
  if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < kSelectWarps; ++w) v = max(v, sh.red[w]);
  __syncthreads();
  return v;
}
__device__ inline uint64_t select_block_sum(uint64_t v, SelectShared& sh) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, o);
  if ((threadIdx.x & 31) == 0) sh.red[threadIdx.x >> 5] = v;
  __syncthreads();
  v = 0;
  for (int w = 0; w < kSelectWarps; ++w) v += sh.red[w];
  __syncthreads();
  return v;
}
// The block's exclusive prefix sum of v, in thread order.
__device__ inline uint64_t select_block_exclusive(uint64_t v, SelectShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t t = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += t;
  }
  if (lane == 31) sh.red[warp] = inc;
  __syncthreads();
  uint64_t before = 0;
  for (int w = 0; w < warp; ++w) before += sh.red[w];
  __syncthreads();
  return before + inc - v;
}

// The least key the kept set holds, for the kept ids among those with key
// >= `lower`: count mode (Mass false) the `need` largest; mass mode the
// shortest prefix in descending key order whose mass (against lmax at t)
// reaches top_p of theirs. Four passes of an 8-bit digit over the value half
// of the keys, then, where the boundary value's ids are kept only in part, one
// pass for the boundary id. Every thread of the block calls it.
template <bool Mass>
__device__ uint64_t select_lowest(const float* __restrict__ l, int64_t n, uint64_t lower, float lmax, float t,
                                  uint64_t need, float top_p, uint64_t* hm, uint32_t* hc, SelectShared& sh) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  uint32_t prefix = 0, pmask = 0;
  uint64_t above_c = 0, above_m = 0;
  double target = 0;  // mass mode, warp 0
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = lane; b < kSelectBins; b += 32) {
      hc[warp * kSelectBins + b] = 0;
      if constexpr (Mass) hm[warp * kSelectBins + b] = 0;
    }
    __syncwarp();
    for (int64_t i = tid; i < n; i += kSelectThreads) {
      const float v = l[i];
      const uint64_t k = sampling::key(v, i);
      if (k == 0 || k < lower) continue;
      const auto hi = static_cast<uint32_t>(k >> 32);
      if ((hi & pmask) != prefix) continue;
      const uint32_t d = (hi >> shift) & 255u;
      atomicAdd(hc + warp * kSelectBins + d, 1u);
      if constexpr (Mass)
        atomicAdd(reinterpret_cast<unsigned long long*>(hm + warp * kSelectBins + d),
                  static_cast<unsigned long long>(sampling::mass(v, lmax, t)));
    }
    __syncthreads();
    if (tid < kSelectBins) {
      uint32_t c = 0;
      uint64_t m = 0;
      for (int w = 0; w < kSelectWarps; ++w) {
        c += hc[w * kSelectBins + tid];
        if constexpr (Mass) m += hm[w * kSelectBins + tid];
      }
      sh.tot_c[tid] = c;
      sh.tot_m[tid] = m;
    }
    __syncthreads();
    if (warp == 0) {
      // Lane j holds bins 255 - 8j down to 248 - 8j: descending keys.
      uint64_t lc = 0, lm = 0;
      for (int q = 0; q < 8; ++q) {
        lc += sh.tot_c[255 - 8 * lane - q];
        lm += sh.tot_m[255 - 8 * lane - q];
      }
      uint64_t ic = lc, im = lm;
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t tc = __shfl_up_sync(0xFFFFFFFFu, ic, o), tm = __shfl_up_sync(0xFFFFFFFFu, im, o);
        if (lane >= o) ic += tc, im += tm;
      }
      if (Mass && shift == 24)
        target = static_cast<double>(top_p) * static_cast<double>(__shfl_sync(0xFFFFFFFFu, im, 31));
      auto reached = [&](uint64_t c, uint64_t m) { return Mass ? static_cast<double>(m) >= target : c >= need; };
      const unsigned ballot = __ballot_sync(0xFFFFFFFFu, reached(above_c + ic, above_m + im));
      if (lane == __ffs(ballot) - 1) {  // some lane reaches: the last holds the whole
        uint64_t c = above_c + ic - lc, m = above_m + im - lm;
        for (int q = 0; q < 8; ++q) {
          const int b = 255 - 8 * lane - q;
          if (reached(c + sh.tot_c[b], m + sh.tot_m[b])) {
            sh.digit = static_cast<uint32_t>(b);
            sh.above_c = c;
            sh.above_m = m;
            sh.bin_c = sh.tot_c[b];
            break;
          }
          c += sh.tot_c[b];
          m += sh.tot_m[b];
        }
      }
    }
    __syncthreads();
    prefix |= sh.digit << shift;
    pmask |= 255u << shift;
    above_c = sh.above_c;
    above_m = sh.above_m;
  }
  // The boundary value's ids (key >= lower) come in ascending id order: how
  // many the kept set takes.
  if (tid == 0) {
    uint64_t r = need - above_c;
    if constexpr (Mass) {
      const uint64_t m1 = sampling::mass(sampling::key_value(prefix), lmax, t);  // > 0: its bin reached the target
      const double est = ceil((target - static_cast<double>(above_m)) / static_cast<double>(m1));
      r = est < 1.0 ? 1 : (est > static_cast<double>(sh.bin_c) ? sh.bin_c : static_cast<uint64_t>(est));
      while (r > 1 && static_cast<double>(above_m + (r - 1) * m1) >= target) --r;
      while (r < sh.bin_c && static_cast<double>(above_m + r * m1) < target) ++r;
    }
    sh.r = r;
  }
  __syncthreads();
  const uint64_t r = sh.r, whole = max(lower, static_cast<uint64_t>(prefix) << 32);
  if (r == sh.bin_c) return whole;  // all of them
  // The r-th smallest id of the boundary value: contiguous ranges per thread.
  const int64_t chunk = (n + kSelectThreads - 1) / kSelectThreads, lo = tid * chunk, hi = min(n, lo + chunk);
  uint64_t cnt = 0;
  for (int64_t i = lo; i < hi; ++i) {
    const uint64_t k = sampling::key(l[i], i);
    cnt += k >= lower && static_cast<uint32_t>(k >> 32) == prefix;
  }
  const uint64_t before = select_block_exclusive(cnt, sh);
  if (before < r && r <= before + cnt) {
    uint64_t seen = before;
    for (int64_t i = lo; i < hi; ++i) {
      const uint64_t k = sampling::key(l[i], i);
      if (k >= lower && static_cast<uint32_t>(k >> 32) == prefix && ++seen == r) {
        sh.result = k;
        break;
      }
    }
  }
  __syncthreads();
  return sh.result;
}

// The least key sampling keeps (top-k, then top-p over those) among logits
// 0 .. n-1, into *lowest_out: 0 keeps every non-NaN logit. One block.
__global__ void __launch_bounds__(kSelectThreads, 1)
    sample_select_kernel(const float* __restrict__ l, int64_t n, SampleArgs a, unsigned long long* lowest_out) {
  extern __shared__ uint64_t select_smem[];
  __shared__ SelectShared sh;
  uint64_t* hm = select_smem;
  auto* hc = reinterpret_cast<uint32_t*>(select_smem + kSelectWarps * kSelectBins);
  pdl_prologue();
  uint64_t kmax = 0, valid = 0;
  for (int64_t i = threadIdx.x; i < n; i += kSelectThreads) {
    const uint64_t k = sampling::key(l[i], i);
    kmax = max(kmax, k);
    valid += k != 0;
  }
  kmax = select_block_max(kmax, sh);
  valid = select_block_sum(valid, sh);
  uint64_t lowest = 0;
  if (valid != 0) {
    if (a.top_k > 0 && static_cast<uint64_t>(a.top_k) < valid)
      lowest = select_lowest<false>(l, n, 0, 0.0f, a.temperature, static_cast<uint64_t>(a.top_k), 1.0f, hm, hc, sh);
    if (a.top_p < 1.0f)
      lowest = max(lowest, select_lowest<true>(l, n, lowest, sampling::key_value(static_cast<uint32_t>(kmax >> 32)),
                                               a.temperature, 0, a.top_p, hm, hc, sh));
  }
  if (threadIdx.x == 0) *lowest_out = lowest;
}

}  // namespace
}  // namespace nibble::cuda
