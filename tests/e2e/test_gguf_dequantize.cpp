// nibble dequantize on a GGUF file: a Hugging Face checkpoint whose weights,
// config and tokenizer are what the file holds. Against stories260K's HF
// checkpoint (llama.cpp's F32 file was converted from it) and against the
// GGUF file itself read through GgufSource.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "nibble/convert.h"
#include "nibble/gguf.h"
#include "nibble/model.h"
#include "nibble/source.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

Tensor logits_of(const ModelSource& src, const std::vector<int32_t>& ids) {
  auto model = Model::load(src);
  KVCache cache(model->config(), 128);
  return model->forward(ids, cache);
}

TEST(GgufDequantize, F32FileGivesBackTheHfCheckpoint) {
  test::TempDir tmp;
  const fs::path dir = test::model_dir("stories260K");
  DequantizeOptions o;
  o.progress = false;
  dequantize_model(dir / "gguf" / "stories260K-F32.gguf", tmp / "hf", o);
  const auto got = CheckpointDir::open(tmp / "hf");
  const auto want = CheckpointDir::open(dir);
  got->validate_against_config();
  EXPECT_EQ(got->config().num_layers, want->config().num_layers);
  EXPECT_EQ(got->config().head_dim, want->config().head_dim);
  // llama.cpp's converter stored the tied head as a tensor of its own (output.weight): the checkpoint has an
  // untied lm_head holding the embedding's values.
  EXPECT_TRUE(want->config().tie_word_embeddings);
  EXPECT_FALSE(got->config().tie_word_embeddings);
  const Tensor head = got->load("lm_head.weight"), embed = want->load("model.embed_tokens.weight").to_f32();
  ASSERT_EQ(head.shape(), embed.shape());
  EXPECT_EQ(std::memcmp(head.raw(), embed.raw(), head.nbytes()), 0);
  // The same tensors, bit for bit (q/k rows back in HF order).
  ASSERT_EQ(got->names().size(), want->names().size() + 1);
  for (const std::string& name : want->names()) {
    ASSERT_TRUE(got->contains(name)) << name;
    const Tensor a = got->load(name), b = want->load(name).to_f32();
    ASSERT_EQ(a.shape(), b.shape()) << name;
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
  }
  // The tokenizer written from tokenizer.ggml.*: the original's ids, BOS and EOS.
  const Tokenizer t_got = Tokenizer::from_file(tmp / "hf" / "tokenizer.json");
  const Tokenizer t_want = Tokenizer::from_file(dir / "tokenizer.json");
  std::ifstream f(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt");
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str().substr(0, 20000);
  EXPECT_EQ(t_got.encode(text, true), t_want.encode(text, true));
  EXPECT_EQ(t_got.bos_id(), t_want.bos_id());
  EXPECT_EQ(t_got.eos_id(), t_want.eos_id());
}

TEST(GgufDequantize, QuantizedFileRunsAsTheGgufDoes) {
  test::TempDir tmp;
  const fs::path file = test::model_dir("stories260K") / "gguf" / "stories260K-Q4_K_M.gguf";
  const auto r = test::run_command(test::nibble_bin() + " dequantize -q --model " + file.string() + " --out " +
                                   (tmp / "hf").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto got = CheckpointDir::open(tmp / "hf");
  const auto gguf = GgufSource::open(file);
  EXPECT_EQ(got->config().tie_word_embeddings, gguf->config().tie_word_embeddings);
  // 70 tokens: the GGUF's Q8_0 matrices run packed (int8_g32_sym, exactly its values), and from 64 rows of x on
  // the packed kernels decode and run the dense GEMM, so both forwards have the same bits.
  std::vector<int32_t> ids = {1, 403, 407, 261, 378, 290, 300, 13, 5, 444};
  for (int32_t i = 0; ids.size() < 70; ++i) ids.push_back(static_cast<int32_t>((37 * i + 11) % 500));
  const Tensor a = logits_of(*got, ids), b = logits_of(*gguf, ids);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);  // the same f32 weights, the same forward
}

}  // namespace
}  // namespace nibble
