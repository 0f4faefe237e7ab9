// config.json parsing: both transformers styles, the fixtures, bad input.
#include <gtest/gtest.h>

#include <fstream>

#include "nibble/arch.h"
#include "nibble/error.h"
#include "nibble/model_config.h"
#include "nibble/source.h"
#include "test_util.h"

namespace nibble {
namespace {

using test::TempDir;

std::filesystem::path write_config(const TempDir& dir, const std::string& text) {
  auto p = dir / "config.json";
  std::ofstream(p) << text;
  return p;
}

std::string error_of(const std::filesystem::path& p) {
  try {
    parse_model_config(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Config, Stories260KTransformers4Style) {
  const ModelConfig c = parse_model_config(test::model_dir("stories260K") / "config.json");
  EXPECT_EQ(c.model_type, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "float32");
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{2});
}

TEST(Config, Qwen3Transformers5Style) {
  const ModelConfig c = parse_model_config(test::model_dir("qwen3-26M-linux") / "config.json");
  EXPECT_EQ(c.model_type, "qwen3");
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1e6);  // from rope_parameters
  EXPECT_EQ(c.rope_scaling.type, "default");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.dtype, "bfloat16");  // from "dtype"
  EXPECT_FALSE(c.sliding_window.has_value());
  // The tensors it implies: qwen3 has q/k norms, an untied head.
  const auto t = expected_tensors(c);
  EXPECT_EQ(t.size(), 1 + 6 * 11 + 2u);
  EXPECT_EQ(t.back().name, "lm_head.weight");
}

TEST(Config, RopeScalingBothStyles) {
  TempDir d;
  const std::string base = R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100)";
  auto p = write_config(d, "{" + base + R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3",
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  ModelConfig c = parse_model_config(p);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.num_kv_heads, 4);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 16);     // hidden / heads

  p = write_config(d, "{" + base + R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1234.0}})");
  c = parse_model_config(p);
  EXPECT_EQ(c.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 1234.0);

  p = write_config(d, "{" + base + R"(, "rope_scaling": {"type": "yarn", "factor": 4.0}})");
  EXPECT_NE(error_of(p).find("rope type 'yarn' is not supported"), std::string::npos) << error_of(p);
}

TEST(Config, Qwen2BiasesAndMistralSlidingWindow) {
  TempDir d;
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  ModelConfig c = parse_model_config(write_config(d, R"({"model_type": "qwen2", )" + base + "}"));
  int biases = 0;
  for (const auto& t : expected_tensors(c)) biases += t.role == TensorRole::Bias;
  EXPECT_EQ(biases, 3);  // q, k, v
  c = parse_model_config(write_config(d, R"({"model_type": "mistral", "sliding_window": 4096, )" + base + "}"));
  EXPECT_EQ(c.sliding_window, 4096);
}

TEST(Config, PerLayerAttentionWindows) {
  TempDir d;
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100)";
  // Mistral: the window on every layer.
  ModelConfig c = parse_model_config(write_config(d, R"({"model_type": "mistral", "sliding_window": 16, )" + base + "}"));
  EXPECT_EQ(c.layer_windows, (std::vector<int64_t>{16, 16, 16, 16}));
  // Qwen2 (transformers 4 style): only layers >= max_window_layers, and only with use_sliding_window.
  c = parse_model_config(write_config(d, R"({"model_type": "qwen2", "sliding_window": 16, "use_sliding_window": true,
    "max_window_layers": 2, )" + base + "}"));
  EXPECT_EQ(c.layer_windows, (std::vector<int64_t>{0, 0, 16, 16}));
  EXPECT_EQ(c.window(1), 0);
  EXPECT_EQ(c.window(3), 16);
  c = parse_model_config(write_config(d, R"({"model_type": "qwen2", "sliding_window": 16, "use_sliding_window": false,
    "max_window_layers": 2, )" + base + "}"));
  EXPECT_EQ(c.layer_windows, (std::vector<int64_t>{0, 0, 0, 0}));
  // layer_types (transformers 5) decides when present.
  c = parse_model_config(write_config(d, R"({"model_type": "qwen3", "sliding_window": 8, "max_window_layers": 0,
    "layer_types": ["full_attention", "sliding_attention", "full_attention", "sliding_attention"], )" + base + "}"));
  EXPECT_EQ(c.layer_windows, (std::vector<int64_t>{0, 8, 0, 8}));
  EXPECT_NE(error_of(write_config(d, R"({"model_type": "qwen3", "layer_types": ["full_attention"], )" + base + "}"))
                .find("one entry per layer"),
            std::string::npos);
  EXPECT_NE(error_of(write_config(d, R"({"model_type": "qwen3", "layer_types": ["full_attention", "chunked_attention",
    "full_attention", "full_attention"], )" + base + "}"))
                .find("chunked_attention"),
            std::string::npos);
}

void expect_same_config(const ModelConfig& a, const ModelConfig& b, const std::string& what) {
  EXPECT_EQ(a.model_type, b.model_type) << what;
  EXPECT_EQ(a.hidden_size, b.hidden_size) << what;
  EXPECT_EQ(a.intermediate_size, b.intermediate_size) << what;
  EXPECT_EQ(a.num_layers, b.num_layers) << what;
  EXPECT_EQ(a.num_heads, b.num_heads) << what;
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads) << what;
  EXPECT_EQ(a.head_dim, b.head_dim) << what;
  EXPECT_EQ(a.vocab_size, b.vocab_size) << what;
  EXPECT_EQ(a.max_position_embeddings, b.max_position_embeddings) << what;
  EXPECT_EQ(a.rms_norm_eps, b.rms_norm_eps) << what;  // exactly: JSON doubles round-trip
  EXPECT_EQ(a.rope_theta, b.rope_theta) << what;
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type) << what;
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor) << what;
  EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor) << what;
  EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor) << what;
  EXPECT_EQ(a.rope_scaling.original_max_position_embeddings, b.rope_scaling.original_max_position_embeddings) << what;
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings) << what;
  EXPECT_EQ(a.attention_bias, b.attention_bias) << what;
  EXPECT_EQ(a.mlp_bias, b.mlp_bias) << what;
  EXPECT_EQ(a.sliding_window, b.sliding_window) << what;
  EXPECT_EQ(a.layer_windows, b.layer_windows) << what;
  EXPECT_EQ(a.bos_token_id, b.bos_token_id) << what;
  EXPECT_EQ(a.eos_token_ids, b.eos_token_ids) << what;
  EXPECT_EQ(expected_tensors(a).size(), expected_tensors(b).size()) << what;
}

// model_config_json (what nibble writes for a GGUF file's checkpoint) reads back as the config it was made from:
// the fixtures, llama3 and linear RoPE scaling, biases, windows on some layers, several EOS ids.
TEST(Config, WrittenConfigReadsBackTheSame) {
  TempDir d;
  std::vector<std::pair<std::string, ModelConfig>> cases = {
      {"stories260K", parse_model_config(test::model_dir("stories260K") / "config.json")},
      {"qwen3", parse_model_config(test::model_dir("qwen3-26M-linux") / "config.json")}};
  const std::string base = R"("hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100, "rms_norm_eps": 1e-5)";
  cases.emplace_back("llama3 rope, biases", parse_model_config(write_config(d, R"({"model_type": "llama",
    "attention_bias": true, "mlp_bias": true, "eos_token_id": [7, 9], "bos_token_id": 3, "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}, )" + base + "}")));
  cases.emplace_back("qwen2 windows, linear rope", parse_model_config(write_config(d, R"({"model_type": "qwen2",
    "sliding_window": 16, "use_sliding_window": true, "max_window_layers": 2, "tie_word_embeddings": true,
    "rope_scaling": {"type": "linear", "factor": 2.5}, )" + base + "}")));
  cases.emplace_back("mistral window", parse_model_config(write_config(d, R"({"model_type": "mistral",
    "sliding_window": 32, )" + base + "}")));
  for (const auto& [what, c] : cases) {
    const std::string text = model_config_json(c, "float32");
    const ModelConfig back = parse_model_config(write_config(d, text));
    expect_same_config(back, c, what);
    EXPECT_EQ(back.dtype, "float32") << what;
  }
  EXPECT_EQ(cases[3].second.layer_windows, (std::vector<int64_t>{0, 0, 16, 16}));  // the case is what it says
}

TEST(Config, BadInputNamesFileAndKey) {
  TempDir d;
  struct Case {
    std::string text, expect;
  };
  const std::vector<Case> cases = {
      {R"({"model_type": "gpt2"})", "model_type 'gpt2' is not supported (supported: llama, mistral, qwen2, qwen3)"},
      {R"({"model_type": "llama"})", "missing required key 'hidden_size'"},
      {R"({"model_type": "llama", "hidden_size": "64"})", "'hidden_size' should be an integer"},
      {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 3, "num_key_value_heads": 2, "vocab_size": 10})", "must be a multiple of"},
      {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 0,
          "num_attention_heads": 4, "vocab_size": 10})", "'num_hidden_layers' must be positive"},
      {R"({"model_type": "llama",)", "malformed JSON"},
      {R"([1, 2])", "expected a JSON object"},
      // Found by fuzz_hf_json: a number past double's range is nlohmann's
      // out_of_range, not a parse_error, and escaped as a foreign exception.
      {R"({"model_type": "llama", "hidden_size": 1e400})", "malformed JSON"},
      // A string from the file stays on the message's one line.
      {R"({"model_type": "gpt2\nx"})", R"(model_type 'gpt2\nx' is not supported)"},
      {R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1000000000000,
          "num_attention_heads": 4, "vocab_size": 10})", "'num_hidden_layers' = 1000000000000 is not plausible"},
  };
  for (const Case& c : cases) {
    const auto p = write_config(d, c.text);
    const std::string err = error_of(p);
    EXPECT_NE(err.find(c.expect), std::string::npos) << "for " << c.text << "\n got: " << err;
    EXPECT_NE(err.find(p.string()), std::string::npos) << err;  // names the file
    EXPECT_EQ(err.find('\n'), std::string::npos) << err;
  }
  EXPECT_NE(error_of(d / "missing.json").find("cannot open"), std::string::npos);
}

// The shard index is JSON too: a number past double's range in it is refused
// with the index's name (found by fuzz_hf_json in config.json's reader, which
// shares the cause).
TEST(Config, ShardIndexWithANumberPastDoubleNamesTheFile) {
  TempDir d;
  std::filesystem::copy_file(test::model_dir("stories260K") / "config.json", d / "config.json");
  std::ofstream(d / "model.safetensors.index.json") << R"({"metadata": {"total_size": 1e400}, "weight_map": {}})";
  const std::string err = test::error_of([&] { CheckpointDir::open(d.path()); });
  EXPECT_NE(err.find("model.safetensors.index.json: malformed JSON"), std::string::npos) << err;
}

}  // namespace
}  // namespace nibble
