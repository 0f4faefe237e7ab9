// Every registry row end to end on stories260K: quantize (RTN) into a packed
// checkpoint, read it back, check each matrix against the reference quantizer
// bit for bit and the bits per weight nibble.json reports against the stored
// bytes, then load the model (int4_asym through its kernel, every other format
// dequantized to f32) and run it. GPTQ through a non-int4 format too.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "nibble/convert.h"
#include "nibble/format.h"
#include "nibble/model.h"
#include "nibble/npy.h"
#include "nibble/quantizer.h"
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

// Logits of the first tokens of a story, from a loaded model.
std::vector<float> logits_of(const ModelSource& src) {
  const auto model = Model::load(src);
  KVCache cache(model->config(), 16);
  const Tensor t = model->forward({1, 403, 407, 261, 378}, cache, false);
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(FormatsEndToEnd, EveryFormatQuantizesLoadsAndRunsStories260K) {
  TempDir tmp;
  const fs::path src_dir = test::model_dir("stories260K");
  auto src = CheckpointDir::open(src_dir);
  const std::vector<float> reference = logits_of(*src);
  for (const FormatSpec* spec : format_registry()) {
    const FormatChoice f = find_format(spec->family);  // the family's default group size
    SCOPED_TRACE(f.canonical_name());
    const fs::path out = tmp / f.canonical_name();
    QuantizeOptions o;
    o.format = std::string(spec->family);
    o.progress = false;
    const QuantizeResult r = quantize_model(src_dir, out, o);
    EXPECT_EQ(r.format, f.canonical_name());
    auto packed = CheckpointDir::open(out);
    ASSERT_TRUE(packed->is_packed());
    EXPECT_EQ(packed->metadata().at(kMetaFormat), f.canonical_name());
    EXPECT_EQ(packed->metadata().at(kMetaGroupSize), std::to_string(f.group_size));
    const auto j = read_json(out / "nibble.json");
    uint64_t qbytes = 0, qparams = 0;
    for (const std::string& name : src->names()) {
      const TensorMeta m = packed->meta(name);
      if (!m.format) continue;
      EXPECT_EQ(m.format->canonical_name(), f.canonical_name());
      const Tensor w = src->load(name).to_f32();
      const int64_t rows = w.size(0), cols = w.size(1);
      // The stored matrix is the reference quantizer's, bit for bit.
      std::vector<float> expect(static_cast<size_t>(rows * cols));
      dequantize(quant::quantize_rtn(f, w.data<float>(), rows, cols), expect.data());
      const Tensor back = packed->load(name);
      ASSERT_EQ(std::memcmp(back.raw(), expect.data(), expect.size() * 4), 0) << name;
      const auto& t = j["tensors"][name];
      EXPECT_EQ(t["bytes"].get<uint64_t>(), m.stored_bytes) << name;
      EXPECT_DOUBLE_EQ(t["bits_per_weight"].get<double>(), 8.0 * m.stored_bytes / (rows * cols)) << name;
      EXPECT_DOUBLE_EQ(t["bits_per_weight"].get<double>(), bits_per_weight(f, rows, cols)) << name;
      qbytes += m.stored_bytes;
      qparams += static_cast<uint64_t>(rows * cols);
    }
    EXPECT_EQ(j["summary"]["quantized_tensors"], 35);
    EXPECT_DOUBLE_EQ(j["summary"]["quantized_bits_per_weight"].get<double>(), 8.0 * qbytes / qparams);
    // Loads (packed kernel or dequantized fallback) and runs; every format
    // gives finite logits, and the 8-bit formats with 3+ mantissa bits stay
    // close to the original model's (measured: about 0.01-0.03).
    const std::vector<float> logits = logits_of(*packed);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    if (spec->code_bits == 8 && spec->family.find("e5m2") == std::string_view::npos) {
      EXPECT_LT(rel_diff(logits, reference), 0.05);
    }
  }
}

TEST(FormatsEndToEnd, GptqWritesNonInt4Formats) {
  TempDir tmp;
  const std::string all = test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt");
  std::ofstream(tmp / "calib.txt", std::ios::binary) << all.substr(0, 96207);
  for (const char* name : {"nvfp4", "int8_channel_sym", "int4_tensor_asym"}) {
    SCOPED_TRACE(name);
    QuantizeOptions o;
    o.method = "gptq";
    o.format = name;
    o.progress = false;
    o.calib.files = {tmp / "calib.txt"};
    o.calib.samples = 16;
    o.calib.length = 128;
    const fs::path out = tmp / name;
    const QuantizeResult r = quantize_model(test::model_dir("stories260K"), out, o);
    EXPECT_EQ(r.format, name);
    auto packed = CheckpointDir::open(out);
    const std::vector<float> logits = logits_of(*packed);
    for (float v : logits) ASSERT_TRUE(std::isfinite(v));
    EXPECT_EQ(read_json(out / "nibble.json")["method"], "gptq");
  }
}

}  // namespace
}  // namespace nibble

namespace nibble {
namespace {

// The CLI side: quantize accepts every registry name and refuses group sizes a
// format does not have, inspect --formats lists the registry, and layer
// reports SQNR and output error for any format.
TEST(FormatsCli, QuantizeInspectAndLayerTakeEveryFormat) {
  TempDir tmp;
  const std::string nb = test::nibble_bin();
  const auto list = test::run_command(nb + " inspect --formats");
  ASSERT_EQ(list.exit_code, 0) << list.err;
  for (const std::string& n : format_names()) EXPECT_NE(list.out.find(n), std::string::npos) << n;
  const auto help = test::run_command(nb + " quantize --help");
  EXPECT_NE(help.out.find("nvfp4"), std::string::npos);
  EXPECT_NE(help.out.find("int5_tensor_asym"), std::string::npos);

  const std::string model = test::model_dir("stories260K").string();
  auto r = test::run_command(nb + " quantize -q --format fp8_e4m3_channel --model " + model + " --out " +
                             (tmp / "fp8").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("fp8_e4m3_channel"), std::string::npos) << r.out;
  r = test::run_command(nb + " inspect " + (tmp / "fp8").string());
  EXPECT_NE(r.out.find("format: fp8_e4m3_channel"), std::string::npos) << r.out;
  r = test::run_command(nb + " quantize -q --format int4_g64_sym --model " + model + " --out " + (tmp / "s").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = test::run_command(nb + " quantize -q --format mxfp4 --group 64 --model " + model + " --out " +
                        (tmp / "bad").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("group size 64"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "bad"));
  r = test::run_command(nb + " run -q --model " + (tmp / "fp8").string() + " --prompt 'Once upon a time' -n 8");
  EXPECT_EQ(r.exit_code, 0) << r.err;

  // nibble layer on a random matrix with every format: SQNR and output error in the report.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> w(16 * 64), x(128 * 64);
  for (auto& v : w) v = 0.02f * normal(rng);
  for (auto& v : x) v = normal(rng);
  io::write_npy(tmp / "W.npy", Tensor::view(DType::F32, {16, 64}, w.data(), nullptr));
  io::write_npy(tmp / "X.npy", Tensor::view(DType::F32, {128, 64}, x.data(), nullptr));
  for (const std::string& n : format_names()) {
    SCOPED_TRACE(n);
    const fs::path rep = tmp / (n + ".json");
    r = test::run_command(nb + " layer -q --weight " + (tmp / "W.npy").string() + " --inputs " +
                          (tmp / "X.npy").string() + " --method rtn --format " + n + " --out " +
                          (tmp / "Q.npy").string() + " --report " + rep.string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.out.find("SQNR"), std::string::npos) << r.out;
    const auto j = read_json(rep);
    EXPECT_EQ(j["grid_format"], n);
    const double rel = j["output_rel_err_calib"].get<double>(), sqnr = j["output_sqnr_db_calib"].get<double>();
    EXPECT_NEAR(sqnr, -20.0 * std::log10(rel), 1e-9);
    EXPECT_GT(sqnr, 0.0);
    EXPECT_GT(j["weight_sqnr_db"].get<double>(), 0.0);
  }
}

}  // namespace
}  // namespace nibble
