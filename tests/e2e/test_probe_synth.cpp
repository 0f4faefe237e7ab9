// nibble probe against an independent computation of one matrix's output
// error, and nibble synth's checkpoints.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "nibble/convert.h"
#include "nibble/error.h"
#include "nibble/model.h"
#include "nibble/probe.h"
#include "nibble/synth.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

TEST(Probe, MatchesAnIndependentLayerZeroComputation) {
  TempDir tmp;
  const fs::path model = test::model_dir("stories260K");
  QuantizeOptions r;
  r.group_size = 32;
  r.progress = false;
  quantize_model(model, tmp / "rtn", r);
  auto ref = CheckpointDir::open(model);
  auto cand = CheckpointDir::open(tmp / "rtn");
  std::vector<int32_t> ids;
  for (int i = 0; i < 3 * 64; ++i) ids.push_back(static_cast<int32_t>((i * 37 + 11) % 512));
  eval::ProbeOptions o;
  o.ctx = 64;
  o.chunks = 0;
  o.progress = false;
  const auto rows = eval::probe(*ref, *cand, ids, 1, o);
  const ModelConfig& c = ref->config();
  ASSERT_EQ(rows.size(), static_cast<size_t>(7 * c.num_layers));  // tied head: not probed

  // Layer 0's q_proj reads RMSNorm(embedding) of each window's tokens (first one BOS=1).
  const Tensor emb = ref->load("model.embed_tokens.weight").to_f32();
  const Tensor gain = ref->load("model.layers.0.input_layernorm.weight").to_f32();
  const Tensor W = ref->load("model.layers.0.self_attn.q_proj.weight").to_f32();
  const Tensor Q = cand->load("model.layers.0.self_attn.q_proj.weight");  // dequantized
  const int64_t D = c.hidden_size, out = W.size(0);
  double err = 0, refsq = 0;
  for (size_t t = 0; t < ids.size(); ++t) {
    const int32_t id = t % 64 == 0 ? 1 : ids[t];
    std::vector<double> x(D);
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += std::pow(emb.data<float>()[id * D + j], 2);
    const double inv = 1.0 / std::sqrt(ss / D + c.rms_norm_eps);
    for (int64_t j = 0; j < D; ++j) x[j] = emb.data<float>()[id * D + j] * inv * gain.data<float>()[j];
    for (int64_t o2 = 0; o2 < out; ++o2) {
      double y = 0, yq = 0;
      for (int64_t j = 0; j < D; ++j) {
        y += W.data<float>()[o2 * D + j] * x[j];
        yq += Q.data<float>()[o2 * D + j] * x[j];
      }
      err += (yq - y) * (yq - y);
      refsq += y * y;
    }
  }
  EXPECT_EQ(rows[0].name, "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(rows[0].tokens, 3 * 64);
  EXPECT_NEAR(rows[0].rel(), std::sqrt(err / refsq), 1e-4 * std::sqrt(err / refsq));

  // A model against itself loses nothing anywhere.
  for (const auto& row : eval::probe(*ref, *ref, ids, 1, o)) EXPECT_EQ(row.sq_err, 0.0) << row.name;
  // Only some layers.
  o.layers = {1};
  o.head = false;
  const auto some = eval::probe(*ref, *cand, ids, 1, o);
  ASSERT_EQ(some.size(), 7u);
  EXPECT_EQ(some[0].layer, 1);
  o.layers = {99};
  EXPECT_THROW(eval::probe(*ref, *cand, ids, 1, o), Error);
}

TEST(Synth, WritesALoadableDeterministicCheckpoint) {
  TempDir tmp;
  SynthOptions o;
  o.hidden = 64;
  o.intermediate = 160;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 600;
  o.context = 128;
  o.progress = false;
  o.tokenizer_from = test::model_dir("stories260K");
  EXPECT_EQ(synthesize_model(tmp / "a", o), 600 * 64 * 2 + 2 * (64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 160 + 2 * 64) + 64);
  synthesize_model(tmp / "b", o);
  auto slurp = [](const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  EXPECT_EQ(slurp(tmp / "a/model.safetensors"), slurp(tmp / "b/model.safetensors"));
  EXPECT_TRUE(fs::exists(tmp / "a/tokenizer.json"));
  auto dir = CheckpointDir::open(tmp / "a");
  const Tensor w = dir->load("model.layers.1.mlp.down_proj.weight").to_f32();
  double s2 = 0;
  for (int64_t i = 0; i < w.numel(); ++i) s2 += std::pow(w.data<float>()[i], 2);
  EXPECT_NEAR(std::sqrt(s2 / w.numel()), 0.02, 0.002);  // N(0, 0.02²)
  KVCache cache(dir->config(), 8);
  const Tensor logits = Model::load(*dir)->forward({1, 2, 3}, cache);
  for (int64_t k = 0; k < logits.numel(); ++k) ASSERT_TRUE(std::isfinite(logits.data<float>()[k]));
  o.heads = 5;  // 64 is not a multiple of 5
  EXPECT_THROW(synthesize_model(tmp / "c", o), Error);
  o.heads = 4;
  o.vocab = 100;  // smaller than the tokenizer
  EXPECT_THROW(synthesize_model(tmp / "d", o), Error);
}

// A model with more embedding rows than its tokenizer has tokens (a padded
// vocabulary, or synth with a borrowed tokenizer): nibble run samples only ids
// the tokenizer can decode, so generation never stops on an undecodable id.
TEST(Synth, RunSamplesOnlyTokenizerIdsOfAPaddedVocabulary) {
  TempDir tmp;
  SynthOptions o;
  o.hidden = 64;
  o.intermediate = 128;
  o.layers = 1;
  o.heads = 4;
  o.kv_heads = 2;
  o.vocab = 4096;  // the stories tokenizer has 512 tokens
  o.context = 256;
  o.progress = false;
  o.tokenizer_from = test::model_dir("stories260K");
  synthesize_model(tmp / "m", o);
  // Random weights: with the whole vocabulary to pick from, ids >= 512 win most steps.
  const auto r = test::run_command(test::nibble_bin() + " run -q --model '" + (tmp / "m").string() +
                                   "' --prompt 'Once upon a time' -n 40");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("Once upon a time", 0), 0u) << r.out;
  EXPECT_GT(r.out.size(), std::string("Once upon a time").size() + 20) << r.out;
}

}  // namespace
}  // namespace nibble
