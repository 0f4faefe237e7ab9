// SmoothQuant (Xiao et al. 2023, "SmoothQuant: Accurate and Efficient
// Post-Training Quantization for Large Language Models"): activation outliers
// sit in a few input channels, so divide those channels by
// s_j = max|X_j|^α / max|W_j|^(1−α) and multiply the weight columns by s_j
// (for α = 0.5 both sides' channel maxima become sqrt(max|X_j| · max|W_j|)),
// which makes per-tensor or per-token
// INT8 activations accurate. 1/s is folded into the RMSNorm gain before the
// q/k/v and gate/up projections; o_proj and down_proj keep their inputs.
#include <cmath>

#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/transform.h"

namespace nibble::quant {

std::vector<double> smoothquant_scales(const std::vector<float>& act_max, const std::vector<const Tensor*>& weights,
                                       double alpha) {
  NIBBLE_CHECK(alpha >= 0 && alpha <= 1, "smoothquant: alpha must be in [0, 1], found {}", alpha);
  const size_t dim = act_max.size();
  std::vector<double> wmax(dim, 0.0);
  for (const Tensor* w : weights) {
    NIBBLE_CHECK(w->dim() == 2 && w->size(1) == static_cast<int64_t>(dim) && w->dtype() == DType::F32 &&
                     w->is_contiguous(),
                 "smoothquant: expected an F32 matrix with {} inputs, found {} {}", dim, dtype_name(w->dtype()),
                 shape_str(w->shape()));
    const float* p = w->data<float>();
    for (int64_t r = 0; r < w->size(0); ++r)
      for (size_t j = 0; j < dim; ++j) wmax[j] = std::max(wmax[j], static_cast<double>(std::abs(p[r * dim + j])));
  }
  std::vector<double> s(dim, 1.0);
  for (size_t j = 0; j < dim; ++j)
    if (act_max[j] > 0 && wmax[j] > 0) s[j] = std::pow(act_max[j], alpha) / std::pow(wmax[j], 1.0 - alpha);
  return s;
}

namespace {

using ojson = nlohmann::ordered_json;

class SmoothQuantTransform final : public LayerTransform {
 public:
  explicit SmoothQuantTransform(const TransformConfig& c) : config_(c) {}

  ojson apply(const ModelConfig&, DecoderLayer& L, std::map<LinearInput, MatrixStats>& stats,
              const std::function<bool(const char*)>&) const override {
    ojson report = ojson::object();
    struct Group {
      const char* name;
      LinearInput input;
      Tensor DecoderLayer::*norm;
      std::vector<LinearWeight DecoderLayer::*> linears;
    };
    const std::vector<Group> groups = {
        {"qkv", LinearInput::QKV, &DecoderLayer::input_norm, {&DecoderLayer::q, &DecoderLayer::k, &DecoderLayer::v}},
        {"gate_up", LinearInput::GateUp, &DecoderLayer::post_norm, {&DecoderLayer::gate, &DecoderLayer::up}},
    };
    for (const Group& g : groups) {
      auto st = stats.find(g.input);
      if (st == stats.end()) continue;
      // Every linear that reads the input is scaled (the fold is exact), so
      // the weight maxima are taken over all of them.
      std::vector<const Tensor*> ws;
      for (auto m : g.linears) ws.push_back(&(L.*m).dense_weight());
      const std::vector<double> s = smoothquant_scales(st->second.abs_max, ws, config_.alpha);
      std::vector<double> inv(s.size());
      double smax = 0, smin = INFINITY;
      for (size_t j = 0; j < s.size(); ++j) {
        inv[j] = 1.0 / s[j];
        smax = std::max(smax, s[j]);
        smin = std::min(smin, s[j]);
      }
      for (auto m : g.linears) scale_linear_columns(L.*m, s);
      scale_norm_gain(L.*g.norm, inv);
      st->second.scale_inputs(inv);
      report[g.name] = {{"alpha", config_.alpha}, {"scale_min", smin}, {"scale_max", smax}};
    }
    return report;
  }

 private:
  TransformConfig config_;
};

std::unique_ptr<LayerTransform> make_smoothquant(const TransformConfig& c) {
  return std::make_unique<SmoothQuantTransform>(c);
}

}  // namespace

extern const TransformSpec kSmoothQuant;
const TransformSpec kSmoothQuant{"smoothquant",
                                 "per-channel smoothing s = max|X|^α / max|W|^(1−α) folded into the norms (for W8A8)",
                                 true, make_smoothquant, nullptr};

}  // namespace nibble::quant
