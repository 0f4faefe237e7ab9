// CPU kernels behind one dispatch point (DESIGN.md: kernels by format, backend, op).
#pragma once

#include <cstdint>

#include "nibble/format.h"

namespace nibble::cpu {

// y[M, N] = x[M, K] · W[N, K]ᵀ with W dense f32 (OpenBLAS sgemm/sgemv).
void gemm_f32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y);

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ with Ŵ an int4_asym matrix read straight from its
// packed parts (qweight [N, ceil(K/2)], scales/mins bf16 [N, ceil(K/G)]). Each
// group is decoded exactly as FORMAT.md says (fl(fl(code·s) + m)) into a small
// buffer and dotted with x in fp32; the full-precision matrix never exists.
void gemm_int4_asym_ref(const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                        const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y);

}  // namespace nibble::cpu
