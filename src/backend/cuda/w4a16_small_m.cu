// The W4A16 kernel for M >= 2 tokens (the w4a16_mma registry rows send those
// calls here; M = 1 takes the integer GEMV, w4a16_gemv.cu). Groups of 32 take
// the rounded path below, two groups to a 64-input chunk with a lane per group
// (WeightStream's GPC = 2; session 80: until then the general kernel of
// w4a16.cu, fused 8B stack on an H100 at 4 / 16 / 64 tokens 2.60 / 3.69 /
// 10.85 -> 1.98 / 2.69 / 7.17 ms), and on sm_90 beyond 16 tokens the wgmma
// kernel as other groups do (session 81); the exact path sums each k-step
// over both of a chunk's groups, which its per-group combine cannot split.
//
// y[M, N] = x[M, K] · Ŵᵀ, x bf16 or fp16, fp32 accumulation. Up to 16 tokens
// the weights are exact (FORMAT.md's c·s + m, never rounded to 16 bits), and
// up to 24 on the matrices w4a16_three_tiles_exact names (groups of 128) and
// those the resident-activation kernel takes (sm_90; groups of 64 and 128):
//  * The mma multiplies x by the offset codes 128 + c (0x4300 | c is exactly
//    that in bf16; 0x6400 | c is 1024 + c in fp16): one and-or per register
//    of the A fragment, no arithmetic on the weights.
//    In fp16 the codes of rows gid + 8 are read in place as 1024 + 16·c
//    (ActTraits::kHiInPlace): one shift per word of 8 codes instead of three.
//  * Per group of G inputs, Σ(c·s + m)·x = s·Σ(128 + c)·x + (m − 128·s)·Σx.
//    Σx per token and group: each warp sums its own groups' activations with
//    all-ones mmas on the fragments it already holds (ones_chunk_mmas), in
//    the lanes and layout the combine wants. Until session 39 a small kernel
//    launched before each call (xsum_kernel) wrote Σx; that extra link in
//    the chain of dependent launches cost more than the mmas (fused 8B stack
//    at 16 tokens 1.844 → 1.757-1.761 ms, at 4 tokens 1.601 → 1.493-1.502;
//    docs/results/s39/).
//  * The structure is the integer GEMV's: one block per 16-row tile (or two),
//    its warps take interleaved groups; each warp streams its groups' codes and
//    scale/min pairs through a cp.async ring in shared memory addressed by
//    32-bit shared-window addresses held in registers; the activations of the
//    warp's next group are loaded one group ahead; the warps meet in shared
//    memory at the end. Programmatic dependent launch: the ring's first stages
//    are in flight before the kernel waits for the kernel that wrote x, and
//    once that wait returns the kernel lets the next one launch (session 43).
//  * 9..16 tokens on matrices of many row tiles on sm_90 (the head, gate|up)
//    take w4a16_resident_x_kernel instead: the call's activations resident in
//    shared memory, Σx summed there once per block, whole units per warp; so
//    do 17..24 tokens, on three token tiles (session 47).
//  * Tokens are the mma's N side (8 per tile, NT tiles). A token column past M
//    reads token M − 1's row (any valid memory will do: an mma's output column
//    depends only on its own input column, and those columns are not stored).
//  * 17..24 tokens, exact, on three token tiles (session 45), where the grid
//    has two-tile warps, staged activations or fewer tiles than SMs: in the
//    8B stack q|k|v 12.18 -> 10.81 us, down 23.17 -> 18.35, 1024 × 4096 6.72
//    -> 5.52 against the rounded path below; 14336 × 4096 19.75 -> 17.92
//    against the wgmma kernel. One-tile grids of 1-2 tiles per SM lost (o:
//    8.35 -> 9.32 us) and stay rounded, as do 25..32 tokens (four exact
//    tiles, 158-224 registers: fused stack M = 32 2.82 -> 3.00 ms).
//  * Otherwise more than 16 tokens (w4a16_exact_weights false): the same kernel on blocks
//    of up to 32 tokens (4 token tiles), each weight decoded once to
//    fl16(c·s + m) (and-or, subtract, fused multiply-add per pair) and used by
//    all of them; the mma accumulates the outputs directly. This replaced the
//    general kernel's register-carried weights at more than 16 tokens. On
//    sm_90 GPUs, 17..64 tokens (and fp16 beyond, in blocks of 64) take the
//    wgmma kernel instead (w4a16_wgmma.cu; fused 8B stack at 64 tokens 7.2 →
//    3.9 ms); this path serves other GPUs.
#include "backend/cuda/check.h"
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_gemv.h"
#include "backend/cuda/w4a16_small_m.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

namespace nibble::cuda {

namespace {

using namespace w4a16;

// The resident kernel keeps Σx for 8·NT token slots per group, and (KS = 2)
// RP(NT) partial-sum slots per warp: two unit parities at two token tiles,
// one at three (24 tokens of x leave no room for a second).
__host__ __device__ constexpr int resident_parities(int nt) { return nt == 2 ? 2 : 1; }

// One block per R consecutive 16-row tiles; its `wpt` warps take interleaved
// groups of all R tiles, so each activation fragment loaded is used R times
// (at 16 tokens and R = 1 the activations were 4× the weights' bytes through
// L1, and their loads' latency the kernel's largest stall). NT token tiles of
// 8, CPG chunks of 64 inputs per group (1: G = 64, 2: G = 128). PF: load the
// next group's activations one group ahead (a second register buffer).
// EXACT = false (more than 16 tokens, w4a16_exact_weights): each weight is
// decoded to fl16(c·s + m) and the mma accumulates the outputs directly (no
// Σx, no per-group partial sums: 4 token tiles would not fit in registers
// twice); the activations are loaded per chunk, when needed.
// The ring has two stages per warp and the main loop is unrolled by two, so
// the stage of every access is a constant and no registers are copied.
template <typename T, typename OutT, int NT, int CPG, int R, bool PF, bool EXACT, int GPC = 1>
__global__ void __launch_bounds__(NT == 1 ? 512 : 256)
    w4a16_small_m_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta, const T* __restrict__ x,
                         int64_t ldx, OutT* __restrict__ y, int64_t ldy, int M, int N, int K, int tiles, int chunks,
                         int groups, int groups_padded) {
  constexpr int S = 2, G = CPG * kChunk;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpt = blockDim.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * R;
  // The warp's next group: weights to issue (ws.gi), activations to load (gx,
  // running pointers xp).
  static_assert(GPC == 1 || !EXACT, "groups of 32 (two per chunk) take the rounded path only");
  WeightStream<R, CPG, GPC> ws(codes, meta, tile0, tiles, chunks, groups_padded, warp, wpt);
  const T* xp[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n) xp[n] = x + static_cast<int64_t>(min(n * 8 + gid, M - 1)) * ldx + warp * G + 16 * tig;
  uint32_t rq = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + (warp * S * R * CPG * 32 + lane) * 16;
  uint32_t rm = static_cast<uint32_t>(__cvta_generic_to_shared(smem)) + wpt * S * R * CPG * 32 * 16 +
                (warp * S * R * 32 + lane) * 8;
  asm volatile("" : "+l"(ws.cp), "+l"(ws.mp), "+r"(rq), "+r"(rm));
  const int64_t xp_step = static_cast<int64_t>(wpt) * G;
  int gx = warp;

  auto issue = [&](auto stage) {  // group ws.gi into `stage`
    ws.template issue<decltype(stage)::value>(rq, rm, groups, chunks);
    cp_async_commit();
  };
  using X = uint4[CPG][NT][2];
  auto load_x = [&](X& xb) {  // group gx's activations
    if ((gx + 1) * G <= K) {  // a whole group (warp-uniform)
#pragma unroll
      for (int u = 0; u < CPG; ++u)
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          xb[u][n][0] = __ldg(reinterpret_cast<const uint4*>(xp[n] + u * kChunk));
          xb[u][n][1] = __ldg(reinterpret_cast<const uint4*>(xp[n] + u * kChunk + 8));
        }
    } else {  // the last group of a ragged K
#pragma unroll
      for (int u = 0; u < CPG; ++u) {
        const int k = (gx * CPG + u) * kChunk + 16 * tig;
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          const T* row = xp[n] - gx * G - 16 * tig;
          xb[u][n][0] = load_x8(row, k, K, true);
          xb[u][n][1] = load_x8(row, k + 8, K, true);
        }
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) xp[n] += xp_step;
    gx += wpt;
  };
  float out[R][NT][4];
  zero_acc(out);
  // Group g (the warp's i-th) from `stage`, with its activations xb.
  auto compute = [&](auto stage, int g, const X& xb) {
    constexpr int st = decltype(stage)::value;
    if constexpr (!EXACT) {                 // activations loaded here, weights decoded to 16 bits
      const bool whole = (g + 1) * G <= K;  // warp-uniform
#pragma unroll
      for (int u = 0; u < CPG; ++u) {
        if (CPG > 1 && g * CPG + u >= chunks) break;
        uint4 xv[NT][2];
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          if (whole) {
            xv[n][0] = __ldg(reinterpret_cast<const uint4*>(xp[n] + u * kChunk));
            xv[n][1] = __ldg(reinterpret_cast<const uint4*>(xp[n] + u * kChunk + 8));
          } else {
            const int k = (g * CPG + u) * kChunk + 16 * tig;
            const T* row = xp[n] - g * G - 16 * tig;
            xv[n][0] = load_x8(row, k, K, true);
            xv[n][1] = load_x8(row, k + 8, K, true);
          }
        }
#pragma unroll
        for (int r = 0; r < R; ++r) {
          uint32_t a[4][4];
          decode_chunk<T>(lds128(rq + ((st * R + r) * CPG + u) * 512), lds64(rm + (st * R + r) * 256), a);
#pragma unroll
          for (int s = 0; s < 4; ++s)
#pragma unroll
            for (int n = 0; n < NT; ++n) {
              const uint4& x2 = xv[n][s >> 1];
              mma_16816<T>(out[r][n], a[s], (s & 1) ? x2.z : x2.x, (s & 1) ? x2.w : x2.y);
            }
        }
      }
#pragma unroll
      for (int n = 0; n < NT; ++n) xp[n] += xp_step;
    } else {
      float acc[R][NT][4], sx[1][NT][4];  // the group's sums, and its Σx (all-ones mmas)
      zero_acc(acc);
      zero_acc(sx);
#pragma unroll
      for (int u = 0; u < CPG; ++u) {  // no branch for a ragged last chunk: load_x zeroed its activations
        uint4 q[R];
#pragma unroll
        for (int r = 0; r < R; ++r) q[r] = lds128(rq + ((st * R + r) * CPG + u) * 512);
        exact_chunk_mmas<T, R, NT>(acc, q, xb[u]);
        ones_chunk_mmas<T, NT>(sx[0], xb[u]);
      }
      uint2 sm[R];
#pragma unroll
      for (int r = 0; r < R; ++r) sm[r] = lds64(rm + (st * R + r) * 256);
      exact_combine<T, R, NT>(out, acc, sm, ones_sums(sx[0]).v);
    }
  };
  const int iters = warp < groups ? (groups - warp + wpt - 1) / wpt : 0;
  using C0 = std::integral_constant<int, 0>;
  using C1 = std::integral_constant<int, 1>;
  issue(C0{});
  grid_dependency_wait();  // weights are in flight; x is the previous kernel's output
  // The next kernel may launch now: its blocks take each SM this grid's
  // blocks leave and issue their first weights while this grid's last blocks
  // finish (session 43: fused 8B stack M = 4 1.445-1.452 -> 1.411-1.420 ms,
  // M = 8 1.552-1.559 -> 1.489-1.494; M = 16 unchanged, 1.682-1.697 against
  // 1.683-1.687). Triggering after the main loop, as before, held the next
  // grid back until every block got there. Every block has started once all
  // have triggered, so the next grid cannot take an SM one of ours waits for.
  grid_dependents_launch();
  if constexpr (PF && EXACT) {
    // Group i from stage i % 2 with activations in buffer i % 2; group i + 1's
    // are loaded meanwhile into the other buffer.
    X xa, xb;
    auto step = [&](auto stage, int i, const X& xc, X& xn) {
      issue(std::integral_constant<int, 1 - decltype(stage)::value>{});
      if (i + 1 < iters) load_x(xn);
      cp_async_wait<1>();
      compute(stage, warp + i * wpt, xc);
    };
    if (iters > 0) load_x(xa);
    for (int i = 0; i < iters; i += 2) {
      step(C0{}, i, xa, xb);
      if (i + 1 >= iters) break;
      step(C1{}, i + 1, xb, xa);
    }
  } else {
    X xa;
    auto step = [&](auto stage, int i) {
      issue(std::integral_constant<int, 1 - decltype(stage)::value>{});
      if constexpr (EXACT) load_x(xa);
      cp_async_wait<1>();
      compute(stage, warp + i * wpt, xa);
    };
    for (int i = 0; i < iters; i += 2) {
      step(C0{}, i);
      if (i + 1 >= iters) break;
      step(C1{}, i + 1);
    }
  }

  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(wpt) * S * R * stage_bytes(CPG));
  store_tile_outputs<R, NT>(out, red, wpt, y, ldy, tile0 * kTileRows, M, N);
}

// Two to eight tokens where the grid is resident at once (session 23): the
// exact path with each lane's activations carried through its own cp.async
// ring stage beside the weights (Σx, until session 39, too), so no activation registers are held
// across groups and no activation load is on a group's critical path; the
// group body has no branch, and its R·NT accumulator chains are interleaved.
// Activations past K are zero-filled by the copy, so a ragged last chunk needs
// no branch either: its stale codes multiply zeros (any code decodes to a
// finite 128 + c). Stage layout per warp, lane-major so that every 16-byte
// shared load is conflict-free: codes [S][R][CPG] × 512 B and scale/min pairs
// [S][R] × 256 B (as the kernel above), then activations [S][CPG][NT][2] ×
// 512 B.
// KS > 1 (launch_staged_split; 9..16 tokens, sm_90): the KS blocks of a
// cluster take the same R = 4 tiles, each its share of the groups; the block's
// warps meet in shared memory, ranks 1.. write their sums into rank 0's, which
// adds them in rank order and stores.
// Measured on the H200 (docs/results/s23/): fused 8B stack M = 2 1.68 → 1.60
// ms, M = 4 1.70 → 1.60, M = 8 1.73 → 1.67. At 9..16 tokens (4 KB of
// activations per stage and warp) only on narrow matrices with long rows
// (launch_small; since session 32). Not used:
//  * at 9..16 tokens on wide matrices: 14336 × 4096 15.5 → 17.5 µs, the head
//    105 → 120 µs, fused stack 2.08 → 2.25 ms; the shared memory the stages
//    take is L1 that main's kernel uses to share the activations between warps;
//  * for grids larger than one wave (the head: 81.5 → 84.0 µs at M = 4);
//  * with one row tile per warp (fused M = 4 2.00 ms) or three stages (1.76).
// Up to 8 tokens the launch bounds ask for one block of 512 threads per SM
// (session 42): without a minimum, ptxas kept these kernels at 64 registers,
// and at groups of 128 spilled 16 bytes; now 72 (groups of 128) and 92 (64),
// no spills. Fused 8B stack M = 4 1.518-1.530 → 1.443-1.458 ms; groups of 64, M =
// 2..8 1.94-1.96 → 1.79-1.80 ms (docs/results/s42/).
template <int NT, int CPG, int R>
__host__ __device__ constexpr size_t staged_stage_bytes() {
  return R * stage_bytes(CPG) + CPG * NT * 2 * 512;
}

template <typename T, typename OutT, int NT, int CPG, int R, int S, int KS>
__global__ void __launch_bounds__(NT == 1 ? 512 : 256, NT == 1 ? 1 : 0)
    w4a16_staged_x_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta, const T* __restrict__ x,
                          int64_t ldx, OutT* __restrict__ y, int64_t ldy, int M, int N, int K, int tiles, int chunks,
                          int groups, int groups_padded) {
  constexpr int G = CPG * kChunk, XI = CPG * NT * 2;
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpt = blockDim.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  // KS > 1: the KS blocks of a cluster take the same R tiles, rank r the
  // groups g0 .. g1 − 1 of its share of K; rank 0 adds the others' sums.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  constexpr bool kClusters = false;  // launch_staged_split runs it on sm_90 only
  if constexpr (KS > 1) __trap();
#else
  constexpr bool kClusters = KS > 1;
#endif
  uint32_t rank = 0;
  if constexpr (kClusters) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const int share = (groups + KS - 1) / KS, g0 = static_cast<int>(rank) * share, g1 = min(groups, g0 + share);
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) / KS * R;
  WeightStream<R, CPG> ws(codes, meta, tile0, tiles, chunks, groups_padded, g0 + warp, wpt);
  const T* xp[NT];
#pragma unroll
  for (int n = 0; n < NT; ++n)
    xp[n] = x + static_cast<int64_t>(min(n * 8 + gid, M - 1)) * ldx + (g0 + warp) * G + 16 * tig;
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint32_t rq = base + (warp * S * R * CPG * 32 + lane) * 16;
  uint32_t rm = base + wpt * S * R * CPG * 512 + (warp * S * R * 32 + lane) * 8;
  uint32_t rx = base + wpt * S * R * stage_bytes(CPG) + (warp * S * XI * 32 + lane) * 16;
  asm volatile("" : "+l"(ws.cp), "+l"(ws.mp), "+r"(rq), "+r"(rm), "+r"(rx));
  const int64_t xp_step = static_cast<int64_t>(wpt) * G;
  int gx = g0 + warp;

  auto issue_w = [&](auto stage) { ws.template issue<decltype(stage)::value>(rq, rm, g1, chunks); };
  auto issue_x = [&](auto stage) {
    constexpr int st = decltype(stage)::value;
    if (gx < g1) {
      if ((gx + 1) * G <= K) {
#pragma unroll
        for (int u = 0; u < CPG; ++u)
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              cp_async16_ca_s(rx + (((st * CPG + u) * NT + n) * 2 + h) * 512, xp[n] + u * kChunk + 8 * h);
      } else {
#pragma unroll
        for (int u = 0; u < CPG; ++u)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int k = gx * G + u * kChunk + 16 * tig + 8 * h;
            const int bytes = max(0, min(16, (K - k) * static_cast<int>(sizeof(T))));
#pragma unroll
            for (int n = 0; n < NT; ++n)
              cp_async16_ca_s(
                  rx + (((st * CPG + u) * NT + n) * 2 + h) * 512,
                  bytes > 0 ? static_cast<const void*>(xp[n] + u * kChunk + 8 * h) : static_cast<const void*>(x),
                  bytes);
          }
      }
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) xp[n] += xp_step;
    gx += wpt;
  };
  float out[R][NT][4];
  zero_acc(out);
  auto compute = [&](auto stage) {
    constexpr int st = decltype(stage)::value;
    float acc[R][NT][4], sx[1][NT][4];  // the group's sums, and its Σx (all-ones mmas)
    zero_acc(acc);
    zero_acc(sx);
#pragma unroll 1
    for (int u = 0; u < CPG; ++u) {
      uint4 q[R];
#pragma unroll
      for (int r = 0; r < R; ++r) q[r] = lds128(rq + ((st * R + r) * CPG + u) * 512);
      uint4 xv[NT][2];
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int h = 0; h < 2; ++h) xv[n][h] = lds128(rx + (((st * CPG + u) * NT + n) * 2 + h) * 512);
      exact_chunk_mmas<T, R, NT>(acc, q, xv);
      ones_chunk_mmas<T, NT>(sx[0], xv);
    }
    uint2 sm[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sm[r] = lds64(rm + (st * R + r) * 256);
    exact_combine<T, R, NT>(out, acc, sm, ones_sums(sx[0]).v);
  };
  const int iters = g0 + warp < g1 ? (g1 - g0 - warp + wpt - 1) / wpt : 0;
  // Prologue: the first S − 1 groups' weights before the wait, their
  // activations after it (two commit groups).
  static_for<S - 1>([&](auto p) { issue_w(p); });
  cp_async_commit();
  grid_dependency_wait();
  grid_dependents_launch();  // the next kernel may launch (as in the kernel above)
  static_for<S - 1>([&](auto p) { issue_x(p); });
  cp_async_commit();
  for_ring_stages<S>(iters, [&](auto stage, int i) {
    constexpr int st = decltype(stage)::value;
    using Next = std::integral_constant<int, (st + S - 1) % S>;
    issue_w(Next{});
    issue_x(Next{});
    cp_async_commit();
    // Group i + st was committed S − 1 commits ago (in steady state), or
    // in the prologue's last commit (st + 1 commits ago) on the first pass.
    if (i == 0 && st < S - 1) {
      cp_async_wait<(st + 1 < S - 1 ? st + 1 : S - 1)>();
    } else {
      cp_async_wait<S - 1>();
    }
    compute(stage);
  });
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(wpt) * S * staged_stage_bytes<NT, CPG, R>());
  if constexpr (!kClusters) {
    store_tile_outputs<R, NT>(out, red, wpt, y, ldy, tile0 * kTileRows, M, N);
  } else {
    // The block's warps meet in `red` (as store_tile_outputs); rank k > 0
    // puts its block sums into slot k − 1 of rank 0's `part`, and rank 0 adds
    // them in rank order and stores.
    constexpr int kRows = R * kTileRows, kOut = NT * 8 * kRows;
    warps_meet<R, NT>(out, red);
    float* part = red + wpt * kOut;  // [KS − 1][kOut]
    for (int i = threadIdx.x; i < kOut; i += blockDim.x) {
      const float v = warps_sum<R, NT>(red, wpt, i);
      if (rank == 0) {
        red[i] = v;  // only this thread reads index i of any warp's slice
      } else {
        const uint32_t dst =
            mapa_shared(static_cast<uint32_t>(__cvta_generic_to_shared(part + (rank - 1) * kOut + i)), 0);
        asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(dst), "f"(v) : "memory");
      }
    }
    cluster_sync();  // the other ranks' sums are in rank 0's `part`; none reads another rank's memory after this
    if (rank == 0) {
      for (int i = threadIdx.x; i < kOut; i += blockDim.x) {
        float v = red[i];
        for (int k = 0; k < KS - 1; ++k) v += part[k * kOut + i];
        const int tok = i / kRows;
        const int64_t row = tile0 * kTileRows + i % kRows;
        if (tok < M && row < N) y[tok * ldy + row] = to_out<OutT>(v);
      }
    }
  }
}

// 9..16 tokens on matrices of many row tiles (sm_90; session 36): the
// activations resident in shared memory. The block (one per SM, up to 16
// warps) bulk-copies the call's x rows (its slice of K) into shared memory
// once, each row padded to a stride of 16 mod 128 bytes so that the lanes'
// 16-byte fragment loads are conflict-free, and sums Σx per (group, token)
// from there with an all-ones mma (no Σx kernel before it). Then each warp
// walks whole units of R = 2 row tiles over its K, one group per ring stage,
// its next unit's weights streaming through its cp.async ring across unit
// boundaries, and stores each unit's outputs itself (no meeting of warps).
// Units go to blocks (clusters) round robin, so they differ by at most one.
// KS = 2 (matrices with too few units for 16 warps a block, w4a16_resident_x_ks):
// the two blocks of a cluster take the two halves of K for the same units
// (half the copy of x per SM), and rank 1 hands each unit's partial sums to
// rank 0 through rank 0's shared memory (a slot per warp and unit parity, a
// full and an empty mbarrier each), which adds them in rank order and stores.
// Measured on the H200 (docs/results/s36/): the 128256 x 4096 head at 16
// tokens 99.4-101.2 -> 81.5-83.9 us (61 -> 75 % of the read bandwidth; with
// KS = 2 88.1-88.5); gate|up with KS = 2 about 1 us a call faster; fused 8B
// stack 1.944-1.958 -> 1.892-1.896 ms. Not used where it lost: gate|up with the
// whole K per block (one tile per warp, 14 warps: fused stack 2.013 ms),
// where every SM copies all of x (128 KiB, from L2) before its first group.
// Also measured and not kept: 3 or 4 ring stages with 12 or 9 warps (head
// 87-105 us), one tile per warp (89.5), an L2 prefetch of the weights 8-24
// groups ahead (110-128), x copied in pieces starting at a different piece
// per block (-0.6 us). Session 37: the weights' tile offsets set once per
// unit (32-bit) instead of a 64-bit multiply per group and tile (SASS: the
// copies' issue 48 -> 22 instructions, the group 273 -> 268): gate|up 23.6 -> 22.6 us,
// the head 84.1-84.5 -> 83.0-83.6 (docs/results/s37/ab_issue_offsets.txt).
// Then the activation rows' and Σx's lane addresses kept in registers with
// running offsets (268 -> 256 per group, 104-105 registers): gate|up 22.44 ->
// 22.34 us, fused M = 16 1.856-1.862 -> 1.840-1.845 ms (ab_pinned_addresses.txt).
// NT = 3 (17..24 tokens; session 47): 24 token slots of x, Σx
// of the third tile by the all-ones mma with x as its B operand (its sums in
// every row, stored by the lanes of gid 0), one partial-sum parity per warp
// (two do not fit beside 24 rows of x: the head's block takes 232320 of the
// 232448 bytes), 128 registers, no spill. Against the wgmma kernel that took
// these calls (docs/results/s47/resident24/): gate|up at 17 / 24 tokens
// 31.35 / 31.25 -> 26.89 / 27.46 us, the head 132.2 / 122.3 -> 103.2 / 103.7;
// fused 8B stack M = 17 2.359-2.385 -> 2.218-2.234 ms, M = 20 2.375-2.392 ->
// 2.277-2.292, M = 24 2.391-2.409 -> 2.345-2.353; fp16 M = 17 2.373 -> 2.153.
// Groups of 64 (resident24_g64/): gate|up at 17 tokens 41.25 -> 31.22 us, the
// head 160.5 -> 121.1; fused stack M = 17 2.995-3.005 -> 2.627-2.630 ms, M = 24
// 3.034-3.036 -> 2.728-2.742, fp16 M = 17 3.527 -> 2.570.
__host__ __device__ constexpr uint32_t resident_x_stride(int K, int elem) {
  return (static_cast<uint32_t>(K) * elem + 127u) / 128u * 128u + 16u;
}

template <typename T, typename OutT, int NT, int CPG, int R, int S, int KS>
__global__ void __launch_bounds__(512, 1)
    w4a16_resident_x_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta, const T* __restrict__ x,
                            int64_t ldx, OutT* __restrict__ y, int64_t ldy, int M, int N, int tiles, int chunks,
                            int groups, int groups_padded) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __trap();  // bulk copies and mbarriers need sm_90 (launch_resident refuses older GPUs)
#else
  static_assert(NT == 2 || NT == 3, "9..16 or 17..24 tokens");
  constexpr int G = CPG * kChunk, kSlots = 8 * NT, P = resident_parities(NT);
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wpb = blockDim.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  // K split over the KS blocks of a cluster: rank `rank` takes groups g0 ..
  // g0 + gpr − 1 (its x slice, Σx and weights), and rank 0 adds the others'
  // partial outputs of each unit (fixed rank order) and stores them.
  uint32_t rank = 0;
  if constexpr (KS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
  const int gpr = groups / KS, g0 = static_cast<int>(rank) * gpr;
  const uint32_t xstride = resident_x_stride(gpr * G, sizeof(T));
  const uint32_t bar = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full0 = bar + 8, empty0 = full0 + 8 * P * wpb;  // per warp and slot parity (KS > 1)
  const uint32_t xs = bar + 1024;
  const uint32_t sx = xs + kSlots * xstride;  // Σx [local group][8·NT tokens], f32
  const uint32_t ring = sx + gpr * kSlots * 4;
  const uint32_t red = ring + wpb * S * R * static_cast<uint32_t>(stage_bytes(CPG));  // [warp][parity][lane] × R·NT·16 B
  uint32_t rq = ring + (warp * S * R * CPG * 32 + lane) * 16;
  uint32_t rm = ring + wpb * S * R * CPG * 512 + (warp * S * R * 32 + lane) * 8;
  uint32_t xl[NT];  // this lane's fragment row of each token tile (tokens past M read token M − 1)
#pragma unroll
  for (int n = 0; n < NT; ++n) xl[n] = xs + min(n * 8 + gid, M - 1) * xstride + 32 * tig;
  uint32_t sxl = sx + 8 * tig;  // Σx of this lane's tokens 2tig, 2tig + 1 (+ n·8) in group 0
  // Kept in registers: recomputed from the block's shared window in every
  // group, they cost about 12 instructions a group.
  asm volatile("" : "+r"(rq), "+r"(rm), "+r"(xl[0]), "+r"(xl[1]), "+r"(sxl));
  if constexpr (NT > 2) asm volatile("" : "+r"(xl[2]));
  if (threadIdx.x == 0) {
    mbar_init(bar, 1);
    if constexpr (KS > 1)
      for (int i = 0; i < 2 * P * wpb; ++i) mbar_init(full0 + 8 * i, 32);  // full and empty: every lane arrives
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  if constexpr (KS > 1)
    cluster_sync();
  else
    __syncthreads();

  // The warp's units: gw, gw + stride, ... with gw = warp·clusters + cluster
  // (the same units for every rank of the cluster).
  const int units = (tiles + R - 1) / R, blocks = static_cast<int>(gridDim.x) / KS;
  const int gw = warp * blocks + static_cast<int>(blockIdx.x) / KS, ustride = wpb * blocks;
  const int my_units = gw < units ? (units - gw + ustride - 1) / ustride : 0;
  const int iters = my_units * gpr;
  // The next group to issue: unit iu, group ig, its first tile's codes and
  // scale/min pairs at cq and cm (this lane's), tile r's at + q_off[r] and
  // m_off[r] (r·tile stride, set per unit: a tile past the matrix reads the
  // last one; its outputs are not stored). The offsets are 32-bit, so the
  // group's addresses cost no 64-bit multiply.
  int iu = gw, ig = 0;
  const int64_t cq_tile = static_cast<int64_t>(chunks) * 32, cm_tile = static_cast<int64_t>(groups_padded) * 8;
  const uint4* cq = codes + static_cast<int64_t>(gw) * R * cq_tile + g0 * CPG * 32 + lane;
  const uint2* cm = meta + static_cast<int64_t>(gw) * R * cm_tile + g0 * 8 + (lane >> 2);
  int q_off[R], m_off[R];
  auto unit_start = [&] {
    const int last_r = min(R, tiles - iu * R) - 1;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      q_off[r] = min(r, last_r) * chunks * 32;
      m_off[r] = min(r, last_r) * groups_padded * 8;
    }
  };
#pragma unroll
  for (int r = 0; r < R; ++r) q_off[r] = m_off[r] = 0;
  if (iu < units) unit_start();
  auto issue = [&](auto stage) {
    constexpr int st = decltype(stage)::value;
    if (iu < units) {
#pragma unroll
      for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int u = 0; u < CPG; ++u) cp_async16_s(rq + ((st * R + r) * CPG + u) * 512, cq + q_off[r] + u * 32);
        cp_async8_s(rm + (st * R + r) * 256, cm + m_off[r]);
      }
    }
    cq += CPG * 32;
    cm += 8;
    if (++ig == gpr) {
      ig = 0;
      iu += ustride;
      cq += (static_cast<int64_t>(ustride) * R - 1) * cq_tile + (cq_tile - gpr * CPG * 32);
      cm += (static_cast<int64_t>(ustride) * R - 1) * cm_tile + (cm_tile - gpr * 8);
      if (iu < units) unit_start();
    }
    cp_async_commit();
  };
  // The prologue: S − 1 groups of weights in flight before the dependency wait.
  static_for<S - 1>([&](auto p) { issue(p); });
  grid_dependency_wait();  // x is the previous kernel's output
  grid_dependents_launch();  // the next kernel may launch (as in the kernel above)
  if (threadIdx.x == 0) {
    const unsigned row_bytes = static_cast<unsigned>(gpr * G) * sizeof(T);
    mbar_expect_tx(bar, row_bytes * M);
    for (int t = 0; t < M; ++t) bulk_copy(xs + t * xstride, x + t * ldx + g0 * G, row_bytes, bar);
  }
  mbar_wait(bar, 0);

  // One group's activation fragments of chunk u (16 consecutive inputs per
  // lane and token tile, the layout's k order).
  auto load_xv_at = [&](uint32_t off, uint4 (&xv)[NT][2]) {
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      xv[n][0] = lds128(xl[n] + off);
      xv[n][1] = lds128(xl[n] + off + 16);
    }
  };
  auto load_xv = [&](int g, int u, uint4 (&xv)[NT][2]) {
    load_xv_at((g * G + u * kChunk) * static_cast<uint32_t>(sizeof(T)), xv);
  };
  // Σx per (group, token slot) by all-ones mmas (ones_chunk_mmas: one per
  // k-step for the 16 tokens); the lanes of tig 0 hold tokens gid and gid + 8.
  for (int g = warp; g < gpr; g += wpb) {
    float acc[NT][4] = {};
#pragma unroll
    for (int u = 0; u < CPG; ++u) {
      uint4 xv[NT][2];
      load_xv(g, u, xv);
      ones_chunk_mmas<T, NT>(acc, xv);
    }
    if (tig == 0) {
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sx + (g * kSlots + gid) * 4), "f"(acc[0][0]) : "memory");
      asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sx + (g * kSlots + gid + 8) * 4), "f"(acc[0][2])
                   : "memory");
    }
    if constexpr (NT == 3) {  // the third tile's sums (the B operand): tokens 16 + 2tig, + 1 in every row
      if (gid == 0)
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sx + (g * kSlots + 16 + 2 * tig) * 4),
                     "f"(acc[2][0]), "f"(acc[2][1])
                     : "memory");
    }
  }
  __syncthreads();

  float out[R][NT][4];
  zero_acc(out);
  int cu = gw, cg = 0;  // the group to compute: unit cu, group cg
  uint32_t xo = 0, so = sxl;  // group cg's byte offset in the x rows, and this lane's Σx of it
  for_ring_stages<S>(iters, [&](auto stage, int) {
    constexpr int st = decltype(stage)::value;
    issue(std::integral_constant<int, (st + S - 1) % S>{});
    cp_async_wait<S - 1>();
    float acc[R][NT][4];
    zero_acc(acc);
#pragma unroll
    for (int u = 0; u < CPG; ++u) {
      uint4 q[R];
#pragma unroll
      for (int r = 0; r < R; ++r) q[r] = lds128(rq + ((st * R + r) * CPG + u) * 512);
      uint4 xv[NT][2];
      load_xv_at(xo + u * kChunk * static_cast<uint32_t>(sizeof(T)), xv);
      exact_chunk_mmas<T, R, NT>(acc, q, xv);
    }
    float2 sb[NT];
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      const uint2 v = lds64(so + n * 8 * 4);
      sb[n] = make_float2(__uint_as_float(v.x), __uint_as_float(v.y));
    }
    uint2 sm[R];
#pragma unroll
    for (int r = 0; r < R; ++r) sm[r] = lds64(rm + (st * R + r) * 256);
    exact_combine<T, R, NT>(out, acc, sm, sb);
    xo += G * static_cast<uint32_t>(sizeof(T));
    so += kSlots * 4;
    if (++cg == gpr) {
      xo = 0;
      so = sxl;
      if constexpr (KS > 1) {
        // Slot k % P of this warp in rank 0's shared memory holds the other
        // ranks' partial sums of the warp's k-th unit (KS = 2: one rank).
        static_assert(KS == 2, "one partner rank");
        const unsigned k = static_cast<unsigned>((cu - gw) / ustride), p = k % P;
        const uint32_t slot = red + ((warp * P + p) * 32 + lane) * (R * NT * 16);
        const uint32_t full = full0 + 8 * (warp * P + p), empty = empty0 + 8 * (warp * P + p);
        float* o = &out[0][0][0];
        if (rank != 0) {
          if (k >= P) mbar_wait_cluster(empty, (k / P - 1) & 1);  // rank 0 has read unit k − P
          const uint32_t rs = mapa_shared(slot, 0), rf = mapa_shared(full, 0);
#pragma unroll
          for (int i = 0; i < R * NT * 4; i += 4)
            asm volatile("st.shared::cluster.v4.f32 [%0], {%1,%2,%3,%4};\n" ::"r"(rs + 4 * i), "f"(o[i]),
                         "f"(o[i + 1]), "f"(o[i + 2]), "f"(o[i + 3])
                         : "memory");
          asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(rf) : "memory");
        } else {
          mbar_wait_cluster(full, (k / P) & 1);
#pragma unroll
          for (int i = 0; i < R * NT * 4; i += 4) {
            const uint4 v = lds128(slot + 4 * i);
            o[i] += __uint_as_float(v.x);
            o[i + 1] += __uint_as_float(v.y);
            o[i + 2] += __uint_as_float(v.z);
            o[i + 3] += __uint_as_float(v.w);
          }
          const uint32_t re = mapa_shared(empty, 1);
          asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];\n" ::"r"(re) : "memory");
          store_tile_outputs<R, NT>(out, nullptr, 1, y, ldy, static_cast<int64_t>(cu) * R * kTileRows, M, N);
        }
      } else {
        store_tile_outputs<R, NT>(out, nullptr, 1, y, ldy, static_cast<int64_t>(cu) * R * kTileRows, M, N);
      }
      zero_acc(out);
      cg = 0;
      cu += ustride;
    }
  });
  cp_async_wait<0>();
  if constexpr (KS > 1) cluster_sync();  // no block leaves while its partner may still reach its memory
#endif
}

// Launches a small-M kernel (both kernels above take the same arguments).
template <typename Kernel, typename T, typename OutT>
void launch_small_m_kernel(Kernel kernel, const SmallMGrid& g, int64_t warps, size_t smem, bool pdl,
                           cudaStream_t stream, const DeviceLinear& w, const T* x, int64_t ldx, OutT* y, int64_t ldy,
                           int M) {
  launch_pdl(kernel, dim3(static_cast<unsigned>(g.blocks)), dim3(static_cast<unsigned>(warps * 32)), smem, stream, pdl,
             static_cast<const uint4*>(w.a.get()), static_cast<const uint2*>(w.b.get()), x, ldx, y, ldy, M,
             static_cast<int>(w.rows), static_cast<int>(w.cols), static_cast<int>(g.tiles), static_cast<int>(g.chunks),
             static_cast<int>(g.groups), static_cast<int>(g.groups_padded));
}

template <typename T, typename OutT, int NT, int CPG, int R, int S>
bool launch_staged(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy, cudaStream_t stream,
                   int sms, bool pdl) {
  const SmallMGrid g(w, CPG, R);
  constexpr int kMaxWarps = NT == 1 ? 16 : 8;
  const size_t smem_warp = S * staged_stage_bytes<NT, CPG, R>() + NT * 8 * R * kTileRows * 4;
  constexpr auto kernel = w4a16_staged_x_kernel<T, OutT, NT, CPG, R, S, 1>;
  max_dynamic_smem_once<kernel>(device_smem_cap(200 << 10));
  const int64_t fit = static_cast<int64_t>(device_smem_cap(200 << 10) / smem_warp);
  const int64_t most = std::min<int64_t>({kMaxWarps, g.groups, fit});
  const int64_t warps =
      one_wave_warps(reinterpret_cast<const void*>(kernel), g.blocks, most, g.groups, 1, smem_warp, sms);
  if (warps == 0) return false;  // more than one wave: the kernel above
  const size_t smem = warps == 1 ? S * staged_stage_bytes<NT, CPG, R>() : static_cast<size_t>(warps) * smem_warp;
  // Launched early, no more blocks on one SM than the even share
  // (even_share_smem). Groups of 64 on gate|up of the 8B stack (896 blocks of
  // 3 warps) lost about 6 us a call to the early launch without it (session
  // 42, docs/results/s42/g64_pdl_probe.txt), and launched without it since;
  // with the share and the early launch the fused 8B stack at groups of 64
  // took 1.583 -> 1.545 ms at 4 tokens, 1.583-1.588 -> 1.546-1.553 at 2 and 8
  // (session 48, docs/results/s48/even_share/).
  const size_t even = pdl ? even_share_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(warps * 32), smem,
                                            g.blocks, sms, device_smem_cap(200 << 10))
                          : smem;
  launch_small_m_kernel(kernel, g, warps, even, pdl, stream, w, x, ldx, y, ldy, M);
  return true;
}

// The staged kernel with K split over clusters of KS blocks (the same R tiles,
// rank k the k-th share of the groups), where the grid is resident at once.
template <typename T, typename OutT, int NT, int CPG, int R, int S, int KS>
bool launch_staged_split(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy,
                         cudaStream_t stream, int sms, bool pdl) {
  const SmallMGrid g(w, CPG, R);
  constexpr int kMaxWarps = NT == 1 ? 16 : 8;
  constexpr size_t kPart = (KS - 1) * NT * 8 * R * kTileRows * 4;  // rank 0's slots for the others' sums
  const size_t smem_warp = S * staged_stage_bytes<NT, CPG, R>() + NT * 8 * R * kTileRows * 4;
  constexpr auto kernel = w4a16_staged_x_kernel<T, OutT, NT, CPG, R, S, KS>;
  max_dynamic_smem_once<kernel>(device_smem_cap(200 << 10));
  const int64_t blocks = g.blocks * KS, share = (g.groups + KS - 1) / KS;
  const int64_t fit = static_cast<int64_t>((device_smem_cap(200 << 10) - kPart) / smem_warp);
  const int64_t most = std::min<int64_t>({kMaxWarps, share, fit});
  if (most < 1 || blocks > sms) return false;
  const int64_t warps = one_wave_warps(reinterpret_cast<const void*>(kernel), blocks, most, share, 1, smem_warp, sms);
  if (warps == 0) return false;
  cudaLaunchAttribute attr[2] = {};
  unsigned nattr = 0;
  if (pdl) attr[nattr++] = pdl_attribute();
  attr[nattr++] = cluster_attribute(KS);
  const size_t smem = static_cast<size_t>(warps) * smem_warp + kPart;
  // Every cluster resident at once, or not this kernel.
  if (int64_t{max_active_clusters<kernel>(static_cast<int>(warps * 32), smem, KS)} * KS < blocks) return false;
  launch_with(kernel, dim3(static_cast<unsigned>(blocks)), dim3(static_cast<unsigned>(warps * 32)), smem, stream, attr,
              nattr, static_cast<const uint4*>(w.a.get()), static_cast<const uint2*>(w.b.get()), x, ldx, y, ldy, M,
              static_cast<int>(w.rows), static_cast<int>(w.cols), static_cast<int>(g.tiles),
              static_cast<int>(g.chunks), static_cast<int>(g.groups), static_cast<int>(g.groups_padded));
  return true;
}

template <typename T, typename OutT, int NT, int CPG, int R, bool PF, bool EXACT, int GPC = 1>
void launch_small_r(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy, cudaStream_t stream,
                    int sms, bool pdl) {
  const SmallMGrid g(w, CPG, R);
  // Warps per block: at most one per group, at most 16 for one token tile and
  // 8 for more (whose warps hold 116-128 registers: two blocks of 8 warps per
  // SM), within 110 KiB of shared memory. With more than one token tile, as
  // many as keep the whole grid resident at once (one_wave_warps); else, and
  // for one token tile, ~32 resident per SM over the grid. Measured on the
  // H200 (bench_w4a16 fused stack, session 15): one wave took M = 16 from 2.186
  // to 2.052 ms, 32 from 3.730 to 3.567, 64 from 7.597 to 7.217, but M = 2..8
  // from 1.669-1.718 to 1.737-1.803 ms.
  constexpr int kMaxWarps = NT == 1 ? 16 : 8;
  const size_t smem_warp = 2 * R * stage_bytes(CPG) + NT * 8 * R * kTileRows * 4;  // ring + reduction
  constexpr auto kernel = w4a16_small_m_kernel<T, OutT, NT, CPG, R, PF, EXACT, GPC>;
  max_dynamic_smem_once<kernel>(device_smem_cap(110 << 10));
  const int64_t fit = static_cast<int64_t>(device_smem_cap(110 << 10) / smem_warp);
  const int64_t most = std::max<int64_t>(std::min<int64_t>({kMaxWarps, g.groups, fit}), 1);
  int64_t warps =
      NT > 1 ? one_wave_warps(reinterpret_cast<const void*>(kernel), g.blocks, most, g.groups, 1, smem_warp, sms) : 0;
  // Three token tiles (17..24 tokens) on grids of more than 4 blocks per SM
  // launch without the dependent launch. On the path of GPUs without wgmma
  // (NIBBLE_W4A16_WGMMA=0 on the H200) gate|up's 896 blocks at 17 tokens took
  // 45.97 us a call with it, 37.96 without (the head 125.8 -> 127.9), and the
  // fused 8B stack went 2.839-2.842 -> 2.482-2.483 ms at 17 tokens, 2.963-2.977
  // -> 2.555 at 24 (session 46, docs/results/s46/portable_pdl/). The
  // mechanism is not known: it is not the piling that launch_staged's even
  // share prevents (below). On sm_90 a call reaches it only where the resident-activation
  // kernel declines one it would take (x rows not 16-byte aligned, or
  // NIBBLE_W4A16_RESIDENT=0): the others that come here at 17..24 tokens are
  // matrices the wgmma grid would split, at most 16896 rows (528 blocks).
  // With that share (even_share_smem: these 896 one-warp blocks, 12 of which
  // fit per SM, capped at 7) and the early launch instead of this rule, the
  // stack took 2.48 -> 2.70 ms at 17 tokens on that path (session 48,
  // docs/results/s48/even_share/ab_small.txt).
  if (NT == 3 && g.blocks > 4 * int64_t{sms}) pdl = false;
  // Groups of 32 at 9..16 tokens launch without it too: the fused 8B stack at
  // 16 tokens took 3.123-3.130 ms with every kernel's early launch and
  // 2.691-2.694 without (an H100, session 80, docs/results/s80/h100-4), while
  // 4 and 64 tokens gained from it (1.980-1.982 against 2.089-2.092 ms, 7.168-
  // 7.174 against 7.388-7.396).
  if (GPC == 2 && NT == 2) pdl = false;
  if (warps == 0) warps = std::clamp<int64_t>(int64_t{sms} * 32 / std::max<int64_t>(g.blocks, 1), 1, most);
  launch_small_m_kernel(kernel, g, warps, static_cast<size_t>(warps) * smem_warp, pdl, stream, w, x, ldx, y, ldy, M);
}

// launch_small's choices at two or more token tiles, which
// w4a16_three_tiles_exact follows too: two-tile warps from 2 row tiles per SM,
// and staged activations (where their grid is one wave) for rows of at least
// 64 groups.
bool small_m_two_tiles(int64_t tiles, int sms) { return tiles >= 2 * int64_t{sms}; }
bool small_m_staged_rows(int64_t rows, int64_t cols, int group_size) {
  return SmallMGrid(rows, cols, group_size, group_size / kChunk, 2).groups >= 64;
}

// Row tiles per warp, measured on the H200 (bench_w4a16, docs/results/
// w4a16-small-m-s12.md): two where the grid stays large (x read once for two
// tiles), one for narrow matrices, whose few blocks need every warp they can
// get. Two tiles of two token tiles hold too many registers for the second
// activation buffer, so they load each group's activations when they need them.
// Up to 8 tokens, grids of two-tile warps that are resident at once take the
// staged kernel (activations through the ring; session 23); at 9..16 tokens,
// narrow matrices of at least 64 groups do (session 32).
template <typename T, typename OutT, int NT, int CPG>
void launch_small(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy, cudaStream_t stream,
                  int sms, bool pdl) {
  const int64_t tiles = (w.rows + kTileRows - 1) / kTileRows;
  const bool wide = NT == 1 ? tiles >= 256 : tiles >= 4 * int64_t{sms};
  // Two row tiles per warp: wide matrices, and at 9..16 tokens also those of
  // 2-4 tiles per SM (session 42: q|k|v at 16 tokens 8.41-8.52 -> 8.04-8.14
  // us over five calls; the fused stack at M = 16 3.5 us faster on average
  // over eight, within its noise; o, 1.9 tiles per SM, lost with two: 6.1 ->
  // 7.3 us in session 41).
  const bool two_tiles = NT == 1 ? wide : small_m_two_tiles(tiles, sms);
  if constexpr (NT == 1) {
    if (wide && launch_staged<T, OutT, NT, CPG, 2, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl)) return;
    // Groups of 64 where the staged grid is more than one wave (the head):
    // four row tiles per warp, so each group's ring bookkeeping and
    // activation loads serve twice the weights (session 42: the head at 4
    // tokens 101.4-101.8 -> 83.7-85.4 us, 65 -> 78 % of the read bandwidth;
    // fused stack M = 2..8 about 1 % faster; 100 registers, no spill).
    if constexpr (CPG == 1) {
      if (wide) return launch_small_r<T, OutT, NT, CPG, 4, true, true>(w, x, M, ldx, y, ldy, stream, sms, pdl);
    }
  }
  if constexpr (NT >= 2) {
    // 9..24 tokens on a narrow matrix (one-tile warps below) with long rows:
    // two-tile warps staging their activations, where that grid is resident
    // at once. Each warp reads its activations once for two tiles, and holds
    // none in registers. In the 8B stack that is down (4096 x 14336: 16.8 ->
    // 15.4 us; fused stack M = 16 1.977 -> 1.938 ms, session 32). On short rows
    // it lost (1024 x 4096 5.2 -> 6.0 us; with q|k|v and o too, fused 1.97 ->
    // 2.15 ms; a third ring stage, down 15.9 us; docs/results/s32/).
    // Session 39: first the same kernel with four-tile warps and K halved
    // over clusters of two blocks, where that grid is resident at once (sm_90;
    // NIBBLE_W4A16_SPLIT=0 turns it off): each SM takes in half of x for twice
    // the rows. Down 14.6-14.7 -> 13.0-13.1 us, fused stack M = 16 1.747-1.753
    // -> 1.691-1.692 ms. Also on matrices of 32-63 groups (o) it lost (6.1 ->
    // 6.3 us).
    if (!wide && small_m_staged_rows(w.rows, w.cols, w.group_size)) {
      const char* e = std::getenv("NIBBLE_W4A16_SPLIT");
      if ((e == nullptr || e[0] != '0') && w4a16_wgmma_device() &&
          launch_staged_split<T, OutT, NT, CPG, NT == 2 ? 4 : 2, 2, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl))
        return;
      if (launch_staged<T, OutT, NT, CPG, 2, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl)) return;
    }
  }
  if (two_tiles)
    launch_small_r<T, OutT, NT, CPG, 2, NT == 1, true>(w, x, M, ldx, y, ldy, stream, sms, pdl);
  else
    launch_small_r<T, OutT, NT, CPG, 1, true, true>(w, x, M, ldx, y, ldy, stream, sms, pdl);
}

// More than 16 tokens: 16-bit weights, blocks of at most 32 tokens (measured
// on the H200: 64 tokens as 8 token tiles at once took 165 registers and 8.37 ms
// for the fused stack, as two blocks of 32 about 7.5 ms; loading the activations
// per k-step to save registers, 12.2 ms).
// GPC = 2: groups of 32, two to a chunk (WeightStream), at every M >= 2.
template <typename T, typename OutT, int CPG, int GPC = 1>
void launch_rounded(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy, cudaStream_t stream,
                    int sms, bool pdl) {
  for (int m0 = 0; m0 < M; m0 += 32) {
    const int m = std::min(32, M - m0);
    const T* xm = x + m0 * ldx;
    OutT* ym = y + m0 * ldy;
    if (m <= 8)
      launch_small_r<T, OutT, 1, CPG, 1, false, false, GPC>(w, xm, m, ldx, ym, ldy, stream, sms, pdl);
    else if (m <= 16)
      launch_small_r<T, OutT, 2, CPG, 1, false, false, GPC>(w, xm, m, ldx, ym, ldy, stream, sms, pdl);
    else
      launch_small_r<T, OutT, 4, CPG, 1, false, false, GPC>(w, xm, m, ldx, ym, ldy, stream, sms, pdl);
  }
}

// The resident-activation kernel above: R = 2 row tiles per warp, S = 2 ring
// stages, at most 16 warps a block (one block per SM), and per block, with K
// split over KS blocks of a cluster, its warps and shared memory: the header
// of mbarriers, the x rows of 8·nt token slots (padded), Σx, the rings and
// (KS > 1) the partial-sum slots (resident_parities(nt) unit parities × 32
// lanes × R·nt·4 floats per warp).
constexpr int kResidentR = 2, kResidentS = 2, kResidentWarps = 16;
constexpr size_t kResidentSmemMax = 227 << 10;  // sm_90's opt-in shared memory per block
struct ResidentGrid {
  int64_t warps;
  size_t smem;
  ResidentGrid(int64_t rows, int64_t cols, int group_size, int sms, size_t elem, int ks, int nt) {
    const SmallMGrid g(rows, cols, group_size, group_size / kChunk, kResidentR);
    const int64_t gpr = g.groups / ks, clusters = sms / ks;
    const size_t slots = 8 * static_cast<size_t>(nt);
    warps = std::min<int64_t>(kResidentWarps, (g.blocks + clusters - 1) / clusters);
    smem = 1024 + slots * size_t{resident_x_stride(static_cast<int>(gpr * group_size), static_cast<int>(elem))} +
           static_cast<size_t>(gpr) * slots * 4 + warps * kResidentS * kResidentR * stage_bytes(group_size / kChunk) +
           (ks > 1 ? static_cast<size_t>(warps) * resident_parities(nt) * 32 * (kResidentR * nt * 4) * sizeof(float)
                   : 0);
  }
};

template <typename T, typename OutT, int NT, int CPG, int KS>
void launch_resident_ks(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy,
                        cudaStream_t stream, bool pdl, int sms) {
  const SmallMGrid g(w, CPG, kResidentR);
  const ResidentGrid rg(w.rows, w.cols, w.group_size, sms, sizeof(T), KS, NT);
  NIBBLE_CHECK(rg.smem <= kResidentSmemMax, "w4a16: {} bytes of shared memory", rg.smem);
  constexpr auto kernel = w4a16_resident_x_kernel<T, OutT, NT, CPG, kResidentR, kResidentS, KS>;
  max_dynamic_smem_once<kernel>(kResidentSmemMax);
  cudaLaunchAttribute attr[2] = {};
  unsigned nattr = 0;
  if (pdl) attr[nattr++] = pdl_attribute();
  if (KS > 1) attr[nattr++] = cluster_attribute(KS);
  launch_with(kernel, dim3(static_cast<unsigned>(sms / KS * KS)), dim3(static_cast<unsigned>(rg.warps * 32)),
              static_cast<size_t>(rg.smem), stream, attr, nattr, static_cast<const uint4*>(w.a.get()),
              static_cast<const uint2*>(w.b.get()), x, ldx, y, ldy, M, static_cast<int>(w.rows),
              static_cast<int>(g.tiles), static_cast<int>(g.chunks), static_cast<int>(g.groups),
              static_cast<int>(g.groups_padded));
}

// Launches it where it applies (w4a16_resident_x_ks; sm_90; x rows 16-byte
// aligned). NIBBLE_W4A16_RESIDENT=0 turns it off (for measurements).
template <typename T, typename OutT, int CPG>
bool launch_resident(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy, cudaStream_t stream,
                     bool pdl, int sms) {
  const int ks = w4a16_resident_x_ks(w.rows, w.cols, w.group_size, M, sms, sizeof(T));
  if (ks == 0) return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || (ldx * static_cast<int64_t>(sizeof(T))) % 16 != 0) return false;
  if (const char* e = std::getenv("NIBBLE_W4A16_RESIDENT"); e != nullptr && e[0] == '0') return false;
  if (!w4a16_wgmma_device()) return false;
  if (M > 16) {
    if (ks == 2)
      launch_resident_ks<T, OutT, 3, CPG, 2>(w, x, M, ldx, y, ldy, stream, pdl, sms);
    else
      launch_resident_ks<T, OutT, 3, CPG, 1>(w, x, M, ldx, y, ldy, stream, pdl, sms);
    return true;
  }
  if (ks == 2)
    launch_resident_ks<T, OutT, 2, CPG, 2>(w, x, M, ldx, y, ldy, stream, pdl, sms);
  else
    launch_resident_ks<T, OutT, 2, CPG, 1>(w, x, M, ldx, y, ldy, stream, pdl, sms);
  return true;
}

// Whether the kernels here run a call of M tokens (groups of 64 or 128) on
// exact weights: up to 16 tokens, and 17..24 on three token tiles where
// w4a16_three_tiles_exact says or the resident-activation kernel takes the
// call (where it then declines one, launch_small's exact kernels run it).
bool small_m_exact(int64_t rows, int64_t cols, int group_size, int64_t M, int sms) {
  return M <= 16 || (M <= 24 && (w4a16_three_tiles_exact(rows, cols, group_size, sms) ||
                                 (w4a16_wgmma_device() && w4a16_resident_x_ks(rows, cols, group_size, M, sms, 2) > 0)));
}

template <typename T, typename OutT>
void run_small(const DeviceLinear& w, const void* xv, int M, int64_t ldx, void* yv, int64_t ldy, cudaStream_t stream,
               bool pdl, int sms) {
  const T* x = static_cast<const T*>(xv);
  OutT* y = static_cast<OutT*>(yv);
  const int G = w.group_size;
  const bool g64 = G == 64;
  // Groups of 32: the rounded path (the exact one sums each k-step over both
  // of a chunk's groups, which its per-group combine cannot split).
  if (G == 32) return launch_rounded<T, OutT, 1, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl);
  if (!small_m_exact(w.rows, w.cols, G, M, sms))
    return g64 ? launch_rounded<T, OutT, 1>(w, x, M, ldx, y, ldy, stream, sms, pdl)
               : launch_rounded<T, OutT, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl);
  if (g64 ? launch_resident<T, OutT, 1>(w, x, M, ldx, y, ldy, stream, pdl, sms)
          : launch_resident<T, OutT, 2>(w, x, M, ldx, y, ldy, stream, pdl, sms))
    return;
  if (M <= 8)
    g64 ? launch_small<T, OutT, 1, 1>(w, x, M, ldx, y, ldy, stream, sms, pdl)
        : launch_small<T, OutT, 1, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl);
  else if (M <= 16)
    g64 ? launch_small<T, OutT, 2, 1>(w, x, M, ldx, y, ldy, stream, sms, pdl)
        : launch_small<T, OutT, 2, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl);
  else  // 17..24 tokens (w4a16_three_tiles_exact; groups of 64 only where the resident kernel declined)
    g64 ? launch_small<T, OutT, 3, 1>(w, x, M, ldx, y, ldy, stream, sms, pdl)
        : launch_small<T, OutT, 3, 2>(w, x, M, ldx, y, ldy, stream, sms, pdl);
}

}  // namespace

bool w4a16_three_tiles_exact(int64_t rows, int64_t cols, int group_size, int sms) {
  // Groups of 64 stay rounded (but where the resident-activation kernel
  // takes the call, small_m_exact): each shape was faster on three exact tiles
  // (o at 17 tokens 8.92 -> 7.67 us, down 25.39 -> 21.03), but the fused 8B
  // stack at groups of 64 took 3.00-3.01 -> 3.38-3.40 ms with programmatic
  // dependent launch (2.89-2.91 without it, against 3.07-3.09): the early
  // launch costs more there, as in session 42's staged gate|up at groups of
  // 64 (docs/results/s45/ntok24/g64_*.txt).
  if (group_size != 128) return false;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  // launch_small's two-tile or staged grids, or fewer tiles than SMs.
  return small_m_two_tiles(tiles, sms) || small_m_staged_rows(rows, cols, group_size) || tiles < sms;
}

bool w4a16_exact_weights(const DeviceLinear& w, int64_t M, Act act) {
  if (w.group_size < 64) return M == 1;  // groups of 32: the integer GEMV, else the rounded path
  if (M <= 16) return true;             // the integer GEMV and the small-M kernels
  return !w4a16_wgmma_applies(w, M, act) && small_m_exact(w.rows, w.cols, w.group_size, M, device_sm_count());
}

bool w4a16_small_m_applies(int group_size, int64_t M) {
  return M >= 2 && (group_size == 32 || group_size == 64 || group_size == 128);
}

int w4a16_resident_x_ks(int64_t rows, int64_t cols, int group_size, int64_t M, int sms, size_t elem) {
  if (M < 9 || M > 24 || (group_size != 64 && group_size != 128) || cols % group_size != 0) return 0;
  const int nt = M > 16 ? 3 : 2;
  const SmallMGrid g(rows, cols, group_size, group_size / kChunk, kResidentR);
  auto fits = [&](int ks) {
    return ResidentGrid(rows, cols, group_size, sms, elem, ks, nt).smem <= kResidentSmemMax;
  };
  // Every warp of every block walks whole units of all of K.
  if (g.blocks >= kResidentWarps * int64_t{sms} && fits(1)) return 1;
  // K halved over clusters of two blocks, at least 12 units per warp slot of a cluster.
  if (g.groups % 2 == 0 && g.blocks >= 12 * int64_t{sms / 2} && fits(2)) return 2;
  return 0;
}

void w4a16_small_m(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, Act act, void* y, int64_t ldy,
                   bool f32_out, cudaStream_t stream, bool pdl, int sms) {
  NIBBLE_CHECK(w4a16_small_m_applies(w.group_size, M), "w4a16: no small-M kernel for M {} and group {}", M,
               w.group_size);
  NIBBLE_CHECK(M < (int64_t{1} << 31), "w4a16: {} tokens in one call", M);
  if (w4a16_wgmma_applies(w, M, act))  // more than 16 tokens on sm_90 (w4a16_wgmma.cu)
    return w4a16_wgmma(w, x, M, ldx, act, y, ldy, f32_out, stream, pdl, sms);
  const int m = static_cast<int>(M);
  with_types(act == Act::BF16, f32_out, [&](auto t, auto o) {
    run_small<typename decltype(t)::type, typename decltype(o)::type>(w, x, m, ldx, y, ldy, stream, pdl, sms);
  });
}

}  // namespace nibble::cuda
