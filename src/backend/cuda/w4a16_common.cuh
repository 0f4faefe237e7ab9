// Device helpers shared by the W4A16 kernels (w4a16.cu: the mma kernel for
// any M; w4a16_gemv.cu: the integer M = 1 kernel; w4a16_small_m.cu: 2..16
// tokens; w4a16_wgmma.cu: more than 16 tokens on sm_90). All read the same
// re-laid-out weights (docs/CUDA.md, "The w4a16_mma layout"). The cp.async
// helpers serve the flash attention kernels too.
#pragma once

#include "backend/cuda/check.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

namespace nibble::cuda::w4a16 {

// Allows kernel K up to `bytes` of dynamic shared memory (more than the
// default 48 KiB), once per process and kernel: the first call's bytes.
template <auto K>
void max_dynamic_smem_once(size_t bytes) {
  static const bool set = [bytes] {
    NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(K, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
    return true;
  }();
  (void)set;
}

constexpr int kTileRows = 16;  // output rows per mma tile
constexpr int kChunk = 64;     // inputs per 16-byte lane load

// Host dispatch on a call's 16-bit activation type and output type: calls
// f(TypeTag<T>{}, TypeTag<OutT>{}) with T __nv_bfloat16 (act_is_bf16) or
// __half, and OutT float (f32_out) or T.
template <typename T>
struct TypeTag {
  using type = T;
};
template <typename F>
void with_types(bool act_is_bf16, bool f32_out, F&& f) {
  if (act_is_bf16)
    f32_out ? f(TypeTag<__nv_bfloat16>{}, TypeTag<float>{}) : f(TypeTag<__nv_bfloat16>{}, TypeTag<__nv_bfloat16>{});
  else
    f32_out ? f(TypeTag<__half>{}, TypeTag<float>{}) : f(TypeTag<__half>{}, TypeTag<__half>{});
}

// The launch attribute that allows programmatic dependent launch (host side;
// the kernels pair it with grid_dependency_wait / grid_dependents_launch).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
}
// A cooperative launch: every block of the grid is resident at once, or the
// launch fails (cudaErrorCooperativeLaunchTooLarge), also where other
// processes hold SMs (MPS). For kernels whose blocks meet at grid barriers.
inline cudaLaunchAttribute cooperative_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeCooperative;
  a.val.cooperative = 1;
  return a;
}
// Thread-block clusters of `blocks` blocks along x (and `blocks_y` along y).
inline cudaLaunchAttribute cluster_attribute(unsigned blocks, unsigned blocks_y = 1) {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = blocks;
  a.val.clusterDim.y = blocks_y;
  a.val.clusterDim.z = 1;
  return a;
}

// Launches `kernel` by cudaLaunchKernelEx with the first `nattrs` of `attrs`
// (the attributes above): the backend's launches with attributes all go
// through here (plain ones use <<<...>>>).
template <typename... KArgs, typename... Args>
void launch_with(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                 cudaLaunchAttribute* attrs, unsigned nattrs, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attrs;
  cfg.numAttrs = nattrs;
  NIBBLE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...));
}
// The same with programmatic dependent launch where `pdl` is set.
template <typename... KArgs, typename... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, bool pdl,
                Args... args) {
  cudaLaunchAttribute attr[1] = {pdl_attribute()};
  launch_with(kernel, grid, block, smem, s, attr, pdl ? 1u : 0u, args...);
}

__device__ inline void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}
__device__ inline void grid_dependents_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ inline void cp_async16(void* smem_dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(d), "l"(src) : "memory");
}
// 16 bytes, or (valid = false) 16 zero bytes without reading src: the
// attention kernels' tiles past the last key.
__device__ inline void cp_async16_zfill(void* smem_dst, const void* src, bool valid) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ inline void cp_async8(void* smem_dst, const void* src) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(d), "l"(src) : "memory");
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ inline float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

template <typename O>
__device__ inline O to_out(float v);
template <>
__device__ inline float to_out<float>(float v) { return v; }
template <>
__device__ inline __nv_bfloat16 to_out<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <>
__device__ inline __half to_out<__half>(float v) { return __float2half_rn(v); }

// The ring in shared memory by 32-bit shared-window addresses, held in
// registers (asm below): with pointers, the compiler recomputed the ring's
// address from the block size and the shared window in every iteration of the
// main loop, or (pointers pinned by asm) lost their address space and used
// generic loads; both made every GEMV 10-30 % slower.
__device__ inline void cp_async16_s(uint32_t dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ inline void cp_async8_s(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src) : "memory");
}
// 16 bytes through L1 (data many warps read, e.g. activations); with `bytes`
// < 16 only that many are read and the rest of the 16 are zero-filled.
__device__ inline void cp_async16_ca_s(uint32_t dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ inline void cp_async16_ca_s(uint32_t dst, const void* src, int bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ inline uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ inline uint2 lds64(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}

// mbarriers in shared memory by 32-bit shared-window addresses.
__device__ inline void mbar_init(uint32_t bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ inline void mbar_expect_tx(uint32_t bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ inline void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ inline void mbar_wait(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// One bulk (TMA) copy of `bytes` (a multiple of 16) into this block's shared
// memory, completing on mbarrier `bar` (async proxy: wgmma may read it once
// the barrier's phase completes, without a proxy fence).
__device__ inline void bulk_copy(uint32_t dst, const void* src, unsigned bytes, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
}
// The same with acquire at cluster scope: for data that other blocks of the
// cluster wrote into this block's shared memory (st.async).
__device__ inline void mbar_wait_cluster(uint32_t bar, unsigned parity) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// Thread-block clusters: a barrier of all threads of the cluster (release /
// acquire), and this block's shared address saddr as the same address in the
// shared memory of the cluster's block `rank`.
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ inline uint32_t mapa_shared(uint32_t saddr, uint32_t rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(saddr), "r"(rank));
  return r;
}

// Shared memory of one ring stage of a warp: a group's codes and its
// scale/min pairs (one 8-byte entry per lane).
__host__ __device__ constexpr size_t stage_bytes(int cpg) { return cpg * 32 * 16 + 32 * 8; }

template <typename T>
struct ActTraits;
template <>
struct ActTraits<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  static constexpr uint32_t kMagic = 0x43004300u;  // 128.0 in both halves
  static constexpr float kOffset = 128.0f;
  // Rows gid + 8's codes (A registers 1 and 3) cannot be read in place from
  // bits 4-7 as in fp16: bf16 has 7 mantissa bits, and bit 7 is the exponent's.
  static constexpr bool kHiInPlace = false;
  static constexpr uint32_t kOne = 0x3F803F80u;  // 1.0 in both halves
  __device__ static T2 magic() { return __floats2bfloat162_rn(128.0f, 128.0f); }
  __device__ static T2 broadcast(uint16_t bf16_bits) {
    __nv_bfloat16 h;
    std::memcpy(&h, &bf16_bits, 2);
    return __bfloat162bfloat162(h);
  }
};
template <>
struct ActTraits<__half> {
  using T2 = __half2;
  static constexpr uint32_t kMagic = 0x64006400u;  // 1024.0 in both halves
  static constexpr float kOffset = 1024.0f;
  // In fp16 (10 mantissa bits) 0x6400 | (c << 4) is exactly 1024 + 16·c, so
  // A registers 1 and 3 (rows gid + 8) take their codes in place, without a
  // shift: one shift per word instead of three (exact_chunk_mmas).
  static constexpr bool kHiInPlace = true;
  static constexpr uint32_t kOne = 0x3C003C00u;  // 1.0 in both halves
  __device__ static T2 magic() { return __floats2half2_rn(1024.0f, 1024.0f); }
  __device__ static T2 broadcast(uint16_t bf16_bits) {
    const float v = __uint_as_float(static_cast<uint32_t>(bf16_bits) << 16);
    return __float2half2_rn(v);
  }
};

template <typename T>
__device__ inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ inline void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ inline void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (a & b) | c in one instruction (the compiler emits an and and an or).
__device__ inline uint32_t and_or(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Eight consecutive activations row[k .. k+7] of one token (16 bytes); zeros at
// and past K (K is even, so pairs are whole) and for tokens past M.
template <typename T>
__device__ inline uint4 load_x8(const T* row, int k, int K, bool tok_ok) {
  if (!tok_ok) return make_uint4(0, 0, 0, 0);
  if (k + 8 <= K) return *reinterpret_cast<const uint4*>(row + k);
  uint32_t v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = (k + 2 * i < K) ? *reinterpret_cast<const uint32_t*>(row + k + 2 * i) : 0u;
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// Decodes one lane's A fragments of a chunk (4 k-steps × 4 registers) of one
// 16-row tile; sm = (scale, min) of rows gid (.x) and gid + 8 (.y).
template <typename T>
__device__ inline void decode_chunk(const uint4& q, const uint2& sm, uint32_t (&a)[4][4]) {
  using Tr = ActTraits<T>;
  using T2 = typename Tr::T2;
  const T2 s_lo = Tr::broadcast(static_cast<uint16_t>(sm.x & 0xFFFF));
  const T2 m_lo = Tr::broadcast(static_cast<uint16_t>(sm.x >> 16));
  const T2 s_hi = Tr::broadcast(static_cast<uint16_t>(sm.y & 0xFFFF));
  const T2 m_hi = Tr::broadcast(static_cast<uint16_t>(sm.y >> 16));
  const uint32_t words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t v = and_or(words[s] >> (4 * j), 0x000F000Fu, Tr::kMagic);
      T2 h;
      std::memcpy(&h, &v, 4);
      h = __hfma2(__hsub2(h, Tr::magic()), (j & 1) ? s_hi : s_lo, (j & 1) ? m_hi : m_lo);
      std::memcpy(&a[s][j], &h, 4);
    }
}

// The block's warps (splitting K) meet in `red` (warps · NT·8·16R floats of
// shared memory): each puts its mma C fragments acc[r][n][j] (row 16r + gid +
// 8·(j / 2), token n·8 + 2·tig + j % 2) at red[warp·kOut + token·16R + row],
// then the block waits for all of them. warps_sum adds entry i over the warps,
// in warp order.
template <int R, int NT>
__device__ __forceinline__ void warps_meet(const float (&acc)[R][NT][4], float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  constexpr int kRows = R * kTileRows, kOut = NT * 8 * kRows;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        red[warp * kOut + (n * 8 + 2 * tig + (j & 1)) * kRows + r * kTileRows + gid + 8 * (j >> 1)] = acc[r][n][j];
  __syncthreads();
}
template <int R, int NT>
__device__ __forceinline__ float warps_sum(const float* red, int nwarps, int i) {
  constexpr int kOut = NT * 8 * R * kTileRows;
  float s = 0.0f;
  for (int w = 0; w < nwarps; ++w) s += red[w * kOut + i];
  return s;
}

// Writes a warp's mma C fragments to y: acc[r][n][j] is row row0 + 16r + gid +
// 8·(j / 2), token n·8 + 2·tig + j % 2; rows ≥ N and tokens ≥ M are not
// stored. With one warp per block directly; otherwise the block's `nwarps`
// warps meet in `red` (warps_meet) and their sums, in warp order, are stored.
template <int R, int NT, typename OutT>
__device__ __forceinline__ void store_tile_outputs(const float (&acc)[R][NT][4], float* red, int nwarps, OutT* y,
                                                   int64_t ldy, int64_t row0, int M, int N) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  if (nwarps == 1) {
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int tok = n * 8 + 2 * tig + (j & 1);
          const int64_t row = row0 + r * kTileRows + gid + 8 * (j >> 1);
          if (tok < M && row < N) y[tok * ldy + row] = to_out<OutT>(acc[r][n][j]);
        }
    return;
  }
  constexpr int kRows = R * kTileRows, kOut = NT * 8 * kRows;
  warps_meet<R, NT>(acc, red);
  for (int i = threadIdx.x; i < kOut; i += blockDim.x) {
    const float s = warps_sum<R, NT>(red, nwarps, i);
    const int tok = i / kRows;
    const int64_t row = row0 + i % kRows;
    if (tok < M && row < N) y[tok * ldy + row] = to_out<OutT>(s);
  }
}

}  // namespace nibble::cuda::w4a16
