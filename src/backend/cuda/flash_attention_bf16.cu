// Tensor-core flash prefill attention in bf16 (include/nibble/cuda_attention.h,
// flash_attention_bf16 and flash_attention_tc; docs/CUDA.md, "Flash prefill
// attention" and "Prefill attention on tensor cores").
//
// The FlashAttention-2 schedule on mma.m16n8k16 (bf16 in, fp32 accumulate).
// One block of 4 warps computes a tile of Br = 64 queries of one head; each
// warp owns 16 query rows and walks the key tiles of Bc = 64 positions:
//
//   S = Q Kⱼᵀ          16×64 per warp: D/16 k-steps × 8 n-tiles of mma, fp32
//   m' = max(m, rowmax S), P = exp2(S − m'), l = l·2^(m−m') + rowsum P
//   O = O·2^(m−m') + bf16(P) Vⱼ   P stays in registers: the accumulator layout
//                                 of two n-tiles is the A fragment of one k-step
//   out = bf16(O / l)
//
// q comes pre-multiplied by scale·log2(e) (scores in log2 units for exp2);
// q, k and v are bf16 in global memory and arrive in shared memory by
// cp.async, K and V double-buffered so the next tile loads during this one.
// Fragments come from shared memory by ldmatrix (V with .trans); a row pitch
// of D + 8 elements (16 bytes more than a row) puts the 8 rows of one 8×8
// matrix on distinct banks.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/convert.h"
#include "backend/cuda/w4a16_common.cuh"
#include "nibble/cuda_attention.h"

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int kBr = 64, kBc = 64, kWarps = 4, kThreads = 32 * kWarps;

template <int D>
struct Bf16Layout {
  static constexpr int kPitch = D + 8;           // elements per shared row
  static constexpr int kTile = kBr * kPitch;     // elements per tile (Br == Bc)
  static constexpr int q = 0, k = kTile, v = 3 * kTile;  // K, V: two buffers each
  static constexpr size_t bytes = static_cast<size_t>(5 * kTile) * sizeof(bf16);
};

__device__ inline unsigned smem_addr(const void* p) { return static_cast<unsigned>(__cvta_generic_to_shared(p)); }

using w4a16::cp_async_commit;
using w4a16::cp_async_wait;
using w4a16::cp_async16_zfill;

__device__ inline void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ inline void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a · b, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ inline void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ inline unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// Rows r0 .. r0+63 of a [rows, stride] bf16 matrix (columns col .. col+D-1)
// into a [64][pitch] tile; rows at or past `end` are zeros (never read).
template <int D>
__device__ inline void load_tile(bf16* tile, const bf16* base, int64_t stride, int64_t r0, int64_t end) {
  constexpr int kChunks = kBr * D / 8;  // 16-byte chunks
  for (int c = threadIdx.x; c < kChunks; c += kThreads) {
    const int r = c / (D / 8), d = (c % (D / 8)) * 8;
    const bool valid = r0 + r < end;
    cp_async16_zfill(tile + r * Bf16Layout<D>::kPitch + d, valid ? base + (r0 + r) * stride + d : base, valid);
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_bf16_kernel(const bf16* __restrict__ q, const bf16* __restrict__ kc, const bf16* __restrict__ vc,
                      bf16* __restrict__ out, int64_t ldo, int64_t n, int64_t p0, int64_t H, int64_t KV,
                      int64_t window) {
  using L = Bf16Layout<D>;
  constexpr int P = L::kPitch, KS = D / 16, DT = D / 8;  // k-steps of S, d-tiles of O
  extern __shared__ __align__(16) bf16 smb[];
  bf16* Qs = smb + L::q;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int64_t h = blockIdx.x, kvh = h / (H / KV), row = KV * D;
  const int64_t q0 = (static_cast<int64_t>(gridDim.y) - 1 - blockIdx.y) * kBr;  // the tile's first query
  const int64_t rows = n - q0 < kBr ? n - q0 : kBr;
  const int64_t first = p0 + q0;       // its position
  const int64_t t_end = first + rows;  // keys up to the last query's position
  const int64_t t_begin = window > 0 && first + 1 > window ? first + 1 - window : 0;
  const bf16* kbase = kc + kvh * D;
  const bf16* vbase = vc + kvh * D;

  load_tile<D>(Qs, q + h * D, H * D, q0, n);
  load_tile<D>(smb + L::k, kbase, row, t_begin, t_end);
  load_tile<D>(smb + L::v, vbase, row, t_begin, t_end);
  cp_async_commit();

  // This thread's rows: gid and gid + 8 of the warp's 16.
  const int64_t pos0 = first + 16 * warp + gid, pos1 = pos0 + 8;
  const int64_t warp_last = first + 16 * warp + 15;  // keys past it are masked for the whole warp
  unsigned qf[KS][4];
  float o[DT][4];
#pragma unroll
  for (int j = 0; j < DT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

  int buf = 0;
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kBc, buf ^= 1) {
    const bool more = t0 + kBc < t_end;
    if (more) {  // the next tile into the other buffer, while this one computes
      load_tile<D>(smb + L::k + (buf ^ 1) * L::kTile, kbase, row, t0 + kBc, t_end);
      load_tile<D>(smb + L::v + (buf ^ 1) * L::kTile, vbase, row, t0 + kBc, t_end);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t0 == t_begin) {
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
        ldmatrix_x4(qf[kk], Qs + (16 * warp + (lane & 15)) * P + 16 * kk + (lane >> 4) * 8);
    }
    if (t0 <= warp_last) {
      const bf16* Ks = smb + L::k + buf * L::kTile;
      const bf16* Vs = smb + L::v + buf * L::kTile;
      float s[8][4];
#pragma unroll
      for (int j = 0; j < 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
          // Keys 8j .. 8j+15, inputs 16kk .. 16kk+15: b0, b1 of n-tiles j and j+1.
          unsigned b[4];
          const int m = lane >> 3;
          ldmatrix_x4(b, Ks + (8 * j + (m >> 1) * 8 + (lane & 7)) * P + 16 * kk + (m & 1) * 8);
          mma_bf16(s[j], qf[kk], b[0], b[1]);
          mma_bf16(s[j + 1], qf[kk], b[2], b[3]);
        }
      // Mask (causal, window) and the online softmax. A row whose keys so far
      // are all masked keeps m = -inf: its exponentials are taken against 0.
      float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int64_t t = t0 + 8 * j + 2 * tig + e;
          const bool ok0 = t <= pos0 && (window <= 0 || pos0 - t < window);
          const bool ok1 = t <= pos1 && (window <= 0 || pos1 - t < window);
          s[j][e] = ok0 ? s[j][e] : -INFINITY;
          s[j][2 + e] = ok1 ? s[j][2 + e] : -INFINITY;
          mx0 = fmaxf(mx0, s[j][e]);
          mx1 = fmaxf(mx1, s[j][2 + e]);
        }
#pragma unroll
      for (int off = 1; off <= 2; off <<= 1) {
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
      }
      const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
      const float base0 = n0 == -INFINITY ? 0.0f : n0, base1 = n1 == -INFINITY ? 0.0f : n1;
      const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
      m0 = n0;
      m1 = n1;
      float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        s[j][0] = exp2f(s[j][0] - base0);
        s[j][1] = exp2f(s[j][1] - base0);
        s[j][2] = exp2f(s[j][2] - base1);
        s[j][3] = exp2f(s[j][3] - base1);
        sum0 += s[j][0] + s[j][1];
        sum1 += s[j][2] + s[j][3];
      }
      l0 = l0 * a0 + sum0;  // this thread's share; the quad is summed at the end
      l1 = l1 * a1 + sum1;
#pragma unroll
      for (int j = 0; j < DT; ++j) {
        o[j][0] *= a0;
        o[j][1] *= a0;
        o[j][2] *= a1;
        o[j][3] *= a1;
      }
      // O += bf16(P) V: k-step kk covers keys 16kk .. 16kk+15 (n-tiles 2kk, 2kk+1 of S).
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) {
        const unsigned pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int j = 0; j < DT; j += 2) {
          // Keys 16kk .. +15, outputs 8j .. 8j+15: b0, b1 of d-tiles j and j+1.
          unsigned b[4];
          const int m = lane >> 3;
          ldmatrix_x4_trans(b, Vs + (16 * kk + (m & 1) * 8 + (lane & 7)) * P + 8 * j + (m >> 1) * 8);
          mma_bf16(o[j], pa, b[0], b[1]);
          mma_bf16(o[j + 1], pa, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }

#pragma unroll
  for (int off = 1; off <= 2; off <<= 1) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, off);
    l1 += __shfl_xor_sync(0xffffffffu, l1, off);
  }
  const int64_t r0 = 16 * warp + gid, r1 = r0 + 8;
  const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
#pragma unroll
  for (int j = 0; j < DT; ++j) {
    const int d = 8 * j + 2 * tig;
    if (r0 < rows)
      *reinterpret_cast<__nv_bfloat162*>(out + (q0 + r0) * ldo + h * D + d) =
          __floats2bfloat162_rn(o[j][0] * inv0, o[j][1] * inv0);
    if (r1 < rows)
      *reinterpret_cast<__nv_bfloat162*>(out + (q0 + r1) * ldo + h * D + d) =
          __floats2bfloat162_rn(o[j][2] * inv1, o[j][3] * inv1);
  }
}

size_t padded(size_t bytes) { return (bytes + 255) / 256 * 256; }

// flash_attention_tc's scratch: bf16 q (q_elems), then an f32 cache's rows
// 0 .. p0+n-1 of k and of v as bf16 (kv_elems each; none for a bf16 cache),
// each part padded to 256 bytes.
struct TcScratch {
  int64_t q_elems, kv_elems;
  size_t q_bytes, kv_bytes;
  explicit TcScratch(const AttentionArgs& a)
      : q_elems(a.n * a.heads * a.head_dim),
        kv_elems(a.kv_bf16 ? 0 : (a.p0 + a.n) * a.kv_heads * a.head_dim),
        q_bytes(padded(static_cast<size_t>(q_elems) * sizeof(bf16))),
        kv_bytes(padded(static_cast<size_t>(kv_elems) * sizeof(bf16))) {}
  size_t bytes() const { return q_bytes + 2 * kv_bytes; }
};

template <int D>
void launch(const AttentionBf16Args& a, cudaStream_t stream) {
  static const bool attribute_set = [] {
    NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(flash_bf16_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(Bf16Layout<D>::bytes)));
    return true;
  }();
  (void)attribute_set;
  const int64_t tiles = (a.n + kBr - 1) / kBr;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(tiles));
  flash_bf16_kernel<D><<<grid, kThreads, Bf16Layout<D>::bytes, stream>>>(
      static_cast<const bf16*>(a.q), static_cast<const bf16*>(a.k), static_cast<const bf16*>(a.v),
      static_cast<bf16*>(a.out), a.ldo, a.n, a.p0, a.heads, a.kv_heads, a.window);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

__global__ void scaled_round_kernel(const float* __restrict__ in, int64_t n, float scale, bf16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = __float2bfloat16_rn(in[i] * scale);
}

}  // namespace

void scaled_round_bf16(const float* in, int64_t n, float scale, bf16* out, cudaStream_t stream) {
  if (n <= 0) return;
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 4096);
  scaled_round_kernel<<<static_cast<unsigned>(blocks), 256, 0, stream>>>(in, n, scale, out);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

bool flash_attention_bf16_supported(int64_t head_dim) { return head_dim == 64 || head_dim == 128; }

void flash_attention_bf16(const AttentionBf16Args& a, void* stream) {
  NIBBLE_CHECK(flash_attention_bf16_supported(a.head_dim), "flash_attention_bf16: head_dim {} is not 64 or 128",
               a.head_dim);
  NIBBLE_CHECK(a.n > 0 && a.p0 >= 0 && a.heads > 0 && a.kv_heads > 0 && a.heads % a.kv_heads == 0,
               "flash_attention_bf16: bad shape (n {}, p0 {}, heads {}, kv_heads {})", a.n, a.p0, a.heads, a.kv_heads);
  NIBBLE_CHECK(a.ldo >= a.heads * a.head_dim && a.ldo % 2 == 0, "flash_attention_bf16: ldo {} (heads × head_dim = {})",
               a.ldo, a.heads * a.head_dim);
  NIBBLE_CHECK((a.n + kBr - 1) / kBr <= 65535 && a.heads <= 65535, "flash_attention_bf16: grid too large");
  auto s = static_cast<cudaStream_t>(stream);
  if (a.head_dim == 64)
    launch<64>(a, s);
  else
    launch<128>(a, s);
}

bool flash_attention_tc_supported(const AttentionArgs& a) {
  return flash_attention_bf16_supported(a.head_dim) && !a.out_f32 && a.prepared == nullptr && a.rope_qkv == nullptr;
}

size_t flash_attention_tc_scratch(const AttentionArgs& a) { return TcScratch(a).bytes(); }

void flash_attention_tc(const AttentionArgs& a, void* scratch, void* stream) {
  NIBBLE_CHECK(flash_attention_tc_supported(a),
               "flash_attention_tc: head_dim {} (64 or 128), a bf16 output and no RoPE step or prepared output",
               a.head_dim);
  NIBBLE_CHECK(a.n > 0 && a.p0 >= 0 && scratch != nullptr, "flash_attention_tc: bad arguments (n {}, p0 {})", a.n,
               a.p0);
  auto s = static_cast<cudaStream_t>(stream);
  const TcScratch layout(a);
  auto* base = static_cast<unsigned char*>(scratch);
  auto* q = reinterpret_cast<bf16*>(base);
  scaled_round_bf16(a.q, layout.q_elems, a.scale * 1.4426950408889634f, q, s);  // log2(e): exp2 units
  AttentionBf16Args b;
  b.q = q;
  b.k = a.k;
  b.v = a.v;
  if (!a.kv_bf16) {  // the cache's rows 0 .. p0+n-1 as bf16
    auto* k = reinterpret_cast<bf16*>(base + layout.q_bytes);
    auto* v = reinterpret_cast<bf16*>(base + layout.q_bytes + layout.kv_bytes);
    scaled_round_bf16(static_cast<const float*>(a.k), layout.kv_elems, 1.0f, k, s);
    scaled_round_bf16(static_cast<const float*>(a.v), layout.kv_elems, 1.0f, v, s);
    b.k = k;
    b.v = v;
  }
  b.out = a.out;
  b.ldo = a.ldo;
  b.n = a.n;
  b.p0 = a.p0;
  b.heads = a.heads;
  b.kv_heads = a.kv_heads;
  b.head_dim = a.head_dim;
  b.window = a.window;
  flash_attention_bf16(b, stream);
}

}  // namespace nibble::cuda
