// GPTQ (Frantar et al. 2022, "GPTQ: Accurate Post-Training Quantization for
// Generative Pre-trained Transformers", Algorithm 1) on one matrix, plus the
// grids it sweeps against and the MSE range search.
//
// Notation: W [rows, cols] quantized column by column; H = Σ xᵀx [cols, cols];
// U = the upper Cholesky factor of (H + λI)⁻¹. Quantizing column i with the
// remaining columns free costs (w − q)² / U_ii² per row and moves the error
// (w − q) / U_ii · U_i,j onto every later column j. Columns are swept in lazy
// blocks: inside a block the update is applied column by column, to the later
// columns the block's errors are applied at once as one GEMM.
#include "nibble/gptq.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <charconv>
#include <cmath>
#include <numeric>

#include "backend/cpu/kernels.h"
#include "nibble/error.h"
#include "nibble/quantizer.h"
#include "nibble/util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda_gptq.h"
#endif

namespace nibble::quant {

// ---- statistics --------------------------------------------------------------

namespace {
std::atomic<uint64_t> g_stats_ids{1};
}

MatrixStats::MatrixStats(int64_t d)
    : dim(d), id(g_stats_ids++), H(static_cast<size_t>(d * d), 0.0), abs_sum(static_cast<size_t>(d), 0.0),
      abs_max(static_cast<size_t>(d), 0.0f) {}

void MatrixStats::add(const float* x, int64_t n, int64_t ld) {
  if (ld == 0) ld = dim;
  NIBBLE_CHECK(ld >= dim, "MatrixStats::add: row stride {} < dim {}", ld, dim);
  constexpr int64_t kChunk = 256;  // rows converted to fp64 at a time
  std::vector<double> buf(static_cast<size_t>(std::min(n, kChunk) * dim));
  for (int64_t r0 = 0; r0 < n; r0 += kChunk) {
    const int64_t m = std::min(kChunk, n - r0);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < dim; ++j) {
        const float v = x[(r0 + i) * ld + j];
        buf[i * dim + j] = v;
        abs_sum[j] += std::abs(v);
        abs_max[j] = std::max(abs_max[j], std::abs(v));
      }
    // H(upper) += Aᵀ A, A = buf [m, dim], by fixed tiles (cpu::syrk_upper), so its bits do not depend on the number
    // of threads: one dsyrk over H, threaded by OpenBLAS, gave other bits on two threads than on one with OpenBLAS's
    // SkylakeX kernels (session 66; its Prescott kernels happened to agree).
    cpu::syrk_upper(true, dim, m, 1.0, buf.data(), dim, H.data(), dim);
  }
  tokens += n;
  finalized_ = false;
  id = g_stats_ids++;
}

void MatrixStats::finalize() {
  if (finalized_) return;
  id = g_stats_ids++;
  for (int64_t i = 0; i < dim; ++i)
    for (int64_t j = i + 1; j < dim; ++j) H[j * dim + i] = H[i * dim + j];
  finalized_ = true;
}

void MatrixStats::scale_inputs(const std::vector<double>& f) {
  NIBBLE_CHECK(static_cast<int64_t>(f.size()) == dim, "MatrixStats::scale_inputs: {} factors for {} inputs", f.size(),
               dim);
  finalize();
  for (int64_t i = 0; i < dim; ++i) {
    for (int64_t j = 0; j < dim; ++j) H[i * dim + j] *= f[i] * f[j];
    abs_sum[i] *= std::abs(f[i]);
    abs_max[i] = static_cast<float>(abs_max[i] * std::abs(f[i]));
  }
  id = g_stats_ids++;
}

// ---- grids -------------------------------------------------------------------

GroupParams fit_group_mse(const FormatSpec& f, const float* w, int64_t n, const GroupParams& tensor) {
  constexpr int kSteps = 33;          // shrink factors 1.0, 0.9875, ..., 0.6
  constexpr double kNorm = 2.4;       // the error norm of the search
  GroupParams best = f.fit_group(w, n, 1.0f, tensor);
  double best_err = INFINITY;
  for (int k = 0; k < kSteps; ++k) {
    const float shrink = static_cast<float>(1.0 - 0.4 * k / (kSteps - 1));
    const GroupParams p = f.fit_group(w, n, shrink, tensor);
    double err = 0;
    for (int64_t i = 0; i < n; ++i) err += std::pow(std::abs(static_cast<double>(w[i]) - f.decode(f.encode(w[i], p), p)), kNorm);
    if (err < best_err) {  // strict: a tie keeps the wider range
      best_err = err;
      best = p;
    }
  }
  return best;
}

namespace {

class FormatGrid final : public Grid {
 public:
  FormatGrid(const FormatChoice& f, bool mse) : f_(f), mse_(mse) {}
  int group_size() const override { return f_.group_size; }
  int64_t group_len(int64_t cols) const override { return f_.group_size > 0 ? f_.group_size : cols; }
  GroupParams fit_tensor(const float* w, int64_t rows, int64_t cols) const override {
    return fit_tensor_params(*f_.spec, w, rows, cols);
  }
  GroupParams fit(const float* w, int64_t n, const GroupParams& tensor) const override {
    return mse_ ? fit_group_mse(*f_.spec, w, n, tensor) : f_.spec->fit_group(w, n, 1.0f, tensor);
  }
  float quantize(float w, const GroupParams& p, uint8_t* code) const override {
    const uint8_t c = f_.spec->encode(w, p);
    if (code) *code = c;
    return f_.spec->decode(c, p);
  }
  const FormatSpec* format() const override { return f_.spec; }

 private:
  FormatChoice f_;
  bool mse_;
};

class UniformGrid final : public Grid {
 public:
  explicit UniformGrid(float step) : step_(step) {}
  int group_size() const override { return 0; }
  int64_t group_len(int64_t) const override { return 0; }
  GroupParams fit(const float*, int64_t, const GroupParams&) const override { return {}; }
  float quantize(float w, const GroupParams&, uint8_t* code) const override {
    if (code) *code = 0;
    return step_ * std::nearbyint(w / step_);
  }

 private:
  float step_;
};

}  // namespace

std::unique_ptr<Grid> make_format_grid(const FormatChoice& f, bool mse) { return std::make_unique<FormatGrid>(f, mse); }

std::unique_ptr<Grid> make_uniform_grid(float step) {
  NIBBLE_CHECK(std::isfinite(step) && step > 0, "uniform grid: the step must be a positive number, found {}", step);
  return std::make_unique<UniformGrid>(step);
}

std::unique_ptr<Grid> parse_grid(const std::string& text, int default_group, bool mse) {
  const std::string prefix = "uniform:step=";
  if (text.rfind("uniform", 0) == 0) {
    NIBBLE_CHECK(text.rfind(prefix, 0) == 0, "--grid '{}': expected uniform:step=S", text);
    const std::string s = text.substr(prefix.size());
    float step = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), step);
    NIBBLE_CHECK(ec == std::errc() && end == s.data() + s.size(), "--grid '{}': '{}' is not a number", text, s);
    NIBBLE_CHECK(!mse, "--mse searches a format's group range; the uniform grid has none");
    return make_uniform_grid(step);
  }
  // A canonical name ("int4_g64_asym") carries its own group size; a family
  // name ("int4_asym") takes the default.
  bool canonical = false;
  for (const FormatSpec* f : format_registry())
    for (int g : f->group_sizes) canonical |= f->canonical_name(g) == text;
  return make_format_grid(find_format(text, canonical ? 0 : default_group), mse);
}

// ---- results -----------------------------------------------------------------

QuantizedMatrix GptqResult::to_quantized(const FormatSpec& f, int group_size) const {
  QuantizedMatrix q;
  q.format = &f;
  q.group_size = group_size;
  q.rows = rows;
  q.cols = cols;
  NIBBLE_CHECK(codes.size() == static_cast<size_t>(rows * cols) &&
                   params.size() == static_cast<size_t>(rows * q.groups_per_row()),
               "quantized result has no codes for format {}", f.canonical_name(group_size));
  q.codes = codes;
  q.params = params;
  return q;
}

GptqResult rtn(const float* w, int64_t rows, int64_t cols, const Grid& grid) {
  GptqResult r;
  r.rows = rows;
  r.cols = cols;
  const bool grouped = grid.group_len(cols) > 0;
  const int64_t g = grouped ? grid.group_len(cols) : cols;
  const int64_t gpr = (cols + g - 1) / g;
  r.dequant.resize(static_cast<size_t>(rows * cols));
  r.codes.resize(static_cast<size_t>(rows * cols));
  if (grouped) r.params.resize(static_cast<size_t>(rows * gpr));
  const GroupParams tensor = grid.fit_tensor(w, rows, cols);
#pragma omp parallel for schedule(static) if (rows * cols > (1 << 16))
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t k = 0; k < gpr; ++k) {
      const int64_t c0 = k * g, n = std::min(g, cols - c0);
      const float* src = w + i * cols + c0;
      const GroupParams p = grouped ? grid.fit(src, n, tensor) : GroupParams{};
      if (grouped) r.params[i * gpr + k] = p;
      for (int64_t j = 0; j < n; ++j)
        r.dequant[i * cols + c0 + j] = grid.quantize(src[j], p, &r.codes[i * cols + c0 + j]);
    }
  }
  if (!grid.format()) r.codes.clear();
  return r;
}

// ---- GPTQ --------------------------------------------------------------------

namespace {

// Factors a (row-major, symmetric positive definite, already index-reversed:
// a = J A J with J the reversal) and leaves in it L⁻¹ (row-major, lower) where
// J A J = L Lᵀ. Then U = J L⁻¹ J is upper with Uᵀ U = A⁻¹: the upper Cholesky
// factor of the inverse for 2/3 n³ flops (potrf + trtri) instead of 4/3 n³
// (potrf + potri + potrf). Row-major data passed as column-major with 'U' is
// the transposed problem, which is the same one here, and needs no copy. Both
// steps give the same bits on any number of threads (cpu::potrf_upper).
bool factor_reversed(std::vector<double>& a, int64_t n) {
  return cpu::potrf_upper(a.data(), n) && cpu::trtri_upper(a.data(), n);
}

}  // namespace

HessianPlan plan_hessian(std::vector<double> diag, bool act_order) {
  HessianPlan p;
  const int64_t n = static_cast<int64_t>(diag.size());
  // Dead inputs (H_jj == 0: never active in calibration) get H_jj = 1; the
  // sweep zeroes their weights.
  p.dead.assign(diag.size(), 0);
  for (int64_t j = 0; j < n; ++j)
    if (diag[j] == 0.0) {
      diag[j] = 1.0;
      p.dead[j] = 1;
      ++p.dead_columns;
    }
  // Sweep order: natural, or decreasing diag(H) (stable, so ties keep index order).
  p.perm.resize(diag.size());
  std::iota(p.perm.begin(), p.perm.end(), 0);
  if (act_order)
    std::stable_sort(p.perm.begin(), p.perm.end(), [&](int64_t a, int64_t b) { return diag[a] > diag[b]; });
  for (double d : diag) p.mean_diag += d;
  p.mean_diag /= static_cast<double>(n);
  p.diag = std::move(diag);
  return p;
}

double damping_factor(const GptqOptions& opt, int attempt) {
  return opt.damp > 0 ? opt.damp * std::pow(10.0, attempt) : (attempt == 0 ? 0.0 : 0.01 * std::pow(10.0, attempt - 1));
}

void fail_not_positive_definite(int64_t inputs, int64_t tokens, double damp_used, const GptqOptions& opt) {
  NIBBLE_FAIL("gptq: the Hessian ({} inputs, {} tokens) is not positive definite even with damping {} "
              "(after {} retries from --damp {}); more calibration data or a larger --damp is needed",
              inputs, tokens, damp_used, opt.max_damp_retries, opt.damp);
}

PreparedHessian prepare_hessian(const MatrixStats& stats, const GptqOptions& opt) {
  NIBBLE_CHECK(stats.tokens > 0, "gptq: no calibration tokens were seen for this matrix");
  NIBBLE_CHECK(opt.damp >= 0 && std::isfinite(opt.damp), "gptq: damping must be >= 0, found {}", opt.damp);
  const int64_t n = stats.dim;
  const std::vector<double>& H = stats.H;
  PreparedHessian p;
  p.cols = n;
  p.act_order = opt.act_order;
  std::vector<double> d0(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) d0[j] = H[j * n + j];
  HessianPlan plan = plan_hessian(std::move(d0), opt.act_order);
  const std::vector<double>& diag = plan.diag;
  const double mean_diag = plan.mean_diag;
  p.dead = std::move(plan.dead);
  p.dead_columns = plan.dead_columns;
  p.perm = std::move(plan.perm);

  // Raise the damping ×10 while the factorization fails.
  std::vector<double> A(static_cast<size_t>(n * n));
  bool ok = false;
  for (int attempt = 0; attempt <= opt.max_damp_retries && !ok; ++attempt) {
    const double factor = damping_factor(opt, attempt);
    const double lambda = factor * mean_diag;
    // A = J P (H + λI) Pᵀ J: permuted to the sweep order, then index-reversed.
#pragma omp parallel for schedule(static) if (n >= 512)
    for (int64_t a = 0; a < n; ++a) {
      const int64_t ia = p.perm[n - 1 - a];
      for (int64_t b = 0; b < n; ++b) {
        const int64_t ib = p.perm[n - 1 - b];
        A[a * n + b] = ia == ib ? diag[ia] + lambda : H[ia * n + ib];
      }
    }
    ok = factor_reversed(A, n);
    p.damp_used = factor;
    p.lambda = lambda;
    p.damp_retries = attempt;
  }
  if (!ok) fail_not_positive_definite(n, stats.tokens, p.damp_used, opt);
  // U = J L⁻¹ J (row-major upper); L⁻¹ is the lower triangle of A.
  p.U.assign(static_cast<size_t>(n * n), 0.0f);
#pragma omp parallel for schedule(static) if (n >= 512)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i; j < n; ++j) {
      const double v = A[(n - 1 - i) * n + (n - 1 - j)];
      p.U[i * n + j] = static_cast<float>(v);
    }
  for (int64_t i = 0; i < n; ++i)
    NIBBLE_CHECK(std::isfinite(p.U[i * n + i]) && p.U[i * n + i] > 0,
                 "gptq: the inverse Hessian's factor is not finite at column {} (damping {})", i, p.damp_used);
  return p;
}

GptqResult gptq(const float* w_in, int64_t rows, int64_t cols, const MatrixStats& stats, const Grid& grid,
                const GptqOptions& opt) {
  NIBBLE_CHECK(stats.dim == cols, "gptq: the statistics are for {} inputs, the matrix has {} columns", stats.dim,
               cols);
  return gptq(w_in, rows, cols, prepare_hessian(stats, opt), grid, opt);
}

GptqResult gptq(const float* w_in, int64_t rows, int64_t cols, const PreparedHessian& prep, const Grid& grid,
                const GptqOptions& opt) {
  NIBBLE_CHECK(prep.cols == cols, "gptq: the Hessian is for {} inputs, the matrix has {} columns", prep.cols, cols);
  NIBBLE_CHECK(prep.act_order == opt.act_order, "gptq: the Hessian was prepared for another column order");
  const int64_t g = grid.group_len(cols);
  const int64_t B = opt.block_size;
  NIBBLE_CHECK(B > 0, "gptq: the block size must be positive, found {}", B);
  // Groups fitted when the sweep reaches them must lie inside one block; groups
  // that blocks do not tile (a per-channel format's whole row wider than a
  // block) get static parameters from the original weights, as GPTQ's
  // reference does for per-channel quantization, and so does act-order.
  const bool static_groups = g > 0 && (opt.act_order || B % g != 0);
  const int64_t gpr = g > 0 ? (cols + g - 1) / g : 0;
  const std::vector<int64_t>& perm = prep.perm;
  const std::vector<float>& U = prep.U;

  GptqResult res;
  res.rows = rows;
  res.cols = cols;
  res.damp_used = prep.damp_used;
  res.lambda = prep.lambda;
  res.damp_retries = prep.damp_retries;
  res.dead_columns = prep.dead_columns;
  std::vector<float> W(w_in, w_in + rows * cols);
  for (int64_t j = 0; j < cols; ++j)
    if (prep.dead[j])
      for (int64_t i = 0; i < rows; ++i) W[i * cols + j] = 0.0f;

  // Per-matrix parameters, and group parameters fixed up front (static
  // groups), from the contiguous groups of the original weights.
  const GroupParams tensor = grid.fit_tensor(W.data(), rows, cols);
  res.params.resize(static_cast<size_t>(rows * gpr));
  if (static_groups) {
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t k = 0; k < gpr; ++k) {
        const int64_t c0 = k * g;
        res.params[i * gpr + k] = grid.fit(&W[i * cols + c0], std::min(g, cols - c0), tensor);
      }
  }
  std::vector<float> Wp(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t a = 0; a < cols; ++a) Wp[i * cols + a] = W[i * cols + perm[a]];
  W = {};

  res.dequant.assign(static_cast<size_t>(rows * cols), 0.0f);
  res.codes.assign(static_cast<size_t>(rows * cols), 0);
  const int nthreads = rows * cols >= (1 << 16) ? 0 : 1;  // 0: OpenMP's default
  std::vector<float> Wb(static_cast<size_t>(B * rows)), Eb(static_cast<size_t>(B * rows));
  std::vector<double> row_cost(static_cast<size_t>(rows), 0.0);  // added in row order at the end

  for (int64_t i1 = 0; i1 < cols; i1 += B) {
    const int64_t i2 = std::min(cols, i1 + B), nb = i2 - i1;
    // The block, transposed: Wb[j][r] = W[r][i1 + j], so a column is contiguous.
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < nb; ++j) Wb[j * rows + r] = Wp[r * cols + i1 + j];

    // Rows are independent inside a block: each thread sweeps its own rows.
#pragma omp parallel num_threads(nthreads > 0 ? nthreads : omp_get_max_threads())
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t r0 = rows * t / nt, r1 = rows * (t + 1) / nt;
      std::vector<float> gbuf(static_cast<size_t>(std::max<int64_t>(g, 1)));
      for (int64_t i = 0; i < nb; ++i) {
        const int64_t col = i1 + i, orig = perm[col];
        if (g > 0 && !static_groups && orig % g == 0) {
          // A new group: fit its parameters on the error-updated weights (the
          // whole group lies in this block, since B is a multiple of g).
          const int64_t n = std::min(g, cols - orig);
          for (int64_t r = r0; r < r1; ++r) {
            for (int64_t k = 0; k < n; ++k) gbuf[k] = Wb[(i + k) * rows + r];
            res.params[r * gpr + orig / g] = grid.fit(gbuf.data(), n, tensor);
          }
        }
        const float d = U[col * cols + col];
        float* wcol = &Wb[i * rows];
        float* ecol = &Eb[i * rows];
        for (int64_t r = r0; r < r1; ++r) {
          const GroupParams p = g > 0 ? res.params[r * gpr + orig / g] : GroupParams{};
          uint8_t code = 0;
          const float q = grid.quantize(wcol[r], p, &code);
          res.dequant[r * cols + orig] = q;
          res.codes[r * cols + orig] = code;
          const float diff = wcol[r] - q;
          row_cost[r] += static_cast<double>(diff) * diff / (static_cast<double>(d) * d);
          ecol[r] = diff / d;
        }
        // Push this column's error onto the block's later columns.
        for (int64_t j = i + 1; j < nb; ++j) {
          const float u = U[col * cols + i1 + j];
          float* wj = &Wb[j * rows];
          for (int64_t r = r0; r < r1; ++r) wj[r] -= ecol[r] * u;
        }
      }
    }
    // ...and the whole block's error onto every column after it, at once:
    // W[:, i2:] -= Ebᵀ · U[i1:i2, i2:]
    if (i2 < cols) {
      cpu::sgemm(true, false, rows, cols - i2, nb, -1.0f, Eb.data(), rows, &U[i1 * cols + i2], cols, 1.0f, &Wp[i2],
                 cols);
    }
  }
  res.sweep_cost = 0;
  for (double v : row_cost) res.sweep_cost += v;
  if (g == 0) res.params.clear();
  if (!grid.format()) res.codes.clear();
  return res;
}

// ---- the registered method ---------------------------------------------------

namespace {

class GptqQuantizer final : public Quantizer {
 public:
  explicit GptqQuantizer(const QuantizerConfig& c) : config_(c), grid_(make_format_grid(c.format, c.mse)) {}
  QuantizedMatrix quantize(const Tensor& w, const MatrixStats* stats, QuantizeInfo* info) const override {
    NIBBLE_CHECK(w.dim() == 2 && w.dtype() == DType::F32 && w.is_contiguous(),
                 "gptq: expected a contiguous F32 2-D matrix, found {} {}", dtype_name(w.dtype()), shape_str(w.shape()));
    NIBBLE_CHECK(stats != nullptr, "gptq needs calibration statistics (pass --calib)");
    GptqOptions o;
    o.damp = config_.damp;
    o.act_order = config_.act_order;
    NIBBLE_CHECK(stats->dim == w.size(1), "gptq: the statistics are for {} inputs, the matrix has {} columns",
                 stats->dim, w.size(1));
    // q/k/v (and gate/up) share their statistics: factor them once.
    std::lock_guard<std::mutex> lock(mu_);
    if (prepared_id_ != stats->id) {
      prepared_ = prepare_hessian(*stats, o);
      prepared_id_ = stats->id;
    }
    GptqResult r = gptq(w.data<float>(), w.size(0), w.size(1), prepared_, *grid_, o);
    if (info) *info = QuantizeInfo{r.damp_used, r.damp_retries, r.dead_columns, 0, 0, {}};
    if (config_.refine > 0) {
      const RefineReport rr = refine(r, w.data<float>(), *stats, prepared_, *grid_, config_.refine);
      if (info) info->refine = rr;
    }
    return r.to_quantized(*config_.format.spec, config_.format.group_size);
  }

 private:
  QuantizerConfig config_;
  std::unique_ptr<Grid> grid_;
  mutable std::mutex mu_;
  mutable uint64_t prepared_id_ = 0;
  mutable PreparedHessian prepared_;
};

// The device is checked here, when the quantizer is made: a run that cannot
// use the GPU fails before any calibration work.
std::unique_ptr<Quantizer> make_gptq(const QuantizerConfig& c) {
  NIBBLE_CHECK(c.device == "cpu" || c.device == "cuda", "gptq: --device must be cpu or cuda, found '{}'", c.device);
  NIBBLE_CHECK(c.refine >= 0, "--refine: the number of passes must be >= 0, found {}", c.refine);
  if (c.device == "cpu") return std::make_unique<GptqQuantizer>(c);
#ifdef NIBBLE_HAVE_CUDA
  return cuda::make_gptq_quantizer(c);
#else
  NIBBLE_FAIL("--device cuda: this build has no CUDA backend (build with NIBBLE_CUDA=on)");
#endif
}

}  // namespace

extern const MethodSpec kGptq;
const MethodSpec kGptq{"gptq", "GPTQ: Hessian-aware column sweep with error feedback (needs --calib)", true, make_gptq};

}  // namespace nibble::quant
