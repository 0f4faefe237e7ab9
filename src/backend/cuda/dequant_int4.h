// int4_asym dequantization into device memory (dequant_int4.cu): the parts as
// FORMAT.md stores them (qweight U8 [rows, (cols + 1) / 2], scales and mins
// BF16 [rows, groups]; F32 with f32_params: int4_asym_f32, and int4_sym as
// int4_sym_as_asym_f32 gives it), already on the device, expanded to F32
// [rows, cols] at `out` on stream s, each weight fl(fl(code·scale) + min).
// Bit-identical to the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nibble::cuda {

void dequant_int4_asym_launch(const uint8_t* qweight, const void* scales, const void* mins, bool f32_params,
                              int64_t rows, int64_t cols, int group_size, float* out, cudaStream_t s);

}  // namespace nibble::cuda
