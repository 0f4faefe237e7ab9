// The prepared activation of the single-token integer W4A16 GEMV
// (w4a16_gemv.cu): one token's x held per group (32, 64 or 128 inputs) in 24-bit
// fixed point, laid out as the GEMV's mma B fragments. Written by the GEMV's
// own prep kernel, or directly by the kernel that computes x (GpuModel's
// decode fuses it into the RMSNorm and the SiLU product).
//
// Layout for an input width K (chunks = ceil(K / 64), P = ceil(chunks / 2)):
//  * frags: [2P chunks][3 planes][4 tig] × 16 bytes. Byte 4i + j of a tig's
//    16 bytes is the plane's digit of input 16·tig + 4i + kPerm[j] of the
//    chunk (the w4a16 layout's k order: nibble pairs are inputs +0/+2, +1/+3).
//  * ginfo: [4P] float2 (d, Σx) per group of 32, [2P] per group of 64, or [P]
//    per group of 128, at byte offset 2P · 192 (room for 4P in every case).
// x ≈ d·v per input, d a power of two chosen per group so |v| < 2^22, and
// v = 65536a + 256b + c in balanced digits a, b, c ∈ [-128, 127] (planes).
#pragma once

#include <cstddef>
#include <cstdint>

namespace nibble::cuda::w4a16 {

constexpr int kPrepChunkBytes = 3 * 4 * 16;  // one chunk of 64 inputs
constexpr int kPrepInputs = 128;             // inputs per prep warp (two chunks)

__host__ __device__ inline int64_t prep_warps(int64_t cols) { return ((cols + 63) / 64 + 1) / 2; }
__host__ __device__ inline size_t prep_ginfo_offset(int64_t cols) {
  return static_cast<size_t>(prep_warps(cols)) * 2 * kPrepChunkBytes;
}
__host__ __device__ inline size_t prep_bytes(int64_t cols) {
  return prep_ginfo_offset(cols) + static_cast<size_t>(prep_warps(cols)) * 4 * 8;
}

// Warp w (all 32 lanes, converged) prepares inputs 128w .. 128w + 127, lane l
// holding inputs 128w + 4l + i in v[i] (zeros past K), in groups of 4·span
// inputs (span: 8, 16 or 32 lanes per group).
// A NaN or inf in a group makes its d NaN, so the GEMV's sums over that group
// are NaN, as a float dot product's would be NaN or inf.
__device__ inline void prep_warp_store_span(const float (&v)[4], int w, int span, void* prepared, int64_t cols) {
  const int lane = threadIdx.x & 31;
  float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
  for (int o = span / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, o));
  const bool lane_finite = isfinite(v[0]) && isfinite(v[1]) && isfinite(v[2]) && isfinite(v[3]);
  // The lanes of this lane's group.
  const unsigned group_lanes = span == 32   ? 0xFFFFFFFFu
                               : span == 16 ? (lane < 16 ? 0x0000FFFFu : 0xFFFF0000u)
                                            : 0xFFu << (lane & 24);
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
  uint32_t plane[3] = {0, 0, 0};
  constexpr int kPerm[4] = {0, 2, 1, 3};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int32_t val = q[kPerm[j]];
    const int32_t c = (val << 24) >> 24, r = (val - c) >> 8;
    const int32_t b = (r << 24) >> 24, a = (r - b) >> 8;
    plane[0] |= (static_cast<uint32_t>(a) & 0xFFu) << (8 * j);
    plane[1] |= (static_cast<uint32_t>(b) & 0xFFu) << (8 * j);
    plane[2] |= (static_cast<uint32_t>(c) & 0xFFu) << (8 * j);
  }
  auto* frags = static_cast<uint32_t*>(prepared);
  auto* ginfo = reinterpret_cast<float2*>(static_cast<unsigned char*>(prepared) + prep_ginfo_offset(cols));
  const int chunk = 2 * w + (lane >> 4), tig = (lane >> 2) & 3, word = lane & 3;
#pragma unroll
  for (int p = 0; p < 3; ++p) frags[((static_cast<int64_t>(chunk) * 3 + p) * 4 + tig) * 4 + word] = plane[p];
  if ((lane & (span - 1)) == 0)
    ginfo[span == 16 ? 2 * w + (lane >> 4) : span == 32 ? w : 4 * w + (lane >> 3)] =
        make_float2(d, static_cast<float>(sum) * d);
}

// Groups of `group` inputs (32, 64 or 128; With32 false: 64 or 128). For 64
// and 128 this is session 6's form, the span known at run time: the GEMV's
// 64-register instantiations at groups of 128, whose fused outputs call it,
// got one 4-byte spill outside their main loop from a path for groups of 32
// (session 78; their 8B decode ran 1.5 % slower on an H100, session 79) and
// from a compile-time dispatch over 64 and 128 alike, so the GEMV's own fused
// outputs take groups of 32 only where its own groups are 32.
template <bool With32 = true>
__device__ inline void prep_warp_store(const float (&v)[4], int w, int group, void* prepared, int64_t cols) {
  if (With32 && group == 32)
    prep_warp_store_span(v, w, 8, prepared, cols);
  else
    prep_warp_store_span(v, w, group == 64 ? 16 : 32, prepared, cols);
}

}  // namespace nibble::cuda::w4a16
