// GgufSource: GGUF files as HF-named ModelSources run by nibble's forward.
// stories260K's F32 GGUF (llama.cpp's llama2.c converter, q/k rows in
// interleaved RoPE order) against the HF checkpoint; synthetic llama (with
// biases, permuted as convert_hf_to_gguf.py permutes them), qwen2, qwen3 and
// Llama-3-RoPE models written both ways; the model-level errors; and the
// perplexity of every llama.cpp quantization of stories260K.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numbers>
#include <random>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gguf_builder.h"
#include "gguf_q4k.h"
#include "nibble/arch.h"
#include "nibble/eval.h"
#include "nibble/gguf.h"
#include "nibble/model.h"
#include "nibble/safetensors.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::GgufBuilder;
using test::TempDir;
using test::to_gguf_name;

fs::path stories() { return test::model_dir("stories260K"); }
fs::path gguf_dir() { return stories() / "gguf"; }

Tensor logits_of(const ModelSource& src, const std::vector<int32_t>& ids) {
  auto model = Model::load(src);
  KVCache cache(model->config(), 64);
  return model->forward(ids, cache);
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i)
    m = std::max(m, std::abs(a.data<float>()[i] - b.data<float>()[i]));
  return m;
}

// ---------------------------------------------------------------- stories260K F32

TEST(GgufSource, Stories260KF32MatchesTheHfCheckpoint) {
  const auto gguf = GgufSource::open(gguf_dir() / "stories260K-F32.gguf");
  const auto hf = CheckpointDir::open(stories());
  const ModelConfig &g = gguf->config(), &h = hf->config();
  EXPECT_EQ(g.model_type, "llama");
  EXPECT_EQ(g.hidden_size, h.hidden_size);
  EXPECT_EQ(g.intermediate_size, h.intermediate_size);
  EXPECT_EQ(g.num_layers, h.num_layers);
  EXPECT_EQ(g.num_heads, h.num_heads);
  EXPECT_EQ(g.num_kv_heads, h.num_kv_heads);
  EXPECT_EQ(g.head_dim, h.head_dim);
  EXPECT_EQ(g.vocab_size, h.vocab_size);
  EXPECT_EQ(g.max_position_embeddings, h.max_position_embeddings);  // 512 (README: patched from 128)
  EXPECT_EQ(static_cast<float>(g.rms_norm_eps), static_cast<float>(h.rms_norm_eps));  // stored as f32 1e-5
  EXPECT_EQ(g.rope_theta, h.rope_theta);  // no key: llama.cpp's default 10000
  EXPECT_EQ(g.rope_scaling.type, "default");
  EXPECT_EQ(g.bos_token_id, h.bos_token_id);
  EXPECT_EQ(g.eos_token_ids, h.eos_token_ids);
  EXPECT_EQ(g.layer_windows, std::vector<int64_t>(5, 0));
  // The converter stores the tied classifier a second time as output.weight.
  EXPECT_FALSE(g.tie_word_embeddings);

  // Every HF tensor, bit for bit, after the name map and the q/k un-permutation.
  for (const std::string& name : hf->names()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(gguf->contains(name));
    const Tensor a = gguf->load(name), b = hf->load(name).to_f32();
    ASSERT_EQ(a.dtype(), DType::F32);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(gguf->meta(name).shape, b.shape());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  }
  const Tensor head = gguf->load("lm_head.weight"), embed = hf->load("model.embed_tokens.weight").to_f32();
  EXPECT_EQ(std::memcmp(head.raw(), embed.raw(), head.nbytes()), 0);
  EXPECT_EQ(gguf->names().size(), hf->names().size() + 1);
  // The permutation is real: the stored q rows are not in HF order.
  const Tensor stored_q = gguf->file().dequantize("blk.0.attn_q.weight");
  const Tensor hf_q = hf->load("model.layers.0.self_attn.q_proj.weight").to_f32();
  EXPECT_NE(std::memcmp(stored_q.raw(), hf_q.raw(), hf_q.nbytes()), 0);
  EXPECT_EQ(gguf->gguf_name("model.layers.0.self_attn.q_proj.weight"), "blk.0.attn_q.weight");

  // Vocabulary: tokens as the HF tokenizer's, scores and types as the README says.
  const Tokenizer tok = Tokenizer::from_file(stories() / "tokenizer.json");
  const io::GgufVocab voc = gguf->vocab();
  EXPECT_EQ(voc.model, "llama");
  ASSERT_EQ(static_cast<int64_t>(voc.tokens.size()), tok.vocab_size());
  for (int32_t i = 0; i < tok.vocab_size(); ++i) EXPECT_EQ(voc.tokens[i], tok.id_to_token(i).value_or("?")) << i;
  ASSERT_EQ(voc.scores.size(), 512u);
  ASSERT_EQ(voc.token_types.size(), 512u);
  for (int i = 0; i < 512; ++i) {
    EXPECT_EQ(voc.scores[i], i < 260 ? 0.0f : static_cast<float>(259 - i)) << i;
    EXPECT_EQ(voc.token_types[i], i == 0 ? 2 : i <= 2 ? 3 : i <= 258 ? 6 : 1) << i;
  }
  EXPECT_EQ(voc.bos_id, 1);
  EXPECT_EQ(voc.eos_id, 2);
  EXPECT_EQ(voc.unknown_id, 0);
  EXPECT_EQ(voc.padding_id, std::nullopt);  // written as 0xFFFFFFFF: none

  // The forward on both: the same logits.
  std::vector<int32_t> ids = tok.encode("Once upon a time, there was a little girl named Lily. She", true);
  ASSERT_EQ((std::vector<int32_t>(ids.begin(), ids.begin() + 5)), (std::vector<int32_t>{1, 403, 407, 261, 378}));
  const Tensor lg = logits_of(*gguf, ids), lh = logits_of(*hf, ids);
  EXPECT_LE(max_abs_diff(lg, lh), 1e-5f);
}

// ---------------------------------------------------------------- synthetic models

// A small model of the given architecture, written as an HF directory and as
// a GGUF the way llama.cpp's convert_hf_to_gguf.py writes it.
struct Synth {
  std::string arch = "llama";  // llama | qwen2 | qwen3
  bool attention_bias = false;
  bool tied = false;
  bool llama3_rope = false;
};

// What a test changes in the GGUF to make it wrong.
struct Defect {
  std::string arch_name = "";    // general.architecture as written
  std::string skip_key = "";     // metadata key left out (without the "<arch>." prefix)
  std::string drop_tensor = "";  // GGUF tensor left out
  std::string rename_from = "", rename_to = "";
  int64_t rope_dims = 0;  // <arch>.rope.dimension_count, when > 0
  bool bad_rope_freqs = false;
  std::vector<std::string> vocab = {};  // tokenizer.ggml.tokens of a SentencePiece ("llama") vocabulary, when not empty
  int64_t bos_id = -1;                  // tokenizer.ggml.bos_token_id, when >= 0
  std::string unloadable = "";          // GGUF tensor stored as Q8_1 (random bytes), a type nibble cannot dequantize
};

ModelConfig synth_config(const Synth& s) {
  ModelConfig c;
  c.model_type = s.arch;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.vocab_size = 128;
  c.max_position_embeddings = 256;
  c.rms_norm_eps = std::ldexp(1.0, -16);          // exact in f32, as GGUF stores it
  c.rope_theta = s.llama3_rope ? 500000 : 10000;  // exact in f32
  c.tie_word_embeddings = s.tied;
  c.attention_bias = s.attention_bias;
  return c;
}

// convert_hf_to_gguf.py's LlamaModel.permute: the rows of each head viewed as
// [2, head_dim/2] and transposed, i.e. GGUF row h·hd + 2j + p is HF row
// h·hd + p·hd/2 + j.
Tensor llama_cpp_permute(const Tensor& t, int64_t heads) {
  const int64_t rows = t.size(0), hd = rows / heads, cols = t.numel() / rows;
  Tensor out = Tensor::empty(DType::F32, t.shape());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < hd / 2; ++j)
      for (int64_t p = 0; p < 2; ++p)
        std::memcpy(out.data_mut<float>() + (h * hd + 2 * j + p) * cols,
                    t.data<float>() + (h * hd + p * hd / 2 + j) * cols, static_cast<size_t>(cols) * 4);
  return out;
}

// llama 3's RoPE divisors as convert_hf_to_gguf.py computes them (in double).
std::vector<float> llama3_divisors(const ModelConfig& c, double factor) {
  std::vector<float> out;
  for (int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    const double wavelen = 2 * std::numbers::pi / freq, low = 8192.0 / 1, high = 8192.0 / 4;
    if (wavelen < high) out.push_back(1);
    else if (wavelen > low) out.push_back(static_cast<float>(factor));
    else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      out.push_back(static_cast<float>(1 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

// Writes hf_dir/{config.json, model.safetensors} and the GGUF; returns the config.
ModelConfig write_synth(const Synth& s, const fs::path& hf_dir, const fs::path& gguf, const Defect& defect = {}) {
  const ModelConfig c = synth_config(s);
  std::mt19937 rng(42);
  std::normal_distribution<float> noise(0.0f, 0.2f);
  std::vector<std::pair<std::string, Tensor>> weights;
  for (const ExpectedTensor& e : expected_tensors(c)) {
    Tensor t = Tensor::empty(DType::F32, e.shape);
    for (int64_t i = 0; i < t.numel(); ++i)
      t.data_mut<float>()[i] = (e.role == TensorRole::Norm ? 1.0f : 0.0f) + noise(rng);
    weights.emplace_back(e.name, t);
  }
  fs::create_directories(hf_dir);
  io::save_safetensors(hf_dir / "model.safetensors", weights);
  json cfg = {{"model_type", s.arch}, {"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
              {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
              {"num_key_value_heads", c.num_kv_heads}, {"head_dim", c.head_dim}, {"vocab_size", c.vocab_size},
              {"max_position_embeddings", c.max_position_embeddings}, {"rms_norm_eps", c.rms_norm_eps},
              {"rope_theta", c.rope_theta}, {"tie_word_embeddings", c.tie_word_embeddings},
              {"attention_bias", c.attention_bias}};
  if (s.llama3_rope)
    cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  std::ofstream(hf_dir / "config.json") << cfg.dump(2);

  GgufBuilder b;
  const std::string arch = defect.arch_name.empty() ? s.arch : defect.arch_name;
  b.kv_str("general.architecture", arch);
  auto kv = [&](const std::string& k, auto v) {
    if (k == defect.skip_key) return;
    if constexpr (std::is_floating_point_v<decltype(v)>)
      b.kv_f32(s.arch + "." + k, static_cast<float>(v));
    else
      b.kv_u32(s.arch + "." + k, static_cast<uint32_t>(v));
  };
  kv("context_length", c.max_position_embeddings);
  if (!defect.vocab.empty()) {
    b.kv_str("tokenizer.ggml.model", "llama");
    b.kv_str_array("tokenizer.ggml.tokens", defect.vocab);
    if (defect.bos_id >= 0) b.kv_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(defect.bos_id));
  }
  kv("embedding_length", c.hidden_size);
  kv("block_count", c.num_layers);
  kv("feed_forward_length", c.intermediate_size);
  kv("attention.head_count", c.num_heads);
  kv("attention.head_count_kv", c.num_kv_heads);
  kv("attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  kv("rope.freq_base", c.rope_theta);
  if (s.arch == "qwen3") kv("attention.key_length", c.head_dim);
  if (defect.rope_dims) kv("rope.dimension_count", defect.rope_dims);
  for (const auto& [name, t] : weights) {
    std::string g = to_gguf_name(name);
    if (g == defect.drop_tensor) continue;
    if (g == defect.rename_from) g = defect.rename_to;
    Tensor stored = t;
    if (s.arch == "llama" && g.find(".attn_q.") != std::string::npos) stored = llama_cpp_permute(t, c.num_heads);
    if (s.arch == "llama" && g.find(".attn_k.") != std::string::npos) stored = llama_cpp_permute(t, c.num_kv_heads);
    if (g == defect.unloadable) {  // Q8_1: 40 bytes per 32 values
      std::string bytes(static_cast<size_t>(t.numel() / 32 * 40), '\0');
      for (char& ch : bytes) ch = static_cast<char>(rng() & 0x3F);
      b.tensor(g, {static_cast<uint64_t>(t.size(1)), static_cast<uint64_t>(t.size(0))},
               static_cast<uint32_t>(io::GgmlType::Q8_1), bytes);
      continue;
    }
    b.tensor_f32(g, stored);
  }
  if (s.llama3_rope) {
    std::vector<float> div = llama3_divisors(c, 8.0);
    if (defect.bad_rope_freqs) div[1] = 1.5f;
    Tensor t = Tensor::empty(DType::F32, {static_cast<int64_t>(div.size())});
    std::memcpy(t.data_mut<float>(), div.data(), div.size() * 4);
    b.tensor_f32("rope_freqs.weight", t);
  }
  b.write(gguf);
  return c;
}


const std::vector<int32_t> kIds = {1, 17, 99, 3, 64, 127, 0, 42, 42, 5, 88, 23};

void expect_same_model(const Synth& s) {
  TempDir tmp("nibble-gguf");
  const ModelConfig c = write_synth(s, tmp / "hf", tmp / "m.gguf");
  const auto gguf = GgufSource::open(tmp / "m.gguf");
  const auto hf = CheckpointDir::open(tmp / "hf");
  EXPECT_EQ(gguf->config().model_type, s.arch);
  EXPECT_EQ(gguf->config().tie_word_embeddings, s.tied);
  EXPECT_EQ(gguf->config().attention_bias, s.attention_bias);
  EXPECT_EQ(gguf->config().head_dim, c.head_dim);
  EXPECT_EQ(gguf->config().rope_scaling.type, hf->config().rope_scaling.type);
  EXPECT_EQ(gguf->config().rope_scaling.factor, hf->config().rope_scaling.factor);
  ASSERT_EQ(gguf->names().size(), hf->names().size());
  for (const std::string& name : hf->names()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(gguf->contains(name));
    const Tensor a = gguf->load(name), b = hf->load(name);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  }
  // Same weights, same forward: the same logits, bit for bit.
  EXPECT_EQ(max_abs_diff(logits_of(*gguf, kIds), logits_of(*hf, kIds)), 0.0f);
}

TEST(GgufSource, LlamaWithBiasesIsUnpermuted) { expect_same_model({.arch = "llama", .attention_bias = true}); }
TEST(GgufSource, LlamaTiedWithLlama3Rope) { expect_same_model({.arch = "llama", .tied = true, .llama3_rope = true}); }
TEST(GgufSource, Qwen2KeepsRowOrder) { expect_same_model({.arch = "qwen2"}); }
TEST(GgufSource, Qwen3TiedWithQkNorm) { expect_same_model({.arch = "qwen3", .tied = true}); }

// A BOS id past the vocabulary is refused before any token is looked up by it
// (GgufSource::tokenizer once indexed the tokens with it first).
TEST(GgufSource, TokenizerWithABosIdPastTheVocabularyIsRefused) {
  TempDir tmp("nibble-gguf");
  write_synth({}, tmp / "hf", tmp / "m.gguf", {.vocab = {"<s>", "a"}, .bos_id = 7});
  const auto gguf = GgufSource::open(tmp / "m.gguf");
  const std::string e = test::error_of([&] { gguf->tokenizer(); });
  EXPECT_NE(e.find("tokenizer.ggml.bos_token_id 7 is outside the 2 tokens"), std::string::npos) << e;
}

TEST(GgufSource, ModelLevelErrors) {
  TempDir tmp("nibble-gguf");
  auto error = [&](const Synth& s, const Defect& d) {
    const fs::path g = tmp / "bad.gguf";
    write_synth(s, tmp / "hf", g, d);
    const std::string msg = test::error_of([&] { GgufSource::open(g); });
    EXPECT_EQ(msg.rfind(g.string() + ": ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  };
  const Synth llama;
  EXPECT_NE(error(llama, {.arch_name = "gpt2"}).find("general.architecture 'gpt2' is not supported (supported: llama, "
                                                     "qwen2, qwen3)"),
            std::string::npos);
  EXPECT_NE(error(llama, {.skip_key = "block_count"}).find("metadata key 'llama.block_count' is missing"),
            std::string::npos);
  EXPECT_NE(error(llama, {.rename_from = "blk.1.ffn_up.weight", .rename_to = "blk.1.ffn_upx.weight"})
                .find("tensor 'blk.1.ffn_upx.weight' has no Hugging Face counterpart"),
            std::string::npos);
  EXPECT_NE(error(llama, {.rename_from = "blk.1.ffn_up.weight", .rename_to = "blk.7.ffn_up.weight"})
                .find("tensor 'blk.7.ffn_up.weight' is in block 7, but llama.block_count is 2"),
            std::string::npos);
  EXPECT_NE(error(llama, {.drop_tensor = "blk.1.ffn_up.weight"})
                .find("tensor 'model.layers.1.mlp.up_proj.weight' is missing"),
            std::string::npos);
  EXPECT_NE(error(llama, {.rope_dims = 8}).find("partial rotary embeddings are not supported"), std::string::npos);
  EXPECT_NE(error({.llama3_rope = true}, {.bad_rope_freqs = true}).find("does not follow llama 3's scaling rule"),
            std::string::npos);
  // A wrong shape: k given q's shape.
  EXPECT_NE(error(llama, {.skip_key = "attention.head_count_kv"})
                .find("tensor 'model.layers.0.self_attn.k_proj.weight' has shape [32, 64], but the config implies [64, "
                      "64]"),
            std::string::npos);
}

// A tensor of a ggml type nibble cannot dequantize: the file opens (inspect
// lists it), check_loadable() names the tensor and its type without loading
// anything, and so does loading it; the other tensors load.
TEST(GgufSource, UnloadableTypeIsReportedBeforeAnyLoad) {
  TempDir tmp("nibble-gguf");
  write_synth({}, tmp / "hf", tmp / "m.gguf", {.unloadable = "blk.1.ffn_down.weight"});
  const auto gguf = GgufSource::open(tmp / "m.gguf");
  const std::string e = test::error_of([&] { gguf->check_loadable(); });
  EXPECT_EQ(e.rfind((tmp / "m.gguf").string() + ": tensor 'blk.1.ffn_down.weight' has ggml type Q8_1, which nibble "
                                                 "cannot dequantize (supported: F32, ",
                    0),
            0u)
      << e;
  EXPECT_EQ(test::error_of([&] { gguf->load("model.layers.1.mlp.down_proj.weight"); }), e);
  EXPECT_EQ(gguf->load("model.layers.1.mlp.up_proj.weight").shape(), (std::vector<int64_t>{96, 64}));
  write_synth({}, tmp / "hf", tmp / "ok.gguf");
  EXPECT_EQ(test::error_of([&] { GgufSource::open(tmp / "ok.gguf")->check_loadable(); }), "(no error)");
}

// Every matrix of `gguf` stored as ggml `type` has the exact format `format`,
// whose parts dequantize to load()'s values bit for bit (`signed_zeros`
// false: as values, a zero's sign aside); every other tensor has none (and
// exact_parts says so). Returns how many matrices were `type`. Matrices of the
// other block types nibble holds exactly (gguf_source.cpp's kExactBlockTypes;
// Q8_0 is in almost every file) are left to their own test.
int expect_exact_matrices(const GgufSource& gguf, const std::string& type, const std::string& format,
                          bool signed_zeros = true) {
  static const std::set<std::string> kExact = {"Q2_K", "Q3_K", "Q4_0", "Q4_1", "Q4_K",   "Q5_0",
                                               "Q5_1", "Q5_K", "Q6_K", "Q8_0", "IQ4_NL", "IQ4_XS"};
  const FormatChoice fc = find_format(format);
  int exact = 0;
  for (const std::string& n : gguf.names()) {
    const std::optional<FormatChoice> f = gguf.exact_format(n);
    const std::string t = gguf.foreign_format(n);
    if (t != type && kExact.count(t)) continue;
    if (t != type) {
      EXPECT_FALSE(f) << n;
      EXPECT_NE(test::error_of([&] { gguf.exact_parts(n); }).find("has no exact nibble format"), std::string::npos);
      continue;
    }
    if (!f) {
      ADD_FAILURE() << n << ": no exact format";
      continue;
    }
    EXPECT_EQ(f->canonical_name(), format);
    const TensorMeta m = gguf.meta(n);
    const Tensor w = dequantize_parts(fc, gguf.exact_parts(n), m.shape[0], m.shape[1]);
    const Tensor ref = gguf.load(n);
    EXPECT_EQ(w.shape(), ref.shape()) << n;
    if (w.shape() == ref.shape() && signed_zeros) {
      EXPECT_EQ(std::memcmp(w.raw(), ref.raw(), ref.nbytes()), 0) << n;
    } else if (w.shape() == ref.shape()) {
      int64_t zeros = 0;
      for (int64_t i = 0; i < ref.numel(); ++i) {
        const float a = w.data<float>()[i], b = ref.data<float>()[i];
        if (a != b || (a == 0.0f && std::signbit(a))) {
          ADD_FAILURE() << n << " [" << i << "]: " << a << " against " << b;
          break;
        }
        zeros += a == 0.0f;
      }
      EXPECT_GT(zeros, 0) << n;  // the case this comparison allows is met
    }
    ++exact;
  }
  return exact;
}

// llama.cpp's Q4_0 (x = (q − 8)·d, f16 d per 32 inputs) is int4_g32_sym
// exactly: exact_parts of every Q4_0 matrix of its stories260K file dequantize
// through nibble's int4_sym to ggml's own values bit for bit, q and k rows
// unpermuted as load() does (llama, 8 and 4 heads). The file's other block
// type (Q8_0) has no exact format; Q4_K_M's file (Q5_0, Q8_0: no Q4_K block)
// has none.
TEST(GgufSource, Q4_0MatricesAreInt4SymExactly) {
  const auto gguf = GgufSource::open(stories() / "gguf" / "stories260K-Q4_0.gguf");
  // the embedding; q, k, v, o, gate, up of 5 layers (down_proj, 172 wide, is F16)
  EXPECT_EQ(expect_exact_matrices(*gguf, "Q4_0", "int4_g32_sym"), 1 + 5 * 6);
  // Q4_K_M's file holds Q5_0, Q8_0 and F16 matrices (no K-quant block: no matrix there is 256 wide): the first two
  // have exact formats.
  const auto km = GgufSource::open(stories() / "gguf" / "stories260K-Q4_K_M.gguf");
  for (const std::string& n : km->names()) {
    const std::string t = km->foreign_format(n);
    EXPECT_EQ(km->exact_format(n).has_value(), t == "Q8_0" || t == "Q5_0") << n;
  }
}

// llama.cpp's Q5_0 (x = (q − 16)·d, an f16 d and 5-bit codes per 32 inputs) is int8_g32_sym exactly: codes q − 16,
// d's f16 bits as the scale. Its Q4_K_M file stores q, k, o, gate, up, the embedding and 3 of 5 v's so (llama.cpp's
// fallback for Q4_K where rows are not 256 wide; v in layers 2 and 4 is Q8_0).
TEST(GgufSource, Q5_0MatricesAreInt8SymExactly) {
  const auto gguf = GgufSource::open(stories() / "gguf" / "stories260K-Q4_K_M.gguf");
  EXPECT_EQ(expect_exact_matrices(*gguf, "Q5_0", "int8_g32_sym"), 1 + 5 * 5 + 3);
}

// llama.cpp's Q5_1 (x = q·d + m, f16 d and m per 32 inputs) is int8_g32_asym_f32 exactly: scale d, min m. Its
// Q5_K_M file stores the same matrices as Q4_K_M's Q5_0 ones so.
TEST(GgufSource, Q5_1MatricesAreInt8AsymF32Exactly) {
  const auto gguf = GgufSource::open(stories() / "gguf" / "stories260K-Q5_K_M.gguf");
  EXPECT_EQ(expect_exact_matrices(*gguf, "Q5_1", "int8_g32_asym_f32"), 1 + 5 * 5 + 3);
}

// llama.cpp's IQ4_NL (x = d·grid[q], an f16 d per 32 inputs, the fixed grid −127..113) is int8_g32_sym exactly: the
// grid values as codes, d's f16 bits as the scale. Its stories260K files (with and without an imatrix) store the
// embedding and q, k, v, o, gate, up of every layer so.
TEST(GgufSource, Iq4NlMatricesAreInt8SymExactly) {
  for (const char* f : {"stories260K-IQ4_NL.gguf", "stories260K-IQ4_NL-imatrix.gguf"}) {
    SCOPED_TRACE(f);
    EXPECT_EQ(expect_exact_matrices(*GgufSource::open(stories() / "gguf" / f), "IQ4_NL", "int8_g32_sym"), 1 + 5 * 6);
  }
}

// The other K-quants are int8_asym_f32 exactly: Q5_K (Q4_K's super-blocks with a 5th bit per code) at groups of 32,
// and at groups of 16 Q2_K ((d·sc)·q − dmin·mn, 4-bit sc and mn), Q3_K (d·(sc − 32)·q, q in −4..3) and Q6_K
// ((d·sc)·(q − 32), an int8 sc); so is IQ4_XS ((d·(ls − 32))·grid[q] per 32) with codes grid[q] + 128. Q3_K's,
// Q6_K's and IQ4_XS's pairs are (S, −4·S), (S, −32·S) and (S, −128·S): every value the same, but a zero product,
// which ggml signs as its factors and these pairs make +0. gguf_q4k.h's one-layer llama, every
// matrix of the type: d (and dmin) of both signs, subnormal and zero, every scale (and min), every code.
TEST(GgufSource, OtherKQuantsAndIq4XsAreInt8AsymF32Exactly) {
  TempDir tmp("nibble-gguf");
  struct Case {
    io::GgmlType type;
    const char* name;
    const char* format;
    int64_t min_sub;  // sub-blocks the helper must write to reach every scale (and min)
    bool signed_zeros;
  };
  for (const Case& c : {Case{io::GgmlType::Q2_K, "Q2_K", "int8_g16_asym_f32", 256, true},
                        Case{io::GgmlType::Q3_K, "Q3_K", "int8_g16_asym_f32", 4096, false},
                        Case{io::GgmlType::Q5_K, "Q5_K", "int8_g32_asym_f32", 64 * 64, true},
                        Case{io::GgmlType::Q6_K, "Q6_K", "int8_g16_asym_f32", 256, false},
                        Case{io::GgmlType::IQ4_XS, "IQ4_XS", "int8_g32_asym_f32", 4096, false}}) {
    SCOPED_TRACE(c.name);
    const fs::path file = tmp / (std::string(c.name) + ".gguf");
    const auto [written, sub] = test::write_k_quant_llama(file, c.type);
    ASSERT_EQ(written, 8);
    ASSERT_GE(sub, c.min_sub);
    EXPECT_EQ(expect_exact_matrices(*GgufSource::open(file), c.name, c.format, c.signed_zeros), written);
  }
}

// llama.cpp's Q8_0 (x = q·d, an f16 d and 32 int8 codes per block) is int8_g32_sym exactly: the codes as they are,
// d's f16 bits as the scale, q and k rows unpermuted.
TEST(GgufSource, Q8_0MatricesAreInt8SymExactly) {
  const auto gguf = GgufSource::open(stories() / "gguf" / "stories260K-Q8_0.gguf");
  // The embedding; q, k, v, o, gate, up of 5 layers (down_proj, 172 wide, is F16); the output head.
  EXPECT_EQ(expect_exact_matrices(*gguf, "Q8_0", "int8_g32_sym"), 1 + 5 * 6 + 1);
}

// llama.cpp's Q4_1 (x = q·d + m, f16 d and m per 32 inputs) is int4_g32_asym_f32
// exactly: scale d, min m, the codes re-ordered, q and k rows unpermuted.
TEST(GgufSource, Q4_1MatricesAreInt4AsymF32Exactly) {
  const auto gguf = GgufSource::open(stories() / "gguf" / "stories260K-Q4_1.gguf");
  // The embedding; q, k, v, o, gate, up of 5 layers (down_proj, 172 wide, is F16; output.weight is Q8_0).
  EXPECT_EQ(expect_exact_matrices(*gguf, "Q4_1", "int4_g32_asym_f32"), 1 + 5 * 6);
}

// Q4_K (256-input super-blocks of 8 sub-blocks of 32, x = (d·sc)·q − dmin·mn)
// is int4_g32_asym_f32 exactly, a group per sub-block. No stories260K file
// holds a Q4_K block (no matrix there is 256 wide), so this reads
// write_k_quant_llama's one-layer llama (gguf_q4k.h): every matrix Q4_K of
// pseudo-random blocks, every pair of 6-bit scale and min. q and k (4 and 2
// heads) are unpermuted too.
TEST(GgufSource, Q4_KMatricesAreInt4AsymF32Exactly) {
  TempDir tmp("nibble-gguf");
  const auto [q4_k, sub] = test::write_k_quant_llama(tmp / "q4k.gguf");
  ASSERT_EQ(q4_k, 8);  // the embedding; q, k, v, o, gate, up, down
  ASSERT_GE(sub, 64 * 64);  // sub-block 64a + r has scale r and min 29r + a (mod 64): every (scale, min) pair
  EXPECT_EQ(expect_exact_matrices(*GgufSource::open(tmp / "q4k.gguf"), "Q4_K", "int4_g32_asym_f32"), q4_k);
}

// ---------------------------------------------------------------- perplexity

// Every llama.cpp quantization of stories260K through nibble's forward, on
// the evaluation half of the TinyStories sample (bytes [96207, end)), ctx 256,
// 40 windows, the HF tokenizer with BOS. gguf/README.md lists llama.cpp's own
// numbers (186 windows, its forward) to set beside these.
TEST(GgufPerplexity, Stories260KQuantizations) {
  std::ifstream in(test::shared_dir() / "data" / "corpora" / "tinystories-valid-sample.txt", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(text.size(), 96207u);
  text = text.substr(96207);
  const Tokenizer tok = Tokenizer::from_file(stories() / "tokenizer.json");
  std::vector<int32_t> ids = tok.encode(text, true);
  std::cout << "evaluation half: " << text.size() << " bytes, " << ids.size() << " tokens with BOS\n";
  // NIBBLE_GGUF_PPL_CHUNKS=186 scores every window, as llama.cpp's run did.
  constexpr int64_t kCtx = 256;
  const char* env = std::getenv("NIBBLE_GGUF_PPL_CHUNKS");
  const int64_t kChunks = env && *env ? std::stoll(env) : 40;
  ASSERT_GE(static_cast<int64_t>(ids.size()), kCtx * kChunks);
  ids.resize(kCtx * kChunks);
  const auto bos = leading_bos(tok);
  auto ppl = [&](const ModelSource& src) { return eval::perplexity(*Model::load(src), ids, kCtx, bos, false); };

  const eval::PerplexityResult hf = ppl(*CheckpointDir::open(stories()));
  std::cout << fmt::format("{:<16} {:>9} {:>8} {:>8}\n", "model", "ppl", "±", "vs HF");
  std::cout << fmt::format("{:<16} {:>9.4f} {:>8.4f} {:>8}\n", "HF (safetensors)", hf.ppl, hf.ppl_stderr, "");
  for (const char* q : {"F32", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_K_M-imatrix", "Q4_0", "Q4_1", "IQ4_NL",
                        "IQ4_NL-imatrix"}) {
    const auto r = ppl(*GgufSource::open(gguf_dir() / fmt::format("stories260K-{}.gguf", q)));
    std::cout << fmt::format("{:<16} {:>9.4f} {:>8.4f} {:>+7.2f}%\n", q, r.ppl, r.ppl_stderr,
                             100 * (r.ppl / hf.ppl - 1));
    EXPECT_EQ(r.scored_tokens, hf.scored_tokens);
    if (std::string(q) == "F32") {
      EXPECT_NEAR(r.ppl, hf.ppl, 1e-9 * hf.ppl);  // the same weights
    } else {
      // llama.cpp measured +0.4% (Q8_0) to +12% (Q4_0) on this model.
      EXPECT_GT(r.ppl, 0.99 * hf.ppl) << q;
      EXPECT_LT(r.ppl, 1.25 * hf.ppl) << q;
    }
  }
}

}  // namespace
}  // namespace nibble
