// GPTQ's input statistics on the GPU: H = Σ xᵀx (cuBLAS SYRK/GEMM, summed in
// fp64 across chunks) and the prepared Hessian, U = the upper Cholesky factor
// of (H + λI)⁻¹ in the sweep order (cuSOLVER Dpotrf, then the inverse of the factor by recursive cuBLAS trmm:
// invert_upper; fp64). The CPU counterparts are MatrixStats::add and prepare_hessian in src/quant/gptq.cpp; every
// host-side decision (dead columns, λ, the order, the retries) is taken by the same code path on the same fp64 numbers.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "backend/cuda/gptq_common.h"
#include "nibble/cuda_gptq.h"

namespace nibble::cuda {

cublasHandle_t gptq_cublas() {
  static const cublasHandle_t h = [] {
    cublasHandle_t c = nullptr;
    NIBBLE_CUBLAS_CHECK(cublasCreate(&c));
    return c;
  }();
  return h;
}

cusolverDnHandle_t gptq_cusolver() {
  static const cusolverDnHandle_t h = [] {
    cusolverDnHandle_t c = nullptr;
    NIBBLE_CUSOLVER_CHECK(cusolverDnCreate(&c));
    return c;
  }();
  return h;
}

const char* hessian_precision_name(HessianPrecision p) {
  switch (p) {
    case HessianPrecision::F64: return "f64";
    case HessianPrecision::F32: return "f32";
    case HessianPrecision::BF16: return "bf16";
  }
  return "?";
}

namespace {

constexpr int kThreads = 256;
// Rows converted to fp64 / bf16 at a time (the conversion buffer: rows × dim).
constexpr int64_t kConvertRows = 1024;

// Per input channel, in row order as MatrixStats::add does: Σ|x| (fp64, so the
// same sums bit for bit) and max|x|. One thread per channel: coalesced rows.
__global__ void abs_stats_kernel(const float* __restrict__ x, int64_t n, int64_t dim, int64_t ld,
                                 double* __restrict__ abs_sum, float* __restrict__ abs_max) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= dim) return;
  double s = abs_sum[j];
  float m = abs_max[j];
  for (int64_t t = 0; t < n; ++t) {
    const float v = fabsf(x[t * ld + j]);
    s = __dadd_rn(s, static_cast<double>(v));
    m = fmaxf(m, v);
  }
  abs_sum[j] = s;
  abs_max[j] = m;
}

// The same sums for bf16 rows, with the rows split over blockIdx.y (chunks of
// kAbsRows) and added with atomics: a different summation order.
constexpr int64_t kAbsRows = 256;
__global__ void abs_stats_bf16_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, int64_t dim, int64_t ld,
                                      double* __restrict__ abs_sum, float* __restrict__ abs_max) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= dim) return;
  const int64_t t0 = blockIdx.y * kAbsRows, t1 = t0 + kAbsRows < n ? t0 + kAbsRows : n;
  double s = 0;
  float m = 0;
  for (int64_t t = t0; t < t1; ++t) {
    const float v = fabsf(__bfloat162float(x[t * ld + j]));
    s += v;
    m = fmaxf(m, v);
  }
  atomicAdd(&abs_sum[j], s);
  // Non-negative floats order as their bit patterns (NaN, 0x7F.., above them all).
  atomicMax(reinterpret_cast<int*>(&abs_max[j]), __float_as_int(m));
}

// out [n, dim] (packed) = x [n, dim] (stride ld) as fp64 or bf16 (round to nearest even).
template <typename T>
__global__ void convert_rows_kernel(const float* __restrict__ x, int64_t n, int64_t dim, int64_t ld, T* __restrict__ out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n * dim) return;
  const float v = x[(i / dim) * ld + i % dim];
  if constexpr (std::is_same_v<T, double>)
    out[i] = static_cast<double>(v);
  else
    out[i] = __float2bfloat16_rn(v);
}

// H += P (f32 partial sums), every element: SYRK leaves P's other triangle zero.
__global__ void flush_kernel(const float* __restrict__ P, double* __restrict__ H, int64_t nn) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < nn) H[i] = __dadd_rn(H[i], static_cast<double>(P[i]));
}

// Row-major H: the cuBLAS column-major "upper" triangle is the row-major lower
// one (b <= a). Copies it onto the row-major upper one.
__global__ void symmetrize_kernel(double* __restrict__ H, int64_t n) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n * n) return;
  const int64_t a = i / n, b = i % n;
  if (b > a) H[i] = H[b * n + a];
}

__global__ void diag_kernel(const double* __restrict__ H, int64_t n, double* __restrict__ d) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) d[i] = H[i * n + i];
}

// A = J P (H + λI) Pᵀ J (prepare_hessian's matrix): permuted to the sweep
// order, then index-reversed; diag is H's diagonal with dead inputs set to 1.
__global__ void build_reversed_kernel(const double* __restrict__ H, const double* __restrict__ diag,
                                      const int64_t* __restrict__ perm, double lambda, int64_t n,
                                      double* __restrict__ A) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= n * n) return;
  const int64_t ia = perm[n - 1 - i / n], ib = perm[n - 1 - i % n];
  A[i] = ia == ib ? __dadd_rn(diag[ia], lambda) : H[ia * n + ib];
}

// U = J L⁻¹ J as f32 (row-major upper, zeros below), L⁻¹ the row-major lower
// triangle of A after Dpotrf + invert_upper; its diagonal apart for the checks.
__global__ void extract_u_kernel(const double* __restrict__ A, int64_t n, float* __restrict__ U,
                                 float* __restrict__ udiag) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= n * n) return;
  const int64_t i = k / n, j = k % n;
  const float v = j >= i ? static_cast<float>(A[(n - 1 - i) * n + (n - 1 - j)]) : 0.0f;
  U[k] = v;
  if (i == j) udiag[i] = v;
}

// The blocks of invert_upper() small enough for one triangular solve.
constexpr int64_t kInvertLeaf = 256;

__global__ void identity_kernel(double* __restrict__ X, int64_t n) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k < n * n) X[k] = k / n == k % n ? 1.0 : 0.0;
}

// R[i + j·ld] = X[i + j·n] for i <= j (column-major upper triangles).
__global__ void copy_upper_kernel(const double* __restrict__ X, int64_t n, double* __restrict__ R, int64_t ld) {
  const int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (k >= n * n) return;
  const int64_t i = k % n, j = k / n;
  if (i <= j) R[i + j * ld] = X[k];
}

// Inverts the upper-triangular n × n matrix R (column-major, leading dimension
// ld; the strictly lower part is neither read nor written) in place:
//   [R11 R12; 0 R22]⁻¹ = [X11, −X11·R12·X22; 0, X22],
// the off-diagonal block by two in-place triangular products (cuBLAS trmm,
// at GEMM rate), the diagonal blocks recursively, blocks of at most
// kInvertLeaf by a triangular solve against the identity (scratch: leaf² doubles).
// cuSOLVER's Xtrtri does the same n³/3 flops but took 4.5 of the 8B
// calibration's 7.9 s of prepare.
void invert_upper(cublasHandle_t h, double* R, int64_t n, int64_t ld, double* scratch) {
  const double one = 1.0, minus_one = -1.0;
  if (n <= kInvertLeaf) {
    identity_kernel<<<grid_for(n * n, kThreads), kThreads>>>(scratch, n);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    NIBBLE_CUBLAS_CHECK(cublasDtrsm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT,
                                    static_cast<int>(n), static_cast<int>(n), &one, R, static_cast<int>(ld), scratch,
                                    static_cast<int>(n)));
    copy_upper_kernel<<<grid_for(n * n, kThreads), kThreads>>>(scratch, n, R, ld);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    return;
  }
  const int64_t n1 = (n / 2 + 63) / 64 * 64, n2 = n - n1;
  double* r12 = R + n1 * ld;
  double* r22 = R + n1 * ld + n1;
  const int m1 = static_cast<int>(n1), m2 = static_cast<int>(n2), l = static_cast<int>(ld);
  invert_upper(h, r22, n2, ld, scratch);
  NIBBLE_CUBLAS_CHECK(cublasDtrmm(h, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, m1,
                                  m2, &one, r22, l, r12, l, r12, l));  // R12·X22
  invert_upper(h, R, n1, ld, scratch);
  NIBBLE_CUBLAS_CHECK(cublasDtrmm(h, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, m1,
                                  m2, &minus_one, R, l, r12, l, r12, l));  // −X11·(R12·X22)
}

template <typename T>
std::vector<T> download(const void* d, size_t count) {
  std::vector<T> h(count);
  if (count) NIBBLE_CUDA_CHECK(cudaMemcpy(h.data(), d, count * sizeof(T), cudaMemcpyDeviceToHost));
  return h;
}

}  // namespace

// ---- H = Σ xᵀx -----------------------------------------------------------------

struct GpuHessian::State {
  int64_t dim = 0, tokens = 0, pending = 0;  // pending: tokens in P not yet added into H
  HessianPrecision precision = HessianPrecision::F64;
  DeviceBuffer H, P, abs_sum, abs_max, convert, upload;  // H fp64 [dim, dim]; P f32 [dim, dim]
  bool symmetric = true;

  void flush() {
    if (pending == 0) return;
    const int64_t nn = dim * dim;
    flush_kernel<<<grid_for(nn, kThreads), kThreads>>>(static_cast<const float*>(P.get()),
                                                       static_cast<double*>(H.get()), nn);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    pending = 0;
  }
};

GpuHessian::GpuHessian(int64_t dim, HessianPrecision precision) : s_(std::make_unique<State>()) {
  NIBBLE_CHECK(dim > 0, "GpuHessian: the dimension must be positive, found {}", dim);
  s_->dim = dim;
  s_->precision = precision;
  const size_t nn = static_cast<size_t>(dim * dim);
  s_->H = DeviceBuffer(nn * sizeof(double));
  NIBBLE_CUDA_CHECK(cudaMemset(s_->H.get(), 0, s_->H.bytes()));
  if (precision != HessianPrecision::F64) {
    s_->P = DeviceBuffer(nn * sizeof(float));
    NIBBLE_CUDA_CHECK(cudaMemset(s_->P.get(), 0, s_->P.bytes()));
  }
  if (precision != HessianPrecision::F32)
    s_->convert = DeviceBuffer(static_cast<size_t>(kConvertRows * dim) * sizeof(double));
  s_->abs_sum = DeviceBuffer(static_cast<size_t>(dim) * sizeof(double));
  s_->abs_max = DeviceBuffer(static_cast<size_t>(dim) * sizeof(float));
  NIBBLE_CUDA_CHECK(cudaMemset(s_->abs_sum.get(), 0, s_->abs_sum.bytes()));
  NIBBLE_CUDA_CHECK(cudaMemset(s_->abs_max.get(), 0, s_->abs_max.bytes()));
}

GpuHessian::~GpuHessian() = default;
GpuHessian::GpuHessian(GpuHessian&&) noexcept = default;
GpuHessian& GpuHessian::operator=(GpuHessian&&) noexcept = default;

int64_t GpuHessian::dim() const { return s_->dim; }
int64_t GpuHessian::tokens() const { return s_->tokens; }
HessianPrecision GpuHessian::precision() const { return s_->precision; }

void GpuHessian::add(const float* x, int64_t n, int64_t ld) {
  State& s = *s_;
  if (ld == 0) ld = s.dim;
  NIBBLE_CHECK(ld >= s.dim, "GpuHessian::add: row stride {} < dim {}", ld, s.dim);
  // Host rows go up in chunks (packed to stride dim), each then added as device rows.
  const int64_t chunk = std::min<int64_t>(std::max<int64_t>(n, 1), kHessianFlushTokens);
  if (s.upload.bytes() < static_cast<size_t>(chunk * s.dim) * sizeof(float))
    s.upload = DeviceBuffer(static_cast<size_t>(chunk * s.dim) * sizeof(float));
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t m = std::min(chunk, n - r0);
    NIBBLE_CUDA_CHECK(cudaMemcpy2D(s.upload.get(), s.dim * sizeof(float), x + r0 * ld, ld * sizeof(float),
                                   s.dim * sizeof(float), m, cudaMemcpyHostToDevice));
    add_device(static_cast<const float*>(s.upload.get()), m, s.dim);
  }
}

void GpuHessian::add_device(const float* x, int64_t n, int64_t ld) {
  State& s = *s_;
  if (ld == 0) ld = s.dim;
  NIBBLE_CHECK(ld >= s.dim, "GpuHessian::add_device: row stride {} < dim {}", ld, s.dim);
  if (n <= 0) return;
  abs_stats_kernel<<<grid_for(s.dim, kThreads), kThreads>>>(x, n, s.dim, ld, static_cast<double*>(s.abs_sum.get()),
                                                            static_cast<float*>(s.abs_max.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  cublasHandle_t h = gptq_cublas();
  NIBBLE_CUBLAS_CHECK(cublasSetStream(h, nullptr));
  const int dim = static_cast<int>(s.dim);
  // cuBLAS is column-major: x [n, dim] row-major (stride ld) is A = xᵀ [dim, n]
  // with lda = ld, and H = A·Aᵀ. SYRK fills the column-major upper triangle.
  for (int64_t r0 = 0; r0 < n;) {
    const float* xr = x + r0 * ld;
    int64_t m = 0;
    if (s.precision == HessianPrecision::F64) {
      m = std::min(kConvertRows, n - r0);
      convert_rows_kernel<double><<<grid_for(m * s.dim, kThreads), kThreads>>>(xr, m, s.dim, ld,
                                                                              static_cast<double*>(s.convert.get()));
      NIBBLE_CUDA_CHECK(cudaGetLastError());
      const double one = 1.0;
      NIBBLE_CUBLAS_CHECK(cublasDsyrk(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, dim, static_cast<int>(m), &one,
                                      static_cast<const double*>(s.convert.get()), dim, &one,
                                      static_cast<double*>(s.H.get()), dim));
    } else if (s.precision == HessianPrecision::F32) {
      m = std::min(kHessianFlushTokens - s.pending, n - r0);
      const float one = 1.0f, beta = s.pending > 0 ? 1.0f : 0.0f;
      NIBBLE_CUBLAS_CHECK(cublasSsyrk(h, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, dim, static_cast<int>(m), &one, xr,
                                      static_cast<int>(ld), &beta, static_cast<float*>(s.P.get()), dim));
    } else {
      m = std::min({kHessianFlushTokens - s.pending, kConvertRows, n - r0});
      convert_rows_kernel<__nv_bfloat16><<<grid_for(m * s.dim, kThreads), kThreads>>>(
          xr, m, s.dim, ld, static_cast<__nv_bfloat16*>(s.convert.get()));
      NIBBLE_CUDA_CHECK(cudaGetLastError());
      const float one = 1.0f, beta = s.pending > 0 ? 1.0f : 0.0f;
      // The full product (there is no bf16 SYRK); symmetrize() keeps one triangle.
      NIBBLE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, dim, dim, static_cast<int>(m), &one,
                                       s.convert.get(), CUDA_R_16BF, dim, s.convert.get(), CUDA_R_16BF, dim, &beta,
                                       s.P.get(), CUDA_R_32F, dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (s.precision != HessianPrecision::F64) {
      s.pending += m;
      if (s.pending == kHessianFlushTokens) s.flush();
    }
    r0 += m;
  }
  s.tokens += n;
  s.symmetric = false;
}

void GpuHessian::add_device_bf16(const void* xv, int64_t n, int64_t ld) {
  State& s = *s_;
  if (ld == 0) ld = s.dim;
  NIBBLE_CHECK(s.precision == HessianPrecision::BF16, "GpuHessian::add_device_bf16 needs the bf16 precision, not {}",
               hessian_precision_name(s.precision));
  NIBBLE_CHECK(ld >= s.dim, "GpuHessian::add_device_bf16: row stride {} < dim {}", ld, s.dim);
  NIBBLE_CHECK(n < (int64_t{1} << 31) / kAbsRows, "GpuHessian::add_device_bf16: too many rows at once ({})", n);
  if (n <= 0) return;
  const auto* x = static_cast<const __nv_bfloat16*>(xv);
  const dim3 grid(grid_for(s.dim, kThreads), static_cast<unsigned>((n + kAbsRows - 1) / kAbsRows));
  abs_stats_bf16_kernel<<<grid, kThreads>>>(x, n, s.dim, ld, static_cast<double*>(s.abs_sum.get()),
                                            static_cast<float*>(s.abs_max.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  cublasHandle_t h = gptq_cublas();
  NIBBLE_CUBLAS_CHECK(cublasSetStream(h, nullptr));
  const int dim = static_cast<int>(s.dim);
  // There is no bf16 SYRK: P is computed in T × T tiles, only those on and
  // above the column-major diagonal (the row-major lower triangle that
  // symmetrize() keeps), T(T+1)/2 of T² GEMMs. The tiles never computed stay zero.
  const int T = s.dim >= 1024 && s.dim % 32 == 0 ? 4 : 1;
  const int b = dim / T;
  auto* P = static_cast<float*>(s.P.get());
  for (int64_t r0 = 0; r0 < n;) {
    const int64_t m = std::min(kHessianFlushTokens - s.pending, n - r0);
    const float one = 1.0f, beta = s.pending > 0 ? 1.0f : 0.0f;
    // Column-major A = xᵀ [dim, m] with lda = ld; tile (I, J) of P is A_I·A_Jᵀ,
    // A_I its rows I·b .. (I+1)·b − 1.
    const __nv_bfloat16* a = x + r0 * ld;
    for (int I = 0; I < T; ++I)
      for (int J = I; J < T; ++J)
        NIBBLE_CUBLAS_CHECK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_T, b, b, static_cast<int>(m), &one, a + I * b,
                                         CUDA_R_16BF, static_cast<int>(ld), a + J * b, CUDA_R_16BF,
                                         static_cast<int>(ld), &beta, P + I * b + static_cast<int64_t>(J) * b * dim,
                                         CUDA_R_32F, dim, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    s.pending += m;
    if (s.pending == kHessianFlushTokens) s.flush();
    r0 += m;
  }
  s.tokens += n;
  s.symmetric = false;
}

const double* GpuHessian::device_h() const {
  State& s = *s_;
  s.flush();
  if (!s.symmetric) {
    symmetrize_kernel<<<grid_for(s.dim * s.dim, kThreads), kThreads>>>(static_cast<double*>(s.H.get()), s.dim);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    s.symmetric = true;
  }
  return static_cast<const double*>(s.H.get());
}

quant::MatrixStats GpuHessian::to_stats() const {
  const double* H = device_h();
  quant::MatrixStats st(s_->dim);
  NIBBLE_CUDA_CHECK(cudaMemcpy(st.H.data(), H, st.H.size() * sizeof(double), cudaMemcpyDeviceToHost));
  st.abs_sum = download<double>(s_->abs_sum.get(), static_cast<size_t>(s_->dim));
  st.abs_max = download<float>(s_->abs_max.get(), static_cast<size_t>(s_->dim));
  st.tokens = s_->tokens;
  return st;
}

// ---- the prepared Hessian ------------------------------------------------------

quant::PreparedHessian GpuPreparedHessian::to_host() const {
  quant::PreparedHessian p;
  p.cols = cols;
  p.act_order = act_order;
  p.U = download<float>(U.get(), static_cast<size_t>(cols * cols));
  p.perm = perm;
  p.dead = dead;
  p.dead_columns = dead_columns;
  p.damp_used = damp_used;
  p.lambda = lambda;
  p.damp_retries = damp_retries;
  return p;
}

GpuPreparedHessian upload(const quant::PreparedHessian& prepared, int64_t tokens) {
  const int64_t n = prepared.cols;
  NIBBLE_CHECK(prepared.U.size() == static_cast<size_t>(n * n) && prepared.perm.size() == static_cast<size_t>(n) &&
                   prepared.dead.size() == static_cast<size_t>(n),
               "upload: the prepared Hessian's arrays do not match its {} columns", n);
  GpuPreparedHessian g;
  g.cols = n;
  g.act_order = prepared.act_order;
  g.U = cuda::upload(prepared.U.data(), prepared.U.size() * sizeof(float));
  g.perm = prepared.perm;
  g.dead = prepared.dead;
  g.dead_columns = prepared.dead_columns;
  g.damp_used = prepared.damp_used;
  g.lambda = prepared.lambda;
  g.damp_retries = prepared.damp_retries;
  g.tokens = tokens;
  return g;
}

GpuPreparedHessian prepare_hessian(const quant::MatrixStats& stats, const quant::GptqOptions& opt) {
  NIBBLE_CHECK(stats.H.size() == static_cast<size_t>(stats.dim * stats.dim),
               "gptq (cuda): the statistics hold {} values for {} inputs", stats.H.size(), stats.dim);
  const DeviceBuffer H = cuda::upload(stats.H.data(), stats.H.size() * sizeof(double));
  return prepare_hessian_device(static_cast<const double*>(H.get()), stats.dim, stats.tokens, opt);
}

GpuPreparedHessian prepare_hessian(const GpuHessian& hessian, const quant::GptqOptions& opt) {
  return prepare_hessian_device(hessian.device_h(), hessian.dim(), hessian.tokens(), opt);
}

GpuPreparedHessian prepare_hessian_device(const double* H, int64_t n, int64_t tokens, const quant::GptqOptions& opt) {
  NIBBLE_CHECK(tokens > 0, "gptq: no calibration tokens were seen for this matrix");
  NIBBLE_CHECK(opt.damp >= 0 && std::isfinite(opt.damp), "gptq: damping must be >= 0, found {}", opt.damp);
  NIBBLE_CHECK(n > 0 && n < (int64_t{1} << 31), "gptq (cuda): {} inputs is out of range", n);
  GpuPreparedHessian p;
  p.cols = n;
  p.act_order = opt.act_order;
  p.tokens = tokens;

  // The diagonal comes to the host for prepare_hessian's own decisions
  // (quant::plan_hessian), so dead columns, the order and λ are identical.
  DeviceBuffer d_diag(static_cast<size_t>(n) * sizeof(double));
  diag_kernel<<<grid_for(n, kThreads), kThreads>>>(H, n, static_cast<double*>(d_diag.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  quant::HessianPlan plan = quant::plan_hessian(download<double>(d_diag.get(), static_cast<size_t>(n)), opt.act_order);
  const std::vector<double>& diag = plan.diag;
  const double mean_diag = plan.mean_diag;
  p.dead = std::move(plan.dead);
  p.dead_columns = plan.dead_columns;
  p.perm = std::move(plan.perm);
  NIBBLE_CUDA_CHECK(cudaMemcpy(d_diag.get(), diag.data(), diag.size() * sizeof(double), cudaMemcpyHostToDevice));
  const DeviceBuffer d_perm = cuda::upload(p.perm.data(), p.perm.size() * sizeof(int64_t));

  DeviceBuffer A(static_cast<size_t>(n * n) * sizeof(double));
  double* a = static_cast<double*>(A.get());
  cusolverDnHandle_t sol = gptq_cusolver();
  NIBBLE_CUSOLVER_CHECK(cusolverDnSetStream(sol, nullptr));
  const int N = static_cast<int>(n);
  // Workspaces: Dpotrf's, and invert_upper's leaf.
  int lwork = 0;
  NIBBLE_CUSOLVER_CHECK(cusolverDnDpotrf_bufferSize(sol, CUBLAS_FILL_MODE_UPPER, N, a, N, &lwork));
  const size_t leaf = static_cast<size_t>(kInvertLeaf * kInvertLeaf) * sizeof(double);
  DeviceBuffer work(std::max(static_cast<size_t>(lwork) * sizeof(double), leaf)), info(sizeof(int));
  cublasHandle_t blas = gptq_cublas();
  NIBBLE_CUBLAS_CHECK(cublasSetStream(blas, nullptr));

  // The factorization as factor_reversed() does it: A is row-major and
  // symmetric, so passing it as column-major with 'U' is the same problem.
  auto factor = [&]() {
    int h_info = 0;
    NIBBLE_CUSOLVER_CHECK(cusolverDnDpotrf(sol, CUBLAS_FILL_MODE_UPPER, N, a, N, static_cast<double*>(work.get()),
                                           lwork, static_cast<int*>(info.get())));
    NIBBLE_CUDA_CHECK(cudaMemcpy(&h_info, info.get(), sizeof(int), cudaMemcpyDeviceToHost));
    if (h_info != 0) return false;
    // A positive definite factorization has a positive diagonal: the inverse
    // exists (extract_u's check below catches an overflow).
    invert_upper(blas, a, n, n, static_cast<double*>(work.get()));
    return true;
  };

  bool ok = false;
  for (int attempt = 0; attempt <= opt.max_damp_retries && !ok; ++attempt) {
    const double factor_used = quant::damping_factor(opt, attempt);
    const double lambda = factor_used * mean_diag;
    build_reversed_kernel<<<grid_for(n * n, kThreads), kThreads>>>(
        H, static_cast<const double*>(d_diag.get()), static_cast<const int64_t*>(d_perm.get()), lambda, n, a);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    ok = factor();
    p.damp_used = factor_used;
    p.lambda = lambda;
    p.damp_retries = attempt;
  }
  if (!ok) quant::fail_not_positive_definite(n, tokens, p.damp_used, opt);
  p.U = DeviceBuffer(static_cast<size_t>(n * n) * sizeof(float));
  DeviceBuffer d_udiag(static_cast<size_t>(n) * sizeof(float));
  extract_u_kernel<<<grid_for(n * n, kThreads), kThreads>>>(a, n, static_cast<float*>(p.U.get()),
                                                            static_cast<float*>(d_udiag.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  const std::vector<float> udiag = download<float>(d_udiag.get(), static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    NIBBLE_CHECK(std::isfinite(udiag[i]) && udiag[i] > 0,
                 "gptq: the inverse Hessian's factor is not finite at column {} (damping {})", i, p.damp_used);
  return p;
}

}  // namespace nibble::cuda
