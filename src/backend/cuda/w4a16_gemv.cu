// The single-token W4A16 GEMV with integer dot products.
//
// y = Ŵ·x for one token, Ŵ = int4_asym (code·scale + min per group of 64 or
// 128 inputs), x bf16 or fp16. Decode reads every weight byte once, so the
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
//    are shifted back, exactly). The three planes are the mma's B columns 0..2.
//  * Per chunk of 16 rows × 64 inputs (512 bytes, one 16-byte load per lane):
//    8 ANDs and 2 integer mmas. Per group the int32 sums give
//    Σ x·(c·s + m) = s·d·(65536·A + 256·B + C) + m·Σx exactly up to fp32
//    rounding of the combination.
//  * The weight stream goes through a per-warp cp.async ring in shared memory
//    (one stage per group), as in the mma kernel; the warps of a block split K
//    by groups and meet in shared memory. Programmatic dependent launch: the
//    ring's first stages are in flight before the kernel waits for x.
#include "backend/cuda/check.h"
#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_gemv.h"

#include <algorithm>

namespace nibble::cuda {

namespace {

using namespace w4a16;

// The prepared activation for one chunk of 64 inputs: [plane a, b, c][tig] ×
// 16 bytes; lane (gid = plane, tig) reads its B fragments of both k-steps in
// one 16-byte load. Byte 4i + j of a tig's 16 bytes is input 16·tig + 4i +
// kPerm[j] (the layout's k order: nibble pairs are inputs +0/+2 and +1/+3).
constexpr int kChunkBytes = 3 * 4 * 16;

__device__ inline uint32_t byte_at(int32_t v) { return static_cast<uint32_t>(v) & 0xFFu; }

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
// Groups of 64 reduce over half-warps, groups of 128 over the warp.
template <typename T>
__global__ void __launch_bounds__(256) prep_x_kernel(const T* __restrict__ x, int K, uint32_t* __restrict__ frags,
                                                     float2* __restrict__ ginfo, int warps_total, int group) {
  grid_dependents_launch();  // the GEMV may start streaming weights now
  const int lane = threadIdx.x & 31;
  const int w = static_cast<int>((static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5);
  if (w >= warps_total) return;
  grid_dependency_wait();  // x is the previous kernel's output; frags may still be read by the previous GEMV
  const int k0 = w * 128 + 4 * lane;
  float v[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = load_act(x, k0 + i, K);
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  const int span = group == 64 ? 16 : 32;  // lanes per group
  for (int o = span / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  // A NaN or inf anywhere in the group (fmaxf drops NaNs, so ask each lane)
  // gives d = NaN below: the group's sum is NaN, as a float dot product's
  // would be NaN or inf.
  const bool lane_finite = isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2]) && isfinite(v[3]);
  const unsigned group_lanes = span == 32 ? 0xFFFFFFFFu : (lane < 16 ? 0x0000FFFFu : 0xFFFF0000u);
  const bool finite = (__ballot_sync(0xFFFFFFFFu, !lane_finite) & group_lanes) == 0;
  // amax < 2^(E - 126) for biased exponent E, so with d = 2^(E - 148),
  // |x / d| < 2^22. d stays a normal float (E - 21 >= 1).
  const uint32_t E = __float_as_uint(amax) >> 23;
  const int Ed = max(static_cast<int>(E) - 21, 1);
  const float d = finite ? __uint_as_float(static_cast<uint32_t>(Ed) << 23) : __int_as_float(0x7FC00000);
  const float inv = __uint_as_float(static_cast<uint32_t>(254 - Ed) << 23);
  int32_t q[4], sum = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    q[i] = finite ? __float2int_rn(v[i] * inv) : 0;
    sum += q[i];
  }
  for (int o = span / 2; o > 0; o >>= 1) sum += __shfl_xor_sync(0xFFFFFFFFu, sum, o);
  // Balanced base-256 digits: v = 65536a + 256b + c, each in [-128, 127].
  uint32_t plane[3] = {0, 0, 0};
  constexpr int kPerm[4] = {0, 2, 1, 3};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int32_t val = q[kPerm[j]];
    const int32_t c = (val << 24) >> 24, r = (val - c) >> 8;
    const int32_t b = (r << 24) >> 24, a = (r - b) >> 8;
    plane[0] |= byte_at(a) << (8 * j);
    plane[1] |= byte_at(b) << (8 * j);
    plane[2] |= byte_at(c) << (8 * j);
  }
  const int chunk = 2 * w + (lane >> 4), tig = (lane >> 2) & 3, word = lane & 3;
#pragma unroll
  for (int p = 0; p < 3; ++p) frags[((static_cast<int64_t>(chunk) * 3 + p) * 4 + tig) * 4 + word] = plane[p];
  if ((lane & (span - 1)) == 0) ginfo[group == 64 ? 2 * w + (lane >> 4) : w] = make_float2(d, static_cast<float>(sum) * d);
}

__device__ inline void mma_u8s8(int32_t (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One block per 16-row tile; its warps take interleaved groups. CPG chunks per
// group (1: groups of 64, 2: groups of 128), S ring stages per warp.
template <typename OutT, int CPG, int S>
__global__ void __launch_bounds__(512) w4a16_gemv_kernel(const uint4* __restrict__ codes, const uint2* __restrict__ meta,
                                                         const uint4* __restrict__ frags,
                                                         const float2* __restrict__ ginfo, OutT* __restrict__ y, int N,
                                                         int chunks, int groups, int groups_padded) {
  static_assert((S & (S - 1)) == 0 && S >= 2, "ring stages: a power of two");
  extern __shared__ __align__(16) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const int64_t tile = blockIdx.x;
  const uint4* cp = codes + tile * chunks * 32 + lane;
  const uint2* mp = meta + tile * groups_padded * 8 + gid;
  uint4* ring_q = reinterpret_cast<uint4*>(smem) + warp * S * CPG * 32;
  uint2* ring_m = reinterpret_cast<uint2*>(smem + static_cast<size_t>(nwarps) * S * CPG * 32 * 16) + warp * S * 32;

  auto issue = [&](int i) {  // the warp's i-th group into stage i % S
    const int g = warp + i * nwarps, st = i & (S - 1);
    if (g < groups) {
#pragma unroll
      for (int u = 0; u < CPG; ++u)
        if (g * CPG + u < chunks) cp_async16(ring_q + (st * CPG + u) * 32 + lane, cp + static_cast<int64_t>(g * CPG + u) * 32);
      cp_async8(ring_m + st * 32 + lane, mp + static_cast<int64_t>(g) * 8);
    }
    cp_async_commit();
  };
  const int iters = warp < groups ? (groups - warp + nwarps - 1) / nwarps : 0;
#pragma unroll
  for (int i = 0; i < S - 1; ++i) issue(i);
  grid_dependency_wait();  // weights are in flight; x is prepared by the previous kernel

  // Lanes of column 2tig (d0, d2) and 2tig + 1 (d1, d3): columns 0, 1, 2 are
  // planes a, b, c; columns 3..7 are zero.
  const float c_even = tig == 0 ? 65536.0f : tig == 1 ? 1.0f : 0.0f, c_odd = tig == 0 ? 256.0f : 0.0f;
  const float c_min = tig == 0 ? 1.0f : 0.0f;  // the min term is added once per row
  const bool b_lane = gid < 3;
  float out_lo = 0.0f, out_hi = 0.0f;  // rows gid, gid + 8
  for (int i = 0; i < iters; ++i) {
    issue(i + S - 1);
    const int g = warp + i * nwarps, st = i & (S - 1);
    uint4 xf[CPG];
#pragma unroll
    for (int u = 0; u < CPG; ++u)
      xf[u] = b_lane ? __ldg(frags + (static_cast<int64_t>(g * CPG + u) * 3 + gid) * 4 + tig) : make_uint4(0, 0, 0, 0);
    const float2 gi = __ldg(ginfo + g);
    cp_async_wait<S - 1>();
    int32_t acc[4] = {0, 0, 0, 0};
#pragma unroll
    for (int u = 0; u < CPG; ++u) {
      if (CPG > 1 && g * CPG + u >= chunks) break;  // the last group of a ragged K (warp-uniform)
      const uint4 q = ring_q[(st * CPG + u) * 32 + lane];
      mma_u8s8(acc, q.x & 0x0F0F0F0Fu, q.x & 0xF0F0F0F0u, q.y & 0x0F0F0F0Fu, q.y & 0xF0F0F0F0u, xf[u].x, xf[u].y);
      mma_u8s8(acc, q.z & 0x0F0F0F0Fu, q.z & 0xF0F0F0F0u, q.w & 0x0F0F0F0Fu, q.w & 0xF0F0F0F0u, xf[u].z, xf[u].w);
    }
    const uint2 sm = ring_m[st * 32 + lane];
    // Rows gid + 8 are 16× (their nibbles were not shifted down): exact shift.
    const float v_lo = fmaf(c_odd, static_cast<float>(acc[1]), c_even * static_cast<float>(acc[0]));
    const float v_hi = fmaf(c_odd, static_cast<float>(acc[3] >> 4), c_even * static_cast<float>(acc[2] >> 4));
    const float s_lo = bf16_bits_to_float(sm.x & 0xFFFFu), m_lo = bf16_bits_to_float(sm.x >> 16);
    const float s_hi = bf16_bits_to_float(sm.y & 0xFFFFu), m_hi = bf16_bits_to_float(sm.y >> 16);
    out_lo = fmaf(s_lo * gi.x, v_lo, fmaf(c_min * m_lo, gi.y, out_lo));
    out_hi = fmaf(s_hi * gi.x, v_hi, fmaf(c_min * m_hi, gi.y, out_hi));
  }
  grid_dependents_launch();
  out_lo += __shfl_xor_sync(0xFFFFFFFFu, out_lo, 1);  // tig 0 + tig 1 (tig 2, 3 hold zeros)
  out_hi += __shfl_xor_sync(0xFFFFFFFFu, out_hi, 1);
  const int64_t row0 = tile * kTileRows;
  if (nwarps == 1) {
    if (tig == 0) {
      if (row0 + gid < N) y[row0 + gid] = to_out<OutT>(out_lo);
      if (row0 + gid + 8 < N) y[row0 + gid + 8] = to_out<OutT>(out_hi);
    }
    return;
  }
  float* red = reinterpret_cast<float*>(smem + static_cast<size_t>(nwarps) * S * (CPG * 32 * 16 + 32 * 8));
  if (tig == 0) {
    red[warp * kTileRows + gid] = out_lo;
    red[warp * kTileRows + gid + 8] = out_hi;
  }
  __syncthreads();
  if (threadIdx.x < kTileRows) {
    float s = 0.0f;
    for (int w = 0; w < nwarps; ++w) s += red[w * kTileRows + threadIdx.x];
    if (row0 + threadIdx.x < N) y[row0 + threadIdx.x] = to_out<OutT>(s);
  }
}

constexpr int kStages = 4;

template <typename T, typename OutT, int CPG>
void launch(const DeviceLinear& w, const T* x, OutT* y, cudaStream_t stream, bool pdl, int sms) {
  const int64_t tiles = (w.rows + kTileRows - 1) / kTileRows, chunks = (w.cols + kChunk - 1) / kChunk;
  const int64_t groups = (chunks + CPG - 1) / CPG;
  const int64_t groups_padded = (chunks * kChunk + w.group_size - 1) / w.group_size;
  const int64_t prep_warps = (chunks + 1) / 2;
  auto* frags = static_cast<uint32_t*>(w.scratch.get());
  auto* ginfo = reinterpret_cast<float2*>(static_cast<unsigned char*>(w.scratch.get()) + prep_warps * 2 * kChunkBytes);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;

  cudaLaunchConfig_t prep = {};
  prep.gridDim = dim3(static_cast<unsigned>((prep_warps + 7) / 8));
  prep.blockDim = dim3(256);
  prep.stream = stream;
  prep.attrs = attr;
  prep.numAttrs = pdl ? 1 : 0;
  NIBBLE_CUDA_CHECK(cudaLaunchKernelEx(&prep, prep_x_kernel<T>, x, static_cast<int>(w.cols), frags, ginfo,
                                       static_cast<int>(prep_warps), w.group_size));

  // Warps per block: ~32 resident per SM over the whole grid, at most 16 and
  // at most one per group.
  const int64_t warps = std::clamp<int64_t>(int64_t{sms} * 32 / std::max<int64_t>(tiles, 1), 1, std::min<int64_t>(16, groups));
  const size_t smem = static_cast<size_t>(warps) * (kStages * (CPG * 32 * 16 + 32 * 8) + kTileRows * 4);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(tiles));
  cfg.blockDim = dim3(static_cast<unsigned>(warps * 32));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;  // always: the GEMV waits for its own prep kernel with griddepcontrol.wait
  auto kernel = w4a16_gemv_kernel<OutT, CPG, kStages>;
  static const bool attr_set = [&] {
    NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 110 << 10));
    return true;
  }();
  (void)attr_set;
  NIBBLE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, static_cast<const uint4*>(w.a.get()),
                                       static_cast<const uint2*>(w.b.get()), reinterpret_cast<const uint4*>(frags),
                                       static_cast<const float2*>(ginfo), y, static_cast<int>(w.rows),
                                       static_cast<int>(chunks), static_cast<int>(groups),
                                       static_cast<int>(groups_padded)));
}

template <typename T>
void launch_act(const DeviceLinear& w, const void* x, void* y, bool f32_out, cudaStream_t s, bool pdl, int sms) {
  const T* xt = static_cast<const T*>(x);
  if (w.group_size == 64)
    f32_out ? launch<T, float, 1>(w, xt, static_cast<float*>(y), s, pdl, sms)
            : launch<T, T, 1>(w, xt, static_cast<T*>(y), s, pdl, sms);
  else
    f32_out ? launch<T, float, 2>(w, xt, static_cast<float*>(y), s, pdl, sms)
            : launch<T, T, 2>(w, xt, static_cast<T*>(y), s, pdl, sms);
}

}  // namespace

bool w4a16_gemv_applies(int group_size) { return group_size == 64 || group_size == 128; }

size_t w4a16_gemv_scratch_bytes(int64_t cols) {
  const int64_t prep_warps = ((cols + kChunk - 1) / kChunk + 1) / 2;
  return static_cast<size_t>(prep_warps) * (2 * kChunkBytes + 2 * sizeof(float2));
}

void w4a16_gemv(const DeviceLinear& w, const void* x, Act act, void* y, bool f32_out, cudaStream_t stream, bool pdl,
                int sms) {
  NIBBLE_CHECK(w4a16_gemv_applies(w.group_size) && w.scratch.bytes() >= w4a16_gemv_scratch_bytes(w.cols),
               "w4a16 gemv: no prepared-activation scratch for this weight (group size {})", w.group_size);
  if (act == Act::BF16)
    launch_act<__nv_bfloat16>(w, x, y, f32_out, stream, pdl, sms);
  else if (act == Act::F16)
    launch_act<__half>(w, x, y, f32_out, stream, pdl, sms);
  else
    launch_act<float>(w, x, y, f32_out, stream, pdl, sms);
}

}  // namespace nibble::cuda
