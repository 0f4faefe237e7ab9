// Hadamard rotation (QuaRot, Ashkboos et al. 2024; QuIP#, Tseng et al. 2024):
// rotating the residual stream by an orthogonal Q changes no output, but the
// rotated weights have no outlier columns left (a randomized Hadamard spreads
// every input over all of them), so rounding them loses less.
//
// With row vectors h (the residual stream) and weights W [out, in]:
// - RMSNorm commutes with Q once its gain g is moved into the linears that
//   read it (‖hQ‖ = ‖h‖), so every norm gain becomes 1 and a reader's weight
//   becomes W·diag(g)·Q (the head takes the final norm's gain: a tied head
//   is untied);
// - the embedding becomes E·Q, and the linears that write the residual stream
//   (o_proj, down_proj) become Qᵀ·W (their biases b·Q);
// - per attention head, values are rotated by a Hadamard Q_h of head_dim:
//   v_proj's rows per head Q_hᵀ·B (bias b·Q_h) and o_proj's input segments
//   per head ·Q_h. Attention mixes positions, not channels, so this is exact;
// - down_proj's input (after the SiLU product, nothing to fold it into) is
//   rotated online by the forward: z·Q_d, and down_proj becomes W·Q_d. When
//   the MLP width has no Hadamard construction this step is left out (noted).
//
// Seeds: Q from seed, Q_h from seed + 1, Q_d from seed + 2.
#include <algorithm>
#include <optional>

#include "nibble/error.h"
#include "nibble/hadamard.h"
#include "nibble/transform.h"

namespace nibble::quant {
namespace {

// w [rows, cols] → rows r·Q (in place on an F32 copy).
Tensor rotate_rows(const Tensor& w, const HadamardRotation& q) {
  Tensor t = w.to_f32();
  q.apply(t.data_mut<float>(), t.numel() / q.size());
  return t;
}

// w [rows, cols] → Qᵀ·w (every column c ↦ cᵀ·Q): through the transpose.
// With q smaller than rows, each transposed row holds rows / q.size()
// segments that are rotated separately (v_proj's per-head blocks).
Tensor rotate_columns(const Tensor& w, const HadamardRotation& q) {
  const int64_t rows = w.size(0), cols = w.size(1);
  const Tensor src = w.to_f32();
  std::vector<float> t(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = src.data<float>()[r * cols + c];
  // [cols, rows]: each row (a column of w) holds rows / q.size() segments
  q.apply(t.data(), cols * rows / q.size());
  Tensor out = Tensor::empty(DType::F32, {rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out.data_mut<float>()[r * cols + c] = t[c * rows + r];
  return out;
}

// w · diag(gain): an RMSNorm gain moved into the linear that reads it.
Tensor scale_cols(const Tensor& w, const Tensor& gain) {
  const Tensor g = gain.to_f32();
  Tensor t = w;
  scale_columns(t, std::vector<double>(g.data<float>(), g.data<float>() + g.numel()));
  return t;
}

class RotatedSource final : public ModelSource {
 public:
  RotatedSource(const ModelSource& src, uint64_t seed, std::vector<std::string>& notes)
      : src_(src), config_(src.config()), q_(config_.hidden_size, seed), qh_(config_.head_dim, seed + 1) {
    if (hadamard_supported(config_.intermediate_size)) {
      qd_.emplace(config_.intermediate_size, seed + 2);
    } else {
      notes.push_back(fmt::format(
          "rotate: down_proj's input is not rotated: no Hadamard matrix of order {} (the MLP width) is known",
          config_.intermediate_size));
    }
    untied_ = config_.tie_word_embeddings;
    config_.tie_word_embeddings = false;  // the head carries the final norm's gain, the embedding does not
  }

  std::string describe() const override { return fmt::format("{} (Hadamard-rotated, seed {})", src_.describe(), q_.seed()); }
  std::vector<std::string> names() const override {
    std::vector<std::string> n = src_.names();
    if (untied_) n.push_back("lm_head.weight");
    return n;
  }
  bool contains(const std::string& name) const override {
    return src_.contains(name) || (untied_ && name == "lm_head.weight");
  }
  TensorMeta meta(const std::string& name) const override {
    TensorMeta m = src_.meta(untied_ && name == "lm_head.weight" ? "model.embed_tokens.weight" : name);
    m.name = name;
    m.format.reset();
    return m;
  }
  const ModelConfig& config() const override { return config_; }
  std::filesystem::path tokenizer_json() const override { return src_.tokenizer_json(); }
  std::optional<Tokenizer> tokenizer() const override { return src_.tokenizer(); }
  std::optional<OnlineRotation> down_proj_rotation() const override {
    if (!qd_) return std::nullopt;
    return OnlineRotation{qd_->size(), qd_->seed()};
  }

  Tensor load(const std::string& name) const override {
    const std::string layers = "model.layers.";
    if (name == "model.embed_tokens.weight") return rotate_rows(src_.load(name), q_);
    if (name == "lm_head.weight") {
      const Tensor w = src_.load(untied_ ? "model.embed_tokens.weight" : name);
      return rotate_rows(scale_cols(w, src_.load("model.norm.weight")), q_);
    }
    if (name == "model.norm.weight") return ones(name);
    if (name.rfind(layers, 0) != 0) return src_.load(name);
    const size_t dot = name.find('.', layers.size());
    const std::string prefix = name.substr(0, dot + 1), rest = name.substr(dot + 1);
    auto gain = [&](const char* norm) { return src_.load(prefix + norm); };
    if (rest == "input_layernorm.weight" || rest == "post_attention_layernorm.weight") return ones(name);
    if (rest == "self_attn.q_proj.weight" || rest == "self_attn.k_proj.weight")
      return rotate_rows(scale_cols(src_.load(name), gain("input_layernorm.weight")), q_);
    if (rest == "self_attn.v_proj.weight") {
      const Tensor w = rotate_rows(scale_cols(src_.load(name), gain("input_layernorm.weight")), q_);
      return rotate_columns(w, qh_);  // per head: Q_hᵀ·B (the transpose's rows hold one segment per head)
    }
    if (rest == "self_attn.v_proj.bias") return rotate_rows(src_.load(name), qh_);
    if (rest == "self_attn.o_proj.weight") return rotate_columns(rotate_rows(src_.load(name), qh_), q_);
    if (rest == "self_attn.o_proj.bias" || rest == "mlp.down_proj.bias") return rotate_rows(src_.load(name), q_);
    if (rest == "mlp.gate_proj.weight" || rest == "mlp.up_proj.weight")
      return rotate_rows(scale_cols(src_.load(name), gain("post_attention_layernorm.weight")), q_);
    if (rest == "mlp.down_proj.weight") {
      const Tensor w = qd_ ? rotate_rows(src_.load(name), *qd_) : src_.load(name).to_f32();
      return rotate_columns(w, q_);
    }
    return src_.load(name);  // q/k biases, q/k norms: the rotation does not reach them
  }

 private:
  Tensor ones(const std::string& name) const {
    Tensor t = Tensor::zeros(DType::F32, src_.meta(name).shape);
    std::fill_n(t.data_mut<float>(), t.numel(), 1.0f);
    return t;
  }

  const ModelSource& src_;
  ModelConfig config_;
  HadamardRotation q_, qh_;
  std::optional<HadamardRotation> qd_;
  bool untied_ = false;
};

std::unique_ptr<ModelSource> wrap_rotated(const ModelSource& src, const TransformConfig& c,
                                          std::vector<std::string>& notes) {
  return std::make_unique<RotatedSource>(src, c.seed, notes);
}

}  // namespace

std::unique_ptr<ModelSource> rotate_model(const ModelSource& src, uint64_t seed, std::vector<std::string>& notes) {
  return wrap_rotated(src, TransformConfig{{}, 0.5, seed}, notes);
}

extern const TransformSpec kRotate;
const TransformSpec kRotate{"rotate",
                            "randomized Hadamard rotation of the residual stream, the value heads and down_proj's "
                            "input (QuaRot); exact in f32",
                            false, nullptr, wrap_rotated};

}  // namespace nibble::quant
