// The transform registry, --method parsing ("[transform+]quantizer") and the
// exact folds every transform is built from.
#include "nibble/transform.h"

#include "nibble/error.h"

namespace nibble::quant {

extern const TransformSpec kAwq;
extern const TransformSpec kSmoothQuant;
extern const TransformSpec kRotate;

const std::vector<const TransformSpec*>& transform_registry() {
  static const std::vector<const TransformSpec*> rows = {&kAwq, &kSmoothQuant, &kRotate};
  return rows;
}

bool MethodChoice::needs_calibration() const {
  return (transform && transform->needs_calibration) || quantizer->needs_calibration;
}

std::vector<std::string> method_names() {
  std::vector<std::string> out;
  for (const MethodSpec* q : method_registry()) out.emplace_back(q->name);
  for (const TransformSpec* t : transform_registry()) {
    out.emplace_back(t->name);  // = name+rtn
    for (const MethodSpec* q : method_registry()) out.push_back(fmt::format("{}+{}", t->name, q->name));
  }
  return out;
}

MethodChoice parse_method(std::string_view text) {
  auto unknown = [&]() {
    return Error(fmt::format("unknown quantization method '{}' (known: {})", text, fmt::join(method_names(), ", ")));
  };
  MethodChoice m;
  const size_t plus = text.find('+');
  const std::string_view first = text.substr(0, plus);
  const std::string_view rest = plus == std::string_view::npos ? std::string_view() : text.substr(plus + 1);
  for (const TransformSpec* t : transform_registry())
    if (t->name == first) m.transform = t;
  if (m.transform) {
    if (rest.empty() && plus != std::string_view::npos) throw unknown();
    const std::string_view q = rest.empty() ? "rtn" : rest;
    for (const MethodSpec* s : method_registry())
      if (s->name == q) m.quantizer = s;
  } else if (plus == std::string_view::npos) {
    for (const MethodSpec* s : method_registry())
      if (s->name == text) m.quantizer = s;
  }
  if (!m.quantizer) throw unknown();
  m.name = m.transform ? fmt::format("{}+{}", m.transform->name, m.quantizer->name) : std::string(m.quantizer->name);
  return m;
}

void scale_norm_gain(Tensor& gain, const std::vector<double>& f) {
  NIBBLE_CHECK(gain.numel() == static_cast<int64_t>(f.size()), "scale_norm_gain: {} factors for a gain of {}",
               f.size(), gain.numel());
  Tensor g = gain.to_f32();  // a copy of our own: the original may be shared
  float* p = g.data_mut<float>();
  for (size_t j = 0; j < f.size(); ++j) p[j] = static_cast<float>(p[j] * f[j]);
  gain = g;
}

void scale_columns(Tensor& w, const std::vector<double>& f) {
  NIBBLE_CHECK(w.dim() == 2 && w.size(1) == static_cast<int64_t>(f.size()),
               "scale_columns: {} factors for a matrix {}", f.size(), shape_str(w.shape()));
  Tensor c = w.to_f32();
  float* p = c.data_mut<float>();
  const int64_t rows = c.size(0), cols = c.size(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) p[r * cols + j] = static_cast<float>(p[r * cols + j] * f[j]);
  w = c;
}

void scale_rows(Tensor& w, Tensor* bias, const std::vector<double>& f) {
  NIBBLE_CHECK(w.dim() == 2 && w.size(0) == static_cast<int64_t>(f.size()), "scale_rows: {} factors for a matrix {}",
               f.size(), shape_str(w.shape()));
  Tensor c = w.to_f32();
  float* p = c.data_mut<float>();
  const int64_t rows = c.size(0), cols = c.size(1);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) p[r * cols + j] = static_cast<float>(p[r * cols + j] * f[r]);
  w = c;
  if (bias && bias->defined() && bias->numel() > 0) {
    Tensor b = bias->to_f32();
    for (int64_t r = 0; r < rows; ++r) b.data_mut<float>()[r] = static_cast<float>(b.data<float>()[r] * f[r]);
    *bias = b;
  }
}

// LinearWeight holds its dense weight by value: take it, rescale, put it back.
void scale_linear_columns(LinearWeight& lw, const std::vector<double>& f) {
  Tensor w = lw.dense_weight();
  const Tensor b = lw.bias;
  scale_columns(w, f);
  lw = LinearWeight::dense(w);
  lw.bias = b;
}

void scale_linear_rows(LinearWeight& lw, const std::vector<double>& f) {
  Tensor w = lw.dense_weight();
  Tensor b = lw.bias;
  scale_rows(w, &b, f);
  lw = LinearWeight::dense(w);
  lw.bias = b;
}

}  // namespace nibble::quant
