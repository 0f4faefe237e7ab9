// The activation quantizers of include/nibble/act_quant.h on the GPU: the
// simulated activation quantization of the GPU forward (GpuOptions::act_quant)
// runs on the device instead of through a round trip to the host.
// Internal to the CUDA backend.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "nibble/act_quant.h"

namespace nibble::cuda {

// Fake-quantizes x[rows, dim] (f32, row stride ld, on the device) in place on
// stream s, with the same float operations as the host's quantizer: the result
// is the host's bit for bit (NaNs stay NaNs).
using ActQuantDevice = void (*)(float* x, int64_t rows, int64_t dim, int64_t ld, cudaStream_t s);

// The device implementation of `spec` (one row per act_quants() row, by name),
// or null for a quantizer with none (the caller then goes through the host).
ActQuantDevice find_act_quant_device(const ActQuantSpec& spec);

}  // namespace nibble::cuda
