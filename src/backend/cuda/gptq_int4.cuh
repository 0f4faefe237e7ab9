// The int4 formats' arithmetic on the GPU, shared by GPTQ's sweep (gptq.cu) and
// its refinement (gptq_refine.cu): every operation is the CPU's
// (src/formats/int4_asym.cpp, int4_sym.cpp) with the same rounding (explicit
// __f*_rn intrinsics, so nvcc never contracts a multiply and an add into an FMA).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace nibble::cuda::gptq_int4 {

constexpr int kLevels = 15;  // int4 codes 0..15

// A group's parameters: int4_asym's and int4_asym_f32's (scale, min); int4_sym's scale (min 0).
struct Int4Params {
  float scale, min;
};

// dtype.cpp's fp32 -> bf16 -> fp32 (round to nearest even), for finite values.
__device__ __forceinline__ float round_bf16(float x) {
  const uint32_t u = __float_as_uint(x);
  return __uint_as_float(((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16) << 16);
}

// The formats the GPU sweep implements, each as its registry row's fit_group
// (given the group's min and max, and the --mse shrink factor), encode and
// decode. fit sets *bad where the CPU's fit_group throws. For --refine:
// code_value (decode = code_value · scale + min, FormatSpec::affine) and store
// (AffineParams::store: the parameters rounded as the format stores them).
// int4_asym (BF16 = true: parameters stored as bf16) and int4_asym_f32 (false: as fp32; FORMAT.md §7.8).
template <bool BF16>
struct AsymT {
  static constexpr bool kHasMin = true;
  // The stored type's rounding (int4_asym.cpp's stored<P>).
  __device__ static __forceinline__ float stored(float v) { return BF16 ? round_bf16(v) : v; }
  // int4_asym.cpp: scale = stored((max − min) / 15), min = stored(min), both times the shrink factor first.
  __device__ static __forceinline__ Int4Params fit(float lo, float hi, float shrink, int* bad) {
    lo = __fmul_rn(lo, shrink);
    hi = __fmul_rn(hi, shrink);
    if (lo == 0.0f) lo = 0.0f;  // -0 -> +0
    const float range = __fsub_rn(hi, lo);
    if (!isfinite(range)) {
      atomicExch(bad, 1);
      return {0.0f, 0.0f};
    }
    return {stored(__fdiv_rn(range, static_cast<float>(kLevels))), stored(lo)};
  }
  // code = clamp(rne((w − min) / scale), 0, 15), w' = code·scale + min.
  __device__ static __forceinline__ int encode(float w, Int4Params p) {
    if (p.scale == 0.0f) return 0;
    const float q = rintf(__fdiv_rn(__fsub_rn(w, p.min), p.scale));  // ties to even, like nearbyint
    return static_cast<int>(fminf(fmaxf(q, 0.0f), static_cast<float>(kLevels)));
  }
  __device__ static __forceinline__ float decode(int code, Int4Params p) {
    return __fadd_rn(__fmul_rn(static_cast<float>(code), p.scale), p.min);
  }
  __device__ static __forceinline__ float code_value(int code) { return static_cast<float>(code); }
  // Both rounded to f32, then to the stored type; a zero min stored as +0.
  __device__ static __forceinline__ Int4Params store(double scale, double min) {
    Int4Params p{stored(__double2float_rn(scale)), stored(__double2float_rn(min))};
    if (p.min == 0.0f) p.min = 0.0f;
    return p;
  }
};

using Asym = AsymT<true>;
using AsymF32 = AsymT<false>;

struct Sym {
  static constexpr bool kHasMin = false;
  static constexpr int kZero = 8;
  // int4_sym.cpp: scale = f16(absmax · shrink / 7); absmax = max(|min|, |max|), as abs_max() finds it.
  __device__ static __forceinline__ Int4Params fit(float lo, float hi, float shrink, int* bad) {
    const float amax = __fmul_rn(fmaxf(fabsf(lo), fabsf(hi)), shrink);
    const float scale = __half2float(__float2half_rn(__fdiv_rn(amax, 7.0f)));  // IEEE round to nearest even
    if (!isfinite(scale)) {
      atomicExch(bad, 1);
      return {0.0f, 0.0f};
    }
    return {scale, 0.0f};
  }
  __device__ static __forceinline__ int encode(float w, Int4Params p) {
    if (p.scale == 0.0f) return kZero;  // an all-zero group
    const float q = __fadd_rn(rintf(__fdiv_rn(w, p.scale)), static_cast<float>(kZero));
    return static_cast<int>(fminf(fmaxf(q, 0.0f), static_cast<float>(kLevels)));
  }
  __device__ static __forceinline__ float decode(int code, Int4Params p) {
    return __fmul_rn(static_cast<float>(code - kZero), p.scale);
  }
  __device__ static __forceinline__ float code_value(int code) { return static_cast<float>(code - kZero); }
  // The scale to f32, then to f16 (int4_sym.cpp's affine_store); no min.
  __device__ static __forceinline__ Int4Params store(double scale, double) {
    return {__half2float(__float2half_rn(__double2float_rn(scale))), 0.0f};
  }
};

}  // namespace nibble::cuda::gptq_int4
