// Device helpers shared by the W4A16 kernels (w4a16.cu: the mma kernel for
// any M; w4a16_gemv.cu: the integer M = 1 kernel). Both read the same
// re-laid-out weights (docs/CUDA.md, "The w4a16_mma layout"). The cp.async
// helpers serve the flash attention kernels too.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nibble::cuda::w4a16 {

constexpr int kTileRows = 16;  // output rows per mma tile
constexpr int kChunk = 64;     // inputs per 16-byte lane load

// The launch attribute that allows programmatic dependent launch (host side;
// the kernels pair it with grid_dependency_wait / grid_dependents_launch).
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = 1;
  return a;
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

}  // namespace nibble::cuda::w4a16
