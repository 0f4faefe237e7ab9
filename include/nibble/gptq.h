// Calibrated quantization of one matrix: the Hessian of a linear's inputs,
// GPTQ (Frantar et al. 2022) and the MSE range search, written against a
// "grid" (how a value becomes a representable one) so the same sweep serves
// the registered formats and the textbook uniform grid of `nibble layer`.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nibble/format.h"
#include "nibble/quantizer.h"
#include "nibble/tensor.h"

namespace nibble::quant {

// H = Σ xᵀx over every calibration token x (a row of a linear's input),
// accumulated in fp64. Unnormalized: GPTQ's result does not depend on the
// scale of H, and the sweep's per-step costs then add up to Σ‖ΔW x‖².
struct MatrixStats {
  explicit MatrixStats(int64_t dim = 0);
  int64_t dim = 0;
  uint64_t id = 0;  // unique per object (and per change): lets a quantizer reuse work on the same statistics
  int64_t tokens = 0;
  std::vector<double> H;  // [dim, dim], both triangles valid after finalize()
  // Per input channel: Σ|x_j| over the tokens (AWQ's activation magnitude is
  // abs_sum / tokens) and max|x_j| (SmoothQuant's).
  std::vector<double> abs_sum;
  std::vector<float> abs_max;

  // Adds the n rows of x[n, dim] (row stride ld, default dim).
  void add(const float* x, int64_t n, int64_t ld = 0);
  // Makes H symmetric (add() fills one triangle).
  void finalize();
  // The statistics of the inputs x_j · factor_j (a transform that scales the
  // input channels): H_ij · f_i · f_j, abs_sum_j · |f_j|, abs_max_j · |f_j|.
  void scale_inputs(const std::vector<double>& factor);

 private:
  bool finalized_ = true;
};

// How a weight becomes a representable value. Groups are group_len(cols)
// consecutive inputs of one output row (0: no groups, one global grid).
class Grid {
 public:
  virtual ~Grid() = default;
  // The format's group size as its registry row names it (0 for per-channel
  // and per-tensor formats and for grids without groups).
  virtual int group_size() const = 0;
  // Inputs per group in a matrix of `cols` inputs; 0 when the grid has no groups.
  virtual int64_t group_len(int64_t cols) const = 0;
  // Parameters of the whole matrix, fitted once before any group (per-tensor
  // scales, NVFP4's global scale); default-constructed when there are none.
  virtual GroupParams fit_tensor(const float*, int64_t, int64_t) const { return {}; }
  // Parameters for the n values of one group (only called when the grid has
  // groups), given the matrix's.
  virtual GroupParams fit(const float* w, int64_t n, const GroupParams& tensor) const = 0;
  // The representable value for w, and its code when the grid has codes.
  virtual float quantize(float w, const GroupParams& p, uint8_t* code) const = 0;
  // True when quantize() produces codes of a registered format.
  virtual const FormatSpec* format() const { return nullptr; }
};

// A registered format with its group size; with `mse`, each group's (min, max)
// is shrunk by the best of 33 factors 1.0, 0.9875, ..., 0.6 (the one minimizing
// Σ|w − w'|^2.4 over the group).
std::unique_ptr<Grid> make_format_grid(const FormatChoice& format, bool mse);
// A symmetric uniform grid: w' = step · round(w / step), no clamp, no codes.
std::unique_ptr<Grid> make_uniform_grid(float step);
// Parses "--grid" text: a format name ("int4_g128_asym", or "int4_asym" with
// `default_group`) or "uniform:step=S".
std::unique_ptr<Grid> parse_grid(const std::string& text, int default_group, bool mse);

// The MSE range search on its own: parameters for one group.
GroupParams fit_group_mse(const FormatSpec& f, const float* w, int64_t n, const GroupParams& tensor = {});

struct GptqOptions {
  double damp = 0.01;       // λ = damp · mean(diag H)
  int block_size = 128;     // lazy-batch width (groups it does not tile get static parameters)
  bool act_order = false;   // sweep columns in decreasing diag(H), static groups
  int max_damp_retries = 3; // ×10 damping per failed Cholesky
};

struct GptqResult {
  int64_t rows = 0, cols = 0;
  std::vector<float> dequant;       // [rows, cols] the chosen representable values
  std::vector<uint8_t> codes;       // [rows, cols] when the grid has codes
  std::vector<GroupParams> params;  // [rows, groups] when the grid has groups
  double damp_used = 0;             // the damping factor that succeeded (relative to mean diag)
  double lambda = 0;                // the absolute value added to diag(H)
  int damp_retries = 0;             // failed Cholesky attempts before it succeeded
  int64_t dead_columns = 0;         // inputs with H_ii == 0 (weights zeroed)
  // Σ over the sweep of (w − q)² / [U]_ii²: equals ‖X ΔWᵀ‖² + λ‖ΔW‖² over the
  // live columns for H = XᵀX (the algorithm's own account of its error).
  double sweep_cost = 0;

  QuantizedMatrix to_quantized(const FormatSpec& f, int group_size) const;
};

// The part of GPTQ that depends only on the inputs: dead inputs, the sweep
// order, the damping, and U, the upper Cholesky factor of (H + λI)⁻¹ in the
// sweep order (fp64 factorization, kept as f32). Matrices that read the same
// input (q/k/v, gate/up) share one.
struct PreparedHessian {
  int64_t cols = 0;
  bool act_order = false;
  std::vector<float> U;         // [cols, cols] row-major, upper
  std::vector<int64_t> perm;    // sweep position -> column
  std::vector<uint8_t> dead;    // per column
  int64_t dead_columns = 0;
  double damp_used = 0, lambda = 0;
  int damp_retries = 0;
};
// Throws an Error when the factorization still fails after the damping retries.
PreparedHessian prepare_hessian(const MatrixStats& stats, const GptqOptions& options);

// The decisions of prepare_hessian that depend only on diag(H) and the options,
// shared by the CPU and GPU preparations so that both decide alike: dead inputs
// (H_jj == 0, then treated as 1), the sweep order (natural, or decreasing diag(H),
// stable), the mean diagonal that the damping is relative to, the damping factor
// of each retry, and the error when every retry failed.
struct HessianPlan {
  std::vector<double> diag;  // diag(H) with the dead entries set to 1
  std::vector<uint8_t> dead;
  int64_t dead_columns = 0;
  std::vector<int64_t> perm;  // sweep position -> column
  double mean_diag = 0;
};
HessianPlan plan_hessian(std::vector<double> diag, bool act_order);
// λ = damping_factor(options, attempt) · mean_diag on attempt 0, 1, ...
double damping_factor(const GptqOptions& options, int attempt);
[[noreturn]] void fail_not_positive_definite(int64_t inputs, int64_t tokens, double damp_used,
                                             const GptqOptions& options);

// GPTQ on w[rows, cols] (row-major f32) with the inputs' statistics.
GptqResult gptq(const float* w, int64_t rows, int64_t cols, const MatrixStats& stats, const Grid& grid,
                const GptqOptions& options);
GptqResult gptq(const float* w, int64_t rows, int64_t cols, const PreparedHessian& hessian, const Grid& grid,
                const GptqOptions& options);

// Refinement of a GPTQ result against the objective GPTQ minimizes one column
// at a time: f(Q) = Σ_rows (q − w)ᵀ (H + λI) (q − w) over the live inputs (w the
// original row, λ the damping the sweep used). Each pass is a coordinate
// descent over every live weight (each moved to the representable value that
// minimizes f with the rest of its row fixed: the nearest one to
// q_j − [(H + λI)(q − w)]_j / (H_jj + λ)), then, for grouped formats with an
// affine decode (FormatSpec::affine), a least-squares refit of each group's
// scale (and min) to its codes, kept when the stored (rounded) parameters
// lower f. Passes stop early once one changes nothing. Every accepted step
// lowers f, so f never rises (Nair and Suggala 2024, "CDQuant: Greedy Coordinate Descent for Accurate LLM
// Quantization", for the coordinate descent after GPTQ).
RefineReport refine(GptqResult& result, const float* w, const MatrixStats& stats, const PreparedHessian& hessian,
                    const Grid& grid, int passes);

// Round-to-nearest on any grid (the group parameters fitted to each group's
// own values), returned in the same shape as GPTQ's result.
GptqResult rtn(const float* w, int64_t rows, int64_t cols, const Grid& grid);

}  // namespace nibble::quant
