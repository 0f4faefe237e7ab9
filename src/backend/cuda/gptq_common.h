// What the parts of the GPU GPTQ (gptq_hessian.cu: H and U; gptq.cu: the
// sweep; gptq_refine.cu) share: the process's cuBLAS / cuSOLVER handles and
// their status checks, and the lookup of their per-format tables.
#pragma once

#include <cublas_v2.h>
#include <cusolverDn.h>

#include <cstddef>

#include "backend/cuda/check.h"
#include "nibble/format.h"

#define NIBBLE_CUBLAS_CHECK(call)                                                                     \
  do {                                                                                                \
    const cublasStatus_t st_ = (call);                                                                \
    NIBBLE_CHECK(st_ == CUBLAS_STATUS_SUCCESS, "cuBLAS error {} in {}", static_cast<int>(st_), #call); \
  } while (0)

#define NIBBLE_CUSOLVER_CHECK(call)                                                                       \
  do {                                                                                                    \
    const cusolverStatus_t st_ = (call);                                                                  \
    NIBBLE_CHECK(st_ == CUSOLVER_STATUS_SUCCESS, "cuSOLVER error {} in {}", static_cast<int>(st_), #call); \
  } while (0)

namespace nibble::cuda {

// One handle of each for the process (never destroyed), on the default
// stream, default math mode: cuBLAS's fp32 routines then run in full fp32 (no
// TF32), which the agreement with the CPU needs.
cublasHandle_t gptq_cublas();
cusolverDnHandle_t gptq_cusolver();

// The row of a per-format table (gptq.cu's sweep, gptq_refine.cu's
// refinement: rows with a `family`) for f's format family, or nullptr.
template <class Row, size_t N>
const Row* format_row(const Row (&rows)[N], const FormatChoice& f) {
  if (f.spec == nullptr) return nullptr;
  for (const Row& r : rows)
    if (r.family == f.spec->family) return &r;
  return nullptr;
}

// Elements processed per thread block of the elementwise kernels.
inline unsigned grid_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace nibble::cuda
