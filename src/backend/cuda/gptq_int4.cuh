// int4_asym's arithmetic on the GPU, shared by GPTQ's sweep (gptq.cu) and
// its refinement (gptq_refine.cu): every operation is the CPU's
// (src/formats/int4_asym.cpp) with the same rounding (explicit __f*_rn
// intrinsics, so nvcc never contracts a multiply and an add into an FMA).
#pragma once

#include <cstdint>

namespace nibble::cuda::gptq_int4 {

constexpr int kLevels = 15;  // int4 codes 0..15

struct Int4Params {
  float scale, min;
};

// dtype.cpp's fp32 -> bf16 -> fp32 (round to nearest even), for finite values.
__device__ __forceinline__ float round_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  return __uint_as_float(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}

__device__ __forceinline__ int encode(float w, Int4Params p) {
  if (p.scale == 0.0f) return 0;
  const float q = rintf(__fdiv_rn(__fsub_rn(w, p.min), p.scale));  // ties to even, like nearbyint
  return static_cast<int>(fminf(fmaxf(q, 0.0f), static_cast<float>(kLevels)));
}

__device__ __forceinline__ float decode(int code, Int4Params p) {
  return __fadd_rn(__fmul_rn(static_cast<float>(code), p.scale), p.min);
}

}  // namespace nibble::cuda::gptq_int4
