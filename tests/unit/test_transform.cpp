// Model transforms (AWQ, SmoothQuant, Hadamard rotation): the literature's
// worked examples, and the property that makes them transforms — the
// transformed layer or model computes what the original did.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/hadamard.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/source.h"
#include "nibble/synth.h"
#include "nibble/transform.h"
#include "test_util.h"

namespace nibble::quant {
namespace {

namespace fs = std::filesystem;

// The grid of the AWQ example, written out independently: symmetric INT4 with
// step max|w|/7 over the whole group, codes −8..7, no rounding of the step.
class SymInt4Grid final : public Grid {
 public:
  int group_size() const override { return 0; }
  int64_t group_len(int64_t cols) const override { return cols; }
  GroupParams fit(const float* w, int64_t n, const GroupParams&) const override {
    float m = 0;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(w[i]));
    GroupParams p;
    p.scale = m / 7.0f;
    return p;
  }
  float quantize(float w, const GroupParams& p, uint8_t* code) const override {
    if (code) *code = 0;
    return p.scale * std::clamp(std::nearbyint(w / p.scale), -8.0f, 7.0f);
  }
};

Tensor matrix(int64_t rows, int64_t cols, std::vector<float> v) {
  Tensor t = Tensor::zeros(DType::F32, {rows, cols});
  std::copy(v.begin(), v.end(), t.data_mut<float>());
  return t;
}

TEST(Awq, WorkedExampleOfTheOutputErrorProxy) {
  // A group of four weights meeting input magnitudes [1, 8, 1, 1]: the proxy
  // Σ (w − ŵ)² a² is 0.2105 unscaled and 0.0047 with channel 2 scaled by 2
  // (issue 7, from the AWQ paper's argument). With H = diag(a²) the
  // implementation's tr(Δ H Δᵀ) is exactly that sum.
  const Tensor w = matrix(1, 4, {0.90f, 0.20f, -0.35f, 0.50f});
  MatrixStats st(4);
  const double a[4] = {1, 8, 1, 1};
  for (int j = 0; j < 4; ++j) {
    st.H[j * 4 + j] = a[j] * a[j];
    st.abs_sum[j] = a[j];
  }
  st.tokens = 1;
  const SymInt4Grid grid;
  // The figures have four decimals.
  EXPECT_NEAR(awq_scaled_error({&w}, st, {1, 1, 1, 1}, grid), 0.2105, 1e-4);
  EXPECT_NEAR(awq_scaled_error({&w}, st, {1, 2, 1, 1}, grid), 0.0047, 1e-4);
  // The search over α starts at α = 0 (no scaling) and finds better.
  const AwqSearch r = awq_search({&w}, st, grid);
  EXPECT_NEAR(r.error_unscaled, 0.2105, 1e-4);
  EXPECT_GT(r.alpha, 0.0);
  EXPECT_LT(r.error, 0.5 * r.error_unscaled);
  // s = a^α / sqrt(max · min): channel 2 gets the largest scale.
  EXPECT_NEAR(r.scales[1], std::pow(8.0, r.alpha / 2), 1e-12);
  EXPECT_NEAR(r.scales[0], std::pow(8.0, -r.alpha / 2), 1e-12);
}

// AWQ's objective decides between scale candidates by small differences, so
// it must be the same number on any number of threads (its product and its
// sum used to follow OpenBLAS's and OpenMP's splits of the work).
TEST(Awq, ObjectiveDoesNotDependOnTheThreadCount) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  const int64_t rows = 300, dim = 512, tokens = 96;
  std::vector<float> wv(static_cast<size_t>(rows * dim)), x(static_cast<size_t>(tokens * dim));
  for (float& v : wv) v = nd(rng);
  for (float& v : x) v = nd(rng);
  const Tensor w = matrix(rows, dim, wv);
  MatrixStats st(dim);
  st.add(x.data(), tokens);
  st.finalize();
  std::vector<double> s(static_cast<size_t>(dim));
  for (int64_t j = 0; j < dim; ++j) s[j] = 0.5 + static_cast<double>(j % 7) / 7;
  const SymInt4Grid grid;
  auto error = [&] { return awq_scaled_error({&w}, st, s, grid); };
  const double one = test::with_threads(1, error);
  for (int threads : {2, 3, 4}) EXPECT_EQ(test::with_threads(threads, error), one) << threads << " threads";
  EXPECT_GT(one, 0.0);
}

TEST(SmoothQuant, WorkedExample) {
  // Activations X [3 tokens, 3 channels] and weights given as [in, out]
  // (issue 7): α = 0.5 gives s = [1.22, 15.5, 1.22] and both sides' channel
  // maxima [0.98, 3.10, 0.73].
  const float X[3][3] = {{0.8f, -40, 0.3f}, {-1.2f, 48, 0.5f}, {0.6f, -36, -0.9f}};
  const float Win[3][2] = {{0.8f, -0.3f}, {0.2f, 0.1f}, {-0.5f, 0.6f}};
  Tensor w = Tensor::zeros(DType::F32, {2, 3});  // [out, in]
  for (int i = 0; i < 3; ++i)
    for (int o = 0; o < 2; ++o) w.data_mut<float>()[o * 3 + i] = Win[i][o];
  MatrixStats st(3);
  for (const auto& row : X) st.add(row, 1);
  const std::vector<double> s = smoothquant_scales(st.abs_max, {&w}, 0.5);
  ASSERT_EQ(s.size(), 3u);
  EXPECT_NEAR(s[0], 1.22, 0.005);
  EXPECT_NEAR(s[1], 15.5, 0.05);
  EXPECT_NEAR(s[2], 1.22, 0.005);
  const double expect[3] = {0.98, 3.10, 0.73};
  for (int j = 0; j < 3; ++j) {
    double xmax = 0, wmax = 0;
    for (const auto& row : X) xmax = std::max(xmax, std::abs(row[j] / s[j]));
    for (int o = 0; o < 2; ++o) wmax = std::max(wmax, std::abs(Win[j][o] * s[j]));
    EXPECT_NEAR(xmax, expect[j], 0.006) << j;  // the figures: 2–3 significant digits
    EXPECT_NEAR(wmax, expect[j], 0.006) << j;
  }
  // α = 1 moves everything into the weights: the activations' maxima become 1.
  const std::vector<double> s1 = smoothquant_scales(st.abs_max, {&w}, 1.0);
  EXPECT_NEAR(s1[1], 48.0, 1e-5);
  EXPECT_THROW(smoothquant_scales(st.abs_max, {&w}, 1.5), Error);
}

TEST(Methods, ParseTransformPlusQuantizer) {
  EXPECT_EQ(parse_method("gptq").name, "gptq");
  EXPECT_EQ(parse_method("gptq").transform, nullptr);
  EXPECT_EQ(parse_method("awq").name, "awq+rtn");
  EXPECT_EQ(parse_method("awq+gptq").name, "awq+gptq");
  EXPECT_EQ(parse_method("rotate+gptq").quantizer->name, "gptq");
  EXPECT_EQ(parse_method("smoothquant").transform->name, "smoothquant");
  EXPECT_TRUE(parse_method("awq").needs_calibration());
  EXPECT_FALSE(parse_method("rotate").needs_calibration());
  EXPECT_TRUE(parse_method("rotate+gptq").needs_calibration());
  for (const char* bad : {"awq+", "rtn+gptq", "hqq", "awq+awq", ""}) {
    const std::string e = test::error_of([&] { parse_method(bad); });
    EXPECT_NE(e.find("unknown quantization method"), std::string::npos) << bad;
    EXPECT_NE(e.find("awq+gptq"), std::string::npos) << e;  // lists what is accepted
  }
}

// ---- the transformed computation equals the original

// A tiny Llama of the given head layout with random norm gains and biases
// absent; returns its directory.
fs::path tiny_model(const test::TempDir& tmp, int64_t heads, int64_t kv_heads) {
  SynthOptions o;
  o.hidden = 64;
  o.intermediate = 96;  // 12 · 8: a Hadamard order, so the online rotation is exercised
  o.layers = 2;
  o.heads = heads;
  o.kv_heads = kv_heads;
  o.vocab = 128;
  o.context = 64;
  o.progress = false;
  o.init_std = 0.08f;
  const fs::path dir = tmp / fmt::format("tiny-{}-{}", heads, kv_heads);
  synthesize_model(dir, o);
  return dir;
}

std::vector<float> layer_output(const ModelConfig& c, const DecoderLayer& L, std::vector<float> x, int64_t n) {
  std::vector<float> keys(n * c.num_kv_heads * c.head_dim), values(keys.size());
  decoder_layer_forward(c, L, rope_inv_freq(c), x.data(), n, 0, keys.data(), values.data());
  return x;
}

bool differs(const Tensor& a, const Tensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i)
    if (a.data<float>()[i] != b.data<float>()[i]) return true;
  return false;
}

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    m = std::max(m, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(a[i])));
  }
  return m / scale;
}

// Layer 0 with random norm gains (synth writes ones), its inputs and the
// statistics of its linears' inputs.
struct LayerCase {
  ModelConfig c;
  DecoderLayer L;
  std::vector<float> x;
  int64_t n = 48;
  std::map<LinearInput, MatrixStats> stats;
};

LayerCase layer_case(const fs::path& dir) {
  LayerCase k;
  auto src = CheckpointDir::open(dir);
  k.c = src->config();
  k.L = DecoderLayer::load(*src, 0, /*dense=*/true);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(0.3f, 2.0f);
  for (Tensor* g : {&k.L.input_norm, &k.L.post_norm}) {
    Tensor t = g->to_f32();
    for (int64_t j = 0; j < t.numel(); ++j) t.data_mut<float>()[j] = u(rng);
    *g = t;
  }
  std::normal_distribution<float> nd(0.0f, 1.0f);
  k.x.resize(k.n * k.c.hidden_size);
  for (int64_t i = 0; i < k.n; ++i)
    for (int64_t j = 0; j < k.c.hidden_size; ++j)
      k.x[i * k.c.hidden_size + j] = nd(rng) * (j % 13 == 0 ? 8.0f : 1.0f);  // a few outlier channels
  for (const LinearSlot& s : decoder_linears())
    if (!k.stats.count(s.input)) k.stats.emplace(s.input, MatrixStats((k.L.*s.member).in_features()));
  const InputTap tap = [&](LinearInput which, const float* x, int64_t n, int64_t) { k.stats.at(which).add(x, n); };
  std::vector<float> keys(k.n * k.c.num_kv_heads * k.c.head_dim), values(keys.size()), x = k.x;
  decoder_layer_forward(k.c, k.L, rope_inv_freq(k.c), x.data(), k.n, 0, keys.data(), values.data(), &tap);
  for (auto& [_, st] : k.stats) st.finalize();
  return k;
}

TEST(Awq, FoldedScalesLeaveTheLayerUnchanged) {
  test::TempDir tmp;
  // Multi-head attention (o_proj's scales fold into v_proj) and grouped-query
  // attention (they cannot: o is left alone).
  for (auto [heads, kv] : {std::pair{4, 4}, std::pair{4, 2}}) {
    LayerCase k = layer_case(tiny_model(tmp, heads, kv));
    const std::vector<float> before = layer_output(k.c, k.L, k.x, k.n);
    TransformConfig tc{find_format("int4_asym", 32)};
    tc.awq_fixed_alpha = 0.5;  // force non-trivial scales on every group
    const auto t = parse_method("awq").transform->make_layer(tc);
    DecoderLayer L = k.L;
    const auto report = t->apply(k.c, L, k.stats, [](const char*) { return true; });
    EXPECT_EQ(report["qkv"]["alpha"], 0.5);
    if (heads == kv)
      EXPECT_EQ(report["o"]["alpha"], 0.5);
    else
      EXPECT_TRUE(report["o"].is_string());
    EXPECT_TRUE(differs(k.L.q.dense_weight(), L.q.dense_weight()));  // the weights did change
    // f32 rounding of the folded weights: relative 1e-5 of the largest output.
    EXPECT_LT(max_rel_diff(before, layer_output(k.c, L, k.x, k.n)), 1e-5) << heads << "/" << kv;
    // The statistics now describe the scaled inputs: H of the qkv input equals
    // that of the transformed layer's own taps.
    std::map<LinearInput, MatrixStats> again;
    for (const LinearSlot& s : decoder_linears())
      if (!again.count(s.input)) again.emplace(s.input, MatrixStats((L.*s.member).in_features()));
    const InputTap tap = [&](LinearInput which, const float* x, int64_t n, int64_t) { again.at(which).add(x, n); };
    std::vector<float> keys(k.n * k.c.num_kv_heads * k.c.head_dim), values(keys.size()), x = k.x;
    decoder_layer_forward(k.c, L, rope_inv_freq(k.c), x.data(), k.n, 0, keys.data(), values.data(), &tap);
    for (auto& [which, st] : again) {
      st.finalize();
      const MatrixStats& want = k.stats.at(which);
      double m = 0, d = 0;
      for (size_t i = 0; i < st.H.size(); ++i) {
        m = std::max(m, std::abs(want.H[i]));
        d = std::max(d, std::abs(want.H[i] - st.H[i]));
      }
      EXPECT_LT(d / m, 1e-4) << static_cast<int>(which);
    }
  }
}

TEST(SmoothQuant, FoldedScalesLeaveTheLayerUnchanged) {
  test::TempDir tmp;
  LayerCase k = layer_case(tiny_model(tmp, 4, 2));
  const std::vector<float> before = layer_output(k.c, k.L, k.x, k.n);
  TransformConfig tc{find_format("int8_channel_sym", 0)};
  tc.alpha = 0.5;
  const auto t = parse_method("smoothquant").transform->make_layer(tc);
  DecoderLayer L = k.L;
  t->apply(k.c, L, k.stats, [](const char*) { return true; });
  EXPECT_LT(max_rel_diff(before, layer_output(k.c, L, k.x, k.n)), 1e-5);
  // The outlier channels (every 13th) of the qkv input are smoothed: after
  // the transform their activation maximum is far closer to the others'.
  const MatrixStats& st = k.stats.at(LinearInput::QKV);
  float outlier = 0, normal = 0;
  for (int64_t j = 0; j < st.dim; ++j) {
    float& m = j % 13 == 0 ? outlier : normal;
    m = std::max(m, st.abs_max[j]);
  }
  EXPECT_LT(outlier / normal, 2.0f);
}

// Logits of `src` on a fixed token sequence.
std::vector<float> logits_of(const ModelSource& src, int64_t n) {
  const auto m = Model::load(src);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % src.config().vocab_size));
  KVCache cache(src.config(), n);
  const Tensor l = m->forward(ids, cache, true);
  return {l.data<float>(), l.data<float>() + l.numel()};
}

TEST(Rotate, RotatedModelReproducesTheLogits) {
  test::TempDir tmp;
  // The two real fixtures (stories: tied head, MLP width 172 has no Hadamard
  // construction; qwen3: q/k norms, untied, width 1536 = 12·128) and a tiny
  // multi-head model.
  const fs::path tiny = tiny_model(tmp, 4, 4);
  for (const fs::path& dir : {test::model_dir("stories260K"), test::model_dir("qwen3-26M-linux"), tiny}) {
    auto src = CheckpointDir::open(dir);
    std::vector<std::string> notes;
    const auto rot = rotate_model(*src, 42, notes);
    const bool mlp_rotated = hadamard_supported(src->config().intermediate_size);
    EXPECT_EQ(rot->down_proj_rotation().has_value(), mlp_rotated) << dir;
    EXPECT_EQ(notes.size(), mlp_rotated ? 0u : 1u);
    if (!mlp_rotated) {
      EXPECT_NE(notes[0].find("172"), std::string::npos) << notes[0];
    }
    EXPECT_FALSE(rot->config().tie_word_embeddings);
    rot->validate_against_config();
    const std::vector<float> a = logits_of(*src, 24), b = logits_of(*rot, 24);
    ASSERT_EQ(a.size(), b.size());
    double d = 0;
    for (size_t i = 0; i < a.size(); ++i) d = std::max(d, static_cast<double>(std::abs(a[i] - b[i])));
    EXPECT_LT(d, 1e-4) << dir;  // the bound for f32
    // ... while the weights themselves changed.
    EXPECT_TRUE(differs(src->load("model.embed_tokens.weight").to_f32(), rot->load("model.embed_tokens.weight")));
  }
}

}  // namespace
}  // namespace nibble::quant
