// Architecture paths the shipped fixtures cannot reach, against transformers:
// tiny random-weight checkpoints made by scripts/make_tiny_fixtures.py (qwen2
// q/k/v biases, mistral with a sliding window shorter than the sequence,
// llama3 and linear RoPE scaling, a tied head), and a Llama-3-style byte-level
// BPE tokenizer against the `tokenizers` library's ids.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/model.h"
#include "nibble/safetensors.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

class TinyArch : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyArch, LogitsMatchTransformers) {
  const fs::path dir = test::test_data_dir() / "tiny" / GetParam();
  auto model = Model::load(*CheckpointDir::open(dir));
  const auto golden = io::SafetensorsFile::open(dir / "golden_logits.safetensors");
  for (const char* seq : {"seq0", "seq1"}) {
    SCOPED_TRACE(seq);
    const Tensor ids_t = golden.tensor(std::string(seq) + ".input_ids");
    const std::vector<int32_t> ids(ids_t.data<int32_t>(), ids_t.data<int32_t>() + ids_t.numel());
    KVCache cache(model->config(), static_cast<int64_t>(ids.size()));
    const Tensor got = model->forward(ids, cache);
    const Tensor want = golden.tensor(std::string(seq) + ".logits");
    ASSERT_EQ(got.shape(), want.shape());
    float worst = 0;
    for (int64_t i = 0; i < got.numel(); ++i)
      worst = std::max(worst, std::abs(got.data<float>()[i] - want.data<float>()[i]));
    // fp32 vs fp32 (transformers eager on CPU): 1e-4 absolute, as for stories260K.
    EXPECT_LT(worst, 1e-4f);
  }
}

INSTANTIATE_TEST_SUITE_P(Golden, TinyArch,
                         ::testing::Values("qwen2-bias", "mistral-swa", "llama3-rope", "llama-linear-tied"));

TEST(TinyArchConfig, FixturesExerciseThePathsTheyClaim) {
  const fs::path d = test::test_data_dir() / "tiny";
  EXPECT_EQ(CheckpointDir::open(d / "mistral-swa")->config().sliding_window, 16);  // < the 40/97-token sequences
  EXPECT_EQ(CheckpointDir::open(d / "llama3-rope")->config().rope_scaling.type, "llama3");
  EXPECT_EQ(CheckpointDir::open(d / "llama-linear-tied")->config().rope_scaling.type, "linear");
  EXPECT_TRUE(CheckpointDir::open(d / "llama-linear-tied")->config().tie_word_embeddings);
  EXPECT_TRUE(CheckpointDir::open(d / "qwen2-bias")->contains("model.layers.0.self_attn.q_proj.bias"));
}

TEST(TokenizerLlama3Style, MatchesTokenizersLibrary) {
  const fs::path dir = test::test_data_dir() / "tiny" / "llama3-tokenizer";
  const Tokenizer tok = Tokenizer::from_file(dir / "tokenizer.json");
  std::ifstream f(dir / "golden.json");
  const auto j = nlohmann::json::parse(f);
  int n = 0;
  for (const auto& c : j["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(tok.encode(text, true), c["ids"].get<std::vector<int32_t>>()) << "text: " << text;
    // tokenizers' decode() skips special tokens by default
    EXPECT_EQ(tok.decode(c["ids"].get<std::vector<int32_t>>(), true), c["decode"].get<std::string>()) << text;
    ++n;
  }
  EXPECT_EQ(n, 16);
}

}  // namespace
}  // namespace nibble
