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

namespace nibble {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

bool is_linear(const std::string& name) {
  for (const char* l : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    if (name.find(std::string(".") + l + ".weight") != std::string::npos) return true;
  return false;
}

// GPTQ v1 parts of w [out, in] (groups of 128, min/max RTN) and the weight they define, f32 [out, in].
struct Packed {
  Tensor qweight, qzeros, scales, dequantized;
};
Packed pack_gptq_v1(const Tensor& w32) {
  const int64_t out = w32.size(0), in = w32.size(1), gs = 128, groups = in / gs;
  const float* w = w32.data<float>();
  Packed p;
  p.qweight = Tensor::zeros(DType::I32, {in / 8, out});
  p.qzeros = Tensor::zeros(DType::I32, {groups, out / 8});
  p.scales = Tensor::empty(DType::F16, {groups, out});
  p.dequantized = Tensor::empty(DType::F32, {out, in});
  auto* qw = static_cast<uint32_t*>(p.qweight.raw_mut());
  auto* qz = static_cast<uint32_t*>(p.qzeros.raw_mut());
  auto* sc = static_cast<uint16_t*>(p.scales.raw_mut());
  float* dq = p.dequantized.data_mut<float>();
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n = 0; n < out; ++n) {
      float mn = 0, mx = 0;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k)
        mn = std::min(mn, w[n * in + k]), mx = std::max(mx, w[n * in + k]);
      const uint16_t s16 = f32_to_f16(std::max((mx - mn) / 15.0f, 1e-6f));
      const float s = f16_to_f32(s16);
      const uint32_t z = static_cast<uint32_t>(std::clamp(std::nearbyint(-mn / s), 0.0f, 15.0f));
      sc[g * out + n] = s16;
      qz[g * (out / 8) + n / 8] |= z << (4 * (n % 8));
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
        const uint32_t q =
            static_cast<uint32_t>(std::clamp(std::nearbyint(w[n * in + k] / s) + static_cast<float>(z), 0.0f, 15.0f));
        qw[(k / 8) * out + n] |= q << (4 * (k % 8));
        dq[n * in + k] = s * (static_cast<float>(q) - static_cast<float>(z));
      }
    }
  // v1 stores every zero minus one, taken from the packed word as a whole.
  for (int64_t i = 0; i < p.qzeros.numel(); ++i) qz[i] -= 0x11111111u;
  return p;
}

void write_dir(const fs::path& dir, const std::vector<std::pair<std::string, Tensor>>& tensors, const json& cfg) {
  fs::create_directories(dir);
  std::vector<io::OutputUnit> plan;
  for (const auto& [name, t] : tensors) plan.push_back({name, {{name, t.dtype(), t.shape()}}, ""});
  io::ShardedWriter w(dir, plan, uint64_t{1} << 40, {{"format", "pt"}});
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
  std::ofstream(dir / "config.json") << cfg.dump(2);
  fs::copy_file(test::model_dir("qwen3-26M-linux") / "tokenizer.json", dir / "tokenizer.json");
}

Tensor logits_of(const ModelSource& src) {
  auto model = Model::load(src);
  KVCache cache(model->config(), 32);
  return model->forward({1, 17, 300, 42, 4000, 5, 77, 1024}, cache);
}

TEST(RivalCheckpoint, GptqDirectoryRunsAsItsDequantizedWeights) {
  test::TempDir tmp;
  const auto base = CheckpointDir::open(test::model_dir("qwen3-26M-linux"));
  std::vector<std::pair<std::string, Tensor>> rival, plain;
  for (const std::string& name : base->names()) {
    const Tensor t = base->load(name);
    if (!is_linear(name)) {
      rival.emplace_back(name, t);
      plain.emplace_back(name, t);
      continue;
    }
    const Packed p = pack_gptq_v1(t.to_f32());
    const std::string prefix = name.substr(0, name.size() - 7);
    rival.emplace_back(prefix + ".qweight", p.qweight);
    rival.emplace_back(prefix + ".qzeros", p.qzeros);
    rival.emplace_back(prefix + ".scales", p.scales);
    // Old AutoGPTQ releases stored an all-zero fp16 bias for linears that have none.
    rival.emplace_back(prefix + ".bias", Tensor::zeros(DType::F16, {t.size(0)}));
    plain.emplace_back(name, p.dequantized);
  }
  std::ifstream cf(test::model_dir("qwen3-26M-linux") / "config.json");
  json cfg = json::parse(cf);
  write_dir(tmp / "plain", plain, cfg);
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4},         {"group_size", 128},
                                {"sym", false},           {"desc_act", false}, {"checkpoint_format", "gptq"}};
  write_dir(tmp / "gptq", rival, cfg);

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

  // dequantize: a plain checkpoint of the same weights, its config without the quantization_config.
  const auto r = test::run_command(test::nibble_bin() + " dequantize -q --model " + (tmp / "gptq").string() +
                                   " --out " + (tmp / "hf").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream hf_cfg(tmp / "hf" / "config.json");
  EXPECT_FALSE(json::parse(hf_cfg).contains("quantization_config"));
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
