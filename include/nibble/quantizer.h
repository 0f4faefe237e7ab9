// Quantization methods: a config struct plus a factory registered by name
// (DESIGN.md, "A quantization method"). A method sees one matrix plus its
// calibration statistics and returns codes and group parameters in a
// registered format.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "nibble/format.h"
#include "nibble/tensor.h"

namespace nibble::quant {

// Calibration statistics of one linear input (GPTQ's Hessian lands here).
struct MatrixStats;

struct QuantizerConfig {
  FormatChoice format;     // target format and group size
  bool mse = false;        // range search per group (33 shrink factors, |err|^2.4)
  bool act_order = false;  // GPTQ: decreasing diag(H) order, static groups
  double damp = 0.01;      // GPTQ: λ = damp · mean(diag H)
  // Where the method runs: "cpu", or "cuda" (GPTQ on int4_asym, int4_sym and int4_asym_f32; needs a
  // CUDA build and a visible device, checked when the quantizer is made).
  std::string device = "cpu";
  // GPTQ: passes of quant::refine after the sweep (0: none; --device cuda: int4_asym, int4_sym).
  int refine = 0;
};

// What GPTQ's --refine did to one matrix (or, summed, to several): its
// objective before and after (quant::refine in gptq.h).
struct RefineReport {
  int64_t code_changes = 0;   // weights moved to another code
  int64_t group_refits = 0;   // groups whose scale (and min) were replaced
  int passes = 0;             // the most passes any row ran
  double cost_before = 0, cost_after = 0;  // f before and after
  RefineReport& operator+=(const RefineReport& o) {
    code_changes += o.code_changes;
    group_refits += o.group_refits;
    passes = passes > o.passes ? passes : o.passes;
    cost_before += o.cost_before;
    cost_after += o.cost_after;
    return *this;
  }
};

// What a method reports about one matrix besides its codes.
struct QuantizeInfo {
  double damp_used = 0;      // GPTQ: damping factor that succeeded
  int damp_retries = 0;      // GPTQ: failed Cholesky attempts (damping ×10 each)
  int64_t dead_columns = 0;  // GPTQ: inputs never active in calibration
  // Filled by the calibrated flow: the stored weight against the matrix the
  // quantizer was given (after any transform), ‖W' − W‖_F / ‖W‖_F and max |W' − W|.
  double rel_error = 0, max_abs_error = 0;
  RefineReport refine;  // GPTQ --refine (all zero without it)
};

class Quantizer {
 public:
  virtual ~Quantizer() = default;
  // w: f32 [rows, cols], contiguous and finite. stats may be null for methods
  // that need no calibration.
  virtual QuantizedMatrix quantize(const Tensor& w, const MatrixStats* stats, QuantizeInfo* info = nullptr) const = 0;
};

struct MethodSpec {
  std::string_view name;
  std::string_view description;
  bool needs_calibration;
  std::unique_ptr<Quantizer> (*make)(const QuantizerConfig& config);
};

const std::vector<const MethodSpec*>& method_registry();
// Throws an Error listing the registered methods when `name` is unknown.
const MethodSpec& find_method(std::string_view name);

// Round-to-nearest with the format's own group fit (the format's reference
// quantizer): what every other method is measured against.
QuantizedMatrix quantize_rtn(const FormatChoice& format, const float* w, int64_t rows, int64_t cols);

}  // namespace nibble::quant
