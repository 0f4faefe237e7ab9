// Pieces shared by the kernels for M >= 2 tokens (w4a16_small_m.cu,
// w4a16_wgmma.cu): their grid's dimensions, a warp's weight stream into its
// ring, and the exact path's per-group arithmetic.
#pragma once
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_gemv.h"
#include "nibble/cuda.h"

#include <tuple>
#include <utility>

namespace nibble::cuda::w4a16 {

// The most clusters of cx × cy blocks (`threads` each, `smem` bytes of dynamic
// shared memory) of `kernel` the current device holds at once
// (cudaOccupancyMaxActiveClusters), asked once per device and configuration.
template <auto kernel>
int max_active_clusters(int threads, size_t smem, unsigned cx, unsigned cy = 1) {
  static Memo<std::tuple<int, int, size_t, unsigned, unsigned>, int> known;
  int dev = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&dev));
  return known.get(std::make_tuple(dev, threads, smem, cx, cy), [&] {
    cudaLaunchAttribute attr = cluster_attribute(cx, cy);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cx, cy);
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    int n = 0;
    NIBBLE_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
    return n;
  });
}

// The grid of a small-M kernel: one block per R row tiles (blocks), groups of CPG
// chunks of 64 inputs (groups_padded: scale/min entries per tile).
struct SmallMGrid {
  int64_t tiles, chunks, groups, groups_padded, blocks;
  SmallMGrid(int64_t rows, int64_t cols, int group_size, int cpg, int r)
      : tiles((rows + kTileRows - 1) / kTileRows),
        chunks((cols + kChunk - 1) / kChunk),
        groups((chunks + cpg - 1) / cpg),
        groups_padded((chunks * kChunk + group_size - 1) / group_size),
        blocks((tiles + r - 1) / r) {}
  SmallMGrid(const DeviceLinear& w, int cpg, int r) : SmallMGrid(w.rows, w.cols, w.group_size, cpg, r) {}
};

// A warp's stream of weight groups into its ring: codes and scale/min pairs
// of group gi of the block's R tiles (tile r at + r·tile stride; a tile past
// the matrix reads the last one, and its outputs are not stored), then gi +=
// step. Lane slots (see w4a16_gemv.cu): stage st, tile r, chunk u of the codes
// at rq + ((st·R + r)·CPG + u)·512, its scale/min entry at rm + (st·R + r)·256.
// GPC = 2 (groups of 32, CPG = 1): a "group" of the stream is a chunk of 64
// inputs holding two groups, and each lane copies the scale/min entry of its
// own one: lanes of tig 0 and 1 hold the chunk's inputs 0..31 (the layout's
// input 16·tig + …), tig 2 and 3 inputs 32..63, so a lane's nibbles all belong
// to group 2·gi + tig / 2 (the integer GEMV's lane per group, session 79).
template <int R, int CPG, int GPC = 1>
struct WeightStream {
  static_assert(GPC == 1 || (GPC == 2 && CPG == 1), "two groups per chunk: groups of 32, one chunk per step");
  const uint4* cp;
  const uint2* mp;
  int cp_tile[R], mp_tile[R];
  int64_t cp_step, mp_step;
  int gi, step;
  __device__ __forceinline__ WeightStream(const uint4* codes, const uint2* meta, int64_t tile0, int tiles, int chunks,
                                          int groups_padded, int first, int step_) {
    const int lane = threadIdx.x & 31;
    cp = codes + (tile0 * chunks + first * CPG) * 32 + lane;
    mp = meta + (tile0 * groups_padded + first * GPC + (GPC == 2 ? (lane >> 1) & 1 : 0)) * 8 + (lane >> 2);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int t = static_cast<int>(tile0 + r < tiles ? r : tiles - 1 - tile0);
      cp_tile[r] = t * chunks * 32;
      mp_tile[r] = t * groups_padded * 8;
    }
    cp_step = static_cast<int64_t>(step_) * CPG * 32;
    mp_step = static_cast<int64_t>(step_) * GPC * 8;
    gi = first;
    step = step_;
  }
  template <int st>
  __device__ __forceinline__ void issue(uint32_t rq, uint32_t rm, int groups, int chunks) {
    if (gi < groups) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < CPG; ++u)
          if (gi * CPG + u < chunks) cp_async16_s(rq + ((st * R + r) * CPG + u) * 512, cp + cp_tile[r] + u * 32);
        cp_async8_s(rm + (st * R + r) * 256, mp + mp_tile[r]);
      }
    }
    cp += cp_step;
    mp += mp_step;
    gi += step;
  }
};

template <int R, int NT>
__device__ __forceinline__ void zero_acc(float (&a)[R][NT][4]) {
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n) a[r][n][0] = a[r][n][1] = a[r][n][2] = a[r][n][3] = 0.0f;
}

// One chunk of a group on the exact path: the codes q[r] of the warp's R tiles
// (offset codes 128 + c, one and-or per register) times the activations
// xv[n][h] (16 inputs per lane and token tile), all R·NT accumulator chains
// issued together. A chunk past K has zero activations, so its codes, stale or
// not (each a finite 128 + c), add nothing.
template <typename T, int R, int NT>
__device__ __forceinline__ void exact_chunk_mmas(float (&acc)[R][NT][4], const uint4 (&q)[R],
                                                 const uint4 (&xv)[NT][2]) {
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const uint32_t w = s == 0 ? q[r].x : s == 1 ? q[r].y : s == 2 ? q[r].z : q[r].w;
      uint32_t a[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if constexpr (ActTraits<T>::kHiInPlace)  // 1024 + 16·c for rows gid + 8 (registers 1, 3)
          a[j] = and_or(j < 2 ? w : w >> 8, (j & 1) ? 0x00F000F0u : 0x000F000Fu, ActTraits<T>::kMagic);
        else
          a[j] = and_or(w >> (4 * j), 0x000F000Fu, ActTraits<T>::kMagic);
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const uint4& x2 = xv[n][s >> 1];
        mma_16816<T>(acc[r][n], a, (s & 1) ? x2.z : x2.x, (s & 1) ? x2.w : x2.y);
      }
    }
}

// Σx of one chunk's activations xv by mmas with all-ones operands.
//  * One token tile: x is the B operand and the weights are ones, so every row
//    of the product is the column sums: sx[0][0] and [1] are the sums of this
//    lane's tokens 2tig and 2tig + 1, what exact_combine's sb wants.
//  * Two token tiles (and tiles 0 and 1 of three, the third as one tile
//    above with its sums in sx[2]; session 45): x is the A operand (16
//    tokens × 16 inputs) and ones the B operand, so every column of the product is the row sums, one mma per
//    k-step for all 16 tokens instead of one per token tile. The B fragments
//    of the two tiles are that A fragment as they are: a0 and a2 (token gid,
//    inputs 2tig.. and 2tig + 8..) are tile 0's b0 and b1, a1 and a3 (token
//    gid + 8) tile 1's. sx[0][0] holds token gid's sum and sx[0][2] token
//    gid + 8's; ones_sums moves them to the lanes exact_combine wants them in.
//    Half the mmas of one per token tile; measured on the H200 (session 41,
//    docs/results/s41/, alternated with the code before in three device
//    calls): q|k|v at 16 tokens 8.47-8.52 -> 8.38-8.45 us, o 6.19-6.21 ->
//    6.11-6.16, down 13.06-13.15 -> 13.00-13.11; the fused 8B stack moved
//    within its noise. Leaving Σx out altogether (a probe) saved about 1 us
//    on q|k|v, so what it costs is not its mma count alone.
template <typename T, int NT>
__device__ __forceinline__ void ones_chunk_mmas(float (&sx)[NT][4], const uint4 (&xv)[NT][2]) {
  const uint32_t one[4] = {ActTraits<T>::kOne, ActTraits<T>::kOne, ActTraits<T>::kOne, ActTraits<T>::kOne};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {  // token tiles 2p and 2p + 1 as one A operand, sums into sx[p]
      const uint4 &t0 = xv[2 * p][s >> 1], &t1 = xv[2 * p + 1][s >> 1];
      const uint32_t a[4] = {(s & 1) ? t0.z : t0.x, (s & 1) ? t1.z : t1.x, (s & 1) ? t0.w : t0.y,
                             (s & 1) ? t1.w : t1.y};
      mma_16816<T>(sx[p], a, one[0], one[1]);
    }
    if constexpr (NT % 2 == 1) {  // the last, unpaired tile as the B operand, sums into sx[NT - 1]
      const uint4& x2 = xv[NT - 1][s >> 1];
      mma_16816<T>(sx[NT - 1], one, (s & 1) ? x2.z : x2.x, (s & 1) ? x2.w : x2.y);
    }
  }
}

// The Σx pairs exact_combine wants (tokens n·8 + 2tig and + 1), from
// ones_chunk_mmas' accumulators. A pair of token tiles 2p, 2p + 1: token
// 16p + t's sum is in the lanes of gid t mod 8, element 0 (t < 8) or 2 of
// sx[p], so four shuffles gather them; an unpaired last tile's are in place.
template <int NT>
struct OnesSums {
  float2 v[NT];
};
template <int NT>
__device__ __forceinline__ OnesSums<NT> ones_sums(const float (&sx)[NT][4]) {
  OnesSums<NT> r;
  const int src = 8 * (threadIdx.x & 3);  // the lanes of gid 2tig; + 4: of gid 2tig + 1
#pragma unroll
  for (int p = 0; p < NT / 2; ++p) {
    r.v[2 * p] = make_float2(__shfl_sync(0xFFFFFFFFu, sx[p][0], src), __shfl_sync(0xFFFFFFFFu, sx[p][0], src + 4));
    r.v[2 * p + 1] =
        make_float2(__shfl_sync(0xFFFFFFFFu, sx[p][2], src), __shfl_sync(0xFFFFFFFFu, sx[p][2], src + 4));
  }
  if constexpr (NT % 2 == 1) r.v[NT - 1] = make_float2(sx[NT - 1][0], sx[NT - 1][1]);
  return r;
}

// A group's exact-path sums into the outputs: out += s·acc + (m − 128·s)·Σx
// (fp16: 1024), sm[r] the (scale, min) pairs of tile r's rows gid and gid + 8,
// sb[n] Σx of tokens n·8 + 2tig and + 1. acc[r][n][j]: row gid + 8·(j / 2),
// token n·8 + 2tig + j % 2.
template <typename T, int R, int NT>
__device__ __forceinline__ void exact_combine(float (&out)[R][NT][4], const float (&acc)[R][NT][4],
                                              const uint2 (&sm)[R], const float2 (&sb)[NT]) {
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s_lo = bf16_bits_to_float(sm[r].x & 0xFFFFu), m_lo = bf16_bits_to_float(sm[r].x >> 16);
    const float s_hi_in = bf16_bits_to_float(sm[r].y & 0xFFFFu), m_hi = bf16_bits_to_float(sm[r].y >> 16);
    // Rows gid + 8 in fp16 summed 1024 + 16·c: Σc·x = acc / 16 − 64·Σx.
    const float s_hi = ActTraits<T>::kHiInPlace ? s_hi_in * 0.0625f : s_hi_in;
    const float o_lo = fmaf(-ActTraits<T>::kOffset, s_lo, m_lo), o_hi = fmaf(-ActTraits<T>::kOffset, s_hi, m_hi);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      out[r][n][0] = fmaf(s_lo, acc[r][n][0], fmaf(o_lo, sb[n].x, out[r][n][0]));
      out[r][n][1] = fmaf(s_lo, acc[r][n][1], fmaf(o_lo, sb[n].y, out[r][n][1]));
      out[r][n][2] = fmaf(s_hi, acc[r][n][2], fmaf(o_hi, sb[n].x, out[r][n][2]));
      out[r][n][3] = fmaf(s_hi, acc[r][n][3], fmaf(o_hi, sb[n].y, out[r][n][3]));
    }
  }
}

// f(std::integral_constant<int, i>{}) for i = 0 .. N − 1.
template <int... I, typename F>
__device__ __forceinline__ void static_for_impl(F&& f, std::integer_sequence<int, I...>) {
  (f(std::integral_constant<int, I>{}), ...);
}
template <int N, typename F>
__device__ __forceinline__ void static_for(F&& f) {
  static_for_impl(f, std::make_integer_sequence<int, N>{});
}
// A ring loop: f(std::integral_constant<int, st>{}, i) for every iteration
// i + st < iters, unrolled by S so that each iteration's ring stage st is a
// constant.
template <int S, typename F>
__device__ __forceinline__ void for_ring_stages(int iters, F&& f) {
  for (int i = 0; i < iters; i += S) {
    bool done = false;
    static_for<S>([&](auto stage) {
      if (done || i + decltype(stage)::value >= iters) {
        done = true;
        return;
      }
      f(stage, i);
    });
  }
}

}  // namespace nibble::cuda::w4a16
