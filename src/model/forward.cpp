// The Llama-family forward, top to bottom (cf. llama2.c forward()), batched
// over the n new tokens of one sequence.
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <numbers>

#include "backend/cpu/kernels.h"
#include "nibble/arch.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/hadamard.h"
#include "nibble/model.h"

namespace nibble {

LinearWeight LinearWeight::dense(Tensor w) {
  NIBBLE_CHECK(w.dtype() == DType::F32 && w.dim() == 2, "dense linear wants F32 [out, in], got {} {}",
               dtype_name(w.dtype()), shape_str(w.shape()));
  LinearWeight l;
  l.out_ = w.size(0);
  l.in_ = w.size(1);
  l.dense_ = w.contiguous();
  return l;
}

LinearWeight LinearWeight::packed(FormatChoice f, std::vector<Tensor> parts, int64_t out, int64_t in) {
  const cpu::PackedKernel* k = cpu::find_packed_kernel(*f.spec);
  NIBBLE_CHECK(k != nullptr, "the CPU forward has no kernel for format {} (load_linear dequantizes such matrices)",
               f.canonical_name());
  LinearWeight l;
  l.format_ = f;
  l.out_ = out;
  l.in_ = in;
  check_parts(f, parts, out, in);  // the kernels read them by the format's dtypes and shapes
  if (k->prepare) parts = k->prepare(parts, out, in, f.group_size);
  for (Tensor& p : parts) l.parts_.push_back(p.contiguous());
  return l;
}

void LinearWeight::forward(const float* x, int64_t M, float* y) const {
  if (is_packed()) {
    cpu::find_packed_kernel(*format_.spec)->gemm(x, M, parts_, out_, in_, format_.group_size, y);
  } else {
    cpu::gemm_f32(x, M, dense_.data<float>(), out_, in_, y);
  }
  if (bias.defined() && bias.numel() > 0) {
    const float* b = bias.data<float>();
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < out_; ++j) y[i * out_ + j] += b[j];
  }
}

KVCache::KVCache(const ModelConfig& c, int64_t max_tokens, const KvQuantSpec* kv)
    : k_(c.num_layers), v_(c.num_layers), kv_(kv), row_(c.num_kv_heads * c.head_dim), max_(max_tokens) {
  for (auto& t : k_) t.assign(static_cast<size_t>(max_ * row_), 0.0f);
  for (auto& t : v_) t.assign(static_cast<size_t>(max_ * row_), 0.0f);
  if (kv_) q_.assign(static_cast<size_t>(c.num_layers), KvCacheRows(*kv_));
}

void KVCache::clear() {
  len_ = 0;
  for (auto& q : q_) q.clear();
}

// x[n, dim] <- x / sqrt(mean(x^2) + eps) * w, in fp32 as HF does.
void rms_norm(const float* x, int64_t n, int64_t dim, const float* w, float eps, float* out) {
#pragma omp parallel for schedule(static) if (n * dim > (1 << 17))
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    float ss = 0.0f;
    for (int64_t j = 0; j < dim; ++j) ss += xi[j] * xi[j];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
    for (int64_t j = 0; j < dim; ++j) out[i * dim + j] = w[j] * (xi[j] * inv);
  }
}

namespace {

void round_bf16(float* x, int64_t n) {
#pragma omp parallel for schedule(static) if (n > (1 << 18))
  for (int64_t i = 0; i < n; ++i) x[i] = round_to_bf16(x[i]);
}

// A linear's input x[n, dim] as the simulated engine hands it over: fake
// quantized (W8A8; not an input the source runs exact) and/or rounded to bf16.
void linear_input(const DecoderLayer& L, LinearInput which, float* x, int64_t n, int64_t dim) {
  if (L.act_quant && !L.exact_inputs[static_cast<size_t>(which)]) {
    NIBBLE_CHECK(L.unsimulated.empty(), "{}", L.unsimulated);
    L.act_quant->apply(x, n, dim);
  }
  if (L.bf16_activations) round_bf16(x, n * dim);
}

// HF rotate_half RoPE on one head vector: pairs (i, i + d/2).
void rope(float* h, int64_t d, const float* cos, const float* sin) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = h[i], b = h[i + half];
    h[i] = a * cos[i] - b * sin[i];
    h[i + half] = b * cos[i] + a * sin[i];
  }
}

}  // namespace

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    // As transformers computes it: 1 / base^(2i/d) in fp32.
    f[i] = static_cast<float>(1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim)));
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    for (auto& v : f) v = static_cast<float>(v / s.factor);
  } else if (s.type == "llama3") {
    const double old = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old / s.low_freq_factor, high_wavelen = old / s.high_freq_factor;
    for (auto& v : f) {
      const double wavelen = 2 * std::numbers::pi / v;
      if (wavelen < high_wavelen) continue;  // high frequencies: unchanged
      if (wavelen > low_wavelen) {
        v = static_cast<float>(v / s.factor);
      } else {  // smooth interpolation between the two
        const double smooth = (old / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        v = static_cast<float>((1 - smooth) * v / s.factor + smooth * v);
      }
    }
  }
  return f;
}

const std::vector<LinearSlot>& decoder_linears() {
  static const std::vector<LinearSlot> slots = {
      {"self_attn.q_proj", &DecoderLayer::q, LinearInput::QKV},
      {"self_attn.k_proj", &DecoderLayer::k, LinearInput::QKV},
      {"self_attn.v_proj", &DecoderLayer::v, LinearInput::QKV},
      {"self_attn.o_proj", &DecoderLayer::o, LinearInput::O},
      {"mlp.gate_proj", &DecoderLayer::gate, LinearInput::GateUp},
      {"mlp.up_proj", &DecoderLayer::up, LinearInput::GateUp},
      {"mlp.down_proj", &DecoderLayer::down, LinearInput::Down},
  };
  return slots;
}

LinearWeight load_linear(const ModelSource& src, const std::string& prefix, bool dense) {
  const std::string wname = prefix + ".weight";
  const TensorMeta meta = src.meta(wname);
  // Formats with a CPU kernel stay packed, a rival's linear too where it is one of them exactly
  // (ModelSource::exact_format: GGUF's legacy, K and IQ4 blocks; GPTQ, AWQ); any other format is dequantized once
  // here and runs through the dense GEMM.
  const std::optional<FormatChoice> f = dense ? std::nullopt : src.exact_format(wname);
  LinearWeight l = f && cpu::find_packed_kernel(*f->spec)
                       ? LinearWeight::packed(*f, src.exact_parts(wname), meta.shape[0], meta.shape[1])
                       : LinearWeight::dense(src.load(wname).to_f32());
  if (src.contains(prefix + ".bias")) l.bias = src.load(prefix + ".bias").to_f32();
  return l;
}

std::vector<DenseFallback> dense_fallbacks(const ModelSource& src,
                                           const std::function<bool(const std::string&)>& runs_packed) {
  std::map<std::string, DenseFallback> by_format;
  for (const std::string& n : src.names()) {
    if (n == "model.embed_tokens.weight") continue;  // a table of rows, not a linear
    const TensorMeta meta = src.meta(n);
    if (meta.shape.size() != 2 || runs_packed(n)) continue;
    std::string format = src.foreign_format(n);
    if (format.empty() && meta.format) format = meta.format->canonical_name();
    if (format.empty()) continue;  // plain weights
    DenseFallback& d = by_format[format];
    d.format = format;
    ++d.matrices;
    d.params += meta.shape[0] * meta.shape[1];
  }
  std::vector<DenseFallback> out;
  for (auto& [name, d] : by_format) out.push_back(d);
  return out;
}

std::vector<DenseFallback> cpu_dense_fallbacks(const ModelSource& src) {
  return dense_fallbacks(src, [&](const std::string& n) {
    const std::optional<FormatChoice> f = src.exact_format(n);
    return f && cpu::find_packed_kernel(*f->spec) != nullptr;
  });
}

DecoderLayer DecoderLayer::load(const ModelSource& src, int64_t i, bool dense) {
  const ModelConfig& c = src.config();
  auto f32 = [&](const std::string& name) { return src.load(name).to_f32(); };
  auto linear = [&](const std::string& prefix) { return load_linear(src, prefix, dense); };
  const std::string p = fmt::format("model.layers.{}.", i);
  DecoderLayer L;
  L.window = c.window(i);
  L.input_norm = f32(p + "input_layernorm.weight");
  L.post_norm = f32(p + "post_attention_layernorm.weight");
  if (find_arch(c.model_type).qk_norm) {
    L.q_norm = f32(p + "self_attn.q_norm.weight");
    L.k_norm = f32(p + "self_attn.k_norm.weight");
  }
  L.q = linear(p + "self_attn.q_proj");
  L.k = linear(p + "self_attn.k_proj");
  L.v = linear(p + "self_attn.v_proj");
  L.o = linear(p + "self_attn.o_proj");
  L.gate = linear(p + "mlp.gate_proj");
  L.up = linear(p + "mlp.up_proj");
  L.down = linear(p + "mlp.down_proj");
  if (const auto r = src.down_proj_rotation()) {
    NIBBLE_CHECK(r->size == L.down.in_features(), "{}: the online rotation has size {} but down_proj reads {} inputs",
                 src.describe(), r->size, L.down.in_features());
    L.down_rotation = std::make_shared<const quant::HadamardRotation>(r->size, r->seed);
  }
  std::string conflict;
  L.exact_inputs = exact_linear_inputs(src, i, &conflict);
  L.act_quant = declared_act_quant(src);
  if (L.act_quant) L.unsimulated = conflict;
  return L;
}

const ActQuantSpec* declared_act_quant(const ModelSource& src) {
  const std::string a = src.activation_quant();
  return a.empty() ? nullptr : find_act_quant(a);
}

std::array<bool, 4> exact_linear_inputs(const ModelSource& src, int64_t layer, std::string* conflict) {
  const std::string p = fmt::format("model.layers.{}.", layer);
  std::array<int, 4> quantized{}, exact{};
  std::array<std::string, 4> a_quantized, a_exact;  // one linear of each kind per input, for the error
  for (const LinearSlot& s : decoder_linears()) {
    const size_t i = static_cast<size_t>(s.input);
    if (src.activations_quantized(p + s.name)) {
      ++quantized[i];
      a_quantized[i] = s.name;
    } else {
      ++exact[i];
      a_exact[i] = s.name;
    }
  }
  std::array<bool, 4> r{};
  for (size_t i = 0; i < 4; ++i) {
    if (conflict && conflict->empty() && quantized[i] > 0 && exact[i] > 0)
      *conflict = fmt::format(
          "{}: layer {}: {} runs with exact activations (kept in 16 bits) but {} with quantized ones; they read one "
          "input, which nibble simulates one way for all its linears (--act-quant NAME or none runs it one way)",
          src.describe(), layer, a_exact[i], a_quantized[i]);
    r[i] = quantized[i] == 0;
  }
  return r;
}

void Model::set_act_quant(const ActQuantSpec* a) {
  for (DecoderLayer& L : layers_) {
    L.act_quant = a;
    L.unsimulated.clear();  // the user's quantizer: a mixed input counts as quantized
  }
}

std::unique_ptr<Model> Model::load(const ModelSource& src) {
  src.validate_against_config();
  auto m = std::unique_ptr<Model>(new Model());
  m->config_ = src.config();
  const ModelConfig& c = m->config_;
  auto f32 = [&](const std::string& name) { return src.load(name).to_f32(); };
  m->embed_ = f32("model.embed_tokens.weight");
  m->final_norm_ = f32("model.norm.weight");
  m->head_ = c.tie_word_embeddings ? LinearWeight::dense(m->embed_) : load_linear(src, "lm_head");
  for (int64_t i = 0; i < c.num_layers; ++i) m->layers_.push_back(DecoderLayer::load(src, i));
  m->inv_freq_ = rope_inv_freq(c);
  return m;
}

void decoder_layer_forward(const ModelConfig& c, const DecoderLayer& L, const std::vector<float>& inv_freq, float* x,
                           int64_t n, int64_t p0, float* keys, float* values, const InputTap* tap,
                           KvCacheRows* kv_rows) {
  decoder_layer_forward(c, L, inv_freq, x, {LayerSegment{n, p0, keys, values, kv_rows}}, tap);
}

void decoder_layer_forward(const ModelConfig& c, const DecoderLayer& L, const std::vector<float>& inv_freq, float* x,
                           const std::vector<LayerSegment>& segments, const InputTap* tap) {
  const int64_t D = c.hidden_size, hd = c.head_dim, H = c.num_heads, KV = c.num_kv_heads, F = c.intermediate_size;
  const float eps = static_cast<float>(c.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t window = L.window, row = KV * hd;
  const KvLayout layout{KV, hd};
  // Row r of x belongs to segment seg[r], at position pos[r] of its sequence; segment s starts at row first[s].
  // work: attention's query-key pairs; longest: the longest sequence's positions.
  int64_t n = 0, work = 0, longest = 0;
  std::vector<int64_t> first;
  for (const LayerSegment& sg : segments) {
    NIBBLE_CHECK(sg.n > 0, "decoder layer: an empty segment");
    NIBBLE_CHECK(!sg.kv_rows || sg.kv_rows->quantized() == sg.kv_rows->spec().boundary(sg.p0),
                 "kv {}: the quantized rows ({}) do not belong to a cache of {} positions (cleared one, not the other?)",
                 sg.kv_rows ? sg.kv_rows->spec().name : "", sg.kv_rows ? sg.kv_rows->quantized() : 0, sg.p0);
    first.push_back(n);
    n += sg.n;
    work += sg.n * (sg.p0 + sg.n);
    longest = std::max(longest, sg.p0 + sg.n);
  }
  std::vector<int32_t> seg(static_cast<size_t>(n));
  std::vector<int64_t> pos(static_cast<size_t>(n));
  for (size_t s = 0; s < segments.size(); ++s)
    for (int64_t i = 0; i < segments[s].n; ++i) {
      seg[static_cast<size_t>(first[s] + i)] = static_cast<int32_t>(s);
      pos[static_cast<size_t>(first[s] + i)] = segments[s].p0 + i;
    }
  // The layer's temporaries, kept by each thread between calls (a batch of sequences takes up to about 256 MiB of
  // them, and fresh pages would cost their first-touch faults at every layer); every one is written before it is read.
  thread_local struct {
    std::vector<float> xn, q, k, v, att, tmp, g, u, cosv, sinv;
  } ws;
  auto grown = [](std::vector<float>& b, int64_t size) -> std::vector<float>& {
    if (static_cast<int64_t>(b.size()) < size) b.resize(static_cast<size_t>(size));
    return b;
  };
  std::vector<float>& xn = grown(ws.xn, n * D);
  std::vector<float>& q = grown(ws.q, n * H * hd);
  std::vector<float>& k = grown(ws.k, n * KV * hd);
  std::vector<float>& v = grown(ws.v, n * KV * hd);
  std::vector<float>& att = grown(ws.att, n * H * hd);
  std::vector<float>& tmp = grown(ws.tmp, n * D);
  std::vector<float>& g = grown(ws.g, n * F);
  std::vector<float>& u = grown(ws.u, n * F);
  // cos/sin per row's position: [n, hd/2]
  const int64_t half = hd / 2;
  std::vector<float>& cosv = grown(ws.cosv, n * half);
  std::vector<float>& sinv = grown(ws.sinv, n * half);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < half; ++j) {
      const float angle = static_cast<float>(pos[static_cast<size_t>(r)]) * inv_freq[j];  // fp32 product, as HF
      cosv[r * half + j] = std::cos(angle);
      sinv[r * half + j] = std::sin(angle);
    }
  // A linear's input as the engine hands it over, and the tap, one segment at a time (a per-tensor activation
  // quantizer's scale is one forward call's; a tap sees each sequence's rows apart, in order).
  auto input = [&](LinearInput which, float* in, int64_t dim) {
    for (size_t s = 0; s < segments.size(); ++s) {
      float* xs = in + first[s] * dim;
      linear_input(L, which, xs, segments[s].n, dim);
      if (tap) (*tap)(which, xs, segments[s].n, dim);
    }
  };

  rms_norm(x, n, D, L.input_norm.data<float>(), eps, xn.data());
  input(LinearInput::QKV, xn.data(), D);
  L.q.forward(xn.data(), n, q.data());  // [n, H*hd]
  L.k.forward(xn.data(), n, k.data());  // [n, KV*hd]
  L.v.forward(xn.data(), n, v.data());  // [n, KV*hd]
  if (L.q_norm.defined() && L.q_norm.numel() > 0) {  // qwen3: per-head RMSNorm before RoPE
    rms_norm(q.data(), n * H, hd, L.q_norm.data<float>(), eps, q.data());
    rms_norm(k.data(), n * KV, hd, L.k_norm.data<float>(), eps, k.data());
  }
  for (int64_t r = 0; r < n; ++r) {
    const LayerSegment& sg = segments[static_cast<size_t>(seg[static_cast<size_t>(r)])];
    const int64_t p = pos[static_cast<size_t>(r)];
    for (int64_t h = 0; h < H; ++h) rope(q.data() + (r * H + h) * hd, hd, &cosv[r * half], &sinv[r * half]);
    for (int64_t h = 0; h < KV; ++h) rope(k.data() + (r * KV + h) * hd, hd, &cosv[r * half], &sinv[r * half]);
    std::copy_n(k.data() + r * row, row, sg.keys + p * row);
    std::copy_n(v.data() + r * row, row, sg.values + p * row);
  }
  // A quantized cache: the rows it now stores quantized, up to boundary(p0 + n).
  for (const LayerSegment& sg : segments)
    if (sg.kv_rows) sg.kv_rows->update(sg.keys, sg.values, sg.p0 + sg.n, layout);
  // Causal attention of each new position over its sequence's cache (GQA: H/KV query heads per kv head).
  // Threads only pay off on real work: a parallel region costs microseconds
  // (and far more on a loaded machine), a decode step of a tiny model less.
  const bool parallel_attention = work * H * hd > (1 << 16);
#pragma omp parallel if (parallel_attention)
  {
    std::vector<float> scores(static_cast<size_t>(longest));
    // Dynamic: a causal row's work grows with its position.
#pragma omp for collapse(2) schedule(dynamic, 16)
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t h = 0; h < H; ++h) {
        const LayerSegment& sg = segments[static_cast<size_t>(seg[static_cast<size_t>(r)])];
        // Keys t0 .. T-1: all earlier positions, or (sliding window W) those with pos - t < W.
        const int64_t kvh = h / (H / KV), T = pos[static_cast<size_t>(r)] + 1;
        const int64_t t0 = window > 0 ? std::max<int64_t>(0, T - window) : 0;
        // Rows below tq come quantized: the boundary of a cache holding T positions.
        const int64_t tq = sg.kv_rows ? sg.kv_rows->spec().boundary(T) : 0;
        // Two runs of rows: [t0, tq) quantized, then the exact ones up to T.
        const int64_t split = std::clamp(tq, t0, T);
        cpu::AttentionRun runs[2];
        int nruns = 0;
        if (split > t0)
          runs[nruns++] = {sg.kv_rows->keys(t0, layout) + kvh * hd, sg.kv_rows->values(t0, layout) + kvh * hd,
                           split - t0};
        if (T > split) runs[nruns++] = {sg.keys + split * row + kvh * hd, sg.values + split * row + kvh * hd, T - split};
        cpu::attention_row(q.data() + (r * H + h) * hd, hd, scale, runs, nruns, row, scores.data(),
                           att.data() + (r * H + h) * hd);
      }
    }
  }
  input(LinearInput::O, att.data(), H * hd);
  L.o.forward(att.data(), n, tmp.data());  // [n, D]
  for (int64_t j = 0; j < n * D; ++j) x[j] += tmp[j];
  rms_norm(x, n, D, L.post_norm.data<float>(), eps, xn.data());
  input(LinearInput::GateUp, xn.data(), D);
  L.gate.forward(xn.data(), n, g.data());  // [n, F]
  L.up.forward(xn.data(), n, u.data());    // [n, F]
  // SiLU(gate) * up: an exp per element, on every thread (the same bits on any number).
#pragma omp parallel for schedule(static) if (n * F > (1 << 16))
  for (int64_t j = 0; j < n * F; ++j) g[j] = g[j] / (1.0f + std::exp(-g[j])) * u[j];
  if (L.down_rotation) L.down_rotation->apply(g.data(), n);  // rotate+...: down_proj's weights read rotated inputs
  input(LinearInput::Down, g.data(), F);
  L.down.forward(g.data(), n, tmp.data());  // [n, D]
  for (int64_t j = 0; j < n * D; ++j) x[j] += tmp[j];
}

Tensor Model::forward(const std::vector<int32_t>& tokens, KVCache& cache, bool all_logits) const {
  const ModelConfig& c = config_;
  const int64_t n = static_cast<int64_t>(tokens.size()), D = c.hidden_size, V = c.vocab_size, p0 = cache.size();
  NIBBLE_CHECK(n > 0, "forward: no tokens");
  NIBBLE_CHECK(p0 + n <= cache.capacity(), "forward: {} + {} tokens exceed the cache of {} positions", p0, n,
               cache.capacity());
  std::vector<float> x(n * D);
  for (int64_t i = 0; i < n; ++i) {
    NIBBLE_CHECK(tokens[i] >= 0 && tokens[i] < V, "forward: token id {} is outside the vocabulary (size {})",
                 tokens[i], V);
    std::copy_n(embed_.data<float>() + tokens[i] * D, D, x.data() + i * D);  // [n, D]
  }
  for (int64_t l = 0; l < c.num_layers; ++l)
    decoder_layer_forward(c, layers_[l], inv_freq_, x.data(), n, p0, cache.keys(l, 0), cache.values(l, 0), nullptr,
                          cache.quantized_rows(l));
  cache.advance(n);

  const int64_t rows = all_logits ? n : 1;
  std::vector<float> xn(rows * D);
  rms_norm(x.data() + (n - rows) * D, rows, D, final_norm_.data<float>(), static_cast<float>(c.rms_norm_eps),
           xn.data());
  Tensor logits = Tensor::zeros(DType::F32, {rows, V});
  head_.forward(xn.data(), rows, logits.data_mut<float>());
  return logits;
}

}  // namespace nibble
