// Model transforms (DESIGN.md, "A quantization method"): methods that reshape
// the model without changing what it computes, so that the quantizer that
// follows loses less. A `--method` is "[transform+]quantizer": "gptq",
// "awq" (= awq+rtn), "awq+gptq", "smoothquant", "rotate+gptq", ...
//
// Two kinds, each a row of one registry:
// - layer transforms (AWQ, SmoothQuant) see one decoder layer (dense f32
//   weights) and the statistics of its linears' inputs from calibration, fold
//   per-channel scales into the operation before (a norm gain, v_proj's or
//   up_proj's rows), and update the statistics to the scaled inputs;
// - model transforms (Hadamard rotation) present the whole checkpoint through
//   a ModelSource that rotates tensors as they are loaded.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/format.h"
#include "nibble/model.h"
#include "nibble/quantizer.h"

namespace nibble::quant {

struct MatrixStats;
class Grid;

struct TransformConfig {
  FormatChoice format;  // the format the weights will be stored in (AWQ searches with it)
  double alpha = 0.5;   // SmoothQuant: migration strength
  uint64_t seed = 0;    // rotation: the random signs
  // AWQ: use this α for every group instead of searching (tests of the folds); < 0 searches.
  double awq_fixed_alpha = -1;
};

class LayerTransform {
 public:
  virtual ~LayerTransform() = default;
  // Reshapes decoder layer L (dense weights) without changing what it
  // computes, given the statistics of its linears' inputs (one per input the
  // selected linears read); rescales `stats` to the transformed inputs.
  // `selected(slot name)` says whether a linear will be quantized (a transform
  // leaves kept linears' scales alone). Returns what it chose, for nibble.json.
  virtual nlohmann::ordered_json apply(const ModelConfig& c, DecoderLayer& L, std::map<LinearInput, MatrixStats>& stats,
                                       const std::function<bool(const char*)>& selected) const = 0;
};

struct TransformSpec {
  std::string_view name;
  std::string_view description;
  bool needs_calibration;
  // Layer transforms: a factory; null for model transforms.
  std::unique_ptr<LayerTransform> (*make_layer)(const TransformConfig&);
  // Model transforms: the transformed view of `src` (which must outlive it;
  // notes for the user land in `notes`); null for layer transforms.
  std::unique_ptr<ModelSource> (*wrap_source)(const ModelSource& src, const TransformConfig&,
                                              std::vector<std::string>& notes);
};

const std::vector<const TransformSpec*>& transform_registry();

// A parsed --method: an optional transform, then a quantizer.
struct MethodChoice {
  const TransformSpec* transform = nullptr;
  const MethodSpec* quantizer = nullptr;
  std::string name;  // canonical: "gptq", "awq+rtn", "rotate+gptq"
  bool needs_calibration() const;
};
// Throws an Error listing the transforms and quantizers when `text` names neither.
MethodChoice parse_method(std::string_view text);
// Every accepted --method spelling, for help texts.
std::vector<std::string> method_names();

// ---- the pieces, public for tests and `nibble layer`

// The rotated view of `src` that `--method rotate+...` quantizes (see
// src/quant/rotate.cpp): computes the same logits in exact arithmetic.
std::unique_ptr<ModelSource> rotate_model(const ModelSource& src, uint64_t seed, std::vector<std::string>& notes);

// Folds per-channel factors into an RMSNorm gain: the norm's output channel j
// is multiplied by factor[j]. `gain` is the gain the forward applies
// (DecoderLayer's norms), F32.
void scale_norm_gain(Tensor& gain, const std::vector<double>& factor);
// w[rows, cols] (F32) · diag(factor): column j scaled by factor[j].
void scale_columns(Tensor& w, const std::vector<double>& factor);
// diag(factor) · w: row i scaled by factor[i] (and the bias, when given).
void scale_rows(Tensor& w, Tensor* bias, const std::vector<double>& factor);
// The same on a layer's dense linear: its inputs scaled (columns), or its
// outputs (rows and bias).
void scale_linear_columns(LinearWeight& lw, const std::vector<double>& factor);
void scale_linear_rows(LinearWeight& lw, const std::vector<double>& factor);

// AWQ's objective for one scaling s of the inputs shared by `weights`
// (each [rows, dim] F32): Σ over the matrices of ‖X (Ŵ − W)ᵀ‖² = tr(Δ H Δᵀ),
// Δ = Q(W·diag(s))·diag(1/s) − W, Q = round-to-nearest on `grid` (a format's,
// see make_format_grid), H = XᵀX from `stats`.
double awq_scaled_error(const std::vector<const Tensor*>& weights, const MatrixStats& stats,
                        const std::vector<double>& s, const Grid& grid);

struct AwqSearch {
  double alpha = 0;               // the chosen exponent
  std::vector<double> scales;     // s = a^α / sqrt(max · min), a = mean |x| per channel
  double error = 0, error_unscaled = 0;  // the objective at α and at s = 1
};
// Searches α over 0, 0.05, ..., 0.95 (20 values, α = 0 is plain rounding, so
// the search never loses to it).
// With fixed_alpha ≥ 0 only that α is evaluated.
AwqSearch awq_search(const std::vector<const Tensor*>& weights, const MatrixStats& stats, const Grid& grid,
                     double fixed_alpha = -1);

// SmoothQuant's factors s_j = max|X_j|^α / max|W_j|^(1−α), the weight maximum
// taken over every matrix in `weights` (each [rows, dim]) at input j. Inputs
// whose activation or weight maximum is 0 keep s_j = 1.
std::vector<double> smoothquant_scales(const std::vector<float>& act_max, const std::vector<const Tensor*>& weights,
                                       double alpha);

}  // namespace nibble::quant
