// GPTQ's --refine on the GPU for int4_asym and int4_sym (each kernel takes the
// format's arithmetic, gptq_int4.cuh, as a template parameter). The reference is quant::refine
// (src/quant/refine.cpp), whose header comment gives the math: per pass a
// coordinate descent over every live weight, then a least-squares refit of each
// group's scale (and min), both against f(Q) = Σ_rows (q − w)ᵀ A (q − w) with
// A = H + λI on the live inputs, and each row's gradient E = (Q − W) A kept
// up to date.
//
// Layout: one warp per row. The coordinate descent has no dependency between
// rows, so one kernel runs a whole pass of it: the warp holds 128 columns of
// its row in registers (lane l holds columns 32m + l, m < 4), visits them in
// order, moves e on those 128 columns at each accepted step, and after the
// chunk moves the rest of its row's e by the chunk's accepted steps at once
// (Σ δ_j A[j, :], read along A's rows: A is symmetric). The same floating-
// point steps as the CPU's per-move saxpy, in another order for the columns
// outside the chunk.
// The refit of group k in every active row is one kernel; the rows whose refit
// was kept are then gathered (in row order) and their E moves by one cuBLAS
// SGEMM, dQ [kept rows, g] · A[G, :], before group k + 1 (each row's refit of
// a group sees the refits of its earlier groups, as on the CPU).
// What differs from the CPU: the order of the float sums (E's first product,
// the warp reductions of the group's forms, which the CPU keeps incrementally),
// so a near tie can go the other way; docs/CUDA.md ("GPTQ --refine on the GPU")
// gives the measured agreement.
#include <cuda_runtime.h>

#include <cub/device/device_select.cuh>

#include <algorithm>
#include <cmath>
#include <string>
#include <string_view>
#include <vector>

#include "backend/cuda/gptq_common.h"
#include "backend/cuda/gptq_int4.cuh"
#include "nibble/cuda_gptq.h"
#include "quant/refine_step.h"

namespace nibble::cuda {
namespace {

using namespace gptq_int4;

constexpr int kChunk = 128;  // columns a warp holds (4 per lane)
constexpr int kWarps = 8;    // rows per block of the coordinate descent
constexpr int kRefitWarps = 16;  // rows per block of the refit (they share A_GG in shared memory)
constexpr unsigned kFull = 0xFFFFFFFFu;

// refine.cpp's smallest_gap: the decoded values rise with the code (scale ≥ 0),
// so the sorted list is the codes' order.
template <class F>
__device__ __forceinline__ float smallest_gap(Int4Params p) {
  float best = INFINITY, prev = F::decode(0, p);
  for (int c = 1; c <= kLevels; ++c) {
    const float v = F::decode(c, p);
    if (v > prev) best = fminf(best, __fsub_rn(v, prev));
    prev = v;
  }
  return isfinite(best) ? best : 0.0f;
}

__device__ __forceinline__ double warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v = __dadd_rn(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// A = H + λI on the live inputs, 0 on a dead input's row and column (refine.cpp's A).
__global__ void objective_kernel(const double* __restrict__ H, const uint8_t* __restrict__ dead, int64_t n,
                                 double lambda, float* __restrict__ A) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n * n; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / n, c = i % n;
    A[i] = dead[r] || dead[c] ? 0.0f : __double2float_rn(__dadd_rn(H[i], r == c ? lambda : 0.0));
  }
}

// D = Q − W on the live inputs (0 on dead ones).
__global__ void difference_kernel(const float* __restrict__ Q, const float* __restrict__ W,
                                  const uint8_t* __restrict__ dead, int64_t rows, int64_t cols, float* __restrict__ D) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    D[i] = dead[i % cols] ? 0.0f : __fsub_rn(Q[i], W[i]);
}

// Σ E ∘ (Q − W) over the live inputs: f(Q), in fp64.
__global__ void objective_value_kernel(const float* __restrict__ E, const float* __restrict__ Q,
                                       const float* __restrict__ W, const uint8_t* __restrict__ dead, int64_t rows,
                                       int64_t cols, double* __restrict__ out) {
  double s = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols;
       i += int64_t(gridDim.x) * blockDim.x)
    if (!dead[i % cols]) s += static_cast<double>(E[i]) * static_cast<double>(__fsub_rn(Q[i], W[i]));
  s = warp_sum(s);
  if ((threadIdx.x & 31) == 0) atomicAdd(out, s);
}

// Per group: the smallest gap of its values (per row).
template <class F>
__global__ void gap_kernel(const float2* __restrict__ params, int64_t n, float* __restrict__ gap) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) gap[i] = smallest_gap<F>({params[i].x, params[i].y});
}
// (A_GG 1)_j for every input j of group G, summed over the group's inputs in order (as the CPU's group_row_sum).
__global__ void group_row_sum_kernel(const float* __restrict__ A, int64_t cols, int g, double* __restrict__ out) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= cols) return;
  const int64_t c0 = j / g * g, c1 = min(cols, c0 + g);
  double s = 0;
  for (int64_t l = c0; l < c1; ++l) s += A[j * cols + l];
  out[j] = s;
}
// 1ᵀ A_GG 1 per group: its row sums added in input order (as the CPU's ones_A_ones).
__global__ void ones_form_kernel(const double* __restrict__ row_sum, int64_t cols, int64_t gpr, int g,
                                 double* __restrict__ out) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= gpr) return;
  double s = 0;
  for (int64_t j = k * g; j < min(cols, (k + 1) * g); ++j) s += row_sum[j];
  out[k] = s;
}

struct Rows {
  float* E;         // [rows, cols] the gradient (Q − W) A
  float* Q;         // [rows, cols] the values (the result's dequant)
  uint8_t* codes;   // [rows, cols]
  float2* params;   // [rows, gpr] (scale, min)
  float* gap;       // [rows, gpr]
  int64_t rows, cols, gpr;
  int g;
};

// One pass of the coordinate descent over every active row.
template <class F>
__global__ void __launch_bounds__(kWarps * 32) descent_kernel(Rows s, const float* __restrict__ A,
                                                              const uint8_t* __restrict__ dead,
                                                              const uint8_t* __restrict__ active,
                                                              uint8_t* __restrict__ changed,
                                                              unsigned long long* __restrict__ moves) {
  __shared__ int s_col[kWarps][kChunk];
  __shared__ float s_delta[kWarps][kChunk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kWarps) + warp;
  if (row >= s.rows || !active[row]) return;
  const int64_t cols = s.cols;
  float* e = s.E + row * cols;
  float* q = s.Q + row * cols;
  uint8_t* code = s.codes + row * cols;
  const float2* params = s.params + row * s.gpr;
  const float* gap = s.gap + row * s.gpr;
  int64_t moved = 0;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    const int n = static_cast<int>(cols - c0 < kChunk ? cols - c0 : kChunk);
    float ev[4], qv[4];
    int cv[4];
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = 32 * m + lane;
      ev[m] = i < n ? e[c0 + i] : 0.0f;
      qv[m] = i < n ? q[c0 + i] : 0.0f;
      cv[m] = i < n ? code[c0 + i] : 0;
    }
    int nm = 0;
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      for (int l = 0; l < 32; ++l) {
        const int i = 32 * m + l;
        if (i >= n) break;
        const int64_t j = c0 + i;
        if (dead[j]) continue;
        const float ej = __shfl_sync(kFull, ev[m], l), qj = __shfl_sync(kFull, qv[m], l);
        const float ajj = A[j * cols + j];
        const int64_t k = j / s.g;
        // The screen and the step of refine.cpp, operation for operation.
        if (fabsf(ej) < __fmul_rn(__fmul_rn(0.49f, ajj), gap[k])) continue;
        const Int4Params p{params[k].x, params[k].y};
        const int c = F::encode(__fsub_rn(qj, __fdiv_rn(ej, ajj)), p);
        const float v = F::decode(c, p), delta = __fsub_rn(v, qj);
        if (delta == 0.0f ||
            !(__fadd_rn(__fmul_rn(__fmul_rn(2.0f, delta), ej), __fmul_rn(__fmul_rn(delta, delta), ajj)) < 0.0f))
          continue;
        if (lane == l) {
          qv[m] = v;
          cv[m] = c;
        }
        const float* arow = A + j * cols + c0;  // A[j, chunk] = A[chunk, j]
#pragma unroll
        for (int mm = 0; mm < 4; ++mm)
          if (32 * mm + lane < n) ev[mm] = fmaf(delta, arow[32 * mm + lane], ev[mm]);
        if (lane == 0) {
          s_col[warp][nm] = static_cast<int>(j);
          s_delta[warp][nm] = delta;
        }
        ++nm;
      }
    }
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      const int i = 32 * m + lane;
      if (i < n) {
        e[c0 + i] = ev[m];
        q[c0 + i] = qv[m];
        code[c0 + i] = static_cast<uint8_t>(cv[m]);
      }
    }
    __syncwarp();
    if (nm > 0) {
      // The rest of the row: e += Σ δ_j A[j, :] over the chunk's steps, in their order.
      // Lane l touches the columns ≡ l (mod 32), the ones it loads in later chunks.
      for (int64_t col = lane; col < cols; col += 32) {
        if (col >= c0 && col < c0 + n) continue;
        float acc = e[col];
        for (int t = 0; t < nm; ++t) acc = fmaf(s_delta[warp][t], A[int64_t(s_col[warp][t]) * cols + col], acc);
        e[col] = acc;
      }
      moved += nm;
    }
    __syncwarp();
  }
  if (lane == 0 && moved > 0) {
    changed[row] = 1;
    atomicAdd(moves, static_cast<unsigned long long>(moved));
  }
}

// out += A_GG x for the group's n inputs, x spread over the warp as the rows are (x[m] is input 32 m + lane);
// A_GG is n × n in shared memory (symmetric). Each lane's out[m] is input 32 m + lane's entry, in double.
__device__ inline void group_product(const float* s_A, int n, int lane, const float (&x)[4], double (&out)[4]) {
#pragma unroll
  for (int ml = 0; ml < 4; ++ml)
    for (int ll = 0; ll < 32; ++ll) {
      const int l = 32 * ml + ll;
      if (l >= n) break;
      const double xl = __shfl_sync(kFull, x[ml], ll);
      const float* arow = s_A + l * n;  // A[l, G] = A[G, l]
#pragma unroll
      for (int m = 0; m < 4; ++m)
        if (32 * m + lane < n) out[m] += static_cast<double>(arow[32 * m + lane]) * xl;
    }
}

// The refit of group k in every active row. A kept refit sets took[row] and
// leaves the change of the group's values in dq[row, :n] (0 on dead inputs).
// The block's rows share A_GG (n × n f32, dynamic shared memory). Without a
// min (F::kHasMin false) the scale alone: Δs = −cᵀe / cᵀA c.
template <class F>
__global__ void __launch_bounds__(kRefitWarps * 32) refit_kernel(Rows s, int64_t k, const float* __restrict__ A,
                                                            const uint8_t* __restrict__ dead,
                                                            const double* __restrict__ row_sum,
                                                            const double* __restrict__ ones_form,
                                                            const uint8_t* __restrict__ active,
                                                            uint8_t* __restrict__ changed, uint8_t* __restrict__ took,
                                                            float* __restrict__ dq_out,
                                                            unsigned long long* __restrict__ refits) {
  extern __shared__ float s_A[];
  const int64_t cols = s.cols, c0 = k * s.g;
  const int n = static_cast<int>(cols - c0 < s.g ? cols - c0 : s.g);
  for (int i = threadIdx.x; i < n * n; i += blockDim.x) s_A[i] = A[(c0 + i / n) * cols + c0 + i % n];
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t(kRefitWarps) + warp;
  if (row >= s.rows) return;
  if (lane == 0) took[row] = 0;
  if (!active[row]) return;
  const float* e = s.E + row * cols + c0;
  float* q = s.Q + row * cols + c0;
  const uint8_t* code = s.codes + row * cols + c0;
  float ev[4], qv[4], cval[4];  // cval: the codes' values (F::code_value)
  int cv[4];
  bool live[4];
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int i = 32 * m + lane;
    live[m] = i < n && !dead[c0 + i];
    ev[m] = i < n ? e[i] : 0.0f;
    qv[m] = i < n ? q[i] : 0.0f;
    cv[m] = i < n ? code[i] : 0;
    cval[m] = i < n ? F::code_value(cv[m]) : 0.0f;
  }
  // cᵀe and 1ᵀe over the live inputs; u = A_GG c, and r = A_GG 1 from the row sums (a dead input's A entries are 0).
  double ce = 0, oe = 0, u[4] = {0, 0, 0, 0};
#pragma unroll
  for (int m = 0; m < 4; ++m)
    if (live[m]) {
      ce += static_cast<double>(cval[m]) * ev[m];
      oe += ev[m];
    }
  group_product(s_A, n, lane, cval, u);
  double cAc = 0, cA1 = 0;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int i = 32 * m + lane;
    cAc += static_cast<double>(cval[m]) * u[m];
    cA1 += static_cast<double>(cval[m]) * (i < n ? row_sum[c0 + i] : 0.0);
  }
  ce = warp_sum(ce);
  oe = warp_sum(oe);
  cAc = warp_sum(cAc);
  cA1 = warp_sum(cA1);
  const quant::RefitSums sums{ce, oe, cAc, cA1, ones_form[k]};
  const float2 p0 = s.params[row * s.gpr + k];
  double ds, dm;
  if (!quant::refit_step(sums, F::kHasMin, ds, dm)) return;
  const double s0 = p0.x, m0 = F::kHasMin ? p0.y : 0.0;
  const Int4Params np = F::store(s0 + ds, m0 + dm);
  const double s1 = np.scale, m1 = F::kHasMin ? np.min : 0.0;
  if (!(s1 > 0) || !isfinite(s1) || !isfinite(m1) || (s1 == s0 && m1 == m0)) return;
  const double s_ = s1 - s0, m_ = m1 - m0;
  if (!(quant::refit_model_change(sums, s_, m_) < 0)) return;
  // The change of f on the values decode gives: 2 dqᵀe + dqᵀ A_GG dq.
  float dq[4];
  double df = 0;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    dq[m] = live[m] ? __fsub_rn(F::decode(cv[m], np), qv[m]) : 0.0f;
    df += 2.0 * dq[m] * ev[m];
  }
  double adq[4] = {0, 0, 0, 0};
  group_product(s_A, n, lane, dq, adq);
#pragma unroll
  for (int m = 0; m < 4; ++m) df += static_cast<double>(dq[m]) * adq[m];
  df = warp_sum(df);
  if (!(df < 0)) return;
  // Kept: every value of the group (dead ones too, as the file decodes them).
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int i = 32 * m + lane;
    if (i < n) {
      q[i] = F::decode(cv[m], np);
      dq_out[row * s.g + i] = dq[m];
    }
  }
  if (lane == 0) {
    s.params[row * s.gpr + k] = make_float2(np.scale, np.min);
    s.gap[row * s.gpr + k] = smallest_gap<F>(np);
    took[row] = 1;
    changed[row] = 1;
    atomicAdd(refits, 1ull);
  }
}

// dq rows of the kept refits, gathered in row order: [m, n] with stride n.
__global__ void gather_kernel(const float* __restrict__ dq, const int* __restrict__ idx, int64_t m, int g, int n,
                              float* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = dq[int64_t(idx[i / n]) * g + i % n];
}
// E[idx[i], :] += T[i, :].
__global__ void scatter_add_kernel(const float* __restrict__ T, const int* __restrict__ idx, int64_t m, int64_t cols,
                                   float* __restrict__ E) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < m * cols;
       i += int64_t(gridDim.x) * blockDim.x) {
    float& e = E[int64_t(idx[i / cols]) * cols + i % cols];
    e = __fadd_rn(e, T[i]);
  }
}

template <typename T>
void fetch(std::vector<T>& h, const void* d, size_t count) {
  h.resize(count);
  NIBBLE_CUDA_CHECK(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost));
}

unsigned blocks_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 4096));
}

// The formats the refinement implements: one row each (gptq_int4.cuh holds their arithmetic).
struct RefineFormat {
  std::string_view family;
  decltype(&gap_kernel<Asym>) gap;
  decltype(&descent_kernel<Asym>) descent;
  decltype(&refit_kernel<Asym>) refit;
};
constexpr RefineFormat kRefineFormats[] = {
    {"int4_asym", gap_kernel<Asym>, descent_kernel<Asym>, refit_kernel<Asym>},
    {"int4_sym", gap_kernel<Sym>, descent_kernel<Sym>, refit_kernel<Sym>},
};

const RefineFormat* refine_format(const FormatChoice& f) { return format_row(kRefineFormats, f); }

}  // namespace

DeviceBuffer refine_objective(const double* H, const GpuPreparedHessian& hessian) {
  const int64_t n = hessian.cols;
  NIBBLE_CHECK(static_cast<int64_t>(hessian.dead.size()) == n, "refine: the prepared Hessian has no dead-input list");
  DeviceBuffer A(static_cast<size_t>(n * n) * sizeof(float));
  const DeviceBuffer dead = upload(hessian.dead.data(), hessian.dead.size());
  objective_kernel<<<blocks_for(n * n, 256), 256>>>(H, static_cast<const uint8_t*>(dead.get()), n, hessian.lambda,
                                                    static_cast<float*>(A.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
  return A;
}

DeviceBuffer refine_objective(const quant::MatrixStats& stats, const GpuPreparedHessian& hessian) {
  NIBBLE_CHECK(stats.dim == hessian.cols, "refine: the statistics are for {} inputs, the Hessian for {}", stats.dim,
               hessian.cols);
  const DeviceBuffer H = upload(stats.H.data(), stats.H.size() * sizeof(double));
  return refine_objective(static_cast<const double*>(H.get()), hessian);
}

bool refine_supports(const FormatChoice& f, std::string* why) {
  const bool ok = refine_format(f) != nullptr && gptq_supports(f);
  if (!ok && why)
    *why = fmt::format("--refine on the GPU supports int4_asym and int4_sym with a group size dividing 128 (32, 64, "
                       "128); {} is not supported there (use --device cpu, or no --refine)",
                       f.spec ? f.canonical_name() : std::string("(no format)"));
  return ok;
}

quant::RefineReport refine_device(quant::GptqResult& res, const float* w, float* dequant, const float* A,
                                  const GpuPreparedHessian& hessian, const FormatChoice& format, int passes) {
  NIBBLE_CHECK(passes >= 0, "--refine: the number of passes must be >= 0, found {}", passes);
  std::string why;
  NIBBLE_CHECK(refine_supports(format, &why), "refine (cuda): {}", why);
  const RefineFormat& rf = *refine_format(format);
  const int64_t rows = res.rows, cols = res.cols, nn = rows * cols;
  const int g = format.group_size;
  const int64_t gpr = (cols + g - 1) / g;
  NIBBLE_CHECK(hessian.cols == cols, "refine: the Hessian is for {} inputs, the matrix has {}", hessian.cols, cols);
  NIBBLE_CHECK(res.codes.size() == static_cast<size_t>(nn) && res.params.size() == static_cast<size_t>(rows * gpr),
               "refine (cuda): the result has no codes or parameters");
  quant::RefineReport rep;
  if (passes == 0 || nn == 0) return rep;
  NIBBLE_CHECK(rows < (int64_t{1} << 31), "refine (cuda): {} rows is more than it indexes", rows);
  cublasHandle_t h = gptq_cublas();

  // The state: codes and parameters up, the gradient E = D A with D = Q − W on the live inputs.
  DeviceBuffer codes = upload(res.codes.data(), res.codes.size());
  std::vector<float2> p2(res.params.size());
  for (size_t i = 0; i < p2.size(); ++i) p2[i] = make_float2(res.params[i].scale, res.params[i].min);
  DeviceBuffer params = upload(p2.data(), p2.size() * sizeof(float2));
  const DeviceBuffer dead = upload(hessian.dead.data(), hessian.dead.size());
  const auto* dead_p = static_cast<const uint8_t*>(dead.get());
  DeviceBuffer E(static_cast<size_t>(nn) * sizeof(float)), gap(static_cast<size_t>(rows * gpr) * sizeof(float));
  DeviceBuffer ones(static_cast<size_t>(gpr) * sizeof(double)), row_sums(static_cast<size_t>(cols) * sizeof(double));
  DeviceBuffer sums(2 * sizeof(double));
  {
    DeviceBuffer D(static_cast<size_t>(nn) * sizeof(float));
    difference_kernel<<<blocks_for(nn, 256), 256>>>(dequant, w, dead_p, rows, cols, static_cast<float*>(D.get()));
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    const float one = 1.0f, zero = 0.0f;
    // Row-major E[rows, cols] = D A is column-major Eᵀ = A Dᵀ (A symmetric).
    NIBBLE_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols), static_cast<int>(rows),
                                    static_cast<int>(cols), &one, A, static_cast<int>(cols),
                                    static_cast<const float*>(D.get()), static_cast<int>(cols), &zero,
                                    static_cast<float*>(E.get()), static_cast<int>(cols)));
  }
  NIBBLE_CUDA_CHECK(cudaMemset(sums.get(), 0, sums.bytes()));
  auto value = [&](int slot) {
    objective_value_kernel<<<blocks_for(nn, 256), 256>>>(static_cast<const float*>(E.get()), dequant, w, dead_p, rows,
                                                         cols, static_cast<double*>(sums.get()) + slot);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
  };
  value(0);
  rf.gap<<<blocks_for(rows * gpr, 256), 256>>>(static_cast<const float2*>(params.get()), rows * gpr,
                                                   static_cast<float*>(gap.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  group_row_sum_kernel<<<blocks_for(cols, 256), 256>>>(A, cols, g, static_cast<double*>(row_sums.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  ones_form_kernel<<<blocks_for(gpr, 128), 128>>>(static_cast<const double*>(row_sums.get()), cols, gpr, g,
                                                  static_cast<double*>(ones.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());

  const Rows s{static_cast<float*>(E.get()), dequant, static_cast<uint8_t*>(codes.get()),
               static_cast<float2*>(params.get()), static_cast<float*>(gap.get()), rows, cols, gpr, g};
  DeviceBuffer active(static_cast<size_t>(rows)), changed(static_cast<size_t>(rows)), took(static_cast<size_t>(rows));
  DeviceBuffer counters(2 * sizeof(unsigned long long));  // weights moved, groups refitted
  DeviceBuffer dq(static_cast<size_t>(rows * g) * sizeof(float)), dqc(static_cast<size_t>(rows * g) * sizeof(float));
  DeviceBuffer idx(static_cast<size_t>(rows) * sizeof(int)), n_idx(sizeof(int));
  DeviceBuffer T;
  NIBBLE_CUDA_CHECK(cudaMemset(active.get(), 1, active.bytes()));
  NIBBLE_CUDA_CHECK(cudaMemset(counters.get(), 0, counters.bytes()));
  auto* ctr = static_cast<unsigned long long*>(counters.get());
  // CUB's select of the rows that kept a refit (stable: row order).
  std::vector<int> iota_h(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) iota_h[r] = static_cast<int>(r);
  const DeviceBuffer iota = upload(iota_h.data(), iota_h.size() * sizeof(int));
  size_t temp_bytes = 0;
  NIBBLE_CUDA_CHECK(cub::DeviceSelect::Flagged(nullptr, temp_bytes, static_cast<const int*>(iota.get()),
                                               static_cast<const uint8_t*>(took.get()), static_cast<int*>(idx.get()),
                                               static_cast<int*>(n_idx.get()), static_cast<int>(rows)));
  DeviceBuffer temp(std::max<size_t>(temp_bytes, 1));
  const unsigned row_blocks = static_cast<unsigned>((rows + kWarps - 1) / kWarps);
  const unsigned refit_blocks = static_cast<unsigned>((rows + kRefitWarps - 1) / kRefitWarps);
  const size_t refit_smem = static_cast<size_t>(g) * g * sizeof(float);
  NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(rf.refit, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(refit_smem)));
  std::vector<uint8_t> host_changed(static_cast<size_t>(rows));
  int pass = 0;
  while (pass < passes) {
    ++pass;
    NIBBLE_CUDA_CHECK(cudaMemset(changed.get(), 0, changed.bytes()));
    auto* act = static_cast<const uint8_t*>(active.get());
    auto* chg = static_cast<uint8_t*>(changed.get());
    rf.descent<<<row_blocks, kWarps * 32>>>(s, A, dead_p, act, chg, ctr);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    for (int64_t k = 0; k < gpr; ++k) {
      const int n = static_cast<int>(std::min<int64_t>(g, cols - k * g));
      rf.refit<<<refit_blocks, kRefitWarps * 32, static_cast<size_t>(n) * n * sizeof(float)>>>(
          s, k, A, dead_p, static_cast<const double*>(row_sums.get()), static_cast<const double*>(ones.get()), act, chg, static_cast<uint8_t*>(took.get()),
          static_cast<float*>(dq.get()), ctr + 1);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
      NIBBLE_CUDA_CHECK(cub::DeviceSelect::Flagged(temp.get(), temp_bytes, static_cast<const int*>(iota.get()),
                                                   static_cast<const uint8_t*>(took.get()),
                                                   static_cast<int*>(idx.get()), static_cast<int*>(n_idx.get()),
                                                   static_cast<int>(rows)));
      int m = 0;
      NIBBLE_CUDA_CHECK(cudaMemcpy(&m, n_idx.get(), sizeof m, cudaMemcpyDeviceToHost));
      if (m == 0) continue;
      gather_kernel<<<blocks_for(int64_t(m) * n, 256), 256>>>(static_cast<const float*>(dq.get()),
                                                              static_cast<const int*>(idx.get()), m, g, n,
                                                              static_cast<float*>(dqc.get()));
      NIBBLE_CUDA_CHECK(cudaGetLastError());
      if (T.bytes() < static_cast<size_t>(m * cols) * sizeof(float))
        T = DeviceBuffer(static_cast<size_t>(m * cols) * sizeof(float));
      // Row-major T[m, cols] = dQ[m, n] · A[G, :] is column-major Tᵀ = A[G, :]ᵀ dQᵀ.
      const float one = 1.0f, zero = 0.0f;
      NIBBLE_CUBLAS_CHECK(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(cols), m, n, &one,
                                      A + k * g * cols, static_cast<int>(cols), static_cast<const float*>(dqc.get()),
                                      n, &zero, static_cast<float*>(T.get()), static_cast<int>(cols)));
      scatter_add_kernel<<<blocks_for(int64_t(m) * cols, 256), 256>>>(
          static_cast<const float*>(T.get()), static_cast<const int*>(idx.get()), m, cols, s.E);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
    }
    // The rows that changed something are the next pass's.
    fetch(host_changed, changed.get(), static_cast<size_t>(rows));
    std::swap(active, changed);
    if (std::none_of(host_changed.begin(), host_changed.end(), [](uint8_t c) { return c != 0; })) break;
  }
  value(1);
  double v[2];
  unsigned long long c[2];
  NIBBLE_CUDA_CHECK(cudaMemcpy(v, sums.get(), sizeof v, cudaMemcpyDeviceToHost));
  NIBBLE_CUDA_CHECK(cudaMemcpy(c, counters.get(), sizeof c, cudaMemcpyDeviceToHost));
  rep.cost_before = v[0];
  rep.cost_after = v[1];
  rep.code_changes = static_cast<int64_t>(c[0]);
  rep.group_refits = static_cast<int64_t>(c[1]);
  rep.passes = pass;
  fetch(res.codes, codes.get(), static_cast<size_t>(nn));
  fetch(p2, params.get(), p2.size());
  for (size_t i = 0; i < p2.size(); ++i) res.params[i] = GroupParams{p2[i].x, p2[i].y};
  if (!res.dequant.empty()) fetch(res.dequant, dequant, static_cast<size_t>(nn));
  return rep;
}

}  // namespace nibble::cuda
