// Block-wide reductions of one float per thread, shared by the CUDA backend's
// kernels. blockDim.x a multiple of 32, at most 1024; scratch: 32 floats of
// shared memory. Every thread gets the result.
#pragma once

#include <cmath>

namespace nibble::cuda {

__device__ inline float block_sum(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += scratch[w];
  return s;
}
// NaNs are skipped, as fmaxf skips them.
__device__ inline float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
  return m;
}

}  // namespace nibble::cuda
