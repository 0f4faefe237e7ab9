// GPTQ on the GPU (src/backend/cuda/gptq.cu): the Hessian H = Σ xᵀx, the
// prepared Hessian (damping, act-order, U = the upper Cholesky factor of
// (H + λI)⁻¹) and the blocked column sweep for int4_asym. Each step computes
// what its CPU counterpart in include/nibble/gptq.h computes; docs/CUDA.md
// ("GPTQ on the GPU") says what agrees with the CPU and how closely.
// Present only in builds with NIBBLE_HAVE_CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nibble/cuda.h"
#include "nibble/format.h"
#include "nibble/gptq.h"
#include "nibble/quantizer.h"

namespace nibble::cuda {

// How the GPU forms each chunk's Σ xᵀx before it is added into the fp64 H.
// Distances are max |ΔH_ij| / √(H_ii H_jj) from the CPU's fp64 MatrixStats,
// measured on correlated synthetic inputs (docs/CUDA.md). On the H200 the fp64
// DSYRK runs on the fp64 tensor cores and is as fast as f32: it is the default.
enum class HessianPrecision {
  F64,   // x converted to fp64, DSYRK: the CPU's arithmetic (~1e-15)
  F32,   // f32 SSYRK over at most kHessianFlushTokens tokens, then added into fp64 (~2e-6)
  BF16,  // x rounded to bf16, cublasGemmEx with fp32 accumulation, then into fp64 (~5e-4)
};
const char* hessian_precision_name(HessianPrecision p);
// f32/bf16 partial sums cover at most this many tokens before they are added
// into the fp64 accumulator (bounds the f32 summation error).
constexpr int64_t kHessianFlushTokens = 4096;

// H = Σ xᵀx over calibration rows, accumulated on the GPU, plus the per-channel
// Σ|x| and max|x| that MatrixStats keeps (bit-identical sums). Device memory:
// dim² fp64, plus dim² f32 for the F32/BF16 partial sums.
class GpuHessian {
 public:
  explicit GpuHessian(int64_t dim, HessianPrecision precision = HessianPrecision::F64);
  ~GpuHessian();
  GpuHessian(GpuHessian&&) noexcept;
  GpuHessian& operator=(GpuHessian&&) noexcept;

  // Adds the n rows of x[n, dim] (row stride ld, default dim); x on the host.
  void add(const float* x, int64_t n, int64_t ld = 0);
  // The same with x in device memory.
  void add_device(const float* x, int64_t n, int64_t ld = 0);
  // x bf16 in device memory (the GPU calibration forward's linear inputs,
  // cuda_calibrate.h). Needs HessianPrecision::BF16, where the rows go to the
  // GEMM as they are. Σ|x| is then summed in another order than MatrixStats'
  // (equal up to fp64 rounding); max|x| is exact.
  void add_device_bf16(const void* x, int64_t n, int64_t ld = 0);

  int64_t dim() const;
  int64_t tokens() const;
  HessianPrecision precision() const;
  // H [dim, dim] (fp64, symmetric, every partial sum flushed) in device memory.
  const double* device_h() const;
  // Everything downloaded as MatrixStats (H finalized, abs_sum, abs_max, tokens).
  quant::MatrixStats to_stats() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The GPU version of quant::PreparedHessian: U stays in device memory.
struct GpuPreparedHessian {
  int64_t cols = 0;
  bool act_order = false;
  DeviceBuffer U;               // f32 [cols, cols] row-major, upper (zeros below the diagonal)
  std::vector<int64_t> perm;    // sweep position -> column
  std::vector<uint8_t> dead;    // per column
  int64_t dead_columns = 0;
  double damp_used = 0, lambda = 0;
  int damp_retries = 0;
  int64_t tokens = 0;

  // Downloads U: the same struct prepare_hessian() returns on the CPU.
  quant::PreparedHessian to_host() const;
};

// quant::prepare_hessian on the GPU: dead columns, λ = damp · mean(diag H),
// act-order permutation, index reversal, cuSOLVER Dpotrf + a cuBLAS trmm inversion (fp64), the
// same ×10 damping retries; throws the same Error when they all fail.
// From the CPU statistics (H is uploaded; both triangles must be valid, i.e. finalized):
GpuPreparedHessian prepare_hessian(const quant::MatrixStats& stats, const quant::GptqOptions& options);
// From a GPU-accumulated Hessian (no copy through the host):
GpuPreparedHessian prepare_hessian(const GpuHessian& hessian, const quant::GptqOptions& options);
// From H [n, n] (fp64, symmetric) already in device memory.
GpuPreparedHessian prepare_hessian_device(const double* H, int64_t n, int64_t tokens,
                                          const quant::GptqOptions& options);
// A CPU-prepared Hessian moved to the GPU (the sweep then sees exactly the CPU's U).
GpuPreparedHessian upload(const quant::PreparedHessian& prepared, int64_t tokens = 0);

// True when the GPU sweep implements the format (int4_asym, int4_sym and int4_asym_f32, every
// group size that divides the 128-column block). The message names what is
// supported.
bool gptq_supports(const FormatChoice& format, std::string* why = nullptr);

// quant::gptq on the GPU for w[rows, cols] (row-major f32, host memory):
// block size 128 (options.block_size must be 128), groups fitted when the sweep
// reaches them (static groups from the original weights with act-order), the
// --mse range search when `mse`. Returns what the CPU returns: codes, params,
// dequant, sweep_cost and the damping report.
quant::GptqResult gptq(const float* w, int64_t rows, int64_t cols, const GpuPreparedHessian& hessian,
                       const FormatChoice& format, bool mse, const quant::GptqOptions& options);

// The same on a matrix already in device memory (w is left as it was): the
// result has no `dequant` on the host; the dequantized values stay on the
// device in *dequant (f32 [rows, cols]).
quant::GptqResult gptq_device(const float* w, int64_t rows, int64_t cols, const GpuPreparedHessian& hessian,
                              const FormatChoice& format, bool mse, const quant::GptqOptions& options,
                              DeviceBuffer* dequant);

// True when the GPU refinement implements the format (int4_asym and int4_sym
// at a group size the sweep takes); the message names what is supported.
bool refine_supports(const FormatChoice& format, std::string* why = nullptr);

// GPTQ's --refine on the GPU (quant::refine's passes, for int4_asym and int4_sym). Its
// objective A = H + λI on the live inputs (0 on a dead input's row and
// column), f32 [cols, cols] in device memory, from H in device memory (fp64,
// symmetric) or from the CPU statistics:
DeviceBuffer refine_objective(const double* H, const GpuPreparedHessian& hessian);
DeviceBuffer refine_objective(const quant::MatrixStats& stats, const GpuPreparedHessian& hessian);
// Refines a GPTQ result of w[rows, cols] (f32, device): result's codes and
// params (host) are uploaded, refined and written back, `dequant` (f32 [rows,
// cols], device: the result's values) is updated in place, and result.dequant
// too when it is not empty. A from refine_objective for the same Hessian.
quant::RefineReport refine_device(quant::GptqResult& result, const float* w, float* dequant, const float* A,
                                  const GpuPreparedHessian& hessian, const FormatChoice& format, int passes);

// The `gptq` method's GPU backend (QuantizerConfig::device == "cuda"); throws
// a clear Error for an unsupported format or when no device is visible.
std::unique_ptr<quant::Quantizer> make_gptq_quantizer(const quant::QuantizerConfig& config);

}  // namespace nibble::cuda
