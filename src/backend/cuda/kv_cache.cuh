// The KV cache's elements on the device (GpuOptions::kv_dtype): f32, or bf16
// (half the bytes). The attention kernels are templated on the element type
// KvT and read the cache through these, widening bf16 to f32 exactly; a bf16
// cache holds every key and value rounded to the nearest bf16 (ties to even)
// as it is written, and the step that writes a row uses that rounded row too,
// so a position reads the same key and value whichever kernel wrote them (the
// CPU's `--kv bf16` simulates exactly this).
#pragma once

#include <cuda_bf16.h>

#include <type_traits>

namespace nibble::cuda::kv {

// The two bf16 values of a 32-bit word (low half first) as f32, exactly.
__device__ __forceinline__ float2 widen2(unsigned u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xFFFF0000u));
}
// Four consecutive elements (16-byte aligned for f32, 8-byte for bf16).
__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float4 load4(const __nv_bfloat16* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  const float2 a = widen2(u.x), b = widen2(u.y);
  return make_float4(a.x, a.y, b.x, b.y);
}
// Two consecutive elements (8-byte aligned for f32, 4-byte for bf16).
__device__ __forceinline__ float2 load2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 load2(const __nv_bfloat16* p) { return widen2(*reinterpret_cast<const unsigned*>(p)); }
__device__ __forceinline__ float load1(const float* p) { return *p; }
__device__ __forceinline__ float load1(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void store1(float* p, float v) { *p = v; }
__device__ __forceinline__ void store1(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
// v as a cache of KvT holds it.
template <typename KvT>
__device__ __forceinline__ float held(float v) {
  if constexpr (std::is_same_v<KvT, __nv_bfloat16>)
    return __bfloat162float(__float2bfloat16_rn(v));
  else
    return v;
}

}  // namespace nibble::cuda::kv
