// W4A16 for more than 16 tokens on Hopper's warpgroup tensor-core instruction
// (wgmma; sm_90a), groups of 32, 64 or 128 (w4a16_small_m.cu dispatches here;
// other GPUs keep the small-M kernel's rounded path): fp16 at any M, bf16 up to
// kWgmmaBf16MaxM tokens (beyond, dequantize + cuBLAS is faster: w4a16.cu).
// Groups of 32 (session 81) take a chunk of two groups as the unit, and each
// lane decodes with its own group's scale/min (WeightStream's GPC = 2, as the
// small-M kernel's rounded path): the decoded A fragments are the same.
//
// y[M, N] = x[M, K] · Ŵᵀ, each weight rounded once to fl16(c·s + m) as the
// rounded path (docs/CUDA.md, "Numerics"), fp32 accumulation.
//  * The small-M kernel takes both mma operands from registers: every warp
//    loads every token's activations, and 32 tokens is its most per pass (two
//    passes re-read all weights at 64). wgmma reads its B operand from shared
//    memory: a warpgroup (4 warps, each one 16-row tile as its A fragments)
//    multiplies 64 rows by one copy of the activations, up to 256 tokens per
//    pass (24, 32, 64 or 128 tokens per wgmma; 256 as two of 128).
//  * x image: a small kernel writes the activations, per group of G inputs, in
//    the order the tensor cores read them: the layout's k order within a chunk
//    (docs/CUDA.md, "The w4a16_mma layout") as wgmma's no-swizzle K-major core
//    matrices of 8 tokens × 8 inputs; zeros past K and M. NTOK·G·2 bytes per
//    group, in the weight's scratch up to 64 tokens, else from the
//    stream-ordered scratch pool for the call.
//  * Main kernel: block (x, z) holds 4·nwg row tiles (warp w: tile 4·nwg·x +
//    w) and takes groups z, z + KS, ... where KS = gridDim.y; with KS > 1 the
//    blocks of a cluster split K and add their partial sums through
//    distributed shared memory, in rank order. Each warp streams its tile's
//    codes and scale/min pairs through its own cp.async ring; each group's
//    image arrives by one bulk (TMA) copy into a ring shared by the block,
//    issued by the last warp to release the stage (a full mbarrier and a
//    release counter per stage; no block barrier and no wait for the slowest
//    warp in the loop).
#include "backend/cuda/check.h"
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_gemv.h"
#include "backend/cuda/w4a16_small_m.cuh"

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>

namespace nibble::cuda {

namespace {

using namespace w4a16;

// Image and weight ring stages: 4 up to 64 tokens, 2 beyond (128 tokens ×
// 128 inputs is 32 KB a stage; at 128 tokens 2 stages measured 3.8 % faster
// than 3 on the fused 8B stack: docs/results/s25/try4_*).
__host__ __device__ constexpr int wg_stages(int ntok) { return ntok <= 64 ? 4 : 2; }
// The widest wgmma (N) per pass over a stage's image, and the most
// warpgroups per block (256 tokens take 128 accumulators per thread).
__host__ __device__ constexpr int wg_width(int ntok) { return ntok < 128 ? ntok : 128; }
__host__ __device__ constexpr int wg_max_nwg(int ntok) { return ntok > 128 ? 2 : 4; }
constexpr int kWgMaxSmem = 227 << 10;
constexpr int kWgPass = 256;  // tokens per pass over the weights at most
// Beyond this many tokens a bf16 call is faster as dequantize + cuBLAS
// (measured on the H200, docs/CUDA.md "More than 64 tokens on Hopper").
constexpr int64_t kWgmmaBf16MaxM = 256;

// Bytes of one group's x image: NTOK tokens × G inputs of 16 bits.
__host__ __device__ constexpr int image_group_bytes(int ntok, int g) { return ntok * g * 2; }

// Block (group, token slice of 8), G threads: thread (t, q) writes the
// 16-byte core-matrix row of k-step j = q / 2, half kh = q % 2, token t: mma
// k index 8·kh + 2·tig + e is input 64·(j / 4) + 16·tig + 4·(j % 4) + 2·kh + e
// (tig 0..3, e 0..1). Core matrices [j][t / 8][kh] of 128 bytes, rows t % 8.
template <typename T, int NTOK, int G>
__global__ void __launch_bounds__(G)
    x_image_kernel(const T* __restrict__ x, int64_t ldx, int M, int K, unsigned char* __restrict__ img) {
  grid_dependents_launch();  // the GEMM may start streaming weights now
  constexpr int Q = G / 8;
  const int g = blockIdx.x, t = blockIdx.y * 8 + threadIdx.x / Q, q = threadIdx.x % Q;
  const int j = q >> 1, kh = q & 1;
  const int k0 = g * G + 64 * (j >> 2) + 4 * (j & 3) + 2 * kh;
  grid_dependency_wait();  // x is the previous kernel's output; the previous GEMM may still read img
  uint32_t v[4];
  const T* row = x + static_cast<int64_t>(t) * ldx;
#pragma unroll
  for (int tig = 0; tig < 4; ++tig) {
    const int k = k0 + 16 * tig;
    uint32_t p = 0;
    if (t < M && k < K) {
      if (k + 1 < K) {
        p = *reinterpret_cast<const uint32_t*>(row + k);
      } else {
        uint16_t lo;
        std::memcpy(&lo, row + k, 2);
        p = lo;
      }
    }
    v[tig] = p;
  }
  unsigned char* dst = img + static_cast<int64_t>(g) * image_group_bytes(NTOK, G) +
                       ((j * (NTOK / 8) + t / 8) * 2 + kh) * 128 + (t % 8) * 16;
  *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
}

// wgmma.m64nNk16 with A from registers (the mma.m16n8k16 A fragment of each
// warp's 16 rows) and B from shared memory; D += A·B. N = 24, 32, 64, 128 (a
// pass of 256 tokens issues two of 128).
template <typename T, int N>
struct Wgmma;
// Both activation types (PTX: the type's name in the instruction).
#define NIBBLE_WGMMA_RS(T, PTX)                                                                                       \
  template <>                                                                                                         \
  struct Wgmma<T, 24> {                                                                                               \
    static __device__ __forceinline__ void mma(float (&d)[12], const uint32_t (&a)[4], uint64_t desc, int scale_d) {  \
      asm volatile(                                                                                                   \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"                                                                \
          "wgmma.mma_async.sync.aligned.m64n24k16.f32." PTX "." PTX                                                   \
          " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, "                                                                \
          "{%12,%13,%14,%15}, %16, p, 1, 1, 0;\n}\n"                                                                  \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
            "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])                                                          \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));                                     \
    }                                                                                                                 \
  };                                                                                                                  \
  template <>                                                                                                         \
  struct Wgmma<T, 32> {                                                                                               \
    static __device__ __forceinline__ void mma(float (&d)[16], const uint32_t (&a)[4], uint64_t desc, int scale_d) {  \
      asm volatile(                                                                                                   \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                                \
          "wgmma.mma_async.sync.aligned.m64n32k16.f32." PTX "." PTX                                                   \
          " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, "                                                \
          "{%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"                                                                  \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
            "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])      \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));                                     \
    }                                                                                                                 \
  };                                                                                                                  \
  template <>                                                                                                         \
  struct Wgmma<T, 64> {                                                                                               \
    static __device__ __forceinline__ void mma(float (&d)[32], const uint32_t (&a)[4], uint64_t desc, int scale_d) {  \
      asm volatile(                                                                                                   \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                                \
          "wgmma.mma_async.sync.aligned.m64n64k16.f32." PTX "." PTX                                                   \
          " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%" \
          "28,%29,%30,%31}, "                                                                                         \
          "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"                                                                  \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
            "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),     \
            "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
            "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])    \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));                                     \
    }                                                                                                                 \
  };                                                                                                                  \
  template <>                                                                                                         \
  struct Wgmma<T, 128> {                                                                                              \
    static __device__ __forceinline__ void mma(float (&d)[64], const uint32_t (&a)[4], uint64_t desc, int scale_d) {  \
      asm volatile(                                                                                                   \
          "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                                                \
          "wgmma.mma_async.sync.aligned.m64n128k16.f32." PTX "." PTX                                                  \
          " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%" \
          "28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%"  \
          "54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "                                                                 \
          "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"                                                                  \
          : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),           \
            "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),     \
            "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),   \
            "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),   \
            "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),   \
            "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),   \
            "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),   \
            "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])    \
          : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));                                     \
    }                                                                                                                 \
  };
NIBBLE_WGMMA_RS(__nv_bfloat16, "bf16")
NIBBLE_WGMMA_RS(__half, "f16")
#undef NIBBLE_WGMMA_RS

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of r across the wgmma's
// asynchronous window (its fence / wait).
__device__ __forceinline__ void fence_reg(float& r) { asm volatile("" : "+f"(r)::"memory"); }
__device__ __forceinline__ void fence_reg(uint32_t& r) { asm volatile("" : "+r"(r)::"memory"); }

// Shared-memory matrix descriptor of a no-swizzle K-major B operand at shared
// address 16·lo (the descriptor holds 14 bits of it; the shared window's
// address has higher bits set, so they are masked): core matrices of 8 tokens
// × 16 bytes, 128 bytes apart along K (leading byte offset) and 256 along N
// (stride byte offset).
__device__ __forceinline__ uint64_t image_desc(uint32_t lo) {
  return static_cast<uint64_t>(lo & 0x3FFFu) | (static_cast<uint64_t>(128 >> 4) << 16) |
         (static_cast<uint64_t>(256 >> 4) << 32);
}

// 16 bytes of rank `rank`'s shared memory at its shared address saddr (after
// a cluster barrier: ordered by it, and independent of each other).
__device__ __forceinline__ float4 ld_cluster_v4(uint32_t saddr, uint32_t rank) {
  const uint32_t r = mapa_shared(saddr, rank);
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0,%1,%2,%3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(r));
  return v;
}

// Shared memory of a block of `nwg` warpgroups: the image ring, each warp's
// weight ring, or, at the end, the outputs of its 4·nwg tiles; then the
// stages' full mbarriers and release counters (16 bytes per stage).
template <int NTOK, int CPG>
__host__ __device__ constexpr size_t wg_smem_bytes(int nwg) {
  constexpr int S = wg_stages(NTOK);
  const size_t ring = S * (image_group_bytes(NTOK, CPG * kChunk) + nwg * 4 * stage_bytes(CPG));
  const size_t red = static_cast<size_t>(nwg) * 4 * NTOK * kTileRows * 4;
  return (ring > red ? ring : red) + 16 * S;
}
static_assert(wg_smem_bytes<128, 2>(wg_max_nwg(128)) <= kWgMaxSmem &&
                  wg_smem_bytes<256, 2>(wg_max_nwg(256)) <= kWgMaxSmem,
              "the largest blocks fit in shared memory");

template <typename T, typename OutT, int NTOK, int CPG, int GPC>
__global__ void __launch_bounds__(wg_max_nwg(NTOK) * 128)
    w4a16_wgmma_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta,
                       const unsigned char* __restrict__ img, OutT* __restrict__ y, int64_t ldy, int M, int N,
                       int tiles, int chunks, int groups, int groups_padded) {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  constexpr int S = wg_stages(NTOK), G = CPG * kChunk, GB = image_group_bytes(NTOK, G);
  constexpr int NW = wg_width(NTOK), P = NTOK / NW, NT = NW / 8;  // P passes of NW tokens, NT of 8 each
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nthr = blockDim.x;
  const int nwarps = nthr >> 5, ks = blockIdx.y, KS = gridDim.y;
  const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * nwarps;
  WeightStream<1, CPG, GPC> ws(codes, meta, tile0 + warp, tiles, chunks, groups_padded, ks, KS);
  const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  uint32_t rq = base + S * GB + (warp * S * CPG * 32 + lane) * 16;
  uint32_t rm = base + S * GB + nwarps * S * CPG * 512 + (warp * S * 32 + lane) * 8;
  const size_t bars = wg_smem_bytes<NTOK, CPG>(nwarps / 4) - 16 * S;
  const uint32_t full0 = base + static_cast<uint32_t>(bars);
  unsigned* const released = reinterpret_cast<unsigned*>(smem + bars + 8 * S);  // warps done with each stage
  asm volatile("" : "+l"(ws.cp), "+l"(ws.mp), "+r"(rq), "+r"(rm));
  if (tid < S) {
    mbar_init(full0 + 8 * tid, 1);
    released[tid] = 0;
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  // Images: one bulk copy per group into a stage, completing on the stage's
  // full barrier: the first S by thread 0, then each by lane 0 of the last
  // warp to release the stage (a counter that wraps at the warp count), so no
  // thread waits for the slowest warp. Every thread walks the groups (ip, gx).
  const unsigned char* ip = img + static_cast<int64_t>(ks) * GB;
  const int64_t ip_step = static_cast<int64_t>(KS) * GB;
  int gx = ks;
  auto issue_x = [&](int st, bool issuer) {
    if (issuer && gx < groups) {
      mbar_expect_tx(full0 + 8 * st, GB);
      bulk_copy(base + st * GB, ip, GB, full0 + 8 * st);
    }
    ip += ip_step;
    gx += KS;
  };
  float acc[P][NW / 2];
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int i = 0; i < NW / 2; ++i) acc[p][i] = 0.0f;
  auto fence_acc = [&] {
#pragma unroll
    for (int p = 0; p < P; ++p)
#pragma unroll
      for (int i = 0; i < NW / 2; ++i) fence_reg(acc[p][i]);
  };
  // Group i from stage st: the A fragments of all its chunks, then its
  // 4·CPG·P wgmma, then the wait (the next group's decode does not overlap
  // them: keeping two groups' or chunks' fragments in flight measured no
  // faster, docs/CUDA.md).
  auto compute = [&](auto stage) {
    constexpr int st = decltype(stage)::value;
    const uint2 sm = lds64(rm + st * 256);
    uint32_t a[CPG][4][4];
#pragma unroll
    for (int u = 0; u < CPG; ++u) decode_chunk<T>(lds128(rq + (st * CPG + u) * 512), sm, a[u]);
    // The descriptors' low words from a register the compiler cannot see
    // through, so that it does not hoist 4·CPG·S descriptors out of the loop;
    // masked and or-ed once per group (the stage's offsets stay within the
    // 14-bit field: shared memory is under 256 KB), so each wgmma's descriptor
    // is one add (session 44: 5 uniform instructions per wgmma -> 3; gate|up at
    // 32 tokens 33.8-34.2 -> 33.2-33.5 us, the head 134-135 -> 128-132).
    uint32_t lo = static_cast<uint32_t>(image_desc((base + st * GB) >> 4));
    asm volatile("" : "+r"(lo));
    fence_acc();
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4 * CPG; ++j)  // k-step j's image: NTOK·32 bytes, tokens p·NW on at p·NW·32
#pragma unroll
      for (int p = 0; p < P; ++p)
        Wgmma<T, NW>::mma(acc[p], a[j / 4][j % 4],
                          (image_desc(0) & ~uint64_t{0xFFFFFFFFu}) | (lo + ((j * NTOK * 32 + p * NW * 32) >> 4)), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_acc();
#pragma unroll
    for (int u = 0; u < CPG; ++u)
#pragma unroll
      for (int s = 0; s < 4; ++s)
#pragma unroll
        for (int j = 0; j < 4; ++j) fence_reg(a[u][s][j]);
  };
  const int iters = ks < groups ? (groups - ks + KS - 1) / KS : 0;
  // Prologue: the first S groups' weights (one commit each) before the
  // dependency wait, their images after it.
  static_for<S>([&](auto p) {
    ws.template issue<decltype(p)::value>(rq, rm, groups, chunks);
    cp_async_commit();
  });
  grid_dependency_wait();
  // The next kernel may launch now, as in the 2..16-token kernels (session 43:
  // gate|up at 17 tokens 34.8-34.9 -> 33.6 us, fused 8B stack M = 64
  // 3.894-3.934 -> 3.831-3.853 ms, M = 17..32 unchanged).
  grid_dependents_launch();
  static_for<S>([&](auto p) { issue_x(decltype(p)::value, tid == 0); });
  for_ring_stages<S>(iters, [&](auto stage, int i) {
    constexpr int st = decltype(stage)::value;
    cp_async_wait<S - 1>();                  // this warp's weights of group i + st
    mbar_wait(full0 + 8 * st, (i / S) & 1);  // its image
    compute(stage);
    // Stage st is read (the wgmma waited for): this warp refills its weights
    // with group i + st + S and releases the image; the last warp to release
    // it refills it.
    ws.template issue<st>(rq, rm, groups, chunks);
    cp_async_commit();
    __syncwarp();
    issue_x(st, lane == 0 && atomicInc(released + st, nwarps - 1) == static_cast<unsigned>(nwarps - 1));
  });
  cp_async_wait<0>();
  __syncthreads();  // shared memory is reused for the outputs (every issued image was consumed)
  float* red = reinterpret_cast<float*>(smem);
  const int gid = lane >> 2, tig = lane & 3, nout = nwarps * NTOK * kTileRows;  // [tile][token][row]
#pragma unroll
  for (int p = 0; p < P; ++p)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        red[(warp * NTOK + p * NW + n * 8 + 2 * tig + (j & 1)) * kTileRows + gid + 8 * (j >> 1)] = acc[p][n * 4 + j];
  if (KS == 1) {
    __syncthreads();
    for (int i = tid; i < nout; i += nthr) {
      const int t = i / kTileRows % NTOK;
      const int64_t row = (tile0 + i / (NTOK * kTileRows)) * kTileRows + i % kTileRows;
      if (t < M && row < N) y[t * ldy + row] = to_out<OutT>(red[i]);
    }
  } else {
    cluster_sync();  // every rank's partial sums are in its shared memory
    // Rank ks adds its share of the outputs, 4 rows of a token at a time: the
    // KS ranks' values loaded together, then summed in rank order.
    const int n4 = nout / 4, per = (n4 + KS - 1) / KS;
    const uint32_t rbase = static_cast<uint32_t>(__cvta_generic_to_shared(red));
    for (int u = ks * per + tid; u < min(n4, (ks + 1) * per); u += nthr) {
      float4 v[8];
#pragma unroll
      for (int r = 0; r < 8; ++r)
        if (r < KS) v[r] = ld_cluster_v4(rbase + u * 16, r);
      float4 sum = v[0];
#pragma unroll
      for (int r = 1; r < 8; ++r)
        if (r < KS) {
          sum.x += v[r].x;
          sum.y += v[r].y;
          sum.z += v[r].z;
          sum.w += v[r].w;
        }
      const int i = 4 * u, t = i / kTileRows % NTOK;
      const int64_t row = (tile0 + i / (NTOK * kTileRows)) * kTileRows + i % kTileRows;
      const float o[4] = {sum.x, sum.y, sum.z, sum.w};
      if (t < M)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (row + e < N) y[t * ldy + row + e] = to_out<OutT>(o[e]);
    }
    cluster_sync();  // no block leaves while another reads its shared memory
  }
#else
  __trap();
#endif
}


// One pass of up to NTOK tokens; img: the pass's x image (units × NTOK·G·2
// bytes, a unit being a group of CPG chunks, or at GPC = 2 one chunk of two
// groups of 32).
template <typename T, typename OutT, int NTOK, int CPG, int GPC>
void launch_wgmma(const DeviceLinear& w, const T* x, int M, int64_t ldx, OutT* y, int64_t ldy, unsigned char* img,
                  cudaStream_t stream, int sms, bool pdl) {
  constexpr int G = CPG * kChunk;
  const SmallMGrid d(w, CPG, 4);  // d.blocks: warpgroup row blocks
  launch_pdl(x_image_kernel<T, NTOK, G>, dim3(static_cast<unsigned>(d.groups), NTOK / 8), dim3(G), 0, stream, pdl, x,
             ldx, M, static_cast<int>(w.cols), img);
  constexpr auto kernel = w4a16_wgmma_kernel<T, OutT, NTOK, CPG, GPC>;
  max_dynamic_smem_once<kernel>(kWgMaxSmem);
  // Clusters the device cannot hold at once would run as a second wave: on the
  // H200, o and down of the 8B model at 33..64 tokens make 32 clusters of 8
  // blocks, of which 30 fit. The split shrinks by one until they all fit, and
  // such a grid launches without programmatic dependent launch: launched
  // early, its clusters would find the previous kernel's blocks still on the
  // SMs and again not all fit (session 44: fused 8B stack M = 64 3.81-3.83 ->
  // 3.50-3.52 ms, M = 128 6.36 -> 4.97-4.99; with the dependent launch kept,
  // M = 64 3.77-3.80).
  WgGrid g = wg_grid(d.blocks, d.groups, sms, wg_max_nwg(NTOK), NTOK >= 128);
  bool lowered = false;
  while (g.ks > 1 &&
         g.blocks > max_active_clusters<kernel>(static_cast<int>(g.nwg * 128),
                                                wg_smem_bytes<NTOK, CPG>(static_cast<int>(g.nwg)), 1,
                                                static_cast<unsigned>(g.ks))) {
    --g.ks;
    lowered = true;
  }
  size_t smem = wg_smem_bytes<NTOK, CPG>(static_cast<int>(g.nwg));
  cudaLaunchAttribute attr[2] = {pdl_attribute(), cluster_attribute(1, static_cast<unsigned>(g.ks))};
  unsigned nattr = 2;  // always after its image kernel, unless its split was lowered
  if (lowered) {
    attr[0] = attr[1];
    nattr = 1;
  } else {
    // Launched early, no more blocks on one SM than the even share
    // (even_share_smem), as long as all its clusters still fit. fp16 at groups
    // of 64 fits 3 blocks of 256 threads per SM on the 32-token image (78-81
    // registers), and gate|up's 224 blocks piled onto the SMs that o left
    // first: o then gate|up took 68.1 us a pair, 51.2 with the share; fused
    // 8B stack at groups of 64, fp16, M = 25 3.54-3.58 -> 3.03-3.05 ms, M = 32
    // 3.62-3.64 -> 3.10-3.11 (session 48, docs/results/s48/even_share/).
    const size_t even = even_share_smem(reinterpret_cast<const void*>(kernel), static_cast<int>(g.nwg * 128), smem,
                                        g.blocks * g.ks, sms, kWgMaxSmem);
    if (even != smem &&
        (g.ks == 1 || g.blocks <= max_active_clusters<kernel>(static_cast<int>(g.nwg * 128), even, 1,
                                                              static_cast<unsigned>(g.ks))))
      smem = even;
  }
  launch_with(kernel, dim3(static_cast<unsigned>(g.blocks), static_cast<unsigned>(g.ks)),
              dim3(static_cast<unsigned>(g.nwg * 128)), smem, stream, attr, nattr,
              static_cast<const uint4*>(w.a.get()), static_cast<const uint2*>(w.b.get()),
              static_cast<const unsigned char*>(img), y, ldy, M, static_cast<int>(w.rows), static_cast<int>(d.tiles),
              static_cast<int>(d.chunks), static_cast<int>(d.groups), static_cast<int>(d.groups_padded));
}

// Passes of up to kWgPass tokens, each on the narrowest image that holds it.
// Up to 64 tokens the image lives in the weight's scratch; a larger one comes
// from the stream-ordered pool for the call.
template <typename T, typename OutT, int CPG, int GPC = 1>
void run_wgmma(const DeviceLinear& w, const void* xv, int M, int64_t ldx, void* yv, int64_t ldy, cudaStream_t stream,
               bool pdl, int sms) {
  const T* x = static_cast<const T*>(xv);
  OutT* y = static_cast<OutT*>(yv);
  const int64_t groups = (w.cols + CPG * kChunk - 1) / (CPG * kChunk);
  unsigned char* big = nullptr;
  if (M > 64)
    NIBBLE_CUDA_CHECK(cudaMallocFromPoolAsync(
        &big, static_cast<size_t>(groups) * image_group_bytes(std::min(M, kWgPass), CPG * kChunk), w4a16_scratch_pool(),
        stream));
  auto* img = static_cast<unsigned char*>(w.scratch.get());
  for (int m0 = 0; m0 < M; m0 += kWgPass) {
    const int m = std::min(kWgPass, M - m0);
    const T* xm = x + m0 * ldx;
    OutT* ym = y + m0 * ldy;
    // Groups of 128: up to 24 tokens a 24-token image and wgmma (session 45:
    // gate|up at 17 tokens 33.1-33.2 -> 31.3-31.4 us, the head 123.1-123.5 ->
    // 118.2-118.4; fused 8B stack M = 17 2.427 -> 2.365-2.377 ms, M = 24
    // 2.466-2.468 -> 2.393). Groups of 64 keep 32: gate|up at 17 tokens took
    // 40.8 -> 55.2 us with 24 (docs/results/s45/ntok24/).
    if (CPG == 2 && m <= 24)
      launch_wgmma<T, OutT, 24, CPG, GPC>(w, xm, m, ldx, ym, ldy, img, stream, sms, pdl);
    else if (m <= 32)
      launch_wgmma<T, OutT, 32, CPG, GPC>(w, xm, m, ldx, ym, ldy, img, stream, sms, pdl);
    else if (m <= 64)
      launch_wgmma<T, OutT, 64, CPG, GPC>(w, xm, m, ldx, ym, ldy, img, stream, sms, pdl);
    else if (m <= 128)
      launch_wgmma<T, OutT, 128, CPG, GPC>(w, xm, m, ldx, ym, ldy, big, stream, sms, pdl);
    else
      launch_wgmma<T, OutT, 256, CPG, GPC>(w, xm, m, ldx, ym, ldy, big, stream, sms, pdl);
  }
  if (big != nullptr) NIBBLE_CUDA_CHECK(cudaFreeAsync(big, stream));
}

template <typename T, typename OutT>
void run_wgmma_g(const DeviceLinear& w, const void* x, int M, int64_t ldx, void* y, int64_t ldy, cudaStream_t stream,
                 bool pdl, int sms) {
  if (w.group_size == 32)
    run_wgmma<T, OutT, 1, 2>(w, x, M, ldx, y, ldy, stream, pdl, sms);
  else if (w.group_size == 64)
    run_wgmma<T, OutT, 1>(w, x, M, ldx, y, ldy, stream, pdl, sms);
  else
    run_wgmma<T, OutT, 2>(w, x, M, ldx, y, ldy, stream, pdl, sms);
}

}  // namespace

// The grid over `row_wgs` warpgroup row blocks (4 tiles each): KS (cluster
// size, splitting K; each block at least 4 groups) and warpgroups per block
// (nwg, at most max_nwg).
//  * Up to 64 tokens: about 4 warpgroups resident per SM, and at least as
//    many blocks as SMs where the rows allow.
//  * 128 and 256 tokens (`wide`): a group's image (32 or 64 KB) is 8-16× one
//    warpgroup's weights for that group (4 KB) and every block reads it, so
//    the most warpgroups per block for which some K split still gives about a
//    wave of blocks (4/5 of the SMs); then the least K split that does. Measured on the H200 (docs/CUDA.md):
//    fused 8B stack at 256 tokens 10.05 → 9.98 ms, 7 linears per layer
//    12.18 → 11.31; at 32 and 64 tokens this rule was slower (3.16 → 3.46
//    ms, 3.95 → 4.47 fused).
WgGrid wg_grid(int64_t row_wgs, int64_t groups, int sms, int max_nwg, bool wide) {
  WgGrid g;
  if (!wide) {
    const int64_t slots = int64_t{sms} * 4;
    while (g.ks < 8 && row_wgs * g.ks * 2 <= slots && groups >= g.ks * 2 * 4) g.ks *= 2;
    g.nwg = max_nwg;
    while (g.nwg > 1 && (row_wgs + g.nwg - 1) / g.nwg * g.ks < sms) g.nwg /= 2;
    g.blocks = (row_wgs + g.nwg - 1) / g.nwg;
    return g;
  }
  const int64_t want = int64_t{sms} * 4 / 5;
  int64_t ks_max = 1;
  while (ks_max < 8 && groups >= ks_max * 2 * 4) ks_max *= 2;
  g.nwg = max_nwg;
  while (g.nwg > 1 && (row_wgs + g.nwg - 1) / g.nwg * ks_max < want) g.nwg /= 2;
  g.blocks = (row_wgs + g.nwg - 1) / g.nwg;
  while (g.ks < ks_max && g.blocks * g.ks < want) g.ks *= 2;
  return g;
}

size_t w4a16_wgmma_scratch_bytes(int64_t cols, int group_size) {
  const int unit = std::max(group_size, kChunk);  // groups of 32: one image per chunk of two
  const int64_t units = (cols + unit - 1) / unit;
  return static_cast<size_t>(units) * image_group_bytes(64, unit);
}

bool w4a16_wgmma_device() {
  static std::array<std::atomic<int>, 64> known{};  // per device: 0 not asked yet, 1 no, 2 sm_90
  int dev = 0;
  NIBBLE_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev >= static_cast<int>(known.size())) return false;
  int k = known[dev].load(std::memory_order_relaxed);
  if (k == 0) {
    int major = 0, minor = 0;
    NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    NIBBLE_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
    k = major == 9 && minor == 0 ? 2 : 1;
    known[dev].store(k, std::memory_order_relaxed);
  }
  return k == 2;
}

bool w4a16_wgmma_applies(const DeviceLinear& w, int64_t M, Act act) {
  const int group_size = w.group_size;
  if (M <= 16 || (group_size != 32 && group_size != 64 && group_size != 128) || act == Act::F32) return false;
  // Larger bf16 calls dequantize the weight and run cuBLAS (w4a16.cu).
  if (act == Act::BF16 && M > kWgmmaBf16MaxM) return false;
  // NIBBLE_W4A16_WGMMA=0 sends these calls to the small-M kernel, the path of
  // other GPUs; =1 sends them all to the wgmma kernel, w4a16_small_m_first's
  // rule aside (both for tests and measurements on Hopper).
  const char* e = std::getenv("NIBBLE_W4A16_WGMMA");
  if (e != nullptr && e[0] == '0') return false;
  if (e != nullptr && e[0] == '1') return w4a16_wgmma_device();
  return w4a16_wgmma_device() && !w4a16_small_m_first(w.rows, w.cols, group_size, M, device_sm_count());
}

bool w4a16_small_m_first(int64_t rows, int64_t cols, int group_size, int64_t M, int sms) {
  if (M > 32) return false;
  // As launch_wgmma's grid (groups of 32: a unit of one chunk, as groups of 64).
  const SmallMGrid d(rows, cols, group_size, std::max(1, group_size / kChunk), 4);
  const int64_t ks = wg_grid(d.blocks, d.groups, sms, 4, false).ks;
  return ks >= 4 || (M <= 24 && ks >= 2 && w4a16_three_tiles_exact(rows, cols, group_size, sms)) ||
         w4a16_resident_x_ks(rows, cols, group_size, M, sms, 2) > 0;
}

void w4a16_wgmma(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, Act act, void* y, int64_t ldy,
                 bool f32_out, cudaStream_t stream, bool pdl, int sms) {
  NIBBLE_CHECK(w.scratch.bytes() >= w4a16_wgmma_scratch_bytes(w.cols, w.group_size),
               "w4a16: the weight's scratch holds {} bytes, the x image needs {}", w.scratch.bytes(),
               w4a16_wgmma_scratch_bytes(w.cols, w.group_size));
  const int m = static_cast<int>(M);
  with_types(act == Act::BF16, f32_out, [&](auto t, auto o) {
    run_wgmma_g<typename decltype(t)::type, typename decltype(o)::type>(w, x, m, ldx, y, ldy, stream, pdl, sms);
  });
}

}  // namespace nibble::cuda
