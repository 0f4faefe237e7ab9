// The CUDA benchmarks' check of a runtime call: on failure, print the error,
// the call and where, and exit (a benchmark has nothing to recover).
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(call)                                                                                        \
  do {                                                                                                  \
    cudaError_t e_ = (call);                                                                            \
    if (e_ != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorString(e_), __FILE__, __LINE__, #call); \
      std::exit(1);                                                                                     \
    }                                                                                                   \
  } while (0)
