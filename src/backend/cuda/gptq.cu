// GPTQ's column sweep on the GPU for int4_asym, int4_sym and int4_asym_f32: one kernel per
// 128-column lazy block, then the block's error onto every later column with
// cublasSgemm. The CPU reference is gptq() in src/quant/gptq.cpp; the group fit
// and the code choice are the format's (src/formats/int4_asym.cpp,
// int4_sym.cpp; on the device gptq_int4.cuh) and fit_group_mse's.
//
// Layout: W is swept in the sweep order (Wp = W with its columns permuted,
// dead columns zeroed), row-major [rows, cols]. Inside a block the rows are
// independent, so one warp owns one row: lane l holds block columns l, l+32,
// l+64, l+96 in registers (v[m] = column 32m + l). For each column j the owner
// lane broadcasts w_j, every lane computes the same code and error
// e = (w − q) / U_jj, and each lane moves e·U_j,k onto its own later columns k.
// U's 128×128 diagonal block sits in shared memory (64 KiB): row j is read by
// the 32 lanes at consecutive addresses, U_jj as a broadcast.
//
// Numerics: every float operation of the CPU sweep is repeated with the same
// rounding (explicit __f*_rn intrinsics, so nvcc never contracts a multiply and
// an add into an FMA; the CPU build uses -ffp-contract=off), bf16 rounding is
// the CPU's bit recipe, ties in the --mse search keep the earlier (wider)
// factor and the |err|^2.4 sums run in the CPU's element order. What differs
// is the trailing update's f32 GEMM (cuBLAS and OpenBLAS sum in different
// orders) and pow() (CUDA's is within 2 ulp); docs/CUDA.md says how much that moves.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>

#include "backend/cuda/gptq_common.h"
#include "backend/cuda/gptq_int4.cuh"
#include "nibble/cuda_gptq.h"

namespace nibble::cuda {
namespace {

using namespace gptq_int4;

constexpr int kBlock = 128;            // columns per lazy block (GptqOptions::block_size)
constexpr int kPerLane = kBlock / 32;  // block columns per lane
constexpr int kRowsPerCta = 8;         // one warp per row
constexpr int kMseSteps = 33;          // fit_group_mse's shrink factors
constexpr unsigned kFull = 0xFFFFFFFFu;

__constant__ float c_shrink[kMseSteps];

// The parameters of one group held by a warp: element i of the group is
// v[i / 32] of lane i % 32, the first n valid. Plain fit, or the --mse search.
// F: the format (gptq_int4::Asym, AsymF32 or Sym).
template <class F, int R, bool kMse>
__device__ __forceinline__ Int4Params warp_fit(const float (&v)[R], int n, int lane, int* bad) {
  float lo = INFINITY, hi = -INFINITY;
#pragma unroll
  for (int m = 0; m < R; ++m)
    if (32 * m + lane < n) {
      lo = fminf(lo, v[m]);
      hi = fmaxf(hi, v[m]);
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    lo = fminf(lo, __shfl_xor_sync(kFull, lo, o));
    hi = fmaxf(hi, __shfl_xor_sync(kFull, hi, o));
  }
  // The CPU's running max keeps the first of equal values: for a zero max,
  // the sign of the first zero in element order (it reaches the stored scale).
  if (hi == 0.0f) {
#pragma unroll
    for (int m = 0; m < R; ++m) {
      const unsigned zeros = __ballot_sync(kFull, 32 * m + lane < n && v[m] == 0.0f);
      if (zeros) {
        hi = __shfl_sync(kFull, v[m], __ffs(zeros) - 1);
        break;
      }
    }
  }
  Int4Params best = F::fit(lo, hi, 1.0f, bad);
  if constexpr (kMse) {
    double best_err = INFINITY;
    for (int k = 0; k < kMseSteps; ++k) {
      const Int4Params p = F::fit(lo, hi, c_shrink[k], bad);
      double t[R];
#pragma unroll
      for (int m = 0; m < R; ++m) {
        t[m] = 0.0;
        if (32 * m + lane < n) {
          const double d = __dsub_rn(static_cast<double>(v[m]), static_cast<double>(F::decode(F::encode(v[m], p), p)));
          t[m] = pow(fabs(d), 2.4);
        }
      }
      // Σ in element order, as the CPU sums (past n every term is +0).
      double err = 0.0;
#pragma unroll
      for (int m = 0; m < R; ++m)
        for (int l = 0; l < 32 && 32 * m + l < n; ++l) err = __dadd_rn(err, __shfl_sync(kFull, t[m], l));
      if (err < best_err) {  // strict: a tie keeps the wider range
        best_err = err;
        best = p;
      }
    }
  }
  return best;
}

// Static groups (act-order): every group of the original column order fitted
// once on the original weights (dead columns zeroed). One warp per row.
template <class F, int R, bool kMse>
__global__ void static_fit_kernel(const float* __restrict__ W, int64_t rows, int64_t cols, int g, int64_t gpr,
                                  float2* __restrict__ params, int* bad) {
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerCta) + threadIdx.x / 32;
  if (row >= rows) return;
  for (int64_t k = 0; k < gpr; ++k) {
    const int64_t c0 = k * g;
    const int n = static_cast<int>(cols - c0 < g ? cols - c0 : int64_t{g});
    float v[R];
#pragma unroll
    for (int m = 0; m < R; ++m) v[m] = 32 * m + lane < n ? W[row * cols + c0 + 32 * m + lane] : 0.0f;
    const Int4Params p = warp_fit<F, R, kMse>(v, n, lane, bad);
    if (lane == 0) params[row * gpr + k] = make_float2(p.scale, p.min);
  }
}

// One lazy block [i1, i1 + nb) of the sweep. Writes codes and dequantized
// values at the original columns, the block's scaled errors Eb [rows, 128],
// each row's cost, and (unless static) the group parameters as groups start.
// G: the group size (a divisor of 128) for groups fitted during the sweep.
template <class F, int G, bool kStatic, bool kMse>
__global__ void __launch_bounds__(kRowsPerCta * 32)
    sweep_block_kernel(const float* __restrict__ Wp, const float* __restrict__ U, const int* __restrict__ perm,
                       int64_t rows, int64_t cols, int64_t i1, int g, int64_t gpr, float2* __restrict__ params,
                       uint8_t* __restrict__ codes, float* __restrict__ dequant, float* __restrict__ Eb,
                       double* __restrict__ cost, int* bad) {
  extern __shared__ float Us[];  // [kBlock][kBlock]: U[i1 + j][i1 + k]
  const int nb = static_cast<int>(cols - i1 < kBlock ? cols - i1 : int64_t{kBlock});
  for (int idx = threadIdx.x; idx < kBlock * kBlock; idx += blockDim.x) {
    const int j = idx / kBlock, k = idx % kBlock;
    Us[idx] = j < nb && k < nb ? U[(i1 + j) * cols + i1 + k] : 0.0f;
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRowsPerCta) + threadIdx.x / 32;
  if (row >= rows) return;

  float v[kPerLane], q_own[kPerLane], e_own[kPerLane];
  int c_own[kPerLane];
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    v[m] = 32 * m + lane < nb ? Wp[row * cols + i1 + 32 * m + lane] : 0.0f;
    q_own[m] = e_own[m] = 0.0f;
    c_own[m] = 0;
  }
  Int4Params p{0.0f, 0.0f};
  double row_cost = 0.0;
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    for (int l = 0; l < 32; ++l) {
      const int j = 32 * m + l;
      if (j >= nb) break;
      const int64_t col = i1 + j;
      if constexpr (kStatic) {
        const float2 s = params[row * gpr + perm[col] / g];
        p = {s.x, s.y};
      } else if (m % (G / 32) == 0 && l == 0) {
        // A group starts here (the natural order, G divides the block): fit it
        // on the error-updated weights of its G columns, all in this block.
        constexpr int R = G / 32;
        float gv[R];
#pragma unroll
        for (int r = 0; r < R; ++r) gv[r] = v[min(m + r, kPerLane - 1)];
        p = warp_fit<F, R, kMse>(gv, min(G, nb - 32 * m), lane, bad);
        if (lane == 0) params[row * gpr + col / G] = make_float2(p.scale, p.min);
      }
      const float w = __shfl_sync(kFull, v[m], l);
      const float d = Us[j * kBlock + j];
      const int code = F::encode(w, p);
      const float q = F::decode(code, p);
      const float diff = __fsub_rn(w, q);
      const float e = __fdiv_rn(diff, d);
      if (lane == l) {
        q_own[m] = q;
        c_own[m] = code;
        e_own[m] = e;
      }
      row_cost = __dadd_rn(row_cost, __ddiv_rn(__dmul_rn(static_cast<double>(diff), static_cast<double>(diff)),
                                               __dmul_rn(static_cast<double>(d), static_cast<double>(d))));
      // The error onto this row's later columns of the block (earlier ones of
      // register m take it too, harmlessly: they are never read again).
#pragma unroll
      for (int mm = m; mm < kPerLane; ++mm) v[mm] = __fsub_rn(v[mm], __fmul_rn(e, Us[j * kBlock + 32 * mm + lane]));
    }
  }
#pragma unroll
  for (int m = 0; m < kPerLane; ++m) {
    const int j = 32 * m + lane;
    if (j >= nb) continue;
    const int64_t orig = kStatic ? perm[i1 + j] : i1 + j;
    codes[row * cols + orig] = static_cast<uint8_t>(c_own[m]);
    dequant[row * cols + orig] = q_own[m];
    Eb[row * kBlock + j] = e_own[m];
  }
  if (lane == 0) cost[row] += row_cost;
}

// W[r, c] = 0 for dead columns c (before the static fit, as the CPU does).
__global__ void zero_dead_kernel(float* __restrict__ W, const uint8_t* __restrict__ dead, int64_t rows, int64_t cols) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * cols && dead[i % cols]) W[i] = 0.0f;
}

// Wp[r, a] = W[r, perm[a]]: the sweep order.
__global__ void permute_kernel(const float* __restrict__ W, const int* __restrict__ perm, int64_t rows, int64_t cols,
                               float* __restrict__ Wp) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < rows * cols) Wp[i] = W[(i / cols) * cols + perm[i % cols]];
}

using SweepKernel = void (*)(const float*, const float*, const int*, int64_t, int64_t, int64_t, int, int64_t, float2*,
                             uint8_t*, float*, float*, double*, int*);

template <class F, int G, bool kStatic, bool kMse>
SweepKernel sweep_kernel() {
  // 64 KiB of dynamic shared memory is over the default 48 KiB: opt in once.
  static const bool ready = [] {
    NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(sweep_block_kernel<F, G, kStatic, kMse>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(kBlock * kBlock * sizeof(float))));
    return true;
  }();
  (void)ready;
  return sweep_block_kernel<F, G, kStatic, kMse>;
}

template <class F>
SweepKernel pick_sweep(int g, bool static_groups, bool mse) {
  if (static_groups) return mse ? sweep_kernel<F, 32, true, true>() : sweep_kernel<F, 32, true, false>();
  switch (g) {
    case 32: return mse ? sweep_kernel<F, 32, false, true>() : sweep_kernel<F, 32, false, false>();
    case 64: return mse ? sweep_kernel<F, 64, false, true>() : sweep_kernel<F, 64, false, false>();
    case 128: return mse ? sweep_kernel<F, 128, false, true>() : sweep_kernel<F, 128, false, false>();
  }
  NIBBLE_FAIL("gptq (cuda): group size {} does not divide the {}-column block", g, kBlock);
}

template <class F>
void launch_static_fit(const float* W, int64_t rows, int64_t cols, int g, int64_t gpr, bool mse, float2* params,
                       int* bad) {
  const unsigned blocks = grid_for(rows, kRowsPerCta);
  const int threads = kRowsPerCta * 32;
  const int R = (g + 31) / 32;
#define NIBBLE_STATIC_FIT(RR)                                                                                     \
  (mse ? static_fit_kernel<F, RR, true><<<blocks, threads>>>(W, rows, cols, g, gpr, params, bad)                \
       : static_fit_kernel<F, RR, false><<<blocks, threads>>>(W, rows, cols, g, gpr, params, bad))
  if (R == 1)
    NIBBLE_STATIC_FIT(1);
  else if (R == 2)
    NIBBLE_STATIC_FIT(2);
  else
    NIBBLE_STATIC_FIT(4);
#undef NIBBLE_STATIC_FIT
  NIBBLE_CUDA_CHECK(cudaGetLastError());
}

void set_shrink_factors() {
  static const bool done = [] {
    float s[kMseSteps];
    for (int k = 0; k < kMseSteps; ++k) s[k] = static_cast<float>(1.0 - 0.4 * k / (kMseSteps - 1));  // fit_group_mse's
    NIBBLE_CUDA_CHECK(cudaMemcpyToSymbol(c_shrink, s, sizeof s));
    return true;
  }();
  (void)done;
}

template <typename T>
void download_into(std::vector<T>& h, const DeviceBuffer& d, size_t count) {
  h.resize(count);
  if (count) NIBBLE_CUDA_CHECK(cudaMemcpy(h.data(), d.get(), count * sizeof(T), cudaMemcpyDeviceToHost));
}

// The formats the sweep implements: one row each (gptq_int4.cuh holds their arithmetic).
struct SweepFormat {
  std::string_view family;
  SweepKernel (*pick)(int g, bool static_groups, bool mse);
  void (*static_fit)(const float* W, int64_t rows, int64_t cols, int g, int64_t gpr, bool mse, float2* params,
                     int* bad);
  const char* bad_group;  // what the CPU's fit_group throws on
};
constexpr SweepFormat kSweepFormats[] = {
    {"int4_asym", pick_sweep<Asym>, launch_static_fit<Asym>, "a group's range max - min is not finite in fp32"},
    {"int4_sym", pick_sweep<Sym>, launch_static_fit<Sym>, "a group's absmax / 7 is beyond the f16 range"},
    {"int4_asym_f32", pick_sweep<AsymF32>, launch_static_fit<AsymF32>,
     "a group's range max - min is not finite in fp32"},
};

const SweepFormat* sweep_format(const FormatChoice& f) { return format_row(kSweepFormats, f); }

}  // namespace

bool gptq_supports(const FormatChoice& f, std::string* why) {
  const bool ok = sweep_format(f) != nullptr && f.group_size > 0 && kBlock % f.group_size == 0;
  if (!ok && why)
    *why = fmt::format("the GPU GPTQ sweep supports int4_asym, int4_sym and int4_asym_f32 with a group size dividing "
                       "{} (32, 64, 128); {} is not supported on --device cuda (use --device cpu)",
                       kBlock, f.spec ? f.canonical_name() : std::string("(no format)"));
  return ok;
}

namespace {

// The sweep on a device matrix: W [rows, cols] f32 (device; consumed: dead
// columns are zeroed in place). Fills res (codes, params, cost, damping) and
// leaves the dequantized values in *dequant (device, f32 [rows, cols]).
void sweep_device(float* w, int64_t rows, int64_t cols, const GpuPreparedHessian& prep, const FormatChoice& format,
                  bool mse, const quant::GptqOptions& opt, quant::GptqResult& res, DeviceBuffer* dequant_out) {
  std::string why;
  NIBBLE_CHECK(gptq_supports(format, &why), "gptq (cuda): {}", why);
  NIBBLE_CHECK(prep.cols == cols, "gptq: the Hessian is for {} inputs, the matrix has {} columns", prep.cols, cols);
  NIBBLE_CHECK(prep.act_order == opt.act_order, "gptq: the Hessian was prepared for another column order");
  NIBBLE_CHECK(opt.block_size == kBlock, "gptq (cuda): the sweep kernel works in blocks of {} columns, found {}",
               kBlock, opt.block_size);
  NIBBLE_CHECK(rows > 0 && cols > 0 && cols < (int64_t{1} << 31), "gptq (cuda): bad matrix shape [{}, {}]", rows,
               cols);
  const SweepFormat& sf = *sweep_format(format);
  const int g = format.group_size;
  const int64_t gpr = (cols + g - 1) / g;
  // Groups lie inside a block (g divides 128); act-order fixes them up front.
  const bool static_groups = opt.act_order;
  set_shrink_factors();

  res.rows = rows;
  res.cols = cols;
  res.damp_used = prep.damp_used;
  res.lambda = prep.lambda;
  res.damp_retries = prep.damp_retries;
  res.dead_columns = prep.dead_columns;

  const int64_t nn = rows * cols;
  constexpr int kThreads = 256;
  std::vector<int> perm32(prep.perm.begin(), prep.perm.end());
  const DeviceBuffer d_dead = upload(prep.dead.data(), prep.dead.size());
  const DeviceBuffer d_perm = upload(perm32.data(), perm32.size() * sizeof(int));
  DeviceBuffer params(static_cast<size_t>(rows * gpr) * sizeof(float2)), bad(sizeof(int));
  DeviceBuffer cost(static_cast<size_t>(rows) * sizeof(double));
  NIBBLE_CUDA_CHECK(cudaMemset(bad.get(), 0, sizeof(int)));
  NIBBLE_CUDA_CHECK(cudaMemset(cost.get(), 0, cost.bytes()));
  NIBBLE_CUDA_CHECK(cudaMemset(params.get(), 0, params.bytes()));
  zero_dead_kernel<<<grid_for(nn, kThreads), kThreads>>>(w, static_cast<const uint8_t*>(d_dead.get()), rows, cols);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  if (static_groups)
    sf.static_fit(w, rows, cols, g, gpr, mse, static_cast<float2*>(params.get()), static_cast<int*>(bad.get()));
  DeviceBuffer Wp(static_cast<size_t>(nn) * sizeof(float));
  float* wp = static_cast<float*>(Wp.get());
  permute_kernel<<<grid_for(nn, kThreads), kThreads>>>(w, static_cast<const int*>(d_perm.get()), rows, cols, wp);
  NIBBLE_CUDA_CHECK(cudaGetLastError());

  DeviceBuffer codes(static_cast<size_t>(nn)), dequant(static_cast<size_t>(nn) * sizeof(float));
  DeviceBuffer Eb(static_cast<size_t>(rows * kBlock) * sizeof(float));
  const SweepKernel kernel = sf.pick(g, static_groups, mse);
  const float* U = static_cast<const float*>(prep.U.get());
  cublasHandle_t h = gptq_cublas();
  NIBBLE_CUBLAS_CHECK(cublasSetStream(h, nullptr));
  const unsigned blocks = grid_for(rows, kRowsPerCta);
  const size_t smem = kBlock * kBlock * sizeof(float);
  for (int64_t i1 = 0; i1 < cols; i1 += kBlock) {
    const int64_t i2 = std::min(cols, i1 + kBlock), nb = i2 - i1;
    kernel<<<blocks, kRowsPerCta * 32, smem>>>(wp, U, static_cast<const int*>(d_perm.get()), rows, cols, i1, g, gpr,
                                               static_cast<float2*>(params.get()), static_cast<uint8_t*>(codes.get()),
                                               static_cast<float*>(dequant.get()), static_cast<float*>(Eb.get()),
                                               static_cast<double*>(cost.get()), static_cast<int*>(bad.get()));
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    if (i2 < cols) {
      // W[:, i2:] -= Eb · U[i1:i2, i2:] (row-major). Column-major, that is
      // C = W[:, i2:]ᵀ [cols − i2, rows] (ld cols) -= U[i1:i2, i2:]ᵀ [cols − i2, nb]
      // (ld cols) · Ebᵀ [nb, rows] (ld 128): no transposes.
      const float minus_one = -1.0f, one = 1.0f;
      NIBBLE_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols - i2),
                                      static_cast<int>(rows), static_cast<int>(nb), &minus_one, U + i1 * cols + i2,
                                      static_cast<int>(cols), static_cast<const float*>(Eb.get()), kBlock, &one,
                                      wp + i2, static_cast<int>(cols)));
    }
  }
  int h_bad = 0;
  NIBBLE_CUDA_CHECK(cudaMemcpy(&h_bad, bad.get(), sizeof(int), cudaMemcpyDeviceToHost));
  NIBBLE_CHECK(!h_bad, "gptq (cuda): {} ({} × {} matrix)", sf.bad_group, rows, cols);

  download_into(res.codes, codes, static_cast<size_t>(nn));
  std::vector<float2> p2;
  download_into(p2, params, static_cast<size_t>(rows * gpr));
  res.params.resize(p2.size());
  for (size_t i = 0; i < p2.size(); ++i) res.params[i] = GroupParams{p2[i].x, p2[i].y};
  std::vector<double> c;
  download_into(c, cost, static_cast<size_t>(rows));
  for (double v : c) res.sweep_cost += v;
  *dequant_out = std::move(dequant);
}

}  // namespace

quant::GptqResult gptq(const float* w_in, int64_t rows, int64_t cols, const GpuPreparedHessian& prep,
                       const FormatChoice& format, bool mse, const quant::GptqOptions& opt) {
  NIBBLE_CHECK(rows > 0 && cols > 0, "gptq (cuda): bad matrix shape [{}, {}]", rows, cols);
  DeviceBuffer W = upload(w_in, static_cast<size_t>(rows * cols) * sizeof(float)), dequant;
  quant::GptqResult res;
  sweep_device(static_cast<float*>(W.get()), rows, cols, prep, format, mse, opt, res, &dequant);
  download_into(res.dequant, dequant, static_cast<size_t>(rows * cols));
  return res;
}

quant::GptqResult gptq_device(const float* w, int64_t rows, int64_t cols, const GpuPreparedHessian& prep,
                              const FormatChoice& format, bool mse, const quant::GptqOptions& opt,
                              DeviceBuffer* dequant) {
  NIBBLE_CHECK(rows > 0 && cols > 0, "gptq (cuda): bad matrix shape [{}, {}]", rows, cols);
  const size_t bytes = static_cast<size_t>(rows * cols) * sizeof(float);
  DeviceBuffer W(bytes);
  NIBBLE_CUDA_CHECK(cudaMemcpy(W.get(), w, bytes, cudaMemcpyDeviceToDevice));
  quant::GptqResult res;
  sweep_device(static_cast<float*>(W.get()), rows, cols, prep, format, mse, opt, res, dequant);
  return res;
}

}  // namespace nibble::cuda
