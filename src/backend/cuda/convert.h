// Element-wise conversions on the device that more than one GPU source needs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace nibble::cuda {

// out[i] = bf16(in[i] · scale) for i < n: the fp32 product rounded to nearest
// even (scale 1: a plain narrowing). Enqueued on `stream` (0: the legacy
// stream); defined in flash_attention_bf16.cu, whose tensor-core prefill
// rounds q and an f32 cache with it, and the GPU calibration its weights.
void scaled_round_bf16(const float* in, int64_t n, float scale, __nv_bfloat16* out, cudaStream_t stream);

}  // namespace nibble::cuda
