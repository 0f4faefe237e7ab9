// int4_asym dequantization on the GPU (the fallback path of the kernel
// registry: dequantize + reference GEMM; also what a GPU loader uses to
// materialize a layer). Layout: docs/FORMAT.md.
#include <cuda_bf16.h>

#include "backend/cuda/check.h"
#include "backend/cuda/dequant_int4.h"
#include "nibble/cuda.h"

namespace nibble::cuda {
namespace {

__device__ inline float param_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float param_f32(float v) { return v; }

// One thread per packed byte: two adjacent inputs of one row.
// qweight [rows, bytes_per_row], scales/mins [rows, groups] (P: bf16 or f32), out [rows, cols].
template <typename P>
__global__ void dequant_int4_asym_kernel(const uint8_t* __restrict__ qweight, const P* __restrict__ scales,
                                         const P* __restrict__ mins, float* __restrict__ out, int64_t rows,
                                         int64_t cols, int group_size) {
  const int64_t bytes_per_row = (cols + 1) / 2, groups = (cols + group_size - 1) / group_size;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= rows * bytes_per_row) return;
  const int64_t r = idx / bytes_per_row, j = idx % bytes_per_row;
  const uint8_t b = qweight[idx];
  for (int half = 0; half < 2; ++half) {
    const int64_t c = 2 * j + half;
    if (c >= cols) break;  // odd width: the padding nibble
    const int64_t g = r * groups + c / group_size;
    const float code = static_cast<float>(half ? (b >> 4) : (b & 0xF));
    // __fmul_rn / __fadd_rn are never contracted into an FMA: bit-exact with
    // the CPU reference and FORMAT.md.
    out[r * cols + c] = __fadd_rn(__fmul_rn(code, param_f32(scales[g])), param_f32(mins[g]));
  }
}

}  // namespace

void dequant_int4_asym_launch(const uint8_t* qweight, const void* scales, const void* mins, bool f32_params,
                              int64_t rows, int64_t cols, int group_size, float* out, cudaStream_t s) {
  const int64_t n = rows * ((cols + 1) / 2);
  if (n == 0) return;
  constexpr int kThreads = 256;
  const auto blocks = static_cast<unsigned>((n + kThreads - 1) / kThreads);
  if (f32_params)
    dequant_int4_asym_kernel<<<blocks, kThreads, 0, s>>>(qweight, static_cast<const float*>(scales),
                                                          static_cast<const float*>(mins), out, rows, cols, group_size);
  else
    dequant_int4_asym_kernel<<<blocks, kThreads, 0, s>>>(qweight, static_cast<const __nv_bfloat16*>(scales),
                                                          static_cast<const __nv_bfloat16*>(mins), out, rows, cols,
                                                          group_size);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

Tensor dequantize_int4_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size) {
  check_parts(find_format("int4_asym", group_size), parts, rows, cols);  // shapes and dtypes are the format's
  const DeviceBuffer d_qw = upload(parts[0]), d_sc = upload(parts[1]), d_mn = upload(parts[2]);
  Tensor out = Tensor::zeros(DType::F32, {rows, cols});
  DeviceBuffer d_out(out.nbytes());
  dequant_int4_asym_launch(static_cast<const uint8_t*>(d_qw.get()), d_sc.get(), d_mn.get(), false, rows, cols,
                           group_size, static_cast<float*>(d_out.get()), nullptr);
  NIBBLE_CUDA_CHECK(cudaMemcpy(out.raw_mut(), d_out.get(), out.nbytes(), cudaMemcpyDeviceToHost));
  return out;
}

}  // namespace nibble::cuda
