// End to end for the transforms of `nibble quantize --method` (issue 7): what
// the checkpoints hold, that they run, and that a rotated checkpoint
// dequantizes back to a plain model computing the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <tuple>

#include <nlohmann/json.hpp>

#include "nibble/convert.h"
#include "nibble/model.h"
#include "nibble/source.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

std::vector<float> logits_of(const fs::path& dir, int64_t n) {
  auto src = CheckpointDir::open(dir);
  const auto m = Model::load(*src);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) ids.push_back(static_cast<int32_t>((i * 53 + 7) % src->config().vocab_size));
  KVCache cache(src->config(), n);
  const Tensor l = m->forward(ids, cache, true);
  return {l.data<float>(), l.data<float>() + l.numel()};
}

QuantizeOptions options(const std::string& method, const std::string& format, int group, const fs::path& calib) {
  QuantizeOptions o;
  o.method = method;
  o.format = format;
  o.group_size = group;
  o.progress = false;
  if (!calib.empty()) {
    o.calib.files = {calib};
    o.calib.samples = 16;
    o.calib.length = 256;
  }
  return o;
}

TEST(MethodsE2E, RotatedCheckpointRunsAndDequantizesToThePlainModelItComputes) {
  TempDir tmp;
  // qwen3: MLP width 1536 = 12·128, so down_proj's input is rotated online.
  const fs::path model = test::model_dir("qwen3-26M-linux");
  const QuantizeResult r = quantize_model(model, tmp / "rot", options("rotate", "int4_asym", 128, {}));
  const auto info = read_json(tmp / "rot/nibble.json");
  EXPECT_EQ(info["method"], "rotate+rtn");
  EXPECT_EQ(info["online_rotation"]["down_proj"]["size"], 1536);
  auto packed = CheckpointDir::open(tmp / "rot");
  ASSERT_TRUE(packed->down_proj_rotation().has_value());
  // The norm gains moved into the linears.
  const Tensor g = packed->load("model.layers.2.input_layernorm.weight").to_f32();
  for (int64_t j = 0; j < g.numel(); ++j) ASSERT_EQ(g.data<float>()[j], 1.0f);

  // Plain HF weights: the online rotation folded back into down_proj.
  DequantizeOptions d;
  d.progress = false;
  dequantize_model(tmp / "rot", tmp / "plain", d);
  EXPECT_FALSE(CheckpointDir::open(tmp / "plain")->down_proj_rotation().has_value());
  const std::vector<float> a = logits_of(tmp / "rot", 20), b = logits_of(tmp / "plain", 20);
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  EXPECT_LT(diff, 1e-3);  // f32 reassociation of the fold (W·Qᵀ) against the online z·Q, logits of magnitude ~10–20
  // The rotation changed what was rounded: the quantized model is not the
  // plain RTN one.
  quantize_model(model, tmp / "rtn", options("rtn", "int4_asym", 128, {}));
  const std::vector<float> c = logits_of(tmp / "rtn", 20);
  double rd = 0;
  for (size_t i = 0; i < a.size(); ++i) rd = std::max(rd, static_cast<double>(std::abs(a[i] - c[i])));
  EXPECT_GT(rd, 1e-2);
  (void)r;
}

TEST(MethodsE2E, TiedHeadIsUntiedByTheRotation) {
  TempDir tmp;
  const fs::path model = test::model_dir("stories260K");  // tied head, MLP width 172: no online rotation
  const QuantizeResult r = quantize_model(model, tmp / "rot", options("rotate", "int4_asym", 64, {}));
  EXPECT_FALSE(read_json(tmp / "rot/config.json")["tie_word_embeddings"].get<bool>());
  bool noted = false;
  for (const auto& n : r.notes) noted = noted || n.find("172") != std::string::npos;
  EXPECT_TRUE(noted);
  auto packed = CheckpointDir::open(tmp / "rot");
  // The untied head stays unquantized, as the tied one does without the rotation.
  EXPECT_FALSE(packed->meta("lm_head.weight").format.has_value());
  for (float v : logits_of(tmp / "rot", 12)) ASSERT_TRUE(std::isfinite(v));
}

TEST(MethodsE2E, LayerTransformsRecordTheirChoicesAndKeepRescaledTensorsInF32) {
  TempDir tmp;
  const std::string all = test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt");
  std::ofstream(tmp / "calib.txt", std::ios::binary) << all.substr(0, 96207);
  const fs::path model = test::model_dir("stories260K");
  for (const auto& [method, format, group] :
       {std::tuple{"awq+gptq", "int4_asym", 64}, std::tuple{"smoothquant", "int8_channel_sym", 0}}) {
    const fs::path out = tmp / method;
    const QuantizeResult r = quantize_model(model, out, options(method, format, group, tmp / "calib.txt"));
    const auto info = read_json(out / "nibble.json");
    const auto& t = info["calibration"]["transform"];
    ASSERT_EQ(t.size(), 5u) << method;  // one entry per layer
    EXPECT_TRUE(t["layer-00000"]["qkv"].contains("alpha")) << method;
    if (std::string(method) == "smoothquant") {
      EXPECT_EQ(info["activations"], "int8_token");  // the default of a W8A8 method
      EXPECT_EQ(CheckpointDir::open(out)->activation_quant(), "int8_token");
    } else {
      EXPECT_FALSE(info.contains("activations"));
      // AWQ never loses to plain rounding on its own objective.
      for (const auto& [layer, groups] : t.items())
        for (const auto& [g, v] : groups.items())
          if (v.is_object()) {
            EXPECT_LE(v["error"].get<double>(), v["error_unscaled"].get<double>()) << layer << g;
          }
    }
    auto packed = CheckpointDir::open(out);
    const std::string norm = "model.layers.1.input_layernorm.weight";
    EXPECT_EQ(packed->meta(norm).dtype, DType::F32) << method;
    if (std::string(method) == "smoothquant") {  // always rescales: the stored gain is the folded one
      const Tensor a = packed->load(norm).to_f32(), b = CheckpointDir::open(model)->load(norm).to_f32();
      double d = 0;
      for (int64_t j = 0; j < a.numel(); ++j) d = std::max(d, static_cast<double>(std::abs(a.data<float>()[j] - b.data<float>()[j])));
      EXPECT_GT(d, 1e-3);
    }
    for (float v : logits_of(out, 12)) ASSERT_TRUE(std::isfinite(v));
    (void)r;
  }
  // A bad activation quantizer fails before anything is written.
  QuantizeOptions o = options("rtn", "int8_channel_sym", 0, {});
  o.activations = "int3_token";
  const std::string e = test::error_of([&] { quantize_model(model, tmp / "bad", o); });
  EXPECT_NE(e.find("int3_token"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(tmp / "bad"));
}

}  // namespace
}  // namespace nibble
