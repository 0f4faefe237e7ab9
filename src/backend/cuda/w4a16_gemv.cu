// The single-token W4A16 GEMV with integer dot products.
//
// y = Ŵ·x for one token, Ŵ = int4_asym (code·scale + min per group of 32, 64
// or 128 inputs), x bf16 or fp16. Decode reads every weight byte once, so the
// kernel must spend few instructions per byte; the mma kernel (w4a16.cu)
// decodes each nibble to a 16-bit float and needs a second mma for Σx, about
// 75 warp instructions per 512 bytes. Here:
//
//  * A small kernel first writes x per group as 24-bit fixed point
//    x ≈ d·v, d a power of two with |v| < 2^22, v = 65536a + 256b + c in three
//    signed bytes ("planes"), plus Σx per group. A bf16 value whose exponent is
//    within 14 of its group's largest is represented exactly (fp16: 11); smaller
//    ones are rounded by at most 2^-22 of the group's largest |x|.
//  * The weights keep the w4a16_mma layout. A lane's 32-bit word holds 8
//    nibbles: w & 0x0F0F0F0F is 4 codes of row gid and w & 0xF0F0F0F0 is 16×
//    4 codes of row gid + 8 at the same inputs, so one AND per 4 weights gives
//    the u8 A fragment of mma.m16n8k32.u8.s8 (rows gid + 8 come out 16× and
//    are shifted back, exactly). The three planes are the mma's B columns 0..2
//    (groups of 32: 0..2 and 4..6 for a chunk's two groups).
//  * Per chunk of 16 rows × 64 inputs (512 bytes, one 16-byte load per lane):
//    8 ANDs and 2 integer mmas. Per group the int32 sums give
//    Σ x·(c·s + m) = s·d·(65536·A + 256·B + C) + m·Σx exactly up to fp32
//    rounding of the combination.
//  * The weight stream goes through a per-warp cp.async ring in shared memory
//    (one stage per group), as in the mma kernel; the warps of a block split K
//    by groups and meet in shared memory. Programmatic dependent launch: the
//    ring's first stages are in flight before the kernel waits for x.
#include <tuple>

#include "backend/cuda/check.h"
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_prep.cuh"
#include "backend/cuda/w4a16_gemv.h"
#include "backend/cuda/w4a16_gemv_math.cuh"
#include "nibble/sample_math.h"

#include <algorithm>

namespace nibble::cuda {

namespace {

using namespace w4a16;

template <typename T>
__device__ inline float load_act(const T* x, int k, int K) {
  if (k >= K) return 0.0f;
  if constexpr (std::is_same_v<T, __nv_bfloat16>)
    return __bfloat162float(x[k]);
  else if constexpr (std::is_same_v<T, __half>)
    return __half2float(x[k]);
  else
    return x[k];
}

// One warp per 128 inputs (two chunks); lane l holds inputs 4l .. 4l + 3.
template <typename T>
__global__ void __launch_bounds__(256) prep_x_kernel(const T* __restrict__ x, int K, void* __restrict__ prepared,
                                                     int group) {
  grid_dependents_launch();  // the GEMV may start streaming weights now
  const int lane = threadIdx.x & 31;
  const int w = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  if (w >= prep_warps(K)) return;
  grid_dependency_wait();  // x is the previous kernel's output; the previous GEMV may still read `prepared`
  const int k0 = w * kPrepInputs + 4 * lane;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = load_act(x, k0 + i, K);
  prep_warp_store(v, w, group, prepared, K);
}

// The work fused around the GEMV (GemvFusion), as the kernel takes it.
struct FuseArgs {
  const float* in_ss = nullptr;  // input side: outputs × 1 / rms (null: × 1)
  int in_parts = 0;
  float in_width = 0.0f, eps = 0.0f;
  int mode = 0;  // output side: kPlain (y), kResidual, kSwiglu
  int width = 0;  // outputs of the fused output side (rows, or rows / 2 for swiglu)
  float* residual = nullptr;
  const float* norm_w = nullptr;
  float* ss_out = nullptr;
  void* prep_out = nullptr;
  int prep_group = 0;
  float* stage = nullptr;
  unsigned* tickets = nullptr;
  // The mailbox handoff (null: tickets): per output row a 64-bit word, the
  // value's bits with a flag of 1 above them, written by the row's block and
  // zeroed by the unit's preparing block once read.
  unsigned long long* mail = nullptr;
};
// The same with decode's draw over a plain output (GemvFusion::argmax_*),
// the kernel's parameter in the instantiation with the argmax only: the
// others keep FuseArgs as it is (a larger parameter changed their register
// allocation, 72 -> 76 for groups of 128).
struct FuseArgsArgmax : FuseArgs {
  const HeadDraw* am_draw = nullptr;
  const int32_t* am_position = nullptr;
  unsigned long long* am_keys = nullptr;
};
template <bool Argmax>
using KernelFuseArgs = std::conditional_t<Argmax, FuseArgsArgmax, FuseArgs>;
constexpr int kPlain = 0, kResidual = 1, kSwiglu = 2;
constexpr int kUnitTiles = kPrepInputs / kTileRows;  // 16-row tiles per prepared unit of 128 outputs

// The input's 1 / rms (GemvFusion's input side), by one whole warp: every
// lane ends with the same bits (a butterfly: a + b == b + a).
// Every part is loaded before the first is added (one memory round trip:
// summed as they arrive, the loads went out in dependent batches), then
// summed in the same order as before.
__device__ __forceinline__ float input_inv_rms(const FuseArgs& f) {
  const int lane = threadIdx.x & 31;
  float part[GemvFusion::kMaxParts / 32];
#pragma unroll
  for (int j = 0; j < GemvFusion::kMaxParts / 32; ++j)
    part[j] = lane + 32 * j < f.in_parts ? __ldcg(f.in_ss + lane + 32 * j) : 0.0f;
  float ss = 0.0f;  // + 0.0f for a missing part: the same bits (the parts are sums of squares, never -0)
#pragma unroll
  for (int j = 0; j < GemvFusion::kMaxParts / 32; ++j) ss += part[j];
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
  return 1.0f / sqrtf(ss / f.in_width + f.eps);
}

// The mailbox's words: relaxed, single-copy atomic 64-bit accesses.
__device__ __forceinline__ void st_mail(unsigned long long* p, unsigned long long w) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;\n" ::"l"(p), "l"(w) : "memory");
}
__device__ __forceinline__ unsigned long long ld_mail(const unsigned long long* p) {
  unsigned long long w;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];\n" : "=l"(w) : "l"(p) : "memory");
  return w;
}

// One warp finishes fused output rows b·16 + lane (lanes 0..15 where
// row_lane; the others take part with zeros): a = the rows' sums times the
// input's 1/rms (bu: up's, for swiglu), written to `stage` (and the residual
// and its sums of squares); then the ticket of the rows' unit of 128 outputs,
// and the last to arrive (ticket reset for the next call) prepares the unit;
// or, with a mailbox, the handoff below.
// With32: the prepared output may have groups of 32 (prep_warp_store).
template <bool With32>
__device__ __forceinline__ void fused_rows_out(const FuseArgs& f, int64_t b, bool row_lane, float a, float bu,
                                               float res, float norm_w) {
  const int lane = threadIdx.x & 31;
  const int64_t r = b * kTileRows + (lane & 15);
  float ss = 0.0f, v = 0.0f;
  if (row_lane) {
    if (f.mode == kSwiglu) {
      v = a / (1.0f + expf(-a)) * bu;
    } else {
      const float xn = res + a;
      f.residual[r] = xn;
      v = xn * norm_w;
      ss = xn * xn;
    }
    if (f.mail == nullptr) f.stage[r] = v;
  }
  if (f.mode == kResidual) {
    // Lanes 0..15 among themselves (16..31 hold zeros), in a fixed order.
    for (int o = 8; o > 0; o >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, o);
    if (lane == 0) f.ss_out[b] = ss;
  }
  const int unit = static_cast<int>(b) / kUnitTiles;
  const int tiles_out = (f.width + kTileRows - 1) / kTileRows;
  if (f.mail != nullptr) {
    // The mailbox: the unit's last tile's block prepares it. The others post
    // their rows (value and flag in one 64-bit store, so no fence) and leave;
    // it takes its own rows from its lanes and waits for the other rows'
    // flags. Every block of the grid is resident at once (launch_gemv uses
    // the mailbox only then), so the wait cannot starve a writer.
    const int first = unit * kUnitTiles, last_tile = min(first + kUnitTiles, tiles_out) - 1;
    if (b != last_tile) {
      if (row_lane) st_mail(f.mail + r, (1ull << 32) | __float_as_uint(v));
      return;
    }
    // Lane l prepares the unit's inputs 4l .. 4l + 3, rows of the unit's tile
    // l / 4. Its own tile's rows come from lanes 0..15 (zero past the width);
    // only the matrix's last tile can be ragged, and that is a unit's last,
    // so every other tile's 16 rows are posted.
    const int own = static_cast<int>(b) - first, t = lane >> 2;
    float vals[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) vals[i] = __shfl_sync(0xFFFFFFFFu, v, (4 * lane + i) & 15);
    if (t != own) {
      unsigned long long* const words = f.mail + static_cast<int64_t>(unit) * kPrepInputs + 4 * lane;
      unsigned long long w[4] = {0, 0, 0, 0};  // a tile past the matrix: zeros
      if (first + t <= last_tile) {
        bool ready;
        do {
          ready = true;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            w[i] = ld_mail(words + i);
            ready = ready && (w[i] >> 32) != 0;
          }
        } while (!ready);
#pragma unroll
        for (int i = 0; i < 4; ++i) st_mail(words + i, 0ull);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) vals[i] = __uint_as_float(static_cast<uint32_t>(w[i]));
    }
    __syncwarp();
    prep_warp_store<With32>(vals, unit, f.prep_group, f.prep_out, f.width);
    return;
  }
  // The ticket (acquire-release: this warp's writes above go before it; the
  // last to arrive sees every other block's).
  __syncwarp();
  int last = 0;
  if (lane == 0) {
    const unsigned count = static_cast<unsigned>(min(kUnitTiles, tiles_out - unit * kUnitTiles));
    unsigned old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(f.tickets + unit) : "memory");
    last = old == count - 1;
    if (last) atomicExch(f.tickets + unit, 0u);
  }
  last = __shfl_sync(0xFFFFFFFFu, last, 0);
  __syncwarp();
  if (last) {
    float v4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int c = unit * kPrepInputs + 4 * lane + i;
      v4[i] = c < f.width ? __ldcg(f.stage + c) : 0.0f;
    }
    prep_warp_store<With32>(v4, unit, f.prep_group, f.prep_out, f.width);
  }
}

// What the head keys this call (GemvFusion::argmax_draw), read after the
// main loop: rows below `limit` (0: none), greedy or sampled.
struct HeadKeys {
  int64_t limit;
  bool sample;
  float t;
  uint64_t seed, draw;
};
__device__ __forceinline__ HeadKeys head_keys(const FuseArgsArgmax& f, int N) {
  HeadKeys h{};
  h.limit = min(static_cast<int64_t>(__ldg(&f.am_draw->limit)), static_cast<int64_t>(N));
  h.sample = __ldg(&f.am_draw->mode) != HeadDraw::kGreedy;
  if (h.sample) {
    h.t = __ldg(&f.am_draw->temperature);
    h.seed = __ldg(reinterpret_cast<const unsigned long long*>(&f.am_draw->seed));
    h.draw = __ldg(reinterpret_cast<const unsigned long long*>(&f.am_draw->draw_base)) +
             static_cast<uint64_t>(static_cast<int64_t>(*f.am_position));  // each step's own
  }
  return h;
}
// The key of output `row` with value v: 0 (no candidate) past the limit;
// greedy sampling::key (0 for NaN; the largest key is the largest value at
// its smallest row); sampled, the key of its score (nibble/sampler.h's draw
// over every row: the largest key is the draw).
__device__ __forceinline__ unsigned long long head_key(const HeadKeys& h, float v, int64_t row) {
  if (row >= h.limit) return 0ull;
  const uint64_t k = sampling::key(v, row);
  if (!h.sample || k == 0) return k;
  return sampling::key(sampling::score(v, h.t, h.seed, h.draw, row), row);
}

// One whole warp per block: the block's best key (each lane's `key`) into
// its slot by a fire-and-forget atomic max (no ticket: a block's exit waits
// for no round trip; on an H100 a ticket per block made the 8B head 8 us
// slower, docs/CUDA.md "Session 69").
__device__ __forceinline__ void block_argmax(const FuseArgsArgmax& f, unsigned long long key) {
  for (int o = 16; o > 0; o >>= 1) key = max(key, __shfl_xor_sync(0xFFFFFFFFu, key, o));
  if ((threadIdx.x & 31) == 0 && key != 0ull)
    asm volatile("red.relaxed.gpu.global.max.u64 [%0], %1;\n" ::"l"(f.am_keys + blockIdx.x % GemvFusion::kArgmaxKeys),
                 "l"(key)
                 : "memory");
}

// The end of one work item (a 16-row tile b; swiglu: gate tile b and up tile
// b + the item count): the warps' partial sums (rows gid and gid + 8 of the
// warp's `tile`, in the lanes of tig 0 and 1) are summed in a fixed order and
// written to y (plain) or as the fused output (warp 0). `red`: nwarps × 16
// floats of shared memory. Every thread of the block calls it. Argmax (plain
// outputs): greedy decode's key (block_argmax). With32: fused_rows_out's.
template <bool Argmax, bool With32, typename OutT>
__device__ __forceinline__ void gemv_item_out(const KernelFuseArgs<Argmax>& f, OutT* __restrict__ y, int N, int64_t b,
                                              int64_t tile, int nwarps, int wpt, float out_lo, float out_hi,
                                              float scale, bool row_lane, float res, float norm_w, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  out_lo += __shfl_xor_sync(0xFFFFFFFFu, out_lo, 1);  // tig 0 + tig 1 (tig 2, 3 hold zeros)
  out_hi += __shfl_xor_sync(0xFFFFFFFFu, out_hi, 1);
  const int64_t row0 = tile * kTileRows;
  if (nwarps == 1 && f.mode == kPlain) {
    if constexpr (Argmax) {
      const HeadKeys h = head_keys(f, N);
      if (h.limit > 0) {  // row `lane` (< 16) from the lanes of tig 0: one key per lane
        const float lo = __shfl_sync(0xFFFFFFFFu, out_lo * scale, (lane & 7) * 4);
        const float hi = __shfl_sync(0xFFFFFFFFu, out_hi * scale, (lane & 7) * 4);
        block_argmax(f, lane < kTileRows ? head_key(h, lane < 8 ? lo : hi, row0 + lane) : 0ull);
      }
    }
    if (tig == 0) {
      if (row0 + gid < N) y[row0 + gid] = to_out<OutT>(out_lo * scale);
      if (row0 + gid + 8 < N) y[row0 + gid + 8] = to_out<OutT>(out_hi * scale);
    }
    return;
  }
  if (tig == 0) {
    red[warp * kTileRows + gid] = out_lo;
    red[warp * kTileRows + gid + 8] = out_hi;
  }
  __syncthreads();
  if (f.mode == kPlain) {
    if constexpr (Argmax) {  // warp 0 sums the rows, takes the key, then stores
      if (warp != 0) return;
      float s = 0.0f;
      if (lane < kTileRows) {
        for (int w = 0; w < nwarps; ++w) s += red[w * kTileRows + lane];
        s *= scale;
      }
      const HeadKeys h = head_keys(f, N);
      if (h.limit > 0) block_argmax(f, lane < kTileRows ? head_key(h, s, row0 + lane) : 0ull);
      if (lane < kTileRows && row0 + lane < N) y[row0 + lane] = to_out<OutT>(s);
    } else if (threadIdx.x < kTileRows) {
      float s = 0.0f;
      for (int w = 0; w < nwarps; ++w) s += red[w * kTileRows + threadIdx.x];
      if (row0 + threadIdx.x < N) y[row0 + threadIdx.x] = to_out<OutT>(s * scale);
    }
    return;
  }
  if (warp == 0) {
    float a = 0.0f, bu = 0.0f;
    if (row_lane) {
      for (int w = 0; w < wpt; ++w) a += red[w * kTileRows + lane];
      a *= scale;
      if (f.mode == kSwiglu) {
        for (int w = 0; w < wpt; ++w) bu += red[(wpt + w) * kTileRows + lane];
        bu *= scale;
      }
    }
    fused_rows_out<With32>(f, b, row_lane, a, bu, res, norm_w);
  }
}

// One block per 16-row tile (swiglu: per pair of tiles, gate tile b and up
// tile b + gridDim.x); a tile's `wpt` warps take interleaved units of
// max(G, 64) inputs: CPG chunks per unit (2 for groups of 128, else 1), GPU
// groups per unit (2 for groups of 32, else 1). S ring stages per warp.
// Groups of 32 (sessions 78-79): a chunk's two groups take the B columns 0..2
// (planes a, b, c of inputs 0..31, the lanes of tig 0, 1) and 4..6 (inputs
// 32..63, tig 2, 3), zeros elsewhere, so one mma pair gives both groups' sums
// (w4a16_prep.cuh: tig t holds the chunk's inputs 16t .. 16t + 15), and the
// accumulator of a lane of tig t holds group t / 2 alone, with groups of 64's
// column constants for tig t % 2. So each lane streams and combines only its
// own group's scale/min entry and (d, Σx): the loop is groups of 64's. The
// sums of tig 2, 3 are added in after the main loop (gemv_item_out adds tig 1
// to tig 0 only).
// `early`: the dependent launch is triggered once the ring's first stages are
// issued, else after the main loop (w4a16_gemv_prepared says why). `Lean`:
// the instantiation held to 64 registers (no spill), so that 32 warps fit on
// an SM (launch_gemv says which grids take it). `Argmax`: greedy decode's
// argmax over the plain output (GemvFusion::argmax_*; the head's instantiation).
template <typename OutT, int G, int S, bool Lean = false, bool Argmax = false>
__global__ void __launch_bounds__(512, Lean ? 2 : 1)
    w4a16_gemv_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta, const uint4* __restrict__ frags,
                      const float2* __restrict__ ginfo, OutT* __restrict__ y, int N, int chunks, int units,
                      int groups_padded, int wpt, KernelFuseArgs<Argmax> f, bool early) {
  static_assert((S & (S - 1)) == 0 && S >= 2, "ring stages: a power of two");
  static_assert(G == 32 || G == 64 || G == 128, "groups of 32, 64 or 128");
  constexpr int CPG = gemv_chunks_per_unit(G), GPU = gemv_groups_per_unit(G);
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int sub = warp / wpt, wi = warp - sub * wpt;  // the warp's tile in the block, its index there
  const int gid = lane >> 2, tig = lane & 3;
  const int64_t tile = blockIdx.x + static_cast<int64_t>(sub) * gridDim.x;
  // The lane's codes and scale/min entry of the warp's next group to issue
  // (first group wi), advanced by running pointers (no per-group index
  // arithmetic in the loop).
  const uint4* cp = codes + tile * chunks * 32 + lane + static_cast<int64_t>(wi) * CPG * 32;
  const int own = GPU == 2 ? tig >> 1 : 0;  // the lane's group in the unit
  const uint2* mp = meta + tile * groups_padded * 8 + gid + (wi * GPU + own) * 8;
  // The lane's slots: stage st, chunk u of the codes at rq + (st·CPG + u)·512,
  // its scale/min entry (of its own group) at rm + st·256 (shared-window
  // addresses).
  uint32_t rq = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + (warp * S * CPG * 32 + lane) * 16;
  uint32_t rm = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + nwarps * S * CPG * 32 * 16 +
                (warp * S * 32 + lane) * 8;
  // Kept in registers: without this the compiler recomputes these addresses
  // from the block index and size in every iteration of the main loop (246
  // instead of 136 instructions per group; the GEMV ran 10-30 % slower).
  asm volatile("" : "+l"(cp), "+l"(mp), "+r"(rq), "+r"(rm));

  // The ring is filled in order: the warp's units wi, wi + wpt, ... into
  // stages 0, 1, ..., S - 1, 0, ...
  const int iters = wi < units ? (units - wi + wpt - 1) / wpt : 0;
  int g_in = wi, st_in = 0;  // the next unit to issue, its stage
  const int64_t cp_step = static_cast<int64_t>(wpt) * CPG * 32, mp_step = static_cast<int64_t>(wpt) * GPU * 8;
  auto issue = [&]() {  // the warp's next unit into its stage (nothing past the last unit)
    if (g_in < units) {
#pragma unroll
      for (int u = 0; u < CPG; ++u)
        if (u == 0 || g_in * CPG + u < chunks) cp_async16_s(rq + (st_in * CPG + u) * 512, cp + u * 32);
      cp_async8_s(rm + st_in * 256, mp);
    }
    g_in += wpt;
    cp += cp_step;
    mp += mp_step;
    st_in = (st_in + 1) & (S - 1);
  };
#pragma unroll
  for (int i = 0; i < S - 1; ++i) {
    issue();
    cp_async_commit();
  }
  if (early) grid_dependents_launch();  // the next kernel may become resident and stream its weights
  // The residual output's operands of warp 0's lanes 0..15 (output row r),
  // loaded now rather than after the main loop: the norm weight before the
  // wait, the residual (the kernel before may write it) after.
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kTileRows + (lane & 15);
  const bool row_lane = f.mode != kPlain && warp == 0 && lane < kTileRows && r < f.width;
  float norm_w = 0.0f, res = 0.0f;
  if (row_lane && f.mode == kResidual) norm_w = __ldg(f.norm_w + r);
  grid_dependency_wait();  // weights are in flight; x is prepared by the previous kernel
  if (row_lane && f.mode == kResidual) res = f.residual[r];

  // Lanes of column 2tig (d0, d2) and 2tig + 1 (d1, d3): columns 0, 1, 2 are
  // planes a, b, c; columns 3..7 are zero (groups of 32: columns 4, 5, 6 are
  // the second group's planes a, b, c, so tig 2, 3 are tig 0, 1 of it).
  const int ct = GPU == 2 ? tig & 1 : tig;  // the lane's tig within its group's columns
  const float c_even = ct == 0 ? 65536.0f : ct == 1 ? 1.0f : 0.0f, c_odd = ct == 0 ? 256.0f : 0.0f;
  const float c_min = ct == 0 ? 1.0f : 0.0f;  // the min term is added once per row and group
  float out_lo = 0.0f, out_hi = 0.0f;  // rows gid, gid + 8
  // The activation of the warp's next unit is loaded one unit ahead: the
  // lane's B fragment, plane gid (columns 0..2; lanes of gid 3..7 hold zeros;
  // groups of 32: plane gid % 4 of tig 0, 1 in gid 0..2 and of tig 2, 3 in
  // gid 4..6), and the (d, Σx) of the lane's own group. Two buffers, used in
  // turn by the loop unrolled by two (no copies).
  const bool b_lane = GPU == 1 ? gid < 3 : (gid & 3) < 3 && (gid >> 2) == own;
  const uint4* x_in = frags + (GPU == 2 ? gid & 3 : gid) * 4 + tig + static_cast<int64_t>(wi) * CPG * 12;
  const float2* gi_in = ginfo + wi * GPU + own;
  const int64_t x_step = static_cast<int64_t>(wpt) * CPG * 12;
  uint4 xa[CPG], xb[CPG];
  float2 ga = make_float2(0.0f, 0.0f), gb = ga;
  auto load_x = [&](uint4 (&xf)[CPG], float2& gi) {  // the next unit's input
#pragma unroll
    for (int u = 0; u < CPG; ++u) xf[u] = b_lane ? __ldg(x_in + u * 12) : make_uint4(0, 0, 0, 0);
    gi = __ldg(gi_in);
    x_in += x_step;
    gi_in += wpt * GPU;
  };
  // One unit from stage st: its int32 sums into the lane's outputs. A
  // ragged last chunk (past K) multiplies its stale ring codes by the zeros
  // the prepared input holds there.
  auto group = [&](int st, const uint4 (&xf)[CPG], float2 gi) {
    uint4 q[CPG];
#pragma unroll
    for (int u = 0; u < CPG; ++u) q[u] = lds128(rq + (st * CPG + u) * 512);
    int32_t acc[4];
    group_sums<CPG>(q, xf, acc);
    group_combine(acc, lds64(rm + st * 256), gi.x, gi.y, c_even, c_odd, c_min, out_lo, out_hi);
  };
  if (iters > 0) load_x(xa, ga);
  // The input's 1 / rms (GemvFusion), in warp 0, which writes the outputs;
  // after the first input's loads, so the two round trips overlap.
  const float scale = f.in_ss != nullptr && warp == 0 ? input_inv_rms(f) : 1.0f;
  int i = 0;
  for (; i + 1 < iters; i += 2) {
    const int st = i & (S - 1);
    issue();
    cp_async_commit();
    load_x(xb, gb);
    cp_async_wait<S - 1>();
    group(st, xa, ga);
    issue();
    cp_async_commit();
    if (i + 2 < iters) load_x(xa, ga);
    cp_async_wait<S - 1>();
    group(st + 1, xb, gb);
  }
  if (i < iters) {
    issue();
    cp_async_commit();
    cp_async_wait<S - 1>();
    group(i & (S - 1), xa, ga);
  }
  grid_dependents_launch();  // a no-op where `early` triggered it already
  if constexpr (GPU == 2) {  // tig 2, 3 hold the second group's sums: to tig 0, 1 (gemv_item_out adds tig 1)
    out_lo += __shfl_xor_sync(0xFFFFFFFFu, out_lo, 2);
    out_hi += __shfl_xor_sync(0xFFFFFFFFu, out_hi, 2);
  }
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(nwarps) * S * stage_bytes(CPG));
  gemv_item_out<Argmax, G == 32>(f, y, N, blockIdx.x, tile, nwarps, wpt, out_lo, out_hi, scale, row_lane, res, norm_w,
                                 red);
}

// A chain of GEMVs in one persistent launch (LinearKernel::gemv_chain).
//
// Work: each block takes items blockIdx.x, + gridDim.x, ... of every call in
// turn (items: 16-row tiles, or for swiglu gate tile b with up tile b + the
// item count). An item is cut in slices of 16 groups (8 of each tile for
// swiglu): consumer warp w takes the slice's w-th group, the group
// w4a16_gemv_kernel's warp w takes (wi + i·wpt), so the sums are the same.
//
// Three kinds of warps per block:
//  * a producer warp streams the slices of all the block's items, call after
//    call, into a ring of kChainStages stages in shared memory with bulk
//    copies (cp.async.bulk: one for a tile's codes of the slice, one for its
//    scale/min pairs, 8-17 KB a request) signalled through mbarriers; a stage
//    is refilled once all consumer warps have released it. Weights depend on
//    nothing, so the stream runs a whole ring ahead of the dot products,
//    across items and calls;
//  * kChainWarps consumer warps compute the dot products and hand each
//    item's partial sums to an epilogue warp through that warp's buffer
//    (named barriers: full, then free again), without waiting for it;
//  * kChainEpi epilogue warps, taking items in turn, sum the partials in a fixed
//    order and write the outputs: plain y, or the fused outputs with their
//    tickets and prepared units, whose fences and atomics stay off the
//    consumers' path.
// Calls: before call c's first dot product the consumers wait until every
// block has finished call c - 1 (sync[c - 1] = gridDim.x; the epilogue warps
// add 1 per block when its outputs of call c - 1 are written), then copy
// call c's prepared input whole into shared memory. The last block to finish
// zeroes the counters. All blocks are resident at once (grid = occupancy ×
// SMs), so the waits cannot deadlock.
struct ChainPhase {
  const uint4* codes;
  const uint2* meta;
  const uint4* frags;  // the prepared input: xbytes, (d, Σx) per group from byte xginfo
  float* y;
  int N, chunks, groups, groups_padded, items, tpb;
  int xbytes, xginfo;
  FuseArgs f;
};
struct ChainParams {
  ChainPhase ph[kGemvChainMax];
  int count;
  unsigned* sync;
};
constexpr int kChainWarps = 16;  // consumer warps per block
constexpr int kChainEpi = 4;     // epilogue warps
constexpr int kChainThreads = (kChainWarps + kChainEpi + 1) * 32;
constexpr int kChainStages = 8;  // ring stages, each a slice of 16 groups
constexpr int kSliceGroups = 16;
constexpr size_t kChainRedBytes = kChainEpi * kChainWarps * kTileRows * 4;
__host__ __device__ constexpr size_t chain_stage_bytes(int cpg) {
  return static_cast<size_t>(kSliceGroups) * (cpg * 512 + 64);
}
__host__ __device__ constexpr size_t chain_ring_bytes(int cpg, int stages) {
  return static_cast<size_t>(stages) * chain_stage_bytes(cpg) + 2 * 8 * stages;  // + full/empty mbarriers
}
// Named barriers (0 is __syncthreads).
constexpr int kBarConsumers = 1;              // the consumer warps
constexpr int kBarFull = 2;                   // + e: buffer e holds an item's sums (consumers arrive, epilogue e waits)
constexpr int kBarFree = kBarFull + kChainEpi;  // + e: epilogue e has read buffer e (it arrives, consumers wait)
constexpr int kBarEpi = kBarFree + kChainEpi;   // the epilogue warps
constexpr int kBarEnd = kBarEpi + 1;            // consumers and epilogue warps, at the end
static_assert(kBarEnd < 16, "16 named barriers");

__device__ inline unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ inline void bar_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int CPG, int S>
__global__ void __launch_bounds__(kChainThreads, 1) w4a16_chain_kernel(const __grid_constant__ ChainParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // mbarriers, bulk copies and cluster fences need sm_90 (w4a16_gemv_chain refuses older GPUs)
#else
  constexpr int NW = kChainWarps, kPair = (NW + 1) * 32;
  constexpr uint32_t kStage = static_cast<uint32_t>(chain_stage_bytes(CPG)), kMeta = kSliceGroups * CPG * 512;
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ __align__(16) unsigned char sph_bytes[sizeof(ChainPhase) * kGemvChainMax];
  auto* sph = reinterpret_cast<ChainPhase*>(sph_bytes);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int G = static_cast<int>(gridDim.x), count = p.count;
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full0 = ring + S * kStage, empty0 = full0 + 8 * S;
  float* red0 = reinterpret_cast<float*>(smem + chain_ring_bytes(CPG, S));
  if (threadIdx.x < count) sph[threadIdx.x] = p.ph[threadIdx.x];
  if (threadIdx.x < S) {
    mbar_init(full0 + 8 * threadIdx.x, 1);
    mbar_init(empty0 + 8 * threadIdx.x, NW);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();

  if (warp == NW + kChainEpi) {  // the producer: every slice of every item of every call, in order
    if (lane == 0) {
      int seq = 0;
      for (int c = 0; c < count; ++c) {
        const ChainPhase& P = sph[c];
        const int per = kSliceGroups / P.tpb;  // groups of each tile per slice
        const int slices = (P.groups + per - 1) / per;
        for (int b = static_cast<int>(blockIdx.x); b < P.items; b += G)
          for (int i = 0; i < slices; ++i, ++seq) {
            const int st = seq % S, use = seq / S;
            const uint32_t full = full0 + 8 * st, dst = ring + st * kStage;
            if (use > 0) mbar_wait(empty0 + 8 * st, (use - 1) & 1);
            const int g0 = i * per, ng = min(per, P.groups - g0);
            const int nc = min(ng * CPG, P.chunks - g0 * CPG);
            mbar_expect_tx(full, static_cast<unsigned>(P.tpb * (nc * 512 + ng * 64)));
            for (int t = 0; t < P.tpb; ++t) {
              const int64_t tile = b + static_cast<int64_t>(t) * P.items;
              bulk_copy(dst + t * per * CPG * 512, P.codes + (tile * P.chunks + g0 * CPG) * 32,
                        static_cast<unsigned>(nc * 512), full);
              bulk_copy(dst + kMeta + t * per * 64, P.meta + (tile * P.groups_padded + g0) * 8,
                        static_cast<unsigned>(ng * 64), full);
            }
          }
      }
      grid_dependents_launch();
    }
    return;
  }

  grid_dependency_wait();  // the first call's input, and what the epilogues read, come from the kernel before
  if (warp >= NW) {  // epilogue warp e: items e, e + kChainEpi, ... of the block's sequence
    const int e = warp - NW;
    float* red = red0 + e * NW * kTileRows;
    int k = 0;  // the block's item count so far
    for (int c = 0; c < count; ++c) {
      const ChainPhase& P = sph[c];
      const FuseArgs& f = P.f;
      const int wpt = NW / P.tpb;
      bool have_scale = false;
      float scale = 1.0f;
      for (int b = static_cast<int>(blockIdx.x); b < P.items; b += G, ++k) {
        if (k % kChainEpi != e) continue;
        const int64_t r = static_cast<int64_t>(b) * kTileRows + (lane & 15);
        const bool row_lane = f.mode != kPlain && lane < kTileRows && r < f.width;
        const float norm_w = row_lane && f.mode == kResidual ? __ldg(f.norm_w + r) : 0.0f;
        bar_sync(kBarFull + e, kPair);  // the item's sums (and, before them, call c's input) are there
        if (f.in_ss != nullptr && !have_scale) {  // once per call
          scale = input_inv_rms(f);
          have_scale = true;
        }
        float a = 0.0f, bu = 0.0f;
        if (lane < kTileRows) {
          const int n = f.mode == kPlain ? NW : wpt;
          for (int w = 0; w < n; ++w) a += red[w * kTileRows + lane];
          if (f.mode == kSwiglu)
            for (int w = 0; w < wpt; ++w) bu += red[(wpt + w) * kTileRows + lane];
        }
        bar_arrive(kBarFree + e, kPair);
        if (f.mode == kPlain) {
          const int64_t row = static_cast<int64_t>(b) * kTileRows + lane;
          if (lane < kTileRows && row < P.N) P.y[row] = a * scale;
        } else {
          const float res = row_lane && f.mode == kResidual ? __ldcg(f.residual + r) : 0.0f;
          fused_rows_out<false>(f, b, row_lane, a * scale, bu * scale, res, norm_w);
        }
      }
      bar_sync(kBarEpi, kChainEpi * 32);  // both epilogue warps are done with call c
      if (c + 1 < count && e == 0 && lane == 0)  // release: the block's outputs of call c go before it
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p.sync + c) : "memory");
    }
  } else {  // consumer warps
    const float c_even = tig == 0 ? 65536.0f : tig == 1 ? 1.0f : 0.0f, c_odd = tig == 0 ? 256.0f : 0.0f;
    const float c_min = tig == 0 ? 1.0f : 0.0f;
    // The call's prepared input, staged whole in shared memory by the block.
    auto* xs = reinterpret_cast<uint4*>(smem + chain_ring_bytes(CPG, S) + kChainRedBytes);
    const uint32_t xs_addr = static_cast<uint32_t>(__cvta_generic_to_shared(xs));
    // The lane's B fragment in each chunk: plane gid (columns 0..2; lanes of
    // gid 3..7 hold zeros).
    const bool b_lane = gid < 3;
    const uint32_t xs_lane = xs_addr + (gid * 4 + tig) * 16;
    int seq = 0, k = 0;  // slices consumed; the block's item count so far
    for (int c = 0; c < count; ++c) {
      const ChainPhase& P = sph[c];
      // The warp's slot in each slice (its tile of the item: warp / per): group
      // i·per + wi of slice i, the group w4a16_gemv_kernel's warp wi takes with
      // per warps per tile, in the same order.
      const int per = kSliceGroups / P.tpb, slices = (P.groups + per - 1) / per;
      const int wi = warp % per;
      if (c > 0 && threadIdx.x == 0)  // call c - 1 finished in every block
        while (ld_acquire(p.sync + c - 1) < static_cast<unsigned>(G)) __nanosleep(32);
      bar_sync(kBarConsumers, NW * 32);
      {
        // Through the L2 (.cg): the input may have been written earlier in this launch.
        const uint4* src = P.frags;
        const int n16 = P.xbytes / 16;
        constexpr int kT = NW * 32;
        for (int i = threadIdx.x; i < n16; i += 4 * kT) {
          uint4 v[4];
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (i + u * kT < n16) v[u] = __ldcg(src + i + u * kT);
#pragma unroll
          for (int u = 0; u < 4; ++u)
            if (i + u * kT < n16) xs[i + u * kT] = v[u];
        }
      }
      bar_sync(kBarConsumers, NW * 32);
      const uint32_t xg_addr = xs_addr + static_cast<uint32_t>(P.xginfo);  // (d, Σx) per group
      for (int b = static_cast<int>(blockIdx.x); b < P.items; b += G, ++k) {
        float out_lo = 0.0f, out_hi = 0.0f;
        for (int i = 0; i < slices; ++i, ++seq) {
          const int st = seq % S;
          const uint32_t base = ring + st * kStage;
          mbar_wait(full0 + 8 * st, (seq / S) & 1);
          // Branch-free, so the chunks' chains interleave: a slot past the
          // call's groups (a ragged last slice) reads stale codes and the last
          // group's input, and its sum is not kept; a ragged last chunk reads
          // the zeros the prepared input holds past K.
          const int g = i * per + wi, gx = min(g, P.groups - 1);
          uint4 q[CPG], xf[CPG];
#pragma unroll
          for (int u = 0; u < CPG; ++u) {
            q[u] = lds128(base + warp * CPG * 512 + u * 512 + lane * 16);
            xf[u] = b_lane ? lds128(xs_lane + (gx * CPG + u) * kPrepChunkBytes) : make_uint4(0, 0, 0, 0);
          }
          int32_t acc[4];
          group_sums<CPG>(q, xf, acc);
          const uint2 gb = lds64(xg_addr + gx * 8);  // (d, Σx)
          float lo = out_lo, hi = out_hi;
          group_combine(acc, lds64(base + kMeta + warp * 64 + gid * 8), __uint_as_float(gb.x),
                        __uint_as_float(gb.y), c_even, c_odd, c_min, lo, hi);
          if (g < P.groups) {  // selects, not a branch
            out_lo = lo;
            out_hi = hi;
          }
          __syncwarp();
          if (lane == 0) mbar_arrive(empty0 + 8 * st);
        }
        // Hand the item to epilogue warp k % kChainEpi (once it has read its item before).
        const int e = k % kChainEpi;
        out_lo += __shfl_xor_sync(0xFFFFFFFFu, out_lo, 1);  // tig 0 + tig 1 (tig 2, 3 hold zeros)
        out_hi += __shfl_xor_sync(0xFFFFFFFFu, out_hi, 1);
        if (k >= kChainEpi) bar_sync(kBarFree + e, kPair);
        float* red = red0 + e * NW * kTileRows;
        if (tig == 0) {
          red[warp * kTileRows + gid] = out_lo;
          red[warp * kTileRows + gid + 8] = out_hi;
        }
        bar_arrive(kBarFull + e, kPair);
      }
      bar_sync(kBarConsumers, NW * 32);  // the block's reads of xs for call c are done
    }
    // The epilogue warps' releases of the last items' buffers (no consumer waits for them otherwise).
    for (int e = 0; e < kChainEpi; ++e)
      if (k > e) bar_sync(kBarFree + e, kPair);
  }
  bar_sync(kBarEnd, (NW + kChainEpi) * 32);  // every warp of the block is past every wait
  if (threadIdx.x == 0 && atomicAdd(p.sync + kGemvChainMax, 1u) == static_cast<unsigned>(G) - 1) {
    for (int c = 0; c < count; ++c) p.sync[c] = 0;
    p.sync[kGemvChainMax] = 0;
  }
#endif
}

// Ring stages per warp. Measured on the H200 (bench_w4a16, fused stack at
// M = 1): 2 stages 1.33-1.35 ms, 4 stages 1.43-1.47 ms, 8 stages 1.87 ms; the
// smaller ring leaves room for more resident warps. Triggering the next
// kernel's launch before the main loop instead of after it was no faster.
// In decode, a GEMV right after the one-block RMSNorm (`deep`) has the GPU to
// itself while the norm runs: 4 stages there (three groups per warp in flight
// before the wait) took q|k|v from 6.9 to 5.5 µs per layer of the 8B shape
// and gate|up from 16.3 to 15.7 (bench_decode_trace); after attention (o) or
// SiLU (down) the larger blocks no longer all fit beside the kernel before,
// and were slower.
constexpr int kStages = 2;
constexpr int kDeepStages = 4;

FuseArgs fuse_args(const DeviceLinear& w, const GemvFusion* fz) {
  FuseArgs a;
  if (fz == nullptr) return a;
  if (fz->in_ss != nullptr) {
    NIBBLE_CHECK(fz->in_parts > 0 && fz->in_parts <= GemvFusion::kMaxParts && fz->in_width > 0,
                 "w4a16 gemv: input norm of {} parts (at most {}) over width {}", fz->in_parts, GemvFusion::kMaxParts,
                 fz->in_width);
    a.in_ss = fz->in_ss;
    a.in_parts = fz->in_parts;
    a.in_width = static_cast<float>(fz->in_width);
    a.eps = fz->eps;
  }
  if (!fz->fuses_output()) return a;
  NIBBLE_CHECK(!(fz->residual != nullptr && fz->swiglu), "w4a16 gemv: residual and swiglu outputs are exclusive");
  a.mode = fz->swiglu ? kSwiglu : kResidual;
  if (fz->swiglu)
    NIBBLE_CHECK(w.rows % (2 * kTileRows) == 0, "w4a16 gemv: swiglu needs rows = 2F with F a multiple of 16 (rows {})",
                 w.rows);
  a.width = static_cast<int>(fz->swiglu ? w.rows / 2 : w.rows);
  NIBBLE_CHECK(w4a16_gemv_applies(fz->prep_group), "w4a16 gemv: fused output group {} (32, 64 or 128)",
               fz->prep_group);
  NIBBLE_CHECK(fz->prep_group != 32 || w.group_size == 32,
               "w4a16 gemv: a fused output in groups of 32 needs the GEMV's own groups to be 32 (found {})",
               w.group_size);
  NIBBLE_CHECK(fz->prep_out != nullptr && fz->prep_bytes >= prep_bytes(a.width),
               "w4a16 gemv: fused output needs {} bytes of prepared activation ({} given)", prep_bytes(a.width),
               fz->prep_bytes);
  NIBBLE_CHECK(fz->stage != nullptr && fz->tickets != nullptr, "w4a16 gemv: fused output needs stage and tickets");
  NIBBLE_CHECK(fz->swiglu || (fz->norm_w != nullptr && fz->ss_out != nullptr),
               "w4a16 gemv: the residual output needs norm_w and ss_out");
  a.residual = fz->residual;
  a.norm_w = fz->norm_w;
  a.ss_out = fz->ss_out;
  a.prep_out = fz->prep_out;
  a.prep_group = fz->prep_group;
  a.stage = fz->stage;
  a.tickets = fz->tickets;
  a.mail = fz->mail;
  return a;
}

// fuse_args with greedy decode's argmax (GemvFusion::argmax_*).
FuseArgsArgmax fuse_args_argmax(const DeviceLinear& w, const GemvFusion& fz) {
  NIBBLE_CHECK(!fz.fuses_output(), "w4a16 gemv: the argmax takes a plain output (no residual or swiglu)");
  NIBBLE_CHECK(fz.argmax_keys != nullptr && fz.argmax_position != nullptr,
               "w4a16 gemv: the argmax needs its key slots and the step's position");
  FuseArgsArgmax a;
  static_cast<FuseArgs&>(a) = fuse_args(w, &fz);
  a.am_draw = fz.argmax_draw;
  a.am_position = fz.argmax_position;
  a.am_keys = fz.argmax_keys;
  return a;
}

template <typename OutT, int G>
void launch_gemv(const DeviceLinear& w, const void* prepared, OutT* y, cudaStream_t stream, bool pdl, int sms,
                 bool deep, const GemvFusion* fz, bool early) {
  constexpr int CPG = gemv_chunks_per_unit(G);
  FuseArgs fa = fuse_args(w, fz);
  const int64_t tiles = (w.rows + kTileRows - 1) / kTileRows, chunks = (w.cols + kChunk - 1) / kChunk;
  const int64_t units = (chunks + CPG - 1) / CPG;
  const int64_t groups_padded = (chunks * kChunk + w.group_size - 1) / w.group_size;
  const int tpb = fa.mode == kSwiglu ? 2 : 1;
  const int stages = deep ? kDeepStages : kStages;
  // Decode's o and down (fused residual outputs) take the 64-register instantiation: their one-wave grids of 256
  // tiles then get 16 warps per tile instead of 11 and 14. `nibble run` on the 8B shape, two H100s, each setting
  // twice alternated in one call: 591.5-591.9 → 598.4-598.7 tok/s (o alone 595.2, down alone 594.3; session 66,
  // docs/results/s66/). Plain outputs keep main's 70-72 registers: for every grid, the stack's o, down and the
  // kernels after them got slower (prepared stack 1.473 → 1.506 ms, q|k|v after down 5.62 → 6.04 µs).
  const bool lean = !deep && fa.mode == kResidual;
  auto kernel = deep   ? w4a16_gemv_kernel<OutT, G, kDeepStages>
                : lean ? w4a16_gemv_kernel<OutT, G, kStages, true>
                       : w4a16_gemv_kernel<OutT, G, kStages>;
  max_dynamic_smem_once<w4a16_gemv_kernel<OutT, G, kStages>>(device_smem_cap(110 << 10));
  max_dynamic_smem_once<w4a16_gemv_kernel<OutT, G, kStages, true>>(device_smem_cap(110 << 10));
  max_dynamic_smem_once<w4a16_gemv_kernel<OutT, G, kDeepStages>>(device_smem_cap(200 << 10));
  // Greedy decode's argmax (the head): the 64-register instantiation with the
  // argmax, whatever the grid (f32 outputs only).
  const bool argmax = fz != nullptr && fz->fuses_argmax();
  NIBBLE_CHECK(!argmax || (std::is_same_v<OutT, float> && !deep), "w4a16 gemv: the argmax needs f32 outputs, no deep ring");
  auto am_kernel = w4a16_gemv_kernel<float, G, kStages, true, true>;
  if (argmax) max_dynamic_smem_once<w4a16_gemv_kernel<float, G, kStages, true, true>>(device_smem_cap(110 << 10));
  const void* config_kernel = argmax ? reinterpret_cast<const void*>(am_kernel) : reinterpret_cast<const void*>(kernel);
  // Warps per tile: at most 16 (8 where a block takes two tiles) and at most
  // one per unit; as many as keep the whole grid resident at once
  // (one_wave_warps), else ~32 resident per SM over the grid.
  const size_t smem_warp = stages * stage_bytes(CPG) + kTileRows * 4;
  const int64_t most = std::min<int64_t>(16 / tpb, units);
  int64_t warps = one_wave_warps(config_kernel, tiles / tpb, most, units, tpb, smem_warp, sms);
  if (warps == 0) {
    warps = std::clamp<int64_t>(int64_t{sms} * 32 / std::max<int64_t>(tiles, 1), 1, most);
    fa.mail = nullptr;  // the mailbox needs every block resident at once (fused_rows_out)
    // Several waves (the head: one-warp blocks): at main's 72 registers (f32 outputs) 28 such blocks fit on an SM,
    // at 64 all 32 do. The 8B head took 103.0-103.5 → 94.9-95.0 µs on an H100 (session 65, docs/results/s65/).
    if (!deep && !argmax) kernel = w4a16_gemv_kernel<OutT, G, kStages, true>;
  }
  const size_t smem = static_cast<size_t>(tpb * warps) * smem_warp;
  const dim3 grid(static_cast<unsigned>(tiles / tpb)), block(static_cast<unsigned>(tpb * warps * 32));
  const auto* frags = static_cast<const uint4*>(prepared);
  const auto* ginfo =
      reinterpret_cast<const float2*>(static_cast<const unsigned char*>(prepared) + prep_ginfo_offset(w.cols));
  const auto* codes = static_cast<const uint4*>(w.a.get());
  const auto* meta = static_cast<const uint2*>(w.b.get());
  if constexpr (std::is_same_v<OutT, float>)
    if (argmax) {
      launch_pdl(am_kernel, grid, block, smem, stream, pdl, codes, meta, frags, ginfo, y, static_cast<int>(w.rows),
                 static_cast<int>(chunks), static_cast<int>(units), static_cast<int>(groups_padded),
                 static_cast<int>(warps), fuse_args_argmax(w, *fz), early);
      return;
    }
  launch_pdl(kernel, grid, block, smem, stream, pdl, codes, meta, frags, ginfo, y, static_cast<int>(w.rows),
             static_cast<int>(chunks), static_cast<int>(units), static_cast<int>(groups_padded),
             static_cast<int>(warps), fa, early);
}

void launch_gemv_out(const DeviceLinear& w, const void* prepared, void* y, bool f32_out, cudaStream_t s, bool pdl,
                     int sms, Act out, bool early, bool deep = false, const GemvFusion* fz = nullptr) {
  // y is f32, or the activation type (fp32 for f32 activations).
  auto by_group = [&](auto* typed_y) {
    using OutT = std::remove_pointer_t<decltype(typed_y)>;
    if (w.group_size == 32) launch_gemv<OutT, 32>(w, prepared, typed_y, s, pdl, sms, deep, fz, early);
    else if (w.group_size == 64) launch_gemv<OutT, 64>(w, prepared, typed_y, s, pdl, sms, deep, fz, early);
    else launch_gemv<OutT, 128>(w, prepared, typed_y, s, pdl, sms, deep, fz, early);
  };
  if (f32_out || out == Act::F32)
    by_group(static_cast<float*>(y));
  else if (out == Act::BF16)
    by_group(static_cast<__nv_bfloat16*>(y));
  else
    by_group(static_cast<__half*>(y));
}

template <int CPG>
void launch_chain(const GemvCall* calls, int count, unsigned* sync, cudaStream_t stream, bool pdl) {
  constexpr int S = kChainStages;
  ChainParams p = {};
  size_t xbytes = 0;  // the largest prepared input
  p.count = count;
  p.sync = sync;
  for (int c = 0; c < count; ++c) {
    const GemvCall& call = calls[c];
    const DeviceLinear& w = *call.w;
    ChainPhase& P = p.ph[c];
    P.f = fuse_args(w, &call.fuse);
    P.f.mail = nullptr;  // a chain block may hold a unit's other items: tickets
    NIBBLE_CHECK(!call.fuse.fuses_argmax(), "w4a16 gemv chain: call {} asks for the argmax (plain GEMVs only)", c);
    NIBBLE_CHECK(P.f.mode != kPlain || call.y != nullptr, "w4a16 gemv chain: call {} has no output", c);
    const int64_t tiles = (w.rows + kTileRows - 1) / kTileRows, chunks = (w.cols + kChunk - 1) / kChunk;
    P.codes = static_cast<const uint4*>(w.a.get());
    P.meta = static_cast<const uint2*>(w.b.get());
    NIBBLE_CHECK(w.cols <= kGemvChainMaxCols, "w4a16 gemv chain: {} inputs (at most {})", w.cols, kGemvChainMaxCols);
    P.frags = static_cast<const uint4*>(call.prepared);
    P.xbytes = static_cast<int>(prep_bytes(w.cols));
    P.xginfo = static_cast<int>(prep_ginfo_offset(w.cols));
    xbytes = std::max(xbytes, static_cast<size_t>(P.xbytes));
    P.y = call.y;
    P.N = static_cast<int>(w.rows);
    P.chunks = static_cast<int>(chunks);
    P.groups = static_cast<int>((chunks + CPG - 1) / CPG);
    P.groups_padded = static_cast<int>((chunks * kChunk + w.group_size - 1) / w.group_size);
    P.tpb = P.f.mode == kSwiglu ? 2 : 1;
    P.items = static_cast<int>(tiles / P.tpb);
  }
  // Shared memory: the ring and its mbarriers, the warps' sums, the largest prepared input.
  const size_t smem = chain_ring_bytes(CPG, S) + kChainRedBytes + xbytes;
  static const int grid = [&] {
    const size_t most = chain_ring_bytes(CPG, S) + kChainRedBytes + prep_bytes(kGemvChainMaxCols);
    NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(w4a16_chain_kernel<CPG, S>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(most)));
    int per_sm = 0;
    NIBBLE_CUDA_CHECK(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, w4a16_chain_kernel<CPG, S>, kChainThreads, most));
    NIBBLE_CHECK(per_sm >= 1, "w4a16 gemv chain: the kernel does not fit on an SM");
    return device_sm_count() * per_sm;
  }();
  launch_pdl(w4a16_chain_kernel<CPG, S>, dim3(static_cast<unsigned>(grid)), dim3(kChainThreads), smem, stream, pdl, p);
}

template <typename T>
void launch_prep(const T* x, int64_t cols, int group, void* prepared, cudaStream_t stream, bool pdl) {
  launch_pdl(prep_x_kernel<T>, dim3(static_cast<unsigned>((prep_warps(cols) + 7) / 8)), dim3(256), 0, stream, pdl, x,
             static_cast<int>(cols), prepared, group);
}

void check_prepared(const DeviceLinear& w, size_t bytes) {
  NIBBLE_CHECK(w4a16_gemv_applies(w.group_size), "w4a16 gemv: group size {} has no single-token kernel", w.group_size);
  NIBBLE_CHECK(bytes >= prep_bytes(w.cols), "w4a16 gemv: {} bytes of prepared activation, {} needed", bytes,
               prep_bytes(w.cols));
}

}  // namespace

// Measured on the H200 (bench_w4a16, M = 1 with prepared inputs, session 15):
// the q|k|v shape 6144 × 4096 (384 tiles) took 7.52 µs with 11 warps per tile
// (352-thread blocks, two per SM: 1.45 waves) and 5.36 µs with 8 (four per SM,
// one wave).
// The answer depends only on the arguments, so it is kept in a Memo.
int64_t one_wave_warps(const void* kernel, int64_t blocks, int64_t most, int64_t groups, int unit, size_t smem_per_warp,
                       int sms) {
  static Memo<std::tuple<const void*, int64_t, int64_t, int64_t, int, size_t, int>, int64_t> known;
  return known.get(std::make_tuple(kernel, blocks, most, groups, unit, smem_per_warp, sms), [&] {
    return one_wave_warps_for(blocks, most, groups, sms, [&](int64_t w) {
      int n = 0;  // blocks resident on one SM
      NIBBLE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &n, kernel, static_cast<int>(unit * w * 32), static_cast<size_t>(unit * w) * smem_per_warp));
      return n;
    });
  });
}

size_t even_share_smem(const void* kernel, int threads, size_t smem, int64_t blocks, int sms, size_t most) {
  static Memo<std::tuple<const void*, int, size_t, int64_t, int, size_t>, size_t> known;
  return known.get(std::make_tuple(kernel, threads, smem, blocks, sms, most), [&] {
    return even_share_smem_for(smem, blocks, sms, most, [&](size_t s) {
      int n = 0;
      NIBBLE_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, s));
      return int64_t{n};
    });
  });
}

bool w4a16_gemv_applies(int group_size) { return group_size == 32 || group_size == 64 || group_size == 128; }
bool w4a16_gemv_chain_applies(int group_size) { return group_size == 64 || group_size == 128; }

size_t w4a16_gemv_scratch_bytes(int64_t cols) { return prep_bytes(cols); }

void w4a16_gemv_prepare(const DeviceLinear& w, const void* x, Act act, void* prepared, size_t prepared_bytes,
                        cudaStream_t stream, bool pdl) {
  check_prepared(w, prepared_bytes);
  if (act == Act::BF16)
    launch_prep(static_cast<const __nv_bfloat16*>(x), w.cols, w.group_size, prepared, stream, pdl);
  else if (act == Act::F16)
    launch_prep(static_cast<const __half*>(x), w.cols, w.group_size, prepared, stream, pdl);
  else
    launch_prep(static_cast<const float*>(x), w.cols, w.group_size, prepared, stream, pdl);
}

void w4a16_gemv(const DeviceLinear& w, const void* x, Act act, void* y, bool f32_out, cudaStream_t stream, bool pdl,
                int sms) {
  // The prep kernel honours `pdl` towards the kernel before it; the GEMV
  // always launches early after its own prep and waits for it.
  w4a16_gemv_prepare(w, x, act, w.scratch.get(), w.scratch.bytes(), stream, pdl);
  launch_gemv_out(w, w.scratch.get(), y, f32_out, stream, true, sms, act, false);
}

void w4a16_gemv_chain(const GemvCall* calls, int count, unsigned* sync, cudaStream_t stream, bool pdl) {
  NIBBLE_CHECK(w4a16_wgmma_device(), "w4a16 gemv chain: needs an sm_90 GPU (mbarriers and bulk copies)");
  NIBBLE_CHECK(count >= 1 && count <= kGemvChainMax, "w4a16 gemv chain: {} calls (1 to {})", count, kGemvChainMax);
  NIBBLE_CHECK(sync != nullptr, "w4a16 gemv chain: no sync counters");
  const int group = calls[0].w->group_size;
  NIBBLE_CHECK(w4a16_gemv_chain_applies(group), "w4a16 gemv chain: groups of 64 or 128 only (found {})", group);
  for (int c = 0; c < count; ++c) {
    NIBBLE_CHECK(calls[c].w->group_size == group, "w4a16 gemv chain: call {} has group {}, call 0 {}", c,
                 calls[c].w->group_size, group);
    check_prepared(*calls[c].w, calls[c].prepared_bytes);
  }
  group == 64 ? launch_chain<1>(calls, count, sync, stream, pdl) : launch_chain<2>(calls, count, sync, stream, pdl);
}

// Decode's GEMVs let the next kernel launch as soon as every block has put
// its first weights in flight (`early`), not after the main loop: the next
// GEMV's blocks then become resident wherever an SM has room and stream their
// weights before they wait. Measured on the H200 (session 15): 8B decode step
// 1496.5 -> 1457.9 µs (bench_decode_trace, 64 positions), 674.8 -> 694.8
// tok/s; the stack of gemv_prepared calls 1.204 -> 1.179 ms. Behind the
// prepare kernel (w4a16_gemv, the gemm path) it was slower (fused stack 1.277
// -> 1.299 ms), so that path keeps the late trigger.
void w4a16_gemv_prepared(const DeviceLinear& w, const void* prepared, size_t prepared_bytes, void* y,
                         cudaStream_t stream, bool pdl, int sms, bool deep, const GemvFusion* fuse) {
  check_prepared(w, prepared_bytes);
  launch_gemv_out(w, prepared, y, true, stream, pdl, sms, Act::F32, true, deep, fuse);
}

}  // namespace nibble::cuda
