// The element-wise, norm and attention kernels of the GPU forward
// (src/backend/cuda/forward.cu; included there only).
//
// Kernels that depend on the position take it twice: `p0` from the host, and
// `p0_dev`, a device int that overrides it when set. Prefill passes the host
// value; decode always reads the device int, so that the one decode step can
// be captured once as a CUDA graph and replayed at every position with only
// that int (and the token id) copied in before each replay.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_prep.cuh"
#include "nibble/cuda.h"
#include "nibble/dtype.h"
#include "nibble/sample_math.h"

#include <cmath>
#include <cstdint>

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ inline int64_t position_of(int64_t p0, const int32_t* p0_dev) { return p0_dev ? *p0_dev : p0; }

// Every kernel here starts with this: launched with programmatic dependent
// launch (GpuModel launches them all so), it lets the next kernel launch at
// once and waits for the previous one to finish before touching memory, so
// launch latency overlaps the previous kernel. Without the attribute both are
// no-ops.
__device__ inline void pdl_prologue() {
  w4a16::grid_dependents_launch();
  w4a16::grid_dependency_wait();
}

// Decode: one head's output (hd values in shared memory, hd a multiple of
// 128), inputs h·hd .. (h+1)·hd - 1 of the o projection, written as its
// prepared activation (w4a16_prep.cuh) by the block's warps.
__device__ inline void prep_store_head(const float* vals, int64_t h, int64_t hd, int64_t H, int group,
                                       void* prepared) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t pw = warp; pw < hd / w4a16::kPrepInputs; pw += blockDim.x >> 5) {
    float v[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = vals[pw * w4a16::kPrepInputs + 4 * lane + j];
    w4a16::prep_warp_store(v, static_cast<int>(h * (hd / w4a16::kPrepInputs) + pw), group, prepared, H * hd);
  }
}

// The linears' inputs: bf16, or f32 for single-token steps whose linears all
// take f32 (the integer W4A16 GEMV; GpuModel's decode).
__device__ inline void store_act(bf16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ inline void store_act(float* p, float v) { *p = v; }

// bf16 / fp16 / f32 values as f32 (exact).
__device__ inline float widen_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float widen_f32(__half v) { return __half2float(v); }
__device__ inline float widen_f32(float v) { return v; }

// The embedding table as the checkpoint stores it (GpuModel keeps it so):
// f32, bf16 or fp16 values, widened (exactly) as rows are read.
struct EmbedTable {
  const void* p = nullptr;
  DType dtype = DType::F32;  // F32, BF16 or F16
};
__device__ inline float embed_at(EmbedTable t, int64_t i) {
  if (t.dtype == DType::BF16) return widen_f32(static_cast<const bf16*>(t.p)[i]);
  if (t.dtype == DType::F16) return widen_f32(static_cast<const __half*>(t.p)[i]);
  return widen_f32(static_cast<const float*>(t.p)[i]);
}
// Elements i .. i + 3 (i a multiple of 4).
__device__ inline float4 embed_at4(EmbedTable t, int64_t i) {
  if (t.dtype == DType::F32) return *reinterpret_cast<const float4*>(static_cast<const float*>(t.p) + i);
  const uint2 u = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(t.p) + i);
  if (t.dtype == DType::BF16)
    return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xFFFF0000u), __uint_as_float(u.y << 16),
                       __uint_as_float(u.y & 0xFFFF0000u));
  const __half2 a = *reinterpret_cast<const __half2*>(&u.x), b = *reinterpret_cast<const __half2*>(&u.y);
  const float2 fa = __half22float2(a), fb = __half22float2(b);
  return make_float4(fa.x, fa.y, fb.x, fb.y);
}

// __restrict__ lets the loads run ahead of the stores (as in the norm kernels
// below). Decode with a prepared q|k|v input uses embed_rmsnorm_prep_kernel.
__global__ void embed_kernel(const int32_t* __restrict__ tokens, EmbedTable embed, float* __restrict__ x, int64_t D) {
  pdl_prologue();
  const int64_t i = blockIdx.x;
  const int64_t row = static_cast<int64_t>(tokens[i]) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) x[i * D + d] = embed_at(embed, row + d);
}

// One block per row: first x[i] += y[i] when y is set (the residual add of the
// previous sublayer, fused here to save a launch; each thread re-reads only
// the elements it wrote), then out[i] = x[i] / sqrt(mean(x[i]²) + eps) * w, as
// OutT (bf16 or f32).
// One block of 1024 threads per row: a decode step has one row, and its
// norm should not be one SM walking 4096 floats 256 at a time.
constexpr int kNormThreads = 1024;
// __restrict__ lets the loads of later elements start before the store of
// x[d] (without it each iteration waited for the previous one's memory
// round trip: 14.7 µs per call at D = 4096 with 256 threads, measured).
template <typename OutT>
__global__ void add_rmsnorm_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t D,
                                   const float* __restrict__ w, float eps, OutT* __restrict__ out, int64_t ldo) {
  pdl_prologue();
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  float* xr = x + i * D;
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float v = xr[d];
    if (y != nullptr) xr[d] = v = v + y[i * D + d];
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) store_act(out + i * ldo + d, xr[d] * inv * w[d]);
}

// Decode (one row, one block of kNormThreads): the same add and RMSNorm, the
// output written only as the single-token W4A16 GEMV's prepared activation
// (w4a16_prep.cuh, groups of `group`), which saves that GEMV's prep kernel.
// Thread t owns inputs 4t + 4·kNormThreads·j, all loaded at once (one memory
// round trip), so warp w holds exactly prep warp w + 32j's 128 inputs.
// Needs D % 4 == 0 and D <= kNormPrepMaxD (norm_prep_supported).
constexpr int kNormPrepIters = 4;
constexpr int64_t kNormPrepMaxD = int64_t{4} * kNormThreads * kNormPrepIters;
inline bool norm_prep_supported(int64_t D) { return D % 4 == 0 && D <= kNormPrepMaxD; }
// x = table[tokens[0]] instead of x (+ y) where `table` is set (the step's
// embedding, below).
__device__ inline void rmsnorm_prep_row(float* __restrict__ x, const float* __restrict__ y,
                                        const int32_t* __restrict__ tokens, EmbedTable table,
                                        int64_t D, const float* __restrict__ w, float eps, void* __restrict__ prepared,
                                        int group) {
  // The norm's weights do not depend on the previous kernel: loaded before
  // waiting for it (one memory round trip less after it ends).
  w4a16::grid_dependents_launch();
  __shared__ float scratch[32];
  float4 xv[kNormPrepIters], wv[kNormPrepIters];
#pragma unroll
  for (int j = 0; j < kNormPrepIters; ++j) {
    const int64_t d = 4 * (threadIdx.x + static_cast<int64_t>(j) * kNormThreads);
    wv[j] = d < D ? __ldg(reinterpret_cast<const float4*>(w + d)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  w4a16::grid_dependency_wait();
  const int64_t trow = table.p != nullptr ? static_cast<int64_t>(tokens[0]) * D : 0;
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kNormPrepIters; ++j) {
    const int64_t d = 4 * (threadIdx.x + static_cast<int64_t>(j) * kNormThreads);
    xv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (d < D) {
      xv[j] = table.p != nullptr ? embed_at4(table, trow + d) : *reinterpret_cast<const float4*>(x + d);
      if (y != nullptr) {
        const float4 yv = *reinterpret_cast<const float4*>(y + d);
        xv[j] = make_float4(xv[j].x + yv.x, xv[j].y + yv.y, xv[j].z + yv.z, xv[j].w + yv.w);
      }
      if (y != nullptr || table.p != nullptr) *reinterpret_cast<float4*>(x + d) = xv[j];
    }
    ss += xv[j].x * xv[j].x + xv[j].y * xv[j].y + xv[j].z * xv[j].z + xv[j].w * xv[j].w;
  }
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  const int warp = threadIdx.x >> 5;
#pragma unroll
  for (int j = 0; j < kNormPrepIters; ++j) {
    const int64_t pw = warp + static_cast<int64_t>(j) * (kNormThreads / 32);
    if (pw >= w4a16::prep_warps(D)) break;  // warp-uniform
    const float v[4] = {xv[j].x * inv * wv[j].x, xv[j].y * inv * wv[j].y, xv[j].z * inv * wv[j].z,
                        xv[j].w * inv * wv[j].w};
    w4a16::prep_warp_store(v, static_cast<int>(pw), group, prepared, D);
  }
}
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_prep_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t D, const float* __restrict__ w,
                            float eps, void* __restrict__ prepared, int group) {
  rmsnorm_prep_row(x, y, nullptr, EmbedTable{}, D, w, eps, prepared, group);
}
// Decode, layer 0: the step's embedding row becomes x and, through the input
// norm, q|k|v's prepared activation (one kernel instead of two). The step's
// first kernel: launched without programmatic dependence.
__global__ void __launch_bounds__(kNormThreads)
    embed_rmsnorm_prep_kernel(const int32_t* __restrict__ tokens, EmbedTable table,
                              float* __restrict__ x, int64_t D, const float* __restrict__ w, float eps,
                              void* __restrict__ prepared, int group) {
  rmsnorm_prep_row(x, nullptr, tokens, table, D, w, eps, prepared, group);
}

// Decode: SiLU(g) · u of one row as the down projection's prepared activation.
__global__ void silu_mul_prep_kernel(const float* __restrict__ g, const float* __restrict__ u, int64_t F,
                                     void* __restrict__ prepared, int group) {
  pdl_prologue();
  const int64_t pw = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (pw >= w4a16::prep_warps(F)) return;
  const int lane = threadIdx.x & 31;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t c = pw * w4a16::kPrepInputs + 4 * lane + i;
    const float a = c < F ? g[c] : 0.0f;
    v[i] = c < F ? a / (1.0f + expf(-a)) * u[c] : 0.0f;
  }
  w4a16::prep_warp_store(v, static_cast<int>(pw), group, prepared, F);
}

// Greedy decode on the device: the index of the largest of v[0 .. n-1], the
// smallest such index on ties (std::max_element's choice; NaN never wins, a
// row of NaN gives 0). kArgmaxBlocks blocks of kArgmaxThreads each scan a
// contiguous slice (16-byte loads) and leave their (value, index) in
// `ArgmaxFeed::part`; the last block to finish (a ticket counter, reset for
// the next call) merges them. Merging by (value, then smaller index) is
// order-free, so the result does not depend on which block finishes last.
// The last block also feeds the next decode step: step = {token, position}
// becomes {result, position + 1}, and host[position % host_slots] = result
// (mapped pinned memory), so greedy steps can run back to back without the
// host in the loop (GpuModel::decode_greedy_run).
constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxBlocks = 64;
struct ArgmaxFeed {
  float* part_v = nullptr;           // [kArgmaxBlocks]
  int64_t* part_i = nullptr;         // [kArgmaxBlocks]
  unsigned* ticket = nullptr;        // zero between calls
  int32_t* step = nullptr;           // {token, position}
  int32_t* host = nullptr;           // mapped pinned ring
  int host_slots = 0;
};
__device__ inline void argmax_merge(float& v, int64_t& i, float ov, int64_t oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}
__device__ inline void argmax_block(float& best, int64_t& bi) {  // the block's pair to thread 0
  __shared__ float sv[kArgmaxThreads / 32];
  __shared__ int64_t si[kArgmaxThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    argmax_merge(best, bi, __shfl_xor_sync(0xFFFFFFFFu, best, o), __shfl_xor_sync(0xFFFFFFFFu, bi, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sv[warp] = best;
    si[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) argmax_merge(best, bi, sv[w], si[w]);
}
__global__ void __launch_bounds__(kArgmaxThreads) argmax_kernel(const float* __restrict__ v, int64_t n,
                                                               ArgmaxFeed f) {
  pdl_prologue();
  // Slices of a multiple of 4 values: 16-byte aligned (v is), a scalar tail.
  const int64_t per = ((n + gridDim.x - 1) / gridDim.x + 3) & ~int64_t{3};
  const int64_t lo = blockIdx.x * per, hi = lo + per < n ? lo + per : n;
  float best = -INFINITY;
  int64_t bi = n;  // past the end: loses every tie
  const int64_t hi4 = hi > lo ? lo + ((hi - lo) & ~int64_t{3}) : lo;
  for (int64_t j = lo + 4 * threadIdx.x; j < hi4; j += 4 * blockDim.x) {
    const float4 x = *reinterpret_cast<const float4*>(v + j);
    argmax_merge(best, bi, x.x, j);
    argmax_merge(best, bi, x.y, j + 1);
    argmax_merge(best, bi, x.z, j + 2);
    argmax_merge(best, bi, x.w, j + 3);
  }
  for (int64_t j = hi4 + threadIdx.x; j < hi; j += blockDim.x) argmax_merge(best, bi, v[j], j);
  argmax_block(best, bi);
  __shared__ bool last;
  if (threadIdx.x == 0) {
    f.part_v[blockIdx.x] = best;
    f.part_i[blockIdx.x] = bi;
    __threadfence();  // the pair is visible before the ticket says so
    last = atomicAdd(f.ticket, 1u) == gridDim.x - 1;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  best = -INFINITY;
  bi = n;
  for (int b = threadIdx.x; b < static_cast<int>(gridDim.x); b += blockDim.x)
    argmax_merge(best, bi, __ldcg(f.part_v + b), __ldcg(f.part_i + b));
  argmax_block(best, bi);
  if (threadIdx.x == 0) {
    const int32_t r = static_cast<int32_t>(bi < n ? bi : 0);
    *f.ticket = 0;
    const int32_t pos = f.step[1];
    f.step[0] = r;
    f.step[1] = pos + 1;
    // No system fence: the host reads the slot only after the step's event,
    // whose completion makes the kernel's writes to mapped memory visible.
    f.host[pos % f.host_slots] = r;
  }
}

// Decode after a head GEMV that took the keys (GemvFusion::argmax_*, session
// 69; or after sample_keys_kernel): one warp reads the kArgmaxKeys slots back
// to zero and feeds the next step as argmax_kernel does (the largest key's
// row; none, where every logit was NaN: 0). Where d's limit is 0 (not a
// greedy or sampled step) the head left no keys, and where its mode is
// kSampleFiltered the keys are left for top-k / top-p (sample_kernels.cuh):
// nothing is read or written.
__global__ void __launch_bounds__(32) argmax_keys_kernel(unsigned long long* keys, const HeadDraw* d, int32_t* step,
                                                         int32_t* host, int host_slots) {
  static_assert(GemvFusion::kArgmaxKeys == 64, "two slots per lane");
  pdl_prologue();
  if (d->limit == 0 || d->mode == HeadDraw::kSampleFiltered) return;
  unsigned long long k = max(atomicExch(keys + threadIdx.x, 0ull), atomicExch(keys + threadIdx.x + 32, 0ull));
  for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xFFFFFFFFu, k, o));
  if (threadIdx.x != 0) return;
  const int32_t r = sampling::key_row(k);
  const int32_t pos = step[1];
  step[0] = r;
  step[1] = pos + 1;
  host[pos % host_slots] = r;  // no system fence: the host reads it after the step's event
}

// y[i, j] += bias[j] for a [n, N] block with leading dimension ldy.
__global__ void bias_add_kernel(float* y, int64_t ldy, const float* bias, int64_t n, int64_t N) {
  pdl_prologue();
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j < n * N) y[(j / N) * ldy + j % N] += bias[j % N];
}

// out[i] = in[i] as f32 (exact) for bf16 / fp16 values: an f32 linear's
// matrix widened just before its GEMM (GpuOptions::f32_linears).
template <typename T>
__global__ void widen_kernel(const T* __restrict__ in, int64_t n, float* __restrict__ out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = widen_f32(in[i]);
}

// x[i, j] = bf16(x[i, j]) (round to nearest even, kept as f32) for an [n, N]
// block with leading dimension ldx: the bf16 inputs of the f32 linears
// (GpuOptions::bf16_inputs), as the CPU forward's bf16_activations rounds them.
__global__ void round_bf16_kernel(float* x, int64_t n, int64_t N, int64_t ldx) {
  pdl_prologue();
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j < n * N) {
    float* p = x + (j / N) * ldx + j % N;
    *p = __bfloat162float(__float2bfloat16_rn(*p));
  }
}

// One warp per (token, head): optional per-head RMSNorm (qwen3), RoPE
// (rotate_half), then q to qf (f32) and k, v into the cache rows at p0 + i.
// One warp: RMS-normalizes one head (when nw is set: qwen3's q/k norm),
// applies RoPE at `pos` and writes it to dst. buf: hd floats of shared memory.
// dst: f32 (q), or a KV cache row of either element type (k).
template <typename DstT>
__device__ inline void rope_head_warp(const float* src, const float* nw, float eps, const float* inv_freq, int64_t hd,
                                      float pos, float* buf, DstT* dst) {
  const int lane = threadIdx.x & 31;
  for (int64_t d = lane; d < hd; d += 32) buf[d] = src[d];
  __syncwarp();
  if (nw != nullptr) {
    float ss = 0.0f;
    for (int64_t d = lane; d < hd; d += 32) ss += buf[d] * buf[d];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
    __syncwarp();
    for (int64_t d = lane; d < hd; d += 32) buf[d] = buf[d] * inv * nw[d];
    __syncwarp();
  }
  const int64_t half = hd / 2;
  for (int64_t d = lane; d < half; d += 32) {
    const float angle = pos * inv_freq[d];
    const float c = cosf(angle), s = sinf(angle), a = buf[d], b = buf[d + half];
    kv::store1(dst + d, a * c - b * s);
    kv::store1(dst + d + half, b * c + a * s);
  }
  __syncwarp();
}

// One warp per (token i, head): q heads to qf (f32), k heads into the key
// cache row p0 + i (with the value row copied alongside); KvT the caches'
// element type (kv_cache.cuh).
template <typename KvT>
__global__ void qkv_rope_kernel(const float* q, const float* k, const float* v, int64_t ld, const float* q_norm,
                                const float* k_norm, float eps, const float* inv_freq, int64_t H, int64_t KV,
                                int64_t hd, int64_t p0_host, const int32_t* p0_dev, float* qf, KvT* kc, KvT* vc) {
  pdl_prologue();
  extern __shared__ float buf[];  // [hd]
  const int64_t p0 = position_of(p0_host, p0_dev);
  const int64_t i = blockIdx.x / (H + KV), hh = blockIdx.x % (H + KV);
  const bool is_q = hh < H;
  const int64_t kvh = hh - H, row = KV * hd;
  const float pos = static_cast<float>(p0 + i);
  if (is_q) {
    rope_head_warp(q + i * ld + hh * hd, q_norm, eps, inv_freq, hd, pos, buf, qf + (i * H + hh) * hd);
  } else {
    rope_head_warp(k + i * ld + kvh * hd, k_norm, eps, inv_freq, hd, pos, buf, kc + (p0 + i) * row + kvh * hd);
    for (int64_t d = threadIdx.x; d < hd; d += 32) kv::store1(vc + (p0 + i) * row + kvh * hd + d, v[i * ld + kvh * hd + d]);
  }
}

// Decode: the attention kernel can do qkv_rope_kernel's work itself (one
// launch less per layer). Every block of a kv head writes the same key and
// value rows (identical values), then reads them back after a barrier.
struct RopeIn {
  const float* qkv = nullptr;  // the qkv projection's row (null: q comes from qf, the cache is filled)
  int64_t ld = 0;
  const float *q_norm = nullptr, *k_norm = nullptr, *inv_freq = nullptr;
  float eps = 0.0f;
  void *kc = nullptr, *vc = nullptr;  // the caches (the kernel's KvT), written at row p0
};

constexpr int kAttentionThreads = 512;

// Dynamic shared memory of attention_kernel for `positions` keys at most.
// q [hd], the partial outputs [max(hd, 4·threads)], the scores [positions].
inline size_t attention_smem(int64_t hd, int64_t positions) {
  return static_cast<size_t>(hd + (hd > 4 * kAttentionThreads ? hd : 4 * kAttentionThreads) + positions) * 4;
}

// One block (kAttentionThreads) per (query i, head h): softmax(q·K / sqrt(hd))
// · V over the cached positions t0 .. p0+i (t0 > 0 under a sliding window).
// The length comes from the position at run time: the grid does not depend on
// it, so a captured decode step serves every position (the shared memory is
// sized for the whole cache then).
// - Scores: one thread per key (hd a multiple of 4), four partial sums.
// - Output: G = blockDim / (hd / 4) groups of hd / 4 threads (a thread per
//   four dimensions, 16-byte loads) each sum every G-th key; the G partial
//   sums are then added in group order. (One thread per dimension, G = 4 at
//   hd = 128, left each thread a quarter of the keys in dependent rounds of 8
//   loads: 9.9 µs per call of the 8B decode at position ~256, measured.)
template <typename OutT, typename KvT>
__global__ void __launch_bounds__(kAttentionThreads)
    attention_kernel(const float* qf, const KvT* kc, const KvT* vc, OutT* out, int64_t ldo, int64_t H, int64_t KV,
                     int64_t hd, int64_t p0_host, const int32_t* p0_dev, int64_t window, float scale,
                     void* prepared, int prep_group, RopeIn rope) {
  pdl_prologue();
  extern __shared__ __align__(16) float sm[];  // q [hd], partial outputs [max(hd, 4·blockDim)], scores [T - t0]
  __shared__ float scratch[32];
  const int64_t p0 = position_of(p0_host, p0_dev);
  const int64_t i = blockIdx.x, h = blockIdx.y, kvh = h / (H / KV), row = KV * hd;
  const int64_t T = p0 + i + 1, t0 = (window > 0 && T > window) ? T - window : 0;
  const int64_t nthreads = blockDim.x;
  float* qs = sm;
  float* part = sm + hd;
  float* sc = part + (hd > 4 * nthreads ? hd : 4 * nthreads);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (rope.qkv != nullptr) {  // decode (i = 0): warp 0 ropes q, warp 1 k into the cache, warp 2 copies v
    const float pos = static_cast<float>(p0);
    const float* k = rope.qkv + H * hd + kvh * hd;
    if (warp == 0) rope_head_warp(rope.qkv + h * hd, rope.q_norm, rope.eps, rope.inv_freq, hd, pos, part, qs);
    if (warp == 1)
      rope_head_warp(k, rope.k_norm, rope.eps, rope.inv_freq, hd, pos, part + hd,
                     static_cast<KvT*>(rope.kc) + p0 * row + kvh * hd);
    if (warp == 2)
      for (int64_t d = lane; d < hd; d += 32) kv::store1(static_cast<KvT*>(rope.vc) + p0 * row + kvh * hd + d, k[KV * hd + d]);
  } else {
    for (int64_t d = threadIdx.x; d < hd; d += nthreads) qs[d] = qf[(i * H + h) * hd + d];
  }
  __syncthreads();
  // Scores: a thread per key, its row in 16-byte loads that are all in flight
  // at once (hd % 4 == 0), four partial sums.
  float mx = -INFINITY;
  const float4* q4 = reinterpret_cast<const float4*>(qs);
  for (int64_t t = t0 + threadIdx.x; t < T; t += nthreads) {
    const KvT* krow = kc + t * row + kvh * hd;
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
#pragma unroll 8
    for (int64_t d = 0; d < hd / 4; ++d) {
      const float4 k = kv::load4(krow + 4 * d), q = q4[d];
      s0 = fmaf(q.x, k.x, s0);
      s1 = fmaf(q.y, k.y, s1);
      s2 = fmaf(q.z, k.z, s2);
      s3 = fmaf(q.w, k.w, s3);
    }
    const float s = ((s0 + s1) + (s2 + s3)) * scale;
    sc[t - t0] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, scratch);  // its barriers also publish sc
  float sum = 0.0f;
  for (int64_t t = t0 + threadIdx.x; t < T; t += nthreads) sum += (sc[t - t0] = expf(sc[t - t0] - mx));
  sum = block_sum(sum, scratch);  // its barriers also publish sc
  const int64_t hd4 = hd / 4, G = hd4 < nthreads ? nthreads / hd4 : 1;
  for (int64_t j = threadIdx.x; j < G * hd4; j += nthreads) {
    const int64_t g = j / hd4, d4 = j % hd4;
    const KvT* vcol = vc + kvh * hd + 4 * d4;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int64_t t = t0 + g; t < T; t += G) {
      const float p = sc[t - t0];
      const float4 v = kv::load4(vcol + t * row);
      o.x += p * v.x;
      o.y += p * v.y;
      o.z += p * v.z;
      o.w += p * v.w;
    }
    reinterpret_cast<float4*>(part)[g * hd4 + d4] = o;
  }
  __syncthreads();
  if (prepared == nullptr) {
    for (int64_t d = threadIdx.x; d < hd; d += nthreads) {
      float o = 0.0f;
      for (int64_t g = 0; g < G; ++g) o += part[g * hd + d];
      store_act(out + i * ldo + h * hd + d, o / sum);
    }
    return;
  }
  // Decode with hd a multiple of 128: the head's output, inputs h·hd ..
  // (h+1)·hd - 1 of the o projection, written as its prepared activation
  // (w4a16_prep.cuh) instead; q's buffer holds the values.
  for (int64_t d = threadIdx.x; d < hd; d += nthreads) {
    float o = 0.0f;
    for (int64_t g = 0; g < G; ++g) o += part[g * hd + d];
    qs[d] = o / sum;
  }
  __syncthreads();
  prep_store_head(qs, h, hd, H, prep_group, prepared);
}

// Decode attention's per-warp helpers (decode_attention_kernel and
// kv_shared_attention_kernel below).
//
// One head of HD values from src: RMS-normalised where nw is set (qwen3's q/k
// norm, weights w in shared memory), then rotated by RoPE (cos/sin tables
// cs/sn), into buf (shared memory); one warp. All of the lane's loads go first
// (one round trip: the stores could alias them for all the compiler knows).
template <int HD>
__device__ __forceinline__ void decode_rope_head(const float* src, const float* nw, const float* w, float* buf,
                                                 const float* cs, const float* sn, float eps) {
  const int lane = threadIdx.x & 31;
  float xr[HD / 32], ss = 0.0f;
#pragma unroll
  for (int i = 0; i < HD / 32; ++i) xr[i] = src[lane + 32 * i];
#pragma unroll
  for (int i = 0; i < HD / 32; ++i) {
    buf[lane + 32 * i] = xr[i];
    ss += xr[i] * xr[i];
  }
  float inv = 1.0f;
  if (nw != nullptr) {
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    inv = 1.0f / sqrtf(ss / static_cast<float>(HD) + eps);
  }
  __syncwarp();
  constexpr int half = HD / 2, kRot = (half + 31) / 32;
  float rot[2 * kRot];
#pragma unroll
  for (int n = 0; n < kRot; ++n) {
    const int d = lane + 32 * n;
    if (d < half) {
      const float a = nw != nullptr ? buf[d] * inv * w[d] : buf[d];
      const float b = nw != nullptr ? buf[d + half] * inv * w[d + half] : buf[d + half];
      rot[2 * n] = a * cs[d] - b * sn[d];
      rot[2 * n + 1] = b * cs[d] + a * sn[d];
    }
  }
  __syncwarp();
#pragma unroll
  for (int n = 0; n < kRot; ++n) {
    const int d = lane + 32 * n;
    if (d < half) {
      buf[d] = rot[2 * n];
      buf[d + half] = rot[2 * n + 1];
    }
  }
}

// The new value row from src into vs (shared memory, as the cache holds it)
// and, where set, into the cache row dst; one warp, its loads first.
template <int HD, typename KvT>
__device__ __forceinline__ void decode_value_row(const float* src, float* vs, KvT* dst) {
  const int lane = threadIdx.x & 31;
  float xr[HD / 32];
#pragma unroll
  for (int i = 0; i < HD / 32; ++i) xr[i] = src[lane + 32 * i];
#pragma unroll
  for (int i = 0; i < HD / 32; ++i) {
    vs[lane + 32 * i] = kv::held<KvT>(xr[i]);
    if (dst != nullptr) kv::store1(dst + lane + 32 * i, xr[i]);
  }
}

// The new key (buf, shared memory, after decode_rope_head) rounded as the
// cache holds it, and written into the cache row dst where set; one warp.
template <int HD, typename KvT>
__device__ __forceinline__ void decode_key_row(float* buf, KvT* dst) {
  const int lane = threadIdx.x & 31;
  __syncwarp();
#pragma unroll
  for (int i = 0; i < HD / 32; ++i) {
    const float v = kv::held<KvT>(buf[lane + 32 * i]);
    buf[lane + 32 * i] = v;
    if (dst != nullptr) kv::store1(dst + lane + 32 * i, v);
  }
}

// RoPE's cos/sin at position p0 and the q/k norm weights (1 where unset)
// into shared memory; the whole block.
__device__ __forceinline__ void decode_rope_tables(const RopeIn& rope, int64_t p0, int64_t hd, float* cs, float* sn,
                                                   float* qn, float* kn) {
  for (int64_t d = threadIdx.x; d < hd / 2; d += blockDim.x) {
    const float angle = static_cast<float>(p0) * rope.inv_freq[d];
    cs[d] = cosf(angle);
    sn[d] = sinf(angle);
  }
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    qn[d] = rope.q_norm != nullptr ? rope.q_norm[d] : 1.0f;
    kn[d] = rope.k_norm != nullptr ? rope.k_norm[d] : 1.0f;
  }
}

// One chunk of decode attention's keys in a warp's registers, and the online
// softmax step over it (decode_attention_kernel and kv_shared_attention_kernel).
// The lanes form KB0 groups of LK lanes (KB0 = 1024 / HD from hd 128 up, else
// 8); group kk holds KPL keys, c0 + j·KB0 + kk for j < KPL, a chunk being the
// KB = KB0·KPL keys c0 .. c0 + KB - 1. Lane `sub` of a group holds its keys'
// 4-element pieces sub, sub + LK, ... (k); lane j holds dimensions
// j·VD .. j·VD + VD - 1 of every key's value (v).
// An f32 cache is held as loaded (KPL = 1: 32 keys' elements per lane, 32 of
// values from hd 128 up); a bf16 cache as loaded too, packed two elements per
// register and widened when used, so the same registers hold twice the keys
// (KPL = 2 from hd 64 up) and a warp walks its range in half the round trips.
// Rows past hi and row p0 (fill_p0, after the wait) are zeros.
template <int HD, typename KvT>
struct DecodeChunk {
  static constexpr bool kBf16 = std::is_same_v<KvT, bf16>;
  static constexpr int KB0 = HD >= 128 ? 1024 / HD : 8, LK = 32 / KB0, SD4 = HD / LK / 4, VD = HD / 32;
  static constexpr int KPL = kBf16 && HD >= 64 ? 2 : 1, KB = KB0 * KPL;
  using KPiece = std::conditional_t<kBf16, uint2, float4>;
  KPiece k[KPL][SD4];
  std::conditional_t<kBf16 && VD >= 2, uint32_t, float> v[KB][kBf16 && VD >= 2 ? VD / 2 : VD];

  // The two bf16 halves of a register as f32, widened where each is used
  // (volatile: the compiler may not keep a chunk's widened elements across
  // the query heads of kv_shared_attention_kernel; it was meant to save
  // registers and does not, 255 either way at G = 4, but it is the version
  // measured in docs/CUDA.md, "A bf16 KV cache").
  __device__ __forceinline__ static float lo(uint32_t w) {
    uint32_t r;
    asm volatile("shl.b32 %0, %1, 16;" : "=r"(r) : "r"(w));
    return __uint_as_float(r);
  }
  __device__ __forceinline__ static float hi(uint32_t w) {
    uint32_t r;
    asm volatile("and.b32 %0, %1, 0xFFFF0000;" : "=r"(r) : "r"(w));
    return __uint_as_float(r);
  }
  __device__ __forceinline__ static float4 widen(const float4& x) { return x; }
  __device__ __forceinline__ static float4 widen(const uint2& x) { return make_float4(lo(x.x), hi(x.x), lo(x.y), hi(x.y)); }
  // Value element j (< VD) of key kk as f32.
  __device__ __forceinline__ float value(int kk, int j) const {
    if constexpr (kBf16 && VD >= 2)
      return j % 2 == 0 ? lo(v[kk][j / 2]) : hi(v[kk][j / 2]);
    else
      return v[kk][j];
  }

  // Keys c0 .. c0 + KB - 1 of kv head kvh from the caches (zeros past hi and
  // for row p0).
  __device__ __forceinline__ void load(const KvT* kc, const KvT* vc, int64_t row, int64_t kvh, int64_t c0,
                                      int64_t hi, int64_t p0, int lane) {
    const int sub = lane % LK, kk = lane / LK;
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
      const int64_t tk = c0 + j * KB0 + kk;
      const bool okk = tk < hi && tk != p0;
      const KvT* krow = kc + tk * row + kvh * HD;
#pragma unroll
      for (int e = 0; e < SD4; ++e) {
        if constexpr (kBf16)
          k[j][e] = okk ? *reinterpret_cast<const uint2*>(krow + 4 * (e * LK + sub)) : make_uint2(0, 0);
        else
          k[j][e] = okk ? *reinterpret_cast<const float4*>(krow + 4 * (e * LK + sub))
                        : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int t = 0; t < KB; ++t) {
      const int64_t tv = c0 + t;
      const KvT* vsrc = vc + tv * row + kvh * HD + lane * VD;
      const bool ok = tv < hi && tv != p0;
      if constexpr (kBf16 && VD >= 2) {  // VD bf16: 4, 8 or 16 bytes
        if constexpr (VD == 2) {
          v[t][0] = ok ? *reinterpret_cast<const uint32_t*>(vsrc) : 0u;
        } else if constexpr (VD == 4) {
          const uint2 w = ok ? *reinterpret_cast<const uint2*>(vsrc) : make_uint2(0, 0);
          v[t][0] = w.x;
          v[t][1] = w.y;
        } else {
#pragma unroll
          for (int q = 0; q < VD / 8; ++q) {
            const uint4 w = ok ? reinterpret_cast<const uint4*>(vsrc)[q] : make_uint4(0, 0, 0, 0);
            v[t][4 * q] = w.x;
            v[t][4 * q + 1] = w.y;
            v[t][4 * q + 2] = w.z;
            v[t][4 * q + 3] = w.w;
          }
        }
      } else if constexpr (VD >= 4) {
#pragma unroll
        for (int j = 0; j < VD; j += 4) {
          const float4 w = ok ? kv::load4(vsrc + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          v[t][j] = w.x;
          v[t][j + 1] = w.y;
          v[t][j + 2] = w.z;
          v[t][j + 3] = w.w;
        }
      } else if constexpr (VD == 2) {
        const float2 w = ok ? kv::load2(vsrc) : make_float2(0.0f, 0.0f);
        v[t][0] = w.x;
        v[t][1] = w.y;
      } else {
        v[t][0] = ok ? kv::load1(vsrc) : 0.0f;
      }
    }
  }

  // Row p0 of a chunk starting at c0 (load left it zero): the new key and
  // value from ksrc / vsrc (shared memory, f32 values the cache holds, or the
  // caches' row p0).
  template <typename SrcT>
  __device__ __forceinline__ void fill_p0(const SrcT* ksrc, const SrcT* vsrc, int64_t c0, int64_t p0, int lane) {
    const int sub = lane % LK, kk = lane / LK;
#pragma unroll
    for (int j = 0; j < KPL; ++j)
      if (c0 + j * KB0 + kk == p0) {
#pragma unroll
        for (int e = 0; e < SD4; ++e) {
          const float4 x = kv::load4(ksrc + 4 * (e * LK + sub));
          if constexpr (kBf16)  // exact: the values are bf16 already
            k[j][e] = make_uint2(pack(x.x, x.y), pack(x.z, x.w));
          else
            k[j][e] = x;
        }
      }
#pragma unroll
    for (int t = 0; t < KB; ++t)
      if (c0 + t == p0) {
#pragma unroll
        for (int j = 0; j < VD; ++j) {
          const float x = kv::load1(vsrc + lane * VD + j);
          if constexpr (kBf16 && VD >= 2) {
            if (j % 2 == 0)
              v[t][j / 2] = pack(x, 0.0f);
            else
              v[t][j / 2] = (v[t][j / 2] & 0xFFFFu) | (__float_as_uint(x) & 0xFFFF0000u);
          } else {
            v[t][j] = x;
          }
        }
      }
  }
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xFFFF0000u);
  }

  // One step of a warp's online softmax for one query over this chunk: the
  // scores (q's 4-element pieces as the keys'), the running max m and sum l,
  // and o (this lane's VD dimensions) rescaled and added to. c0: the chunk's
  // first key; hi: the range's end.
  __device__ __forceinline__ void softmax_step(const float4 (&q)[SD4], int64_t c0, int64_t hi, int lane, float scale,
                                               float& m, float& l, float (&o)[VD]) const {
    const int kk = lane / LK;
    float s[KPL], cm = -INFINITY;
    bool in[KPL];
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int e = 0; e < SD4; ++e) {
        const float4 x = widen(k[j][e]);
        s0 = fmaf(q[e].x, x.x, s0);
        s1 = fmaf(q[e].y, x.y, s1);
        s0 = fmaf(q[e].z, x.z, s0);
        s1 = fmaf(q[e].w, x.w, s1);
      }
      s[j] = s0 + s1;
#pragma unroll
      for (int off = 1; off < LK; off <<= 1) s[j] += __shfl_xor_sync(0xffffffffu, s[j], off);
      in[j] = c0 + j * KB0 + kk < hi;
      s[j] = in[j] ? s[j] * scale : -INFINITY;
      cm = fmaxf(cm, s[j]);
    }
#pragma unroll
    for (int off = LK; off < 32; off <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, off));
    const float m_new = fmaxf(m, cm);  // finite: the chunk's first key is in range
    const float alpha = expf(m - m_new);
    float p[KPL], ps = 0.0f;
#pragma unroll
    for (int j = 0; j < KPL; ++j) {
      p[j] = in[j] ? expf(s[j] - m_new) : 0.0f;
      ps += p[j];
    }
#pragma unroll
    for (int off = LK; off < 32; off <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
    l = fmaf(l, alpha, ps);
    m = m_new;
#pragma unroll
    for (int j = 0; j < VD; ++j) o[j] *= alpha;
#pragma unroll
    for (int t = 0; t < KB; ++t) {
      const float pk = __shfl_sync(0xffffffffu, p[t / KB0], (t % KB0) * LK);
#pragma unroll
      for (int j = 0; j < VD; ++j) o[j] = fmaf(pk, value(t, j), o[j]);
    }
  }
};

// Decode attention on a cluster of kDecodeRanks blocks per head
// (decode_attention, include/nibble/cuda_attention.h; sm_90). The row-wise
// kernel above gives a head one block, so a decode step's attention ran on
// H of the GPU's SMs as one long chain of dependent loads and barriers
// (12.4 µs per layer of the 8B shape at ~70 positions, measured). Here block
// r of head h's cluster takes the r-th of kDecodeRanks equal ranges of the
// keys t0 .. p0 (the length read at run time: one captured step serves every
// position), with its own max and sum; the other ranks send their (o, m, l)
// to rank 0, which combines them:
// out = Σ_r e^(m_r − M)·o_r / Σ_r e^(m_r − M)·l_r.
// - Before waiting for the previous kernel (only constants, the position,
//   which the step's first kernel was launched after, and cache rows before
//   p0, which earlier steps wrote): the q/k norm weights and RoPE's cos/sin at
//   p0 into shared memory, each warp's first chunk of keys and values into
//   registers, and rank 0's mbarrier for the ranks' results (one cluster
//   barrier, so the other ranks see it initialised).
// - Then warps 0, 1, 2 take q, k and v of the new position from the qkv row
//   (each lane's loads issued together: one round trip; norms, RoPE); the
//   new key and value are used from shared memory, and one block per kv head
//   writes them into the caches.
// - Each warp runs its own online softmax over chunks of 1024/hd keys (keys
//   and values of a chunk loaded together, 32 floats of each per lane), and
//   the block's eight warps meet once in shared memory.
// - Ranks 1.. write their (o, m, l) into rank 0's shared memory with st.async,
//   which completes the transaction count of rank 0's mbarrier, and exit;
//   rank 0 waits on the mbarrier alone (no cluster-wide barrier, no remote
//   reads), combines, and writes the prepared output.
// Session 14, globaltimer stamps in the kernel (8-layer 8B-shaped copy, 64
// positions, ns after the wait returns): before its last two changes, q/k/v
// ready 1460, the chunk loop done 1990, the cluster barrier 2860, rank 0's
// combine 2980, the second cluster barrier 3590, the prepared output 4130;
// after, q/k/v ready 700-900, the loop done 1260-1440, the prepared output
// 2730-2870. Before session 14 the block scored every key, took a block-wide
// max and sum, then ran P·V (five barriers, a second round trip between the
// scores and P·V, a scores buffer sized by the longest context): 8.5 µs per
// layer at 64 positions against 4.8 now (bench_decode_trace extensions).
// Tried on the session-10 kernel: clusters of 8 (16.3 µs at 250 positions
// against 9.8), an L2 prefetch of the rank's K/V rows before the wait (no
// faster at 250, slower at 1000), letting the next kernel launch only after
// the P·V step (no change), the first batch of K and V rows loaded into
// registers before the wait (160 registers; 13.0 µs at 250 positions, 21.3
// at 1000, and the next kernel launched later). Tried in session 14: the
// next chunk's rows in flight while one is used (206 registers: 8.3 µs at
// 64 positions, the kernel no longer fits beside the GEMV before it), at
// most 80 registers (spills; 6.3 µs at 64), an L2 prefetch of the next GEMVs'
// weights from this kernel (slower at every size: 8, 16, 32 MB).
// hd: 32, 64, 128 or 256 (a template argument).
constexpr int kDecodeRanks = 4;
constexpr int kDecodeThreads = 256;
constexpr int kDecodeMaxHd = 256;
// Shared memory (floats): q, k, v, q/k norm weights [hd each], cos/sin [hd/2
// each], the result (o [hd], m, l; padded to 4), the warps' outputs [warps·hd]
// and their m and l [2·warps]: at most 15.4 KB, whatever the length.
inline size_t decode_attention_smem(int64_t hd) {
  return static_cast<size_t>(7 * hd + 4 + (kDecodeThreads / 32) * (hd + 2)) * 4;
}
template <typename OutT, int HD, typename KvT>
__global__ void __launch_bounds__(kDecodeThreads, 2)
    decode_attention_kernel(const float* __restrict__ qf, const KvT* kc, const KvT* vc, OutT* out, int64_t H,
                            int64_t KV, int64_t p0_host, const int32_t* p0_dev, int64_t window, float scale,
                            void* prepared, int prep_group, RopeIn rope) {
  constexpr int64_t hd = HD;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t h = blockIdx.x / kDecodeRanks, kvh = h / (H / KV), row = KV * hd;
  extern __shared__ __align__(16) float sm[];
  float* qs = sm;
  float* ks = qs + hd;
  float* vs = ks + hd;
  float* qn = vs + hd;
  float* kn = qn + hd;
  float* cs = kn + hd;
  float* sn = cs + hd / 2;
  float* res = sn + hd / 2;  // o [hd], m, l
  float* wo = res + hd + 4;  // the warps' outputs [warps][hd]; 16-byte aligned
  float* wml = wo + (kDecodeThreads / 32) * hd;  // the warps' m [warps], then l [warps]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // Ranks 1.. send their (o, m, l) into rank 0's `remote` with st.async,
  // counted by rank 0's mbarrier `arrived`; set up before the wait (the
  // cluster barrier here makes it visible to every rank before any sends).
  __shared__ __align__(16) float remote[kDecodeRanks - 1][kDecodeMaxHd + 4];
  __shared__ __align__(8) unsigned long long arrived;
  const uint32_t arrived_addr = static_cast<uint32_t>(__cvta_generic_to_shared(&arrived));
  if (rank == 0 && threadIdx.x == 0) {
    w4a16::mbar_init(arrived_addr, 1);
    w4a16::mbar_expect_tx(arrived_addr, static_cast<unsigned>((kDecodeRanks - 1) * (hd + 2) * 4));
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  cluster.sync();
  const int64_t p0 = position_of(p0_host, p0_dev);
  const bool fresh = rope.qkv != nullptr;  // the new key and value come from the qkv row
  if (fresh) decode_rope_tables(rope, p0, hd, cs, sn, qn, kn);
  // This rank's keys: lo .. hi-1, in chunks of KB keys (DecodeChunk: 8, or 4
  // for hd 256; twice as many in a bf16 cache); warp w takes chunks w, w + 8,
  // ... with its own running max m, sum l and output o (online softmax), so no
  // block barrier separates the scores from P·V and a chunk's key and value
  // rows are loaded together. Scores: LK lanes per key, lane `sub` holding
  // q's float4s sub, sub + LK, ... (a key's LK lanes read contiguous bytes),
  // summed by log2(LK) shuffles. P·V: lane j holds dimensions j·VD .. j·VD +
  // VD - 1 of every key in the chunk. A lane holds 32 registers of keys and as
  // many of values per chunk from hd 128 up. The warp's first chunk is loaded before the wait:
  // rows before p0 were written by earlier steps (the step's first kernel
  // waits for the step before); row p0 is filled in after the wait.
  const int64_t T = p0 + 1, t0 = (window > 0 && T > window) ? T - window : 0;
  const int64_t chunk = (T - t0 + kDecodeRanks - 1) / kDecodeRanks;
  const int64_t lo = t0 + rank * chunk, hi = lo + chunk < T ? lo + chunk : T;
  using Chunk = DecodeChunk<HD, KvT>;
  constexpr int KB = Chunk::KB, LK = Chunk::LK, SD4 = Chunk::SD4, VD = Chunk::VD;
  constexpr int kWarps = kDecodeThreads / 32;
  const int sub = lane % LK;
  Chunk ch;  // rows c0 .. c0 + KB - 1 of the range (row p0 filled in after the wait)
  const int64_t c_first = lo + warp * KB;
  if (c_first < hi) ch.load(kc, vc, row, kvh, c_first, hi, p0, lane);
  w4a16::grid_dependents_launch();
  w4a16::grid_dependency_wait();
  const bool writer = fresh && rank == 0 && h % (H / KV) == 0;  // one block per kv head fills the caches
  if (fresh) {
    __syncthreads();  // the tables
    if (warp < 2) {  // q (warp 0) or k (warp 1): RMS norm where set, then RoPE
      const float* src = rope.qkv + (warp == 0 ? h * hd : H * hd + kvh * hd);
      const float* nw = warp == 0 ? rope.q_norm : rope.k_norm;
      const float* w = warp == 0 ? qn : kn;
      float* buf = warp == 0 ? qs : ks;
      decode_rope_head<HD>(src, nw, w, buf, cs, sn, rope.eps);
      if (warp == 1)
        decode_key_row<HD>(buf, writer ? static_cast<KvT*>(rope.kc) + p0 * row + kvh * hd : nullptr);
    } else if (warp == 2) {
      decode_value_row<HD>(rope.qkv + (H + KV) * hd + kvh * hd, vs,
                           writer ? static_cast<KvT*>(rope.vc) + p0 * row + kvh * hd : nullptr);
    }
  } else {
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qf[h * hd + d];
  }
  __syncthreads();
  float4 qr[SD4];
#pragma unroll
  for (int e = 0; e < SD4; ++e) qr[e] = reinterpret_cast<const float4*>(qs)[e * LK + sub];
  float m = -INFINITY, l = 0.0f, o[VD];
#pragma unroll
  for (int j = 0; j < VD; ++j) o[j] = 0.0f;
  for (int64_t c0 = c_first; c0 < hi; c0 += kWarps * KB) {
    if (c0 != c_first) ch.load(kc, vc, row, kvh, c0, hi, p0, lane);
    if (p0 >= c0 && p0 < c0 + KB) {
      // Row p0: the new key and value from shared memory (fresh), else from
      // the caches, which the kernel before wrote.
      if (fresh)
        ch.fill_p0(ks, vs, c0, p0, lane);
      else
        ch.fill_p0(kc + p0 * row + kvh * HD, vc + p0 * row + kvh * HD, c0, p0, lane);
    }
    ch.softmax_step(qr, c0, hi, lane, scale, m, l, o);
  }
  // The block's warps meet: res = (Σ_w e^(m_w − M)·o_w, M, Σ_w e^(m_w − M)·l_w).
  if (lane == 0) {
    wml[warp] = m;
    wml[kWarps + warp] = l;
  }
#pragma unroll
  for (int j = 0; j < VD; ++j) wo[warp * HD + lane * VD + j] = o[j];
  __syncthreads();
  {
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wml[w]);
    float ww[kWarps], L = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      ww[w] = wml[w] == -INFINITY ? 0.0f : expf(wml[w] - M);  // a warp without keys weighs nothing
      L = fmaf(ww[w], wml[kWarps + w], L);
    }
    // The block's (o [hd], m, l): rank 0 keeps it in res, the others write it
    // into rank 0's remote[rank - 1].
    uint32_t rdst = 0, rbar = 0;
    if (rank > 0) {
      const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(&remote[rank - 1][0]));
      asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(rdst) : "r"(dst));
      asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(rbar) : "r"(arrived_addr));
    }
    for (int64_t d = threadIdx.x; d < hd + 2; d += blockDim.x) {
      float v = d == hd ? M : L;
      if (d < hd) {
        v = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) v = fmaf(ww[w], wo[w * HD + d], v);
      }
      if (rank == 0)
        res[d] = v;
      else
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(
                         rdst + static_cast<uint32_t>(d) * 4),
                     "r"(__float_as_uint(v)), "r"(rbar)
                     : "memory");
    }
    if (rank > 0) return;  // nothing reads this block's shared memory
  }
  // Rank 0: the other ranks' (o, m, l) have arrived when the barrier's phase 0 completes.
  w4a16::mbar_wait_cluster(arrived_addr, 0);
  __syncthreads();  // res
  {
    float m[kDecodeRanks], w[kDecodeRanks];
    const float* rr[kDecodeRanks];
    float M = -INFINITY;
#pragma unroll
    for (int r = 0; r < kDecodeRanks; ++r) {
      rr[r] = r == 0 ? res : remote[r - 1];
      m[r] = rr[r][hd];
      M = fmaxf(M, m[r]);
    }
    float L = 0.0f;
#pragma unroll
    for (int r = 0; r < kDecodeRanks; ++r) {
      w[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - M);  // an empty range weighs nothing
      L = fmaf(w[r], rr[r][hd + 1], L);
    }
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
      float o = 0.0f;
#pragma unroll
      for (int r = 0; r < kDecodeRanks; ++r) o = fmaf(w[r], rr[r][d], o);
      o /= L;
      if (prepared != nullptr)
        wo[d] = o;  // warp 0's slot: every warp's output has been read
      else
        store_act(out + h * hd + d, o);
    }
  }
  if (prepared != nullptr) {
    __syncthreads();
    prep_store_head(wo, h, hd, H, prep_group, prepared);
  }
#else
  __trap();  // launched only on sm_90 and later (decode_attention checks the device)
#endif
}

// Decode attention with each kv head's keys read once for all of its G query
// heads (kv_shared_attention, include/nibble/cuda_attention.h; session 17).
// decode_attention_kernel above gives every query head its own cluster, so
// each key and value row is read G times (4 for Llama-3-8B): at 8000
// positions its attention took 50 µs per layer of the 8B shape, against 15 µs
// for one read of the f32 cache at the read bandwidth. Here block (kvh, r)
// takes the r-th of R equal ranges of the keys t0 .. p0 for every query head
// of kv head kvh (R ranks, ~one block per SM over the grid):
// - before the wait, as above: RoPE's cos/sin and the q/k norm weights into
//   shared memory, each warp's first chunk of keys and values into registers;
// - after it, warps take the G query heads, the key and the value of the new
//   position (norms, RoPE; rank 0 writes the key and value rows), q stays in
//   shared memory (G·hd floats: too many registers for G > 1);
// - each warp runs an online softmax per query head over its chunks of KB keys
//   (the chunk's key and value registers serve all G heads), the block's
//   warps meet in shared memory, and the block leaves (o [hd], m, l) per head
//   in `part`;
// - the block that takes the kv head's last ticket combines the R ranges in
//   rank order (so the result does not depend on which block is last),
//   writes the G heads' outputs (or their prepared activation) and resets the
//   ticket.
// hd: 64 or 128; G: 1, 2, 4 or 8.
constexpr int kSharedThreads = 256;
constexpr int kSharedMaxRanks = 64;
constexpr int kSharedMinKeys = 128;
template <int HD, int G>
constexpr size_t kv_shared_smem_floats() {
  return G * HD + 4 * HD + HD + (kSharedThreads / 32) * G * (HD + 2) + G * kSharedMaxRanks + G;
}
template <typename OutT, int HD, int G, typename KvT>
__global__ void __launch_bounds__(kSharedThreads)
    kv_shared_attention_kernel(const float* __restrict__ qf, const KvT* kc, const KvT* vc, OutT* out, int64_t H,
                               int64_t KV, int R, int64_t p0_host, const int32_t* p0_dev, int64_t window, float scale,
                               void* prepared, int prep_group, RopeIn rope, float* part, unsigned* tickets) {
  constexpr int64_t hd = HD;
  constexpr int kWarps = kSharedThreads / 32;
  const int64_t kvh = blockIdx.x / R, row = KV * hd;
  const int r = static_cast<int>(blockIdx.x % R);
  extern __shared__ __align__(16) float sm[];
  float* qs = sm;              // q of the G heads [G][HD]
  float* ks = qs + G * HD;     // the new key and value [HD] each
  float* vs = ks + HD;
  float* qn = vs + HD;         // q / k norm weights
  float* kn = qn + HD;
  float* cs = kn + HD;         // cos, sin [HD / 2] each
  float* sn = cs + HD / 2;
  float* wo = sn + HD / 2;     // the warps' (o [HD], m, l) per head: [kWarps][G][HD + 2]
  float* wts = wo + kWarps * G * (HD + 2);  // the combine's weights [G][kSharedMaxRanks], then L [G]
  __shared__ int last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t p0 = position_of(p0_host, p0_dev);
  const bool fresh = rope.qkv != nullptr;
  if (fresh) decode_rope_tables(rope, p0, hd, cs, sn, qn, kn);
  // Ranks with keys: at least kSharedMinKeys each (short contexts use fewer
  // blocks, and fewer partial results to combine); the others leave at once.
  const int64_t T = p0 + 1, t0 = (window > 0 && T > window) ? T - window : 0;
  const int Ra = static_cast<int>(min(static_cast<int64_t>(R), (T - t0 + kSharedMinKeys - 1) / kSharedMinKeys));
  if (r >= Ra) {
    w4a16::grid_dependents_launch();
    return;
  }
  // Keys lo .. hi-1 of this rank, chunks of KB, warp w taking chunks w, w + 8,
  // ...: the same lane layout as decode_attention_kernel.
  const int64_t chunk = (T - t0 + Ra - 1) / Ra;
  const int64_t lo = t0 + r * chunk, hi = lo + chunk < T ? lo + chunk : T;
  using Chunk = DecodeChunk<HD, KvT>;
  constexpr int KB = Chunk::KB, KB0 = Chunk::KB0, LK = Chunk::LK, SD4 = Chunk::SD4, VD = Chunk::VD;
  const int sub = lane % LK, kk = lane / LK;
  // An L2 prefetch of chunk c0, issued a chunk ahead of its loads: lane sub of
  // key group kk takes the sub-th 128-byte line of its keys' rows and value
  // rows (a row of HD elements has HD / kLine lines).
  constexpr int kLine = 128 / static_cast<int>(sizeof(KvT));
  auto prefetch_chunk = [&](int64_t c0) {
#pragma unroll
    for (int j = 0; j < Chunk::KPL; ++j) {
      const int64_t t = c0 + j * KB0 + kk;
      if (t < hi && sub < HD / kLine) {
        asm volatile("prefetch.global.L2 [%0];" ::"l"(kc + t * row + kvh * HD + sub * kLine));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(vc + t * row + kvh * HD + sub * kLine));
      }
    }
  };
  Chunk ch;
  const int64_t c_first = lo + warp * KB;
  if (c_first < hi) ch.load(kc, vc, row, kvh, c_first, hi, p0, lane);
  prefetch_chunk(c_first + kWarps * KB);
  w4a16::grid_dependents_launch();
  w4a16::grid_dependency_wait();
  if (fresh) {
    const bool writer = r == 0;  // one block per kv head fills the caches' row p0
    __syncthreads();             // the tables
    for (int item = warp; item < G + 2; item += kWarps) {
      if (item <= G) {  // q of head item, or (item G) the key: RMS norm where set, then RoPE
        const bool key = item == G;
        const float* src = rope.qkv + (key ? H * hd + kvh * hd : (kvh * G + item) * hd);
        const float* nw = key ? rope.k_norm : rope.q_norm;
        const float* w = key ? kn : qn;
        float* buf = key ? ks : qs + item * HD;
        decode_rope_head<HD>(src, nw, w, buf, cs, sn, rope.eps);
        if (key) decode_key_row<HD>(buf, writer ? static_cast<KvT*>(rope.kc) + p0 * row + kvh * hd : nullptr);
      } else {  // the value
        decode_value_row<HD>(rope.qkv + (H + KV) * hd + kvh * hd, vs,
                             writer ? static_cast<KvT*>(rope.vc) + p0 * row + kvh * hd : nullptr);
      }
    }
  } else {
    for (int64_t d = threadIdx.x; d < G * hd; d += blockDim.x) qs[d] = qf[kvh * G * hd + d];
  }
  __syncthreads();
  float m[G], l[G], o[G][VD];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < VD; ++j) o[g][j] = 0.0f;
  }
  for (int64_t c0 = c_first; c0 < hi; c0 += kWarps * KB) {
    if (c0 != c_first) ch.load(kc, vc, row, kvh, c0, hi, p0, lane);
    prefetch_chunk(c0 + kWarps * KB);
    if (p0 >= c0 && p0 < c0 + KB) {  // row p0: the new key and value (shared memory), or the caches
      if (fresh)
        ch.fill_p0(ks, vs, c0, p0, lane);
      else
        ch.fill_p0(kc + p0 * row + kvh * HD, vc + p0 * row + kvh * HD, c0, p0, lane);
    }
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float4* q4 = reinterpret_cast<const float4*>(qs + g * HD);
      float4 qg[SD4];
#pragma unroll
      for (int e = 0; e < SD4; ++e) qg[e] = q4[e * LK + sub];
      ch.softmax_step(qg, c0, hi, lane, scale, m[g], l[g], o[g]);
    }
  }
  // The block's warps meet: per head, (Σ_w e^(m_w − M)·o_w, M, Σ_w e^(m_w − M)·l_w).
#pragma unroll
  for (int g = 0; g < G; ++g) {
    float* wg = wo + (warp * G + g) * (HD + 2);
#pragma unroll
    for (int j = 0; j < VD; ++j) wg[lane * VD + j] = o[g][j];
    if (lane == 0) {
      wg[HD] = m[g];
      wg[HD + 1] = l[g];
    }
  }
  __syncthreads();
  float* mine = part + (kvh * R + r) * G * (hd + 2);
  for (int64_t i = threadIdx.x; i < G * (hd + 2); i += blockDim.x) {
    const int g = static_cast<int>(i / (hd + 2)), d = static_cast<int>(i % (hd + 2));
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, wo[(w * G + g) * (HD + 2) + HD]);
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float* wg = wo + (w * G + g) * (HD + 2);
      const float ww = wg[HD] == -INFINITY ? 0.0f : expf(wg[HD] - M);  // a warp without keys weighs nothing
      v = fmaf(ww, wg[d], v);  // o (d < HD) or l (d = HD + 1); m (d = HD) is M instead
    }
    mine[i] = d == HD ? M : v;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned t = atomicAdd(tickets + kvh, 1u);
    last = t == static_cast<unsigned>(Ra - 1);
    if (last) tickets[kvh] = 0;  // every rank with keys has arrived: ready for the next call
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The kv head's last block: out = Σ_r e^(m_r − M)·o_r / Σ_r e^(m_r − M)·l_r,
  // summed in rank order. Warp g: head g's weights (lane: ranks lane and
  // lane + 32, m and l loaded at once); then each thread its elements' o_r,
  // 16 ranks' loads at a time.
  const float* all = part + kvh * R * G * (hd + 2);
  for (int g = warp; g < G; g += kWarps) {
    float mr[2], lr[2];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int rr = lane + 32 * u;
      const float* pr = all + (rr * G + g) * (hd + 2);
      mr[u] = rr < Ra ? __ldcg(pr + hd) : -INFINITY;
      lr[u] = rr < Ra ? __ldcg(pr + hd + 1) : 0.0f;
    }
    float M = fmaxf(mr[0], mr[1]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    float L = 0.0f;
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int rr = lane + 32 * u;
      const float w = mr[u] == -INFINITY ? 0.0f : expf(mr[u] - M);  // an empty range weighs nothing
      wts[g * kSharedMaxRanks + rr] = w;
      L = fmaf(w, lr[u], L);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) L += __shfl_xor_sync(0xffffffffu, L, off);
    if (lane == 0) wts[G * kSharedMaxRanks + g] = L;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < G * hd; i += blockDim.x) {
    const int g = static_cast<int>(i / hd), d = static_cast<int>(i % hd);
    float pv[kSharedMaxRanks / 4];  // the ranks' values, loaded 16 at a time, then added in rank order
    float v = 0.0f;
    for (int r0 = 0; r0 < Ra; r0 += kSharedMaxRanks / 4) {
#pragma unroll
      for (int u = 0; u < kSharedMaxRanks / 4; ++u)
        pv[u] = r0 + u < Ra ? __ldcg(all + ((r0 + u) * G + g) * (hd + 2) + d) : 0.0f;
#pragma unroll
      for (int u = 0; u < kSharedMaxRanks / 4; ++u)
        if (r0 + u < Ra) v = fmaf(wts[g * kSharedMaxRanks + r0 + u], pv[u], v);
    }
    v /= wts[G * kSharedMaxRanks + g];
    if (prepared != nullptr)
      qs[i] = v;  // q is no longer needed
    else
      store_act(out + (kvh * G + g) * hd + d, v);
  }
  if (prepared != nullptr) {
    __syncthreads();
    for (int g = 0; g < G; ++g) prep_store_head(qs + g * HD, kvh * G + g, hd, H, prep_group, prepared);
  }
}

// Decode attention split over the keys (split_attention, include/nibble/
// cuda_attention.h): block (h, s) takes the s-th of gridDim.y equal ranges of
// the keys t0 .. p0 (the length read at run time, so a captured step serves
// every position) and leaves its unnormalised output, max and sum (log2
// units) in part[h][s] = [o (hd) | m | l]. Each warp scores 32 keys at once (a
// lane per key, q from shared memory), rescales its running sums once per 32
// keys and adds the 32 weighted value rows (a lane per dimension); the block's
// warps then meet in shared memory. hd: a multiple of 32, at most 256.
constexpr int kSplitThreads = 128;
constexpr int kSplitMaxHd = 256;
template <typename KvT>
__global__ void __launch_bounds__(kSplitThreads)
    split_attention_kernel(const float* __restrict__ qf, const KvT* __restrict__ kc, const KvT* __restrict__ vc,
                           int64_t H, int64_t KV, int64_t hd, int64_t p0_host, const int32_t* p0_dev, int64_t window,
                           float qscale, float* __restrict__ part) {
  pdl_prologue();
  __shared__ __align__(16) float qs[kSplitMaxHd];
  __shared__ float wm[kSplitThreads / 32], wl[kSplitThreads / 32], wo[kSplitThreads / 32][kSplitMaxHd];
  const int64_t h = blockIdx.x, S = gridDim.y, split = blockIdx.y, kvh = h / (H / KV), row = KV * hd;
  const int64_t T = position_of(p0_host, p0_dev) + 1, t0 = (window > 0 && T > window) ? T - window : 0;
  const int64_t per = (T - t0 + S - 1) / S, begin = t0 + split * per, end = begin + per < T ? begin + per : T;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nd = static_cast<int>(hd / 32);
  for (int64_t d = threadIdx.x; d < hd; d += kSplitThreads) qs[d] = qf[h * hd + d] * qscale;
  __syncthreads();
  float m = -INFINITY, l = 0.0f, o[kSplitMaxHd / 32];
#pragma unroll
  for (int j = 0; j < kSplitMaxHd / 32; ++j) o[j] = 0.0f;
  for (int64_t tb = begin + 32 * warp; tb < end; tb += 32 * (kSplitThreads / 32)) {
    const int64_t t = tb + lane;
    float sc = -INFINITY;
    if (t < end) {
      const KvT* kt = kc + t * row + kvh * hd;
      const float4* q4 = reinterpret_cast<const float4*>(qs);
      float acc = 0.0f;
      for (int64_t d = 0; d < hd / 4; ++d) {
        const float4 a = q4[d], b = kv::load4(kt + 4 * d);
        acc = fmaf(a.x, b.x, acc);
        acc = fmaf(a.y, b.y, acc);
        acc = fmaf(a.z, b.z, acc);
        acc = fmaf(a.w, b.w, acc);
      }
      sc = acc;
    }
    float mt = sc;
    for (int off = 16; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
    const float m_new = fmaxf(m, mt);  // finite: lane 0's key is in range
    const float corr = exp2f(m - m_new), p = t < end ? exp2f(sc - m_new) : 0.0f;
    float ps = p;
    for (int off = 16; off > 0; off >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, off);
    l = l * corr + ps;
    m = m_new;
#pragma unroll
    for (int j = 0; j < kSplitMaxHd / 32; ++j) o[j] *= corr;
    const int keys = end - tb < 32 ? static_cast<int>(end - tb) : 32;
    for (int k = 0; k < keys; ++k) {
      const float pk = __shfl_sync(0xffffffffu, p, k);
      const KvT* vt = vc + (tb + k) * row + kvh * hd;
#pragma unroll
      for (int j = 0; j < kSplitMaxHd / 32; ++j)
        if (j < nd) o[j] = fmaf(pk, kv::load1(vt + lane + 32 * j), o[j]);
    }
  }
  if (lane == 0) {
    wm[warp] = m;
    wl[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kSplitMaxHd / 32; ++j)
    if (j < nd) wo[warp][lane + 32 * j] = o[j];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kSplitThreads / 32; ++w) M = fmaxf(M, wm[w]);
  float* dst = part + (h * S + split) * (hd + 2);
  for (int64_t d = threadIdx.x; d < hd; d += kSplitThreads) {
    float acc = 0.0f;
    if (M != -INFINITY)  // an empty range (short cache, many splits) leaves zeros
      for (int w = 0; w < kSplitThreads / 32; ++w) acc = fmaf(exp2f(wm[w] - M), wo[w][d], acc);
    dst[d] = acc;
  }
  if (threadIdx.x == 0) {
    float L = 0.0f;
    if (M != -INFINITY)
      for (int w = 0; w < kSplitThreads / 32; ++w) L = fmaf(exp2f(wm[w] - M), wl[w], L);
    dst[hd] = M;
    dst[hd + 1] = L;
  }
}

// One block per head: out = Σ_s 2^(m_s − M)·o_s / Σ_s 2^(m_s − M)·l_s, as
// OutT, or (prepared set, hd a multiple of 128) as the o projection's
// prepared activation. S ≤ kSplitMaxSplits.
constexpr int kSplitMaxSplits = 256;
template <typename OutT>
__global__ void __launch_bounds__(kSplitThreads)
    split_combine_kernel(const float* __restrict__ part, int64_t hd, int S, OutT* out, void* prepared, int prep_group,
                         int64_t H) {
  pdl_prologue();
  __shared__ float w[kSplitMaxSplits];
  __shared__ __align__(16) float vals[kSplitMaxHd];
  __shared__ float red[2];
  const int64_t h = blockIdx.x;
  const float* ph = part + h * S * (hd + 2);
  if (threadIdx.x == 0) {
    float M = -INFINITY;
    for (int s = 0; s < S; ++s) M = fmaxf(M, ph[s * (hd + 2) + hd]);
    float L = 0.0f;
    for (int s = 0; s < S; ++s) {
      const float ms = ph[s * (hd + 2) + hd];
      w[s] = ms == -INFINITY ? 0.0f : exp2f(ms - M);
      L = fmaf(w[s], ph[s * (hd + 2) + hd + 1], L);
    }
    red[0] = 1.0f / L;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < hd; d += kSplitThreads) {
    float acc = 0.0f;
    for (int s = 0; s < S; ++s) acc = fmaf(w[s], ph[s * (hd + 2) + d], acc);
    vals[d] = acc * red[0];
  }
  if (prepared == nullptr) {
    for (int64_t d = threadIdx.x; d < hd; d += kSplitThreads) store_act(out + h * hd + d, vals[d]);
    return;
  }
  __syncthreads();
  prep_store_head(vals, h, hd, H, prep_group, prepared);
}

// h = SiLU(g) · u as OutT, the down projection's input; g and u rows have
// leading dimension ld (they are the two halves of one gate|up output).
template <typename OutT>
__global__ void silu_mul_kernel(const float* g, const float* u, int64_t ld, OutT* h, int64_t ldh, int64_t n,
                                int64_t F) {
  pdl_prologue();
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= n * F) return;
  const int64_t r = j / F, c = j % F;
  const float a = g[r * ld + c];
  store_act(h + r * ldh + c, a / (1.0f + expf(-a)) * u[r * ld + c]);
}

}  // namespace
}  // namespace nibble::cuda
