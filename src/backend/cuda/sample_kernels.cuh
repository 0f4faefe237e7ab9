// Sampled decode on the device (src/backend/cuda/forward.cu; included there
// after forward_kernels.cuh): nibble/sampler.h's draw, bit for bit the CPU's
// (the arithmetic is nibble/sample_math.h's, shared with the host).
//
// A step at temperature > 0 takes the score keys of every logit (l / T plus
// its Gumbel variable, nibble/sampler.h) into GemvFusion::kArgmaxKeys slots:
// where it can, the head GEMV does it (GemvFusion::argmax_*, HeadDraw), else
// sample_keys_kernel. The largest key over the slots is then the draw over
// every id. With top-k or top-p, sample_select_kernel first checks whether
// that id is kept: if so (the usual case) the slots stand; if not, it finds
// the least key kept and clears the slots, and sample_keys_kernel scores the
// kept logits again. argmax_keys_kernel (the greedy head's) reads the slots
// back to zero and feeds the next step. The draw number comes from the
// step's position on the device, so steps need nothing from the host.
#pragma once

#include <cstdint>

#include "backend/cuda/forward_kernels.cuh"
#include "nibble/sample_math.h"
#include "nibble/sampler.h"

namespace nibble::cuda {
namespace {

// One run's sampling: its config (temperature > 0), and the draw number of
// position 0 (the draw of a step at position p is draw_base + p, mod 2^64).
struct SampleArgs {
  SamplerConfig c;
  uint64_t draw_base = 0;
};

// The draw's state in device memory, zero to start with.
struct SampleState {
  unsigned long long keys[GemvFusion::kArgmaxKeys];  // sample_keys_kernel's slots: zero between draws
  HeadDraw feed;  // the limit and kSample: what argmax_keys_kernel reads
  unsigned long long lowest;  // sample_select_kernel: the least key kept
  uint32_t checked;  // sample_select_kernel: 1 where the slots' draw is kept as it is
  uint32_t pad;
};

constexpr int kSampleKeysThreads = 256, kSampleKeysBlocks = 128;

// Every kept logit's score (l / T plus its Gumbel variable) as a key; each
// warp's largest into slot (global warp) mod kArgmaxKeys by a relaxed atomic
// max. Kept: below `limit`, not NaN, key at least *lowest (null: 0). Nothing
// where *checked is set (null: never).
__global__ void __launch_bounds__(kSampleKeysThreads)
    sample_keys_kernel(const float* __restrict__ l, int64_t limit, SampleArgs a, const int32_t* step,
                       const unsigned long long* lowest, const uint32_t* checked, unsigned long long* keys) {
  pdl_prologue();
  if (checked != nullptr && *checked != 0) return;
  const uint64_t draw = a.draw_base + static_cast<uint64_t>(static_cast<int64_t>(step[1]));
  const uint64_t lo = lowest != nullptr ? *lowest : 0ull;
  uint64_t best = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < limit;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = l[i];
    const uint64_t k = sampling::key(v, i);
    if (k == 0 || k < lo) continue;
    best = max(best, sampling::key(sampling::score(v, a.c.temperature, a.c.seed, draw, i), i));
  }
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xFFFFFFFFu, best, o));
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if ((threadIdx.x & 31) == 0 && best != 0)
    asm volatile("red.relaxed.gpu.global.max.u64 [%0], %1;\n" ::"l"(keys + warp % GemvFusion::kArgmaxKeys),
                 "l"(static_cast<unsigned long long>(best))
                 : "memory");
}

constexpr int kSelectThreads = 1024, kSelectWarps = kSelectThreads / 32, kSelectBins = 256;
// Each block of the cluster holds the value halves of the keys of its slice
// of kSelectSlice logits in shared memory; clusters of up to 16 blocks:
// vocabularies up to kSelectMaxLogits.
constexpr int kSelectSlice = 16384, kSelectMaxRanks = 16;
constexpr int64_t kSelectMaxLogits = int64_t{kSelectSlice} * kSelectMaxRanks;
// Per-warp histograms of one 8-bit digit (masses u64, counts u32), then the slice.
constexpr size_t kSelectSmem = size_t{kSelectWarps} * kSelectBins * (8 + 4) + size_t{kSelectSlice} * 4;
inline int select_ranks(int64_t n) { return static_cast<int>((n + kSelectSlice - 1) / kSelectSlice); }

struct SelectShared {
  // This block's histogram totals, double-buffered by pass parity (the other
  // ranks read them between two cluster barriers).
  uint32_t tot_c[2][kSelectBins];
  uint64_t tot_m[2][kSelectBins];
  // The cluster's totals of the current pass.
  uint32_t all_c[kSelectBins];
  uint64_t all_m[kSelectBins];
  uint64_t red[kSelectWarps];
  uint64_t part[2][3];  // this block's largest value half, candidates, boundary-id count; [parity]
  uint64_t found[2];    // the boundary key where this block holds it, else 0; [parity]
  uint64_t check[3];    // the check: this block's keys above the draw's, their mass, the whole mass
  uint32_t digit;
  uint64_t above_c, above_m, bin_c, r;
  int pass;  // passes so far (parity of tot_*, part, found)
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

// The select kernel's view of its cluster: the block's slice [base, base +
// cnt) of the logits as value halves (0: NaN) in `vals`.
struct SelectSlice {
  const uint32_t* vals;
  int64_t base;
  int cnt;
  unsigned rank, ranks;
  // The key of the slice's j-th value half (hi != 0).
  __device__ uint64_t key(uint32_t hi, int j) const {
    return (static_cast<uint64_t>(hi) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(base + j));
  }
};

// The least key the kept set holds, for the kept ids among those with key
// >= `lower`: count mode (Mass false) the `need` largest; mass mode the
// shortest prefix in descending key order whose mass (against lmax at t)
// reaches top_p of theirs. Four passes of an 8-bit digit over the value
// halves (each block's histogram, summed over the cluster), then, where the
// boundary value's ids are kept only in part, one pass for the boundary id.
// Every thread of every block of the cluster calls it and gets the same key.
template <bool Mass>
__device__ uint64_t select_lowest(const SelectSlice& sl, uint64_t lower, float lmax, float t, uint64_t need,
                                  float top_p, uint64_t* hm, uint32_t* hc, SelectShared& sh) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters
  namespace cg = cooperative_groups;
  const cg::cluster_group cluster = cg::this_cluster();
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  uint32_t prefix = 0, pmask = 0;
  uint64_t above_c = 0, above_m = 0;
  double target = 0;  // mass mode, warp 0
  for (int shift = 24; shift >= 0; shift -= 8) {
    const int par = sh.pass & 1;
    for (int b = lane; b < kSelectBins; b += 32) {
      hc[warp * kSelectBins + b] = 0;
      if constexpr (Mass) hm[warp * kSelectBins + b] = 0;
    }
    __syncwarp();
    for (int j = tid; j < sl.cnt; j += kSelectThreads) {
      const uint32_t hi = sl.vals[j];
      if (hi == 0 || (hi & pmask) != prefix || sl.key(hi, j) < lower) continue;
      const uint32_t d = (hi >> shift) & 255u;
      atomicAdd(hc + warp * kSelectBins + d, 1u);
      if constexpr (Mass)
        atomicAdd(reinterpret_cast<unsigned long long*>(hm + warp * kSelectBins + d),
                  static_cast<unsigned long long>(sampling::mass(sampling::key_value(hi), lmax, t)));
    }
    __syncthreads();
    if (tid < kSelectBins) {
      uint32_t c = 0;
      uint64_t m = 0;
      for (int w = 0; w < kSelectWarps; ++w) {
        c += hc[w * kSelectBins + tid];
        if constexpr (Mass) m += hm[w * kSelectBins + tid];
      }
      sh.tot_c[par][tid] = c;
      sh.tot_m[par][tid] = m;
    }
    cluster.sync();  // every rank's totals of this pass are written
    if (tid < kSelectBins) {
      uint32_t c = 0;
      uint64_t m = 0;
      for (unsigned q = 0; q < sl.ranks; ++q) {
        const SelectShared* o = cluster.map_shared_rank(&sh, q);
        c += o->tot_c[par][tid];
        m += o->tot_m[par][tid];
      }
      sh.all_c[tid] = c;
      sh.all_m[tid] = m;
    }
    __syncthreads();
    if (tid == 0) ++sh.pass;
    if (warp == 0) {
      // Lane j holds bins 255 - 8j down to 248 - 8j: descending keys.
      uint64_t lc = 0, lm = 0;
      for (int q = 0; q < 8; ++q) {
        lc += sh.all_c[255 - 8 * lane - q];
        lm += sh.all_m[255 - 8 * lane - q];
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
          if (reached(c + sh.all_c[b], m + sh.all_m[b])) {
            sh.digit = static_cast<uint32_t>(b);
            sh.above_c = c;
            sh.above_m = m;
            sh.bin_c = sh.all_c[b];
            break;
          }
          c += sh.all_c[b];
          m += sh.all_m[b];
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
  const uint64_t r = sh.r;
  if (r == sh.bin_c) return max(lower, static_cast<uint64_t>(prefix) << 32);  // all of them
  // The r-th smallest id of the boundary value: the slices lie in rank
  // order, and each thread takes a contiguous range of its block's.
  const int par = sh.pass & 1;
  const int chunk = (sl.cnt + kSelectThreads - 1) / kSelectThreads, lo = tid * chunk, hi = min(sl.cnt, lo + chunk);
  auto boundary = [&](int j) { return sl.vals[j] == prefix && sl.key(prefix, j) >= lower; };
  uint64_t cnt = 0;
  for (int j = lo; j < hi; ++j) cnt += boundary(j);
  const uint64_t before_thread = select_block_exclusive(cnt, sh);
  if (tid == kSelectThreads - 1) sh.part[par][2] = before_thread + cnt;
  if (tid == 0) sh.found[par] = 0;
  cluster.sync();
  uint64_t before_rank = 0;
  for (unsigned q = 0; q < sl.rank; ++q) before_rank += cluster.map_shared_rank(&sh, q)->part[par][2];
  const uint64_t before = before_rank + before_thread;
  if (before < r && r <= before + cnt) {
    uint64_t seen = before;
    for (int j = lo; j < hi; ++j)
      if (boundary(j) && ++seen == r) {
        sh.found[par] = sl.key(prefix, j);
        break;
      }
  }
  cluster.sync();
  uint64_t k = 0;
  for (unsigned q = 0; q < sl.ranks; ++q) k = max(k, cluster.map_shared_rank(&sh, q)->found[par]);
  if (tid == 0) ++sh.pass;
  __syncthreads();
  return k;
#else
  return 0;
#endif
}

// Top-k / top-p over logits 0 .. n-1, after the slots `keys` took the score
// keys of every id (the draw with no filter). One cluster of select_ranks(n)
// blocks (launched with that cluster dimension), block r holding logits
// r·kSelectSlice onwards.
//
// The check: the slots' draw d is the filtered draw too wherever d is kept,
// since the draw is the largest score over the kept ids. Top-k keeps d iff
// fewer than k keys lie above d's; top-p iff the mass of the keys above d's
// stays below top_p of the mass of top-k's set (nibble/sampler.h: the kept
// prefix is the shortest that reaches it). With both filters that set's mass
// is not known before a select; it lies between the mass down to d's key and
// the whole mass, so the check decides only where both bounds agree. Where
// it holds, st->checked = 1 and the slots stand; where it does not (or
// cannot decide), st->checked = 0, st->lowest the least key kept, and the
// slots cleared for sample_keys_kernel's filtered pass.
__global__ void __launch_bounds__(kSelectThreads, 1)
    sample_select_kernel(const float* __restrict__ l, int64_t n, SampleArgs a, unsigned long long* keys,
                         SampleState* st) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // clusters: launched on sm_90 and later only (sample_select_supported)
  namespace cg = cooperative_groups;
  extern __shared__ uint64_t select_smem[];
  __shared__ SelectShared sh;
  const cg::cluster_group cluster = cg::this_cluster();
  uint64_t* hm = select_smem;
  auto* hc = reinterpret_cast<uint32_t*>(select_smem + kSelectWarps * kSelectBins);
  uint32_t* vals = hc + kSelectWarps * kSelectBins;
  SelectSlice sl;
  sl.vals = vals;
  sl.rank = cluster.block_rank();
  sl.ranks = cluster.num_blocks();
  sl.base = static_cast<int64_t>(sl.rank) * kSelectSlice;
  const int64_t left = n - sl.base;
  sl.cnt = left <= 0 ? 0 : static_cast<int>(left < kSelectSlice ? left : kSelectSlice);
  if (threadIdx.x == 0) sh.pass = 0;
  pdl_prologue();
  uint64_t vmax = 0, valid = 0;
  for (int j = threadIdx.x; j < sl.cnt; j += kSelectThreads) {
    const auto hi = static_cast<uint32_t>(sampling::key(l[sl.base + j], sl.base + j) >> 32);  // 0: NaN
    vals[j] = hi;
    vmax = max(vmax, static_cast<uint64_t>(hi));
    valid += hi != 0;
  }
  // The unfiltered draw's key: the slots' largest (every block reads them).
  const uint64_t drawn = select_block_max(threadIdx.x < GemvFusion::kArgmaxKeys ? keys[threadIdx.x] : 0ull, sh);
  vmax = select_block_max(vmax, sh);
  valid = select_block_sum(valid, sh);
  if (threadIdx.x == 0) {
    sh.part[0][0] = vmax;
    sh.part[0][1] = valid;
  }
  cluster.sync();
  for (unsigned q = 0; q < sl.ranks; ++q) {
    const SelectShared* o = cluster.map_shared_rank(&sh, q);
    if (q == 0) vmax = valid = 0;
    vmax = max(vmax, o->part[0][0]);
    valid += o->part[0][1];
  }
  const bool top_k = a.c.top_k > 0 && static_cast<uint64_t>(a.c.top_k) < valid, top_p = a.c.top_p < 1.0f;
  const float lmax = sampling::key_value(static_cast<uint32_t>(vmax)), t = a.c.temperature;
  // valid == 0: every logit NaN, no key in the slots, the draw is id 0 (as the CPU's).
  bool checked = valid == 0;
  if (!checked && drawn != 0) {
    const int64_t id = sampling::key_row(drawn);
    const uint64_t kd = sampling::key(l[id], id);  // the drawn id's own key
    uint64_t above = 0, m_above = 0, m_all = 0;
    for (int j = threadIdx.x; j < sl.cnt; j += kSelectThreads) {
      const uint32_t hi = vals[j];
      if (hi == 0) continue;
      const uint64_t m = top_p ? sampling::mass(sampling::key_value(hi), lmax, t) : 0;
      if (sl.key(hi, j) > kd) ++above, m_above += m;
      m_all += m;
    }
    above = select_block_sum(above, sh);
    m_above = select_block_sum(m_above, sh);
    m_all = select_block_sum(m_all, sh);
    if (threadIdx.x == 0) sh.check[0] = above, sh.check[1] = m_above, sh.check[2] = m_all;
    cluster.sync();
    above = m_above = m_all = 0;
    for (unsigned q = 0; q < sl.ranks; ++q) {
      const SelectShared* o = cluster.map_shared_rank(&sh, q);
      above += o->check[0];
      m_above += o->check[1];
      m_all += o->check[2];
    }
    const uint64_t m_low =
        top_p ? m_above + sampling::mass(sampling::key_value(static_cast<uint32_t>(kd >> 32)), lmax, t) : 0;
    checked = sampling::draw_kept(a.c.top_k, a.c.top_p, valid, above, m_above, m_low, m_all);
  }
  if (sl.rank == 0 && threadIdx.x == 0) st->checked = checked ? 1u : 0u;
  if (!checked) {
    uint64_t lowest = 0;
    if (top_k)
      lowest = select_lowest<false>(sl, 0, 0.0f, t, static_cast<uint64_t>(a.c.top_k), 1.0f, hm, hc, sh);
    if (top_p) lowest = max(lowest, select_lowest<true>(sl, lowest, lmax, t, 0, a.c.top_p, hm, hc, sh));
    if (sl.rank == 0) {
      if (threadIdx.x == 0) st->lowest = lowest;
      // Every rank read the slots before the first cluster barrier.
      if (threadIdx.x < GemvFusion::kArgmaxKeys) keys[threadIdx.x] = 0;
    }
  }
  cluster.sync();  // no block leaves while another may read its shared memory
#endif
}

}  // namespace
}  // namespace nibble::cuda
