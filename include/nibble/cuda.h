// The CUDA backend's host-side entry points. Present only in builds with
// NIBBLE_HAVE_CUDA (configure with NIBBLE_CUDA=auto|on and nvcc on PATH).
#pragma once

#include <vector>

#include "nibble/format.h"
#include "nibble/tensor.h"

namespace nibble::cuda {

// True when the CUDA runtime sees at least one device.
bool device_available();

// Dequantizes an int4_asym matrix on the GPU: parts (qweight U8, scales BF16,
// mins BF16, as FORMAT.md stores them) are copied to the device, one kernel
// expands them, and the result comes back as F32 [rows, cols]. Bit-identical
// to the CPU reference (product and sum rounded separately, no FMA).
Tensor dequantize_int4_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);

}  // namespace nibble::cuda
