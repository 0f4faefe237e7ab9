// Sampled decode on the device (src/backend/cuda/forward.cu; included there
// after forward_kernels.cuh): nibble/sampler.h's draw, bit for bit the CPU's
// (the arithmetic is nibble/sample_math.h's, shared with the host).
//
// A step at temperature > 0 takes the score keys of every logit (l / T plus
// its Gumbel variable, nibble/sampler.h) into GemvFusion::kArgmaxKeys slots:
// where it can, the head GEMV does it (GemvFusion::argmax_*, HeadDraw), else
// sample_keys_kernel. The largest key over the slots is then the draw over
// every id. With top-k or top-p, sample_filter_kernel first checks whether
// that id is kept: if so (the usual case) the slots stand; if not, it finds
// the least key kept, clears the slots and scores the kept logits into them.
// argmax_keys_kernel (the greedy head's) reads the slots
// back to zero and feeds the next step. The draw number comes from the
// step's position on the device, so steps need nothing from the host.
#pragma once

#include <algorithm>
#include <cstdint>

#include "backend/cuda/forward_kernels.cuh"
#include "backend/cuda/sample_filter.h"
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

// The warp's largest key into slot (global warp) mod kArgmaxKeys by a relaxed
// atomic max (none where it is 0: no key).
__device__ inline void warp_key_to_slot(uint64_t best, unsigned long long* keys) {
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xFFFFFFFFu, best, o));
  const unsigned warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  if ((threadIdx.x & 31) == 0 && best != 0)
    asm volatile("red.relaxed.gpu.global.max.u64 [%0], %1;\n" ::"l"(keys + warp % GemvFusion::kArgmaxKeys),
                 "l"(static_cast<unsigned long long>(best))
                 : "memory");
}

constexpr int kSampleKeysThreads = 256, kSampleKeysBlocks = 128;

// Every logit's score (l / T plus its Gumbel variable) as a key; each warp's
// largest into slot (global warp) mod kArgmaxKeys by a relaxed atomic max.
// Below `limit`, not NaN.
__global__ void __launch_bounds__(kSampleKeysThreads)
    sample_keys_kernel(const float* __restrict__ l, int64_t limit, SampleArgs a, const int32_t* step,
                       unsigned long long* keys) {
  pdl_prologue();
  const uint64_t draw = a.draw_base + static_cast<uint64_t>(static_cast<int64_t>(step[1]));
  uint64_t best = 0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < limit;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float v = l[i];
    const uint64_t k = sampling::key(v, i);
    if (k == 0) continue;
    best = max(best, sampling::key(sampling::score(v, a.c.temperature, a.c.seed, draw, i), i));
  }
  warp_key_to_slot(best, keys);
}

// Top-k / top-p: one kernel of `blocks` blocks (at most one per SM, launched
// cooperatively, so all resident at once or the launch fails), block b holding
// logits [b·per, (b+1)·per) as the value halves of their keys in shared memory.
// The blocks meet at grid barriers in device memory (FilterGrid): partial
// results per block, read back in block order, and each radix pass's histogram
// summed by atomics (integer counts and masses, so exact in any order). Any
// GPU: no clusters.
struct FilterHist {
  unsigned long long m[kFilterBins];
  uint32_t c[kFilterBins];
};
// The blocks' meeting place, zero to start with (and left so: the barrier's
// count returns to 0; every histogram is zeroed in the round before its use).
struct FilterGrid {
  // The barrier: arrivals and generation, on lines of their own (the blocks
  // poll the generation while others' arrivals land).
  alignas(128) unsigned count;
  alignas(128) unsigned gen;
  unsigned long long part[2][kFilterMaxBlocks][3];  // per block, by round parity
  FilterHist hist[3];  // round r sums into hist[r % 3]
};

// The draw's state in device memory, zero to start with (the filter's grid
// apart: FilterGrid, allocated where top-k / top-p first run, so that greedy
// and temperature-only runs allocate what they did before it).
struct SampleState {
  unsigned long long keys[GemvFusion::kArgmaxKeys];  // sample_keys_kernel's slots: zero between draws
  HeadDraw feed;  // the limit and kSample: what argmax_keys_kernel reads
  uint32_t checked;  // sample_filter_kernel: 1 where the slots' draw is kept as it is, 0 where it selected
  uint32_t pad;
};

struct FilterShared {
  uint64_t red[kFilterWarps][3];
  uint32_t hc[kFilterBins];
  uint64_t hm[kFilterBins];
  uint32_t all_c[kFilterBins];
  uint64_t all_m[kFilterBins];
  uint32_t digit;
  uint64_t above_c, above_m, bin_c, r, found;
};

// Three block reductions at one barrier pair: v[i] becomes the block's
// largest (Max_i) or its sum.
template <bool Max0, bool Max1, bool Max2>
__device__ inline void filter_block_reduce3(uint64_t (&v)[3], FilterShared& sh) {
  constexpr bool kMax[3] = {Max0, Max1, Max2};
  for (int o = 16; o > 0; o >>= 1)
#pragma unroll
    for (int i = 0; i < 3; ++i) {
      const uint64_t t = __shfl_xor_sync(0xFFFFFFFFu, v[i], o);
      v[i] = kMax[i] ? max(v[i], t) : v[i] + t;
    }
  if ((threadIdx.x & 31) == 0)
#pragma unroll
    for (int i = 0; i < 3; ++i) sh.red[threadIdx.x >> 5][i] = v[i];
  __syncthreads();
#pragma unroll
  for (int i = 0; i < 3; ++i) v[i] = 0;
  for (int w = 0; w < kFilterWarps; ++w)
#pragma unroll
    for (int i = 0; i < 3; ++i) v[i] = kMax[i] ? max(v[i], sh.red[w][i]) : v[i] + sh.red[w][i];
  __syncthreads();
}

// The block's exclusive prefix sum of v, in thread order.
__device__ inline uint64_t filter_block_exclusive(uint64_t v, FilterShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t inc = v;
  for (int o = 1; o < 32; o <<= 1) {
    const uint64_t t = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += t;
  }
  if (lane == 31) sh.red[warp][0] = inc;
  __syncthreads();
  uint64_t before = 0;
  for (int w = 0; w < warp; ++w) before += sh.red[w][0];
  __syncthreads();
  return before + inc - v;
}

// Mass of logit `v` against `lmax` at t (sampling::mass), with the values at
// least 31·t below lmax (`cut` = -31·t: their quotient is below -30, where
// exp_mass gives 0) skipped before the division: most of a real vocabulary.
__device__ inline uint64_t filter_mass(float v, float lmax, float t, float cut) {
  return sampling::sub(v, lmax) < cut ? 0 : sampling::mass(v, lmax, t);
}

// The kernel's view of its grid: this block's slice [base, base + cnt) as
// value halves (0: NaN) in `vals`, and the rounds of partial results.
struct FilterSlice {
  const uint32_t* vals;
  int64_t base;
  int cnt;
  unsigned blocks;
  FilterGrid* g;
  unsigned round;  // grid barriers passed in this launch
  // The key of the slice's j-th value half (hi != 0).
  __device__ uint64_t key(uint32_t hi, int j) const {
    return (static_cast<uint64_t>(hi) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(base + j));
  }
  // This round's partial results and histogram.
  __device__ unsigned long long* part() const { return g->part[round & 1][blockIdx.x]; }
  __device__ FilterHist* hist() const { return &g->hist[round % 3]; }
  // The grid barrier that ends the round: the block's writes before it are
  // seen by every block after it. Block 0 first zeroes the next round's
  // histogram (the round before last read it). Returns the round's parts.
  __device__ const unsigned long long (*sync())[3] {
    if (blockIdx.x == 0) {
      FilterHist* next = &g->hist[(round + 1) % 3];
      for (int i = threadIdx.x; i < kFilterBins; i += kFilterThreads) next->m[i] = 0, next->c[i] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      unsigned gen;
      asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(gen) : "l"(&g->gen) : "memory");
      if (atomicAdd(&g->count, 1u) == blocks - 1) {
        atomicExch(&g->count, 0u);  // nobody arrives again before the generation moves
        asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(&g->gen), "r"(gen + 1) : "memory");
      } else {
        unsigned now;
        do asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(now) : "l"(&g->gen) : "memory");
        while (now == gen);
      }
      __threadfence();
    }
    __syncthreads();
    return g->part[(round++) & 1];
  }
};

// The blocks' partial results of the round that just ended, reduced in the
// block: thread q < blocks loads block q's (kMax: largest, else sum).
template <bool Max0, bool Max1, bool Max2>
__device__ inline void filter_gather(const unsigned long long (*parts)[3], unsigned blocks, uint64_t (&v)[3],
                                     FilterShared& sh) {
#pragma unroll
  for (int i = 0; i < 3; ++i) v[i] = threadIdx.x < blocks ? __ldcg(&parts[threadIdx.x][i]) : 0ull;
  filter_block_reduce3<Max0, Max1, Max2>(v, sh);
}

// The least key the kept set holds, for the kept ids among those with key
// >= `lower`: count mode (Mass false) the `need` largest; mass mode the
// shortest prefix in descending key order whose mass (against lmax at t)
// reaches top_p of theirs. Four passes of an 8-bit digit over the value
// halves (each block's histogram, summed over the grid), then, where the
// boundary value's ids are kept only in part, one pass for the boundary id.
// Every thread of every block calls it and gets the same key.
template <bool Mass>
__device__ uint64_t filter_lowest(FilterSlice& sl, uint64_t lower, float lmax, float t, uint64_t need, float top_p,
                                  FilterShared& sh) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const float cut = sampling::mul(-31.0f, t);
  uint32_t prefix = 0, pmask = 0;
  uint64_t above_c = 0, above_m = 0;
  double target = 0;  // mass mode, warp 0
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < kFilterBins; b += kFilterThreads) sh.hc[b] = 0, sh.hm[b] = 0;
    __syncthreads();
    for (int j = tid; j < sl.cnt; j += kFilterThreads) {
      const uint32_t hi = sl.vals[j];
      if (hi == 0 || (hi & pmask) != prefix || sl.key(hi, j) < lower) continue;
      const uint32_t d = (hi >> shift) & 255u;
      atomicAdd(&sh.hc[d], 1u);
      if constexpr (Mass)
        atomicAdd(reinterpret_cast<unsigned long long*>(&sh.hm[d]),
                  static_cast<unsigned long long>(filter_mass(sampling::key_value(hi), lmax, t, cut)));
    }
    __syncthreads();
    FilterHist* h = sl.hist();
    for (int b = tid; b < kFilterBins; b += kFilterThreads) {
      if (sh.hc[b] != 0) atomicAdd(&h->c[b], sh.hc[b]);
      if (Mass && sh.hm[b] != 0) atomicAdd(&h->m[b], static_cast<unsigned long long>(sh.hm[b]));
    }
    sl.sync();
    for (int b = tid; b < kFilterBins; b += kFilterThreads) {
      sh.all_c[b] = __ldcg(&h->c[b]);
      sh.all_m[b] = Mass ? __ldcg(&h->m[b]) : 0ull;
    }
    __syncthreads();
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
    sh.found = 0;
  }
  __syncthreads();
  const uint64_t r = sh.r;
  if (r == sh.bin_c) return max(lower, static_cast<uint64_t>(prefix) << 32);  // all of them
  // The r-th smallest id of the boundary value: the slices lie in block
  // order, and each thread takes a contiguous range of its block's.
  const int chunk = (sl.cnt + kFilterThreads - 1) / kFilterThreads, lo = tid * chunk, hi = min(sl.cnt, lo + chunk);
  auto boundary = [&](int j) { return sl.vals[j] == prefix && sl.key(prefix, j) >= lower; };
  uint64_t cnt = 0;
  for (int j = lo; j < hi; ++j) cnt += boundary(j);
  const uint64_t before_thread = filter_block_exclusive(cnt, sh);
  if (tid == kFilterThreads - 1) sl.part()[0] = before_thread + cnt;
  const auto* counts = sl.sync();
  uint64_t v[3] = {tid < blockIdx.x ? __ldcg(&counts[tid][0]) : 0ull, 0, 0};  // the blocks before this one
  filter_block_reduce3<false, false, false>(v, sh);
  const uint64_t before = v[0] + before_thread;
  if (before < r && r <= before + cnt) {
    uint64_t seen = before;
    for (int j = lo; j < hi; ++j)
      if (boundary(j) && ++seen == r) {
        sh.found = sl.key(prefix, j);
        break;
      }
  }
  __syncthreads();
  if (tid == 0) sl.part()[0] = sh.found;
  uint64_t k[3];
  filter_gather<true, false, false>(sl.sync(), sl.blocks, k, sh);
  return k[0];
}

// Top-k / top-p over logits 0 .. n-1, after the slots `keys` took the score
// keys of every id (the draw with no filter); filter_blocks(n) blocks of
// `per` logits each (the last may hold fewer).
//
// The check: the slots' draw d is the filtered draw too wherever d is kept,
// since the draw is the largest score over the kept ids. Top-k keeps d iff
// fewer than k keys lie above d's; top-p iff the mass of the keys above d's
// stays below top_p of the mass of top-k's set (nibble/sampler.h: the kept
// prefix is the shortest that reaches it). With both filters that set's mass
// is not known before a select; it lies between the mass down to d's key and
// the whole mass, so the check decides only where both bounds agree. Where
// it holds, st->checked = 1 and the slots stand; where it does not (or
// cannot decide), st->checked = 0: the select finds the least key kept, block
// 0 clears the slots, and every block puts its kept logits' score keys into
// them, as sample_keys_kernel does.
__global__ void __launch_bounds__(kFilterThreads, 1)
    sample_filter_kernel(const float* __restrict__ l, int64_t n, int per, SampleArgs a, const int32_t* step,
                         unsigned long long* keys, SampleState* st, FilterGrid* grid) {
  __shared__ uint32_t vals[kFilterSlice];
  __shared__ FilterShared sh;
  const int tid = threadIdx.x;
  FilterSlice sl;
  sl.vals = vals;
  sl.base = static_cast<int64_t>(blockIdx.x) * per;
  sl.cnt = static_cast<int>(n - sl.base < 0 ? 0 : n - sl.base < per ? n - sl.base : per);
  sl.blocks = gridDim.x;
  sl.g = grid;
  sl.round = 0;
  pdl_prologue();
  // Every load at once: the slots (the unfiltered draw's key is their
  // largest; every block reads them) and this thread's logits.
  uint64_t r3[3] = {tid < GemvFusion::kArgmaxKeys ? keys[tid] : 0ull, 0, 0};
  // Thread tid's logits are tid·kFilterPer onwards: two 16-byte loads (per
  // is a multiple of kFilterPer, so aligned with l), both in flight at once.
  float v[kFilterPer];
  const int j0 = tid * kFilterPer;
  const float* src = l + sl.base + j0;
  if (j0 + kFilterPer <= sl.cnt && (reinterpret_cast<uintptr_t>(src) & 15) == 0) {
    const float4 a0 = __ldg(reinterpret_cast<const float4*>(src)), a1 = __ldg(reinterpret_cast<const float4*>(src) + 1);
    v[0] = a0.x, v[1] = a0.y, v[2] = a0.z, v[3] = a0.w, v[4] = a1.x, v[5] = a1.y, v[6] = a1.z, v[7] = a1.w;
  } else {
#pragma unroll
    for (int i = 0; i < kFilterPer; ++i) v[i] = j0 + i < sl.cnt ? src[i] : __int_as_float(0x7FC00000);  // NaN: no key
  }
#pragma unroll
  for (int i = 0; i < kFilterPer; ++i) {
    const auto hi = static_cast<uint32_t>(sampling::key(v[i], 0) >> 32);  // 0: NaN
    if (j0 + i < sl.cnt) vals[j0 + i] = hi;
    r3[1] = max(r3[1], static_cast<uint64_t>(hi));
    r3[2] += hi != 0;
  }
  filter_block_reduce3<true, true, false>(r3, sh);
  const uint64_t drawn = r3[0];
  const float ld = drawn != 0 ? l[sampling::key_row(drawn)] : 0.0f;  // the drawn id's logit
  if (tid == 0) sl.part()[0] = r3[1], sl.part()[1] = r3[2];
  uint64_t g3[3];
  filter_gather<true, false, false>(sl.sync(), sl.blocks, g3, sh);
  const uint64_t vmax = g3[0], valid = g3[1];
  const bool top_k = a.c.top_k > 0 && static_cast<uint64_t>(a.c.top_k) < valid, top_p = a.c.top_p < 1.0f;
  const float lmax = sampling::key_value(static_cast<uint32_t>(vmax)), t = a.c.temperature;
  // valid == 0: every logit NaN, no key in the slots, the draw is id 0 (as the CPU's).
  bool checked = valid == 0;
  if (!checked && drawn != 0) {
    const uint64_t kd = sampling::key(ld, sampling::key_row(drawn));  // the drawn id's own key
    const float cut = sampling::mul(-31.0f, t);
    uint64_t c3[3] = {0, 0, 0};  // keys above the draw's, their mass, the whole mass
    for (int j = tid; j < sl.cnt; j += kFilterThreads) {
      const uint32_t hi = vals[j];
      if (hi == 0) continue;
      const uint64_t m = top_p ? filter_mass(sampling::key_value(hi), lmax, t, cut) : 0;
      if (sl.key(hi, j) > kd) ++c3[0], c3[1] += m;
      c3[2] += m;
    }
    filter_block_reduce3<false, false, false>(c3, sh);
    if (tid == 0) sl.part()[0] = c3[0], sl.part()[1] = c3[1], sl.part()[2] = c3[2];
    filter_gather<false, false, false>(sl.sync(), sl.blocks, c3, sh);
    const uint64_t m_low =
        top_p ? c3[1] + sampling::mass(sampling::key_value(static_cast<uint32_t>(kd >> 32)), lmax, t) : 0;
    checked = sampling::draw_kept(a.c.top_k, a.c.top_p, valid, c3[0], c3[1], m_low, c3[2]);
  }
  if (blockIdx.x == 0 && tid == 0) st->checked = checked ? 1u : 0u;
  if (checked) return;  // every block takes the same branch
  // Every block read the slots before the first grid barrier; the next one
  // (always one: sync below) orders this clearing before their new keys.
  if (blockIdx.x == 0 && tid < GemvFusion::kArgmaxKeys) keys[tid] = 0;
  uint64_t lowest = 0;
  if (top_k) lowest = filter_lowest<false>(sl, 0, 0.0f, t, static_cast<uint64_t>(a.c.top_k), 1.0f, sh);
  if (top_p) lowest = max(lowest, filter_lowest<true>(sl, lowest, lmax, t, 0, a.c.top_p, sh));
  if (!top_k && !top_p) sl.sync();
  // The kept logits' score keys, each warp's largest into slot (global warp)
  // mod kArgmaxKeys, as sample_keys_kernel.
  const uint64_t draw = a.draw_base + static_cast<uint64_t>(static_cast<int64_t>(step[1]));
  uint64_t best = 0;
  for (int j = tid; j < sl.cnt; j += kFilterThreads) {
    const uint32_t hi = vals[j];
    if (hi == 0 || sl.key(hi, j) < lowest) continue;
    const int64_t i = sl.base + j;
    best = max(best, sampling::key(sampling::score(sampling::key_value(hi), t, a.c.seed, draw, i), i));
  }
  warp_key_to_slot(best, keys);
}

}  // namespace
}  // namespace nibble::cuda
