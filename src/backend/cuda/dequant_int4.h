// int4_asym dequantization into device memory (dequant_int4.cu): the parts as
// FORMAT.md stores them (qweight U8 [rows, (cols + 1) / 2], scales and mins
// BF16 [rows, groups]), already on the device, expanded to F32 [rows, cols]
// at `out` on stream s. Bit-identical to the CPU reference.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace nibble::cuda {

void dequant_int4_asym_launch(const uint8_t* qweight, const void* scales, const void* mins, int64_t rows, int64_t cols,
                              int group_size, float* out, cudaStream_t s);

}  // namespace nibble::cuda
