// A whole GPTQ checkpoint through RivalSource: qwen3-26M-linux's linears,
// rounded to 4-bit g128 codes and packed here in GPTQ's v1 layout (the layout
// itself is checked against GPTQModel's own vectors in test_rival.cpp), must
// run exactly as a plain checkpoint holding scale · (q − z) does (also with
// the all-zero biases old AutoGPTQ releases stored), be found by
// open_model_source, and come back from `nibble dequantize` as that plain
// checkpoint without its quantization_config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/checkpoint_writer.h"
#include "nibble/dtype.h"
#include "nibble/model.h"
#include "nibble/rival.h"
#include "test_util.h"
#include "unit/gptq_checkpoint.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

Tensor logits_of(const ModelSource& src) {
  auto model = Model::load(src);
  KVCache cache(model->config(), 32);
  return model->forward({1, 17, 300, 42, 4000, 5, 77, 1024}, cache);
}

TEST(RivalCheckpoint, GptqDirectoryRunsAsItsDequantizedWeights) {
  test::TempDir tmp;
  // Old AutoGPTQ releases stored an all-zero fp16 bias for linears that have none.
  test::write_gptq_qwen3(tmp.path(), /*zero_bias=*/true);
  const auto base = CheckpointDir::open(test::model_dir("qwen3-26M-linux"));

  // Found by its config; the packed parts hidden behind each linear's weight.
  const auto src = open_model_source((tmp / "gptq").string());
  ASSERT_NE(dynamic_cast<const RivalSource*>(src.get()), nullptr);
  src->validate_against_config();
  const size_t n_linears = 7 * static_cast<size_t>(src->config().num_layers);
  EXPECT_EQ(src->names().size(), base->names().size() + n_linears);  // the zero biases are plain tensors
  EXPECT_FALSE(src->contains("model.layers.0.mlp.up_proj.qweight"));
  const TensorMeta m = src->meta("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(m.shape, base->meta("model.layers.0.mlp.up_proj.weight").shape);
  EXPECT_EQ(m.stored_bytes, 1536u * 512 / 2 + 4 * 1536 / 2 + 4 * 1536 * 2);  // codes, zeros, fp16 scales

  const auto plain_src = CheckpointDir::open(tmp / "plain");
  const Tensor a = logits_of(*src), b = logits_of(*plain_src);
  ASSERT_EQ(a.shape(), b.shape());
  // The same f32 weights, the same forward; adding a zero bias changes no value.
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);

  // dequantize: a plain checkpoint of the same weights, its config without the quantization_config,
  // and without the copies AutoGPTQ and auto-round keep beside it.
  for (const char* f : {"quantize_config.json", "quantization_config.json"})
    std::ofstream(tmp / "gptq" / f) << R"({"quant_method": "gptq", "bits": 4, "group_size": 128})";
  const auto r = test::run_command(test::nibble_bin() + " dequantize -q --model " + (tmp / "gptq").string() +
                                   " --out " + (tmp / "hf").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream hf_cfg(tmp / "hf" / "config.json");
  EXPECT_FALSE(json::parse(hf_cfg).contains("quantization_config"));
  EXPECT_FALSE(fs::exists(tmp / "hf" / "quantize_config.json"));
  EXPECT_FALSE(fs::exists(tmp / "hf" / "quantization_config.json"));
  const auto hf = CheckpointDir::open(tmp / "hf");
  const Tensor w1 = hf->load("model.layers.3.self_attn.o_proj.weight"),
               w2 = plain_src->load("model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(std::memcmp(w1.raw(), w2.raw(), w1.nbytes()), 0);

  // quantize refuses it, naming what it is.
  const auto q = test::run_command(test::nibble_bin() + " quantize -q --method rtn --model " + (tmp / "gptq").string() +
                                   " --out " + (tmp / "again").string());
  EXPECT_NE(q.exit_code, 0);
  EXPECT_NE(q.err.find("already quantized (gptq)"), std::string::npos) << q.err;
  // hf: names plain checkpoints only.
  EXPECT_NE(test::error_of([&] { open_model_source("hf:" + (tmp / "gptq").string()); }).find("quantized (gptq)"),
            std::string::npos);
}

}  // namespace
}  // namespace nibble
