// CUDA error checking: every runtime call goes through NIBBLE_CUDA_CHECK.
#pragma once

#include <cuda_runtime.h>

#include "nibble/error.h"

#define NIBBLE_CUDA_CHECK(call)                                                                      \
  do {                                                                                               \
    cudaError_t err_ = (call);                                                                       \
    NIBBLE_CHECK(err_ == cudaSuccess, "CUDA error {} ({}) in {}", static_cast<int>(err_),            \
                 cudaGetErrorString(err_), #call);                                                   \
  } while (0)
