// nibble quantize on a GGUF file: llama.cpp's F32 file of stories260K was
// converted from the HF checkpoint, so quantizing either must store the same
// codes, scales and mins (GPTQ included: the file's own tokenizer must give
// the calibration text the same ids). A block-quantized file is refused.
#include <gtest/gtest.h>

#include "nibble/convert.h"
#include "nibble/source.h"
#include "nibble/tokenizer.h"
#include "same_parts.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

QuantizeOptions gptq_options() {
  QuantizeOptions o;
  o.method = "gptq";
  o.mse = true;
  o.progress = false;
  o.keep_regex = "lm_head";  // the GGUF file stores the tied head as a tensor of its own
  o.calib.files = {(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").string()};
  o.calib.samples = 8;
  o.calib.length = 128;
  return o;
}

TEST(GgufQuantize, F32FileGivesTheHfCheckpointsCodes) {
  test::TempDir tmp;
  const fs::path dir = test::model_dir("stories260K");
  const QuantizeOptions o = gptq_options();
  const QuantizeResult g = quantize_model(dir / "gguf" / "stories260K-F32.gguf", tmp / "from-gguf", o);
  quantize_model(dir, tmp / "from-hf", o);
  test::expect_same_parts(tmp / "from-gguf", tmp / "from-hf");
  // The head llama.cpp stored untied stays a plain tensor (--keep); the checkpoint says it is untied.
  const auto got = CheckpointDir::open(tmp / "from-gguf");
  got->validate_against_config();
  EXPECT_FALSE(got->config().tie_word_embeddings);
  EXPECT_FALSE(got->meta("lm_head.weight").format.has_value());
  EXPECT_EQ(g.tensors.size(), got->names().size());
  // Its tokenizer is the file's: it loads and gives the HF tokenizer's ids.
  const std::optional<Tokenizer> tok = got->tokenizer();
  ASSERT_TRUE(tok.has_value());
  const std::string text = "Once upon a time, Lily found a shiny red ball. \"Mom!\" she said.";
  EXPECT_EQ(tok->encode(text, true), Tokenizer::from_file(dir / "tokenizer.json").encode(text, true));
}

TEST(GgufQuantize, BlockQuantizedFileIsRefused) {
  test::TempDir tmp;
  const fs::path file = test::model_dir("stories260K") / "gguf" / "stories260K-Q4_K_M.gguf";
  const auto r = test::run_command(test::nibble_bin() + " quantize -q --method rtn --model " + file.string() +
                                   " --out " + (tmp / "out").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("is stored as Q"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nibble dequantize"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

}  // namespace
}  // namespace nibble
