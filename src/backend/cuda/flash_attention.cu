// Flash-style causal prefill attention (include/nibble/cuda_attention.h;
// docs/CUDA.md, "Flash prefill attention").
//
// The KV cache of the GPU forward is fp32 (or bf16, widened to fp32 as its
// tiles are loaded: kv_cache.cuh), so this is the FlashAttention-2
// schedule on fp32 CUDA cores (no tensor cores: TF32 would drop 13 bits of
// the scores' inputs, bf16 16). One block of 256 threads computes a tile of
// Br = 64 queries of one head against key tiles of Bc = 64 cached positions:
//
//   for each key tile j (keys t_begin .. last query's position):
//     S = Q Kⱼᵀ                         64×64 scores, 4×4 per thread, registers
//     m' = max(m, rowmax S)             running max per query row (log2 units)
//     P = exp2(S − m'), l = l·2^(m−m') + rowsum P
//     O = O·2^(m−m') + P Vⱼ             64×hd, 4 rows × hd/16 columns per thread
//   out = bf16(O / l)
//
// Shared memory: Q [64][hd] (pre-multiplied by scale·log2 e), K [64][hd+4],
// V [64][hd]; P (transposed, [64][68]) reuses K's space once S is in
// registers. 97 KiB at hd = 128 (two blocks per SM), whatever the length.
// K and V tiles arrive by cp.async: V's load overlaps the S product.
//
// Thread layout: tid = 16·ty + tx. Thread (ty, tx) owns query rows 4ty..4ty+3
// (S, the row statistics and O: the rescale needs no exchange), score columns
// tx + 16j (j < 4), output columns 4tx + 64j .. +3 (j < hd/64). The 16 threads
// of a row are half a warp, so row max / sum are 4 xor-shuffles.
// Bank conflicts: K's pitch hd+4 ≡ 4 (mod 32) puts the 8 rows one quarter-warp
// reads (LDS.128) on distinct banks; Q and P reads are broadcasts (one row per
// half-warp); V reads are contiguous 16-byte runs of one row.
//
// Blocks: grid (heads, query tiles), the tile with the most keys first (tile
// index reversed), so the short causal tiles fill the tail; the heads of one
// kv head are adjacent in launch order and share K/V tiles through the L2.
#include <cuda_bf16.h>

#include <type_traits>

#include <cmath>

#include "backend/cuda/check.h"
#include "backend/cuda/kv_cache.cuh"
#include "backend/cuda/w4a16_common.cuh"
#include "nibble/cuda_attention.h"

namespace nibble::cuda {
namespace {

constexpr int kBr = 64, kBc = 64, kThreads = 256;
constexpr int kPitchP = kBr + 4;  // transposed P: [kBc][kPitchP]

template <int D>
struct FlashLayout {
  static constexpr int kPitchK = D + 4;
  static constexpr int q = 0, k = kBr * D, v = k + kBc * kPitchK, floats = v + kBc * D;
  static constexpr size_t bytes = static_cast<size_t>(floats) * 4;
  static_assert(D % 64 == 0, "output columns: 16 threads × float4 per 64");
  static_assert(kBc * kPitchP <= kBc * kPitchK, "P reuses K's space");
};

using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::cp_async16_zfill;

// Rows t0 .. t0+63 of one kv head's cache (pitch `row` elements) into a
// [64][pitch] f32 tile; rows at or past t_end are zeros (never read from
// memory). An f32 cache arrives by cp.async; a bf16 cache (kv_cache.cuh) is
// loaded and widened by the threads, so its tile is in place on return.
template <int D, typename KvT>
__device__ inline void load_tile(float* tile, int pitch, const KvT* cache, int64_t row, int64_t t0, int64_t t_end) {
  constexpr int kChunks = kBc * D / 4;  // 4 elements each
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    const int r = c / (D / 4), d = (c % (D / 4)) * 4;
    const bool valid = t0 + r < t_end;
    if constexpr (std::is_same_v<KvT, float>)
      cp_async16_zfill(tile + r * pitch + d, valid ? cache + (t0 + r) * row + d : cache, valid);
    else
      *reinterpret_cast<float4*>(tile + r * pitch + d) =
          valid ? kv::load4(cache + (t0 + r) * row + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

template <int D, typename OutT, typename KvT>
__global__ void __launch_bounds__(kThreads, D <= 128 ? 2 : 1)
    flash_attention_kernel(const float* __restrict__ q, const KvT* __restrict__ kc, const KvT* __restrict__ vc,
                           OutT* __restrict__ out, int64_t ldo, int64_t n, int64_t p0, int64_t H,
                           int64_t KV, int64_t window, float qscale) {
  using L = FlashLayout<D>;
  extern __shared__ __align__(16) float sm[];
  float* Qs = sm + L::q;  // [kBr][D]
  float* Ks = sm + L::k;  // [kBc][D+4]; P [kBc][kPitchP] after S
  float* Vs = sm + L::v;  // [kBc][D]
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int64_t h = blockIdx.x, kvh = h / (H / KV), row = KV * D;
  const int64_t q0 = (static_cast<int64_t>(gridDim.y) - 1 - blockIdx.y) * kBr;  // first query of the tile
  const int64_t rows = n - q0 < kBr ? n - q0 : kBr;
  // Keys: from the first query's window start to the last query's position.
  const int64_t t_end = p0 + q0 + rows;
  const int64_t t_begin = window > 0 && p0 + q0 + 1 > window ? p0 + q0 + 1 - window : 0;
  const KvT* kbase = kc + kvh * D;
  const KvT* vbase = vc + kvh * D;

  load_tile<D>(Ks, L::kPitchK, kbase, row, t_begin, t_end);
  cp_async_commit();
  load_tile<D>(Vs, D, vbase, row, t_begin, t_end);
  cp_async_commit();
  // Q, scaled so that the scores come out in log2 units (exp2 below). Rows
  // past n are zeros: computed like the others, never stored.
  for (int c = tid; c < kBr * D / 4; c += kThreads) {
    const int r = c / (D / 4), d = (c % (D / 4)) * 4;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (r < rows) v = *reinterpret_cast<const float4*>(q + ((q0 + r) * H + h) * D + d);
    v.x *= qscale;
    v.y *= qscale;
    v.z *= qscale;
    v.w *= qscale;
    *reinterpret_cast<float4*>(Qs + r * D + d) = v;
  }

  constexpr int kOut = D / 64;  // float4 output column groups per thread
  float4 o[4][kOut];
  float m[4], l[4];  // running max (log2 units) and this thread's share of the running sum
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    m[i] = -INFINITY;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < kOut; ++j) o[i][j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  const int64_t pos0 = p0 + q0 + 4 * ty;  // position of this thread's first row

  for (int64_t t0 = t_begin; t0 < t_end; t0 += kBc) {
    cp_async_wait<1>();  // K tile in (V may still be in flight)
    __syncthreads();     // ... for every thread; Q too, the first time
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) s[i][j] = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d += 4) {
      float4 a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = *reinterpret_cast<const float4*>(Qs + (4 * ty + i) * D + d);
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = *reinterpret_cast<const float4*>(Ks + (tx + 16 * j) * L::kPitchK + d);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          s[i][j] = fmaf(a[i].x, b[j].x, s[i][j]);
          s[i][j] = fmaf(a[i].y, b[j].y, s[i][j]);
          s[i][j] = fmaf(a[i].z, b[j].z, s[i][j]);
          s[i][j] = fmaf(a[i].w, b[j].w, s[i][j]);
        }
    }
    // Mask (causal, window), online softmax. A row whose keys in this tile are
    // all masked and that has seen none yet keeps m = -inf: its exponentials
    // are taken against 0 so that they are 0, not NaN.
    float alpha[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t pos = pos0 + i;
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int64_t t = t0 + tx + 16 * j;
        const bool ok = t <= pos && (window <= 0 || pos - t < window);
        s[i][j] = ok ? s[i][j] : -INFINITY;
        mx = fmaxf(mx, s[i][j]);
      }
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m[i], mx);
      const float base = m_new == -INFINITY ? 0.0f : m_new;
      alpha[i] = exp2f(m[i] - base);
      float sum = 0.0f;
#pragma unroll
      for (int j = 0; j < 4; ++j) sum += (s[i][j] = exp2f(s[i][j] - base));
      l[i] = l[i] * alpha[i] + sum;
      m[i] = m_new;
    }
    __syncthreads();  // every thread is done with K: P goes there
    float* Ps = Ks;   // [kBc][kPitchP], transposed: the 4 rows of one key are one float4
#pragma unroll
    for (int j = 0; j < 4; ++j)
      *reinterpret_cast<float4*>(Ps + (tx + 16 * j) * kPitchP + 4 * ty) = make_float4(s[0][j], s[1][j], s[2][j], s[3][j]);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
      for (int j = 0; j < kOut; ++j) {
        o[i][j].x *= alpha[i];
        o[i][j].y *= alpha[i];
        o[i][j].z *= alpha[i];
        o[i][j].w *= alpha[i];
      }
    cp_async_wait<0>();  // V tile in
    __syncthreads();     // ... and P written, for every thread
#pragma unroll 4
    for (int c = 0; c < kBc; ++c) {
      const float4 p = *reinterpret_cast<const float4*>(Ps + c * kPitchP + 4 * ty);
      const float pr[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
      for (int j = 0; j < kOut; ++j) {
        const float4 v = *reinterpret_cast<const float4*>(Vs + c * D + 4 * tx + 64 * j);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          o[i][j].x = fmaf(pr[i], v.x, o[i][j].x);
          o[i][j].y = fmaf(pr[i], v.y, o[i][j].y);
          o[i][j].z = fmaf(pr[i], v.z, o[i][j].z);
          o[i][j].w = fmaf(pr[i], v.w, o[i][j].w);
        }
      }
    }
    __syncthreads();  // done with P (K's space) and V: the next tiles may land
    if (t0 + kBc < t_end) {
      load_tile<D>(Ks, L::kPitchK, kbase, row, t0 + kBc, t_end);
      cp_async_commit();
      load_tile<D>(Vs, D, vbase, row, t0 + kBc, t_end);
      cp_async_commit();
    }
  }

#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float sum = l[i];
#pragma unroll
    for (int off = 8; off > 0; off >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, off);
    const int64_t r = 4 * ty + i;
    if (r >= rows) continue;
    const float inv = 1.0f / sum;
    OutT* dst = out + (q0 + r) * ldo + h * D;
#pragma unroll
    for (int j = 0; j < kOut; ++j) {
      const int d = 4 * tx + 64 * j;
      if constexpr (std::is_same_v<OutT, float>) {
        *reinterpret_cast<float4*>(dst + d) =
            make_float4(o[i][j].x * inv, o[i][j].y * inv, o[i][j].z * inv, o[i][j].w * inv);
      } else {
        *reinterpret_cast<__nv_bfloat162*>(dst + d) = __floats2bfloat162_rn(o[i][j].x * inv, o[i][j].y * inv);
        *reinterpret_cast<__nv_bfloat162*>(dst + d + 2) = __floats2bfloat162_rn(o[i][j].z * inv, o[i][j].w * inv);
      }
    }
  }
}

template <int D, typename OutT, typename KvT>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  // Above 48 KiB of dynamic shared memory a kernel must opt in, once.
  static const bool attribute_set = [] {
    NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(flash_attention_kernel<D, OutT, KvT>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(FlashLayout<D>::bytes)));
    return true;
  }();
  (void)attribute_set;
  const int64_t tiles = (a.n + kBr - 1) / kBr;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(tiles));
  const float qscale = a.scale * 1.4426950408889634f;  // log2(e): scores in log2 units for exp2
  flash_attention_kernel<D, OutT, KvT><<<grid, kThreads, FlashLayout<D>::bytes, stream>>>(
      a.q, static_cast<const KvT*>(a.k), static_cast<const KvT*>(a.v), static_cast<OutT*>(a.out), a.ldo, a.n, a.p0,
      a.heads, a.kv_heads, a.window, qscale);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

template <int D>
void launch(const AttentionArgs& a, cudaStream_t stream) {
  NIBBLE_CHECK(a.prepared == nullptr, "flash_attention: no prepared output (the decode kernels' alone)");
  if (a.kv_bf16)
    a.out_f32 ? launch<D, float, __nv_bfloat16>(a, stream) : launch<D, __nv_bfloat16, __nv_bfloat16>(a, stream);
  else
    a.out_f32 ? launch<D, float, float>(a, stream) : launch<D, __nv_bfloat16, float>(a, stream);
}

}  // namespace

bool flash_attention_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128 || head_dim == 256; }

void flash_attention(const AttentionArgs& a, void* stream) {
  NIBBLE_CHECK(flash_attention_supported(a.head_dim), "flash_attention: head_dim {} is not one of 64, 128, 256",
               a.head_dim);
  NIBBLE_CHECK(a.n > 0 && a.p0 >= 0 && a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
               "flash_attention: bad shape (n {}, p0 {}, heads {}, kv_heads {})", a.n, a.p0, a.heads, a.kv_heads);
  NIBBLE_CHECK(a.ldo >= a.heads * a.head_dim && a.ldo % (a.out_f32 ? 4 : 2) == 0,
               "flash_attention: ldo {} (heads × head_dim = {})", a.ldo, a.heads * a.head_dim);
  NIBBLE_CHECK((a.n + kBr - 1) / kBr <= 65535 && a.heads <= 65535, "flash_attention: grid too large");
  auto s = static_cast<cudaStream_t>(stream);
  switch (a.head_dim) {
    case 64: launch<64>(a, s); break;
    case 128: launch<128>(a, s); break;
    default: launch<256>(a, s); break;
  }
}

}  // namespace nibble::cuda
