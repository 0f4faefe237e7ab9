// AWQ (Lin et al. 2024, "AWQ: Activation-aware Weight Quantization for LLM
// Compression and Acceleration"): inputs that carry large activations matter
// more, so scale their weight columns up by s (less relative rounding error)
// and their inputs down by 1/s, folded into the operation before. The scale is
// s = a^α from the mean |activation| a per input channel, α searched to
// minimize the linears' output error with the scaled, rounded weights.
//
// The output error is measured exactly on the calibration inputs through
// their Hessian H = XᵀX (the statistics GPTQ uses): ‖X ΔWᵀ‖² = tr(ΔW H ΔWᵀ).
// The reference implementation measures it on a subsample of the tokens; with
// H the cost no longer depends on how many tokens were seen.

#include <cmath>

#include "backend/cpu/kernels.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/transform.h"

namespace nibble::quant {
namespace {

using ojson = nlohmann::ordered_json;

// H as f32 [dim, dim] (both triangles): the objective only ranks candidates.
std::vector<float> hessian_f32(const MatrixStats& st) {
  std::vector<float> h(st.H.size());
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<float>(st.H[i]);
  return h;
}

double scaled_error(const std::vector<const Tensor*>& weights, const std::vector<float>& H, int64_t dim,
                    const std::vector<double>& s, const Grid& grid) {
  double total = 0;
  for (const Tensor* w : weights) {
    NIBBLE_CHECK(w->dim() == 2 && w->size(1) == dim && w->dtype() == DType::F32 && w->is_contiguous(),
                 "awq: expected an F32 matrix with {} inputs, found {} {}", dim, dtype_name(w->dtype()),
                 shape_str(w->shape()));
    const int64_t rows = w->size(0);
    const float* p = w->data<float>();
    std::vector<float> ws(static_cast<size_t>(rows * dim)), delta(ws.size()), e(ws.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j) ws[r * dim + j] = static_cast<float>(p[r * dim + j] * s[j]);
    const GptqResult q = rtn(ws.data(), rows, dim, grid);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j)
        delta[r * dim + j] = static_cast<float>(q.dequant[r * dim + j] / s[j] - p[r * dim + j]);
    // E = Δ H, then tr(Δ H Δᵀ) = Σ Δ ∘ E
    cpu::sgemm(false, false, rows, dim, dim, 1.0f, delta.data(), dim, H.data(), dim, 0.0f, e.data(), dim);
    // Per row, then the rows in order: the same sum on any number of threads.
    std::vector<double> row_sum(static_cast<size_t>(rows), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < dim; ++j) row_sum[r] += static_cast<double>(delta[r * dim + j]) * e[r * dim + j];
    for (double v : row_sum) total += v;
  }
  return total;
}

}  // namespace

double awq_scaled_error(const std::vector<const Tensor*>& weights, const MatrixStats& stats,
                        const std::vector<double>& s, const Grid& grid) {
  NIBBLE_CHECK(static_cast<int64_t>(s.size()) == stats.dim, "awq: {} scales for {} inputs", s.size(), stats.dim);
  return scaled_error(weights, hessian_f32(stats), stats.dim, s, grid);
}

AwqSearch awq_search(const std::vector<const Tensor*>& weights, const MatrixStats& stats, const Grid& grid,
                     double fixed_alpha) {
  constexpr int kGrid = 20;  // α = 0, 0.05, ..., 0.95 (the reference implementation's grid)
  const int64_t dim = stats.dim;
  NIBBLE_CHECK(stats.tokens > 0, "awq: no calibration tokens reached this input");
  const std::vector<float> H = hessian_f32(stats);
  std::vector<double> a(static_cast<size_t>(dim));
  for (int64_t j = 0; j < dim; ++j) a[j] = stats.abs_sum[j] / static_cast<double>(stats.tokens);
  // s = a^α, centred (geometric mean of the extremes = 1) so the scaled
  // weights stay in the range the format was fitted for.
  auto scales_for = [&](double alpha) {
    std::vector<double> s(static_cast<size_t>(dim));
    double mx = 0, mn = INFINITY;
    for (int64_t j = 0; j < dim; ++j) {
      s[j] = std::max(std::pow(a[j], alpha), 1e-4);  // a dead channel must not get a zero scale
      mx = std::max(mx, s[j]);
      mn = std::min(mn, s[j]);
    }
    const double norm = std::sqrt(mx * mn);
    for (double& v : s) v /= norm;
    return s;
  };
  AwqSearch best;
  if (fixed_alpha >= 0) {
    best.alpha = fixed_alpha;
    best.scales = scales_for(fixed_alpha);
    best.error = scaled_error(weights, H, dim, best.scales, grid);
    best.error_unscaled = scaled_error(weights, H, dim, std::vector<double>(static_cast<size_t>(dim), 1.0), grid);
    return best;
  }
  best.error = INFINITY;
  for (int k = 0; k < kGrid; ++k) {
    const double alpha = static_cast<double>(k) / kGrid;
    std::vector<double> s = scales_for(alpha);  // α = 0: every scale is 1
    const double err = scaled_error(weights, H, dim, s, grid);
    if (k == 0) best.error_unscaled = err;
    if (err < best.error) {  // strict: a tie keeps the smaller α
      best.error = err;
      best.alpha = alpha;
      best.scales = std::move(s);
    }
  }
  return best;
}

namespace {

std::vector<double> inverse(const std::vector<double>& s) {
  std::vector<double> r(s.size());
  for (size_t j = 0; j < s.size(); ++j) r[j] = 1.0 / s[j];
  return r;
}

class AwqTransform final : public LayerTransform {
 public:
  explicit AwqTransform(const TransformConfig& c) : config_(c), grid_(make_format_grid(c.format, false)) {}

  ojson apply(const ModelConfig&, DecoderLayer& L, std::map<LinearInput, MatrixStats>& stats,
              const std::function<bool(const char*)>& selected) const override {
    ojson report = ojson::object();
    // One group per input: the linears that read it, and where 1/s goes.
    struct Group {
      const char* name;
      LinearInput input;
      std::vector<std::pair<const char*, LinearWeight DecoderLayer::*>> linears;
    };
    const std::vector<Group> groups = {
        {"qkv", LinearInput::QKV, {{"self_attn.q_proj", &DecoderLayer::q}, {"self_attn.k_proj", &DecoderLayer::k},
                                   {"self_attn.v_proj", &DecoderLayer::v}}},
        {"o", LinearInput::O, {{"self_attn.o_proj", &DecoderLayer::o}}},
        {"gate_up", LinearInput::GateUp, {{"mlp.gate_proj", &DecoderLayer::gate}, {"mlp.up_proj", &DecoderLayer::up}}},
        {"down", LinearInput::Down, {{"mlp.down_proj", &DecoderLayer::down}}},
    };
    for (const Group& g : groups) {
      auto st = stats.find(g.input);
      if (st == stats.end()) continue;
      // o_proj's inputs are v_proj's outputs only when every query head has
      // its own value head; with GQA a value channel feeds several heads'
      // inputs, which would need equal scales (the reference skips it too).
      if (g.input == LinearInput::O && L.v.out_features() != L.o.in_features()) {
        report[g.name] = "skipped: grouped-query attention";
        continue;
      }
      std::vector<const Tensor*> ws;
      for (const auto& [name, m] : g.linears)
        if (selected(name)) ws.push_back(&(L.*m).dense_weight());
      if (ws.empty()) continue;
      st->second.finalize();
      const AwqSearch r = awq_search(ws, st->second, *grid_, config_.awq_fixed_alpha);
      report[g.name] = {{"alpha", r.alpha}, {"error", r.error}, {"error_unscaled", r.error_unscaled}};
      if (r.alpha == 0) {  // s = 1: nothing to fold
        continue;
      }
      const std::vector<double> inv = inverse(r.scales);
      for (const auto& [name, m] : g.linears) scale_linear_columns(L.*m, r.scales);
      switch (g.input) {  // where the inputs' 1/s is folded
        case LinearInput::QKV: scale_norm_gain(L.input_norm, inv); break;
        case LinearInput::GateUp: scale_norm_gain(L.post_norm, inv); break;
        case LinearInput::O: scale_linear_rows(L.v, inv); break;
        case LinearInput::Down: scale_linear_rows(L.up, inv); break;
      }
      st->second.scale_inputs(inv);
    }
    return report;
  }

 private:
  TransformConfig config_;
  std::unique_ptr<Grid> grid_;
};

std::unique_ptr<LayerTransform> make_awq(const TransformConfig& c) { return std::make_unique<AwqTransform>(c); }

}  // namespace

extern const TransformSpec kAwq;
const TransformSpec kAwq{"awq", "activation-aware per-channel scales (searched α), folded into the op before", true,
                         make_awq, nullptr};

}  // namespace nibble::quant
