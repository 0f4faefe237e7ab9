// The activation quantizers of src/quant/act_quant.cpp on the device (act_quant.h).
//
// Each mirrors the host's float operations one for one, so the result is the
// host's bit for bit: IEEE division and multiplication (__fdiv_rn, __fmul_rn:
// no fused or approximate forms), rintf for nearbyint (ties to even, as the
// host's default rounding mode), the host's clamp (which lets a NaN through),
// fmaxf for the absolute maxima (like the host's std::max it skips NaNs; a
// maximum is the same in any order), CUDA's round-to-nearest-even fp16 and
// saturating E4M3 conversions for the host's f32_to_f16 / f32_to_f8_e4m3.
// Scratch (the maxima, llm_int8's outlier columns) is stream-ordered, from w4a16_scratch_pool.
#include "backend/cuda/act_quant.h"

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string_view>

#include "backend/cuda/block_reduce.cuh"
#include "backend/cuda/check.h"
#include "backend/cuda/w4a16_gemv.h"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 256;
constexpr float kLlmInt8Threshold = 6.0f;  // bitsandbytes' Linear8bitLt default, as the host's

// out (≥ 0, no NaN) = max(out, v): non-negative floats order as their bits do.
__device__ void atomic_max_nonneg(float* out, float v) { atomicMax(reinterpret_cast<int*>(out), __float_as_int(v)); }

// The absolute maximum of each row (per_row) or of the whole matrix (out[0]); out starts at 0.
__global__ void absmax_kernel(const float* __restrict__ x, int64_t dim, int64_t ld, bool per_row,
                              float* __restrict__ out) {
  const float* row = x + blockIdx.x * ld;
  float m = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) m = fmaxf(m, fabsf(row[j]));
  __shared__ float scratch[32];
  m = block_max(m, scratch);
  if (threadIdx.x == 0) atomic_max_nonneg(out + (per_row ? blockIdx.x : 0), m);
}

__device__ float clamp127(float v) { return v < -127.0f ? -127.0f : (127.0f < v ? 127.0f : v); }  // std::clamp

// code = clamp(rne(x / scale), -127, 127), x = code · scale, scale = absmax / 127 (none for a zero absmax).
__global__ void int8_kernel(float* __restrict__ x, int64_t rows, int64_t dim, int64_t ld, bool per_row,
                            const float* __restrict__ amax) {
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / dim;
    const float a = amax[per_row ? r : 0];
    if (!(a > 0.0f)) continue;
    const float scale = __fdiv_rn(a, 127.0f);
    float& v = x[r * ld + i % dim];
    v = __fmul_rn(clamp127(rintf(__fdiv_rn(v, scale))), scale);
  }
}

// x = e4m3(x / scale) · scale, scale = absmax / 448.
__global__ void fp8_e4m3_kernel(float* __restrict__ x, int64_t rows, int64_t dim, int64_t ld,
                                const float* __restrict__ amax) {
  const float a = amax[0];
  if (!(a > 0.0f)) return;
  const float scale = __fdiv_rn(a, 448.0f);
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    float& v = x[i / dim * ld + i % dim];
    const __nv_fp8_storage_t b = __nv_cvt_float_to_fp8(__fdiv_rn(v, scale), __NV_SATFINITE, __NV_E4M3);
    v = __fmul_rn(__half2float(__half(__nv_cvt_fp8_to_halfraw(b, __NV_E4M3))), scale);
  }
}

__device__ float to_f16(float v) { return __half2float(__float2half_rn(v)); }

// llm_int8, first half: per row the absolute maximum of its fp16 entries below the threshold, and the outlier
// columns (any fp16 entry at or above it); both start at 0.
__global__ void llm_int8_scan_kernel(const float* __restrict__ x, int64_t dim, int64_t ld, float* __restrict__ amax,
                                     int* __restrict__ outlier) {
  const float* row = x + blockIdx.x * ld;
  float m = 0.0f;
  for (int64_t j = threadIdx.x; j < dim; j += kThreads) {
    const float h = fabsf(to_f16(row[j]));
    if (h >= kLlmInt8Threshold) outlier[j] = 1;
    else m = fmaxf(m, h);  // a NaN is neither: skipped, as the host's std::max skips it
  }
  __shared__ float scratch[32];
  m = block_max(m, scratch);
  if (threadIdx.x == 0) amax[blockIdx.x] = m;
}
// Second half: every entry outside the outlier columns becomes rne(h · 127/absmax) · absmax/127 (0 for a row
// whose absmax is 0); the outlier columns keep x.
__global__ void llm_int8_apply_kernel(float* __restrict__ x, int64_t rows, int64_t dim, int64_t ld,
                                      const float* __restrict__ amax, const int* __restrict__ outlier) {
  const int64_t n = rows * dim;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    const int64_t r = i / dim, j = i % dim;
    if (outlier[j]) continue;
    const float a = amax[r];
    float& v = x[r * ld + j];
    v = a > 0.0f ? __fmul_rn(rintf(__fmul_rn(to_f16(v), __fdiv_rn(127.0f, a))), __fdiv_rn(a, 127.0f)) : 0.0f;
  }
}

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

// Stream-ordered scratch of `bytes`, zeroed, from the backend's pool of per-call scratch.
struct Scratch {
  void* p = nullptr;
  cudaStream_t s;
  Scratch(size_t bytes, cudaStream_t stream) : s(stream) {
    NIBBLE_CUDA_CHECK(cudaMallocFromPoolAsync(&p, bytes, w4a16_scratch_pool(), s));
    NIBBLE_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
  }
  ~Scratch() { cudaFreeAsync(p, s); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
};

void int8_symmetric(float* x, int64_t rows, int64_t dim, int64_t ld, cudaStream_t s, bool per_row) {
  if (rows <= 0 || dim <= 0) return;
  Scratch amax(static_cast<size_t>(per_row ? rows : 1) * sizeof(float), s);
  auto* a = static_cast<float*>(amax.p);
  absmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, dim, ld, per_row, a);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  int8_kernel<<<grid_for(rows * dim), kThreads, 0, s>>>(x, rows, dim, ld, per_row, a);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
void int8_tensor(float* x, int64_t rows, int64_t dim, int64_t ld, cudaStream_t s) {
  int8_symmetric(x, rows, dim, ld, s, false);
}
void int8_token(float* x, int64_t rows, int64_t dim, int64_t ld, cudaStream_t s) {
  int8_symmetric(x, rows, dim, ld, s, true);
}
void fp8_e4m3_tensor(float* x, int64_t rows, int64_t dim, int64_t ld, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  Scratch amax(sizeof(float), s);
  auto* a = static_cast<float*>(amax.p);
  absmax_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, dim, ld, false, a);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  fp8_e4m3_kernel<<<grid_for(rows * dim), kThreads, 0, s>>>(x, rows, dim, ld, a);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}
void llm_int8(float* x, int64_t rows, int64_t dim, int64_t ld, cudaStream_t s) {
  if (rows <= 0 || dim <= 0) return;
  Scratch amax(static_cast<size_t>(rows) * sizeof(float), s), outlier(static_cast<size_t>(dim) * sizeof(int), s);
  auto* a = static_cast<float*>(amax.p);
  auto* o = static_cast<int*>(outlier.p);
  llm_int8_scan_kernel<<<static_cast<unsigned>(rows), kThreads, 0, s>>>(x, dim, ld, a, o);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  llm_int8_apply_kernel<<<grid_for(rows * dim), kThreads, 0, s>>>(x, rows, dim, ld, a, o);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

struct Row {
  std::string_view name;  // act_quants()'s row
  ActQuantDevice run;
};
constexpr Row kRows[] = {
    {"int8_tensor", int8_tensor},
    {"int8_token", int8_token},
    {"fp8_e4m3_tensor", fp8_e4m3_tensor},
    {"llm_int8", llm_int8},
};

}  // namespace

ActQuantDevice find_act_quant_device(const ActQuantSpec& spec) {
  for (const Row& r : kRows)
    if (r.name == spec.name) return r.run;
  return nullptr;
}

}  // namespace nibble::cuda
