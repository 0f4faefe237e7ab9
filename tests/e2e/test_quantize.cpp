// End to end: quantize both real fixtures, read the result back, dequantize it,
// and every bad input the issue lists (through the CLI: one line, non-zero
// exit, nothing written under the output name).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "nibble/convert.h"
#include "nibble/error.h"
#include "nibble/source.h"
#include "nibble/util.h"
#include "test_util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda.h"
#endif

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

QuantizeOptions quiet_options(int group = 128) {
  QuantizeOptions o;
  o.group_size = group;
  o.progress = false;
  return o;
}

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

// Checks a packed checkpoint against its source: which tensors are quantized,
// each dequantized weight within half a step (plus FORMAT.md's bf16 allowance),
// untouched tensors bit-identical. Returns the number of weights beyond a plain half step.
int64_t check_packed_against_source(const fs::path& src_dir, const fs::path& packed_dir, int group,
                                    bool head_quantized) {
  auto src = CheckpointDir::open(src_dir);
  auto packed = CheckpointDir::open(packed_dir);
  EXPECT_TRUE(packed->is_packed());
  EXPECT_EQ(packed->names().size(), src->names().size());
  int64_t beyond_half_step = 0;
  for (const std::string& name : src->names()) {
    SCOPED_TRACE(name);
    const TensorMeta m = packed->meta(name);
    const bool is_linear = name.find("_proj.weight") != std::string::npos;
    const bool expect_q = is_linear || (name == "lm_head.weight" && head_quantized);
    EXPECT_EQ(m.format.has_value(), expect_q);
    const Tensor orig = src->load(name);
    if (!expect_q) {
      const Tensor kept = packed->load(name);
      EXPECT_EQ(kept.dtype(), orig.dtype());
      EXPECT_EQ(kept.shape(), orig.shape());
      EXPECT_EQ(std::memcmp(kept.raw(), orig.raw(), orig.nbytes()), 0);
      continue;
    }
    EXPECT_EQ(m.format->canonical_name(), fmt::format("int4_g{}_asym", group));
    const Tensor w = orig.to_f32(), back = packed->load(name);
    const auto parts = packed->parts(name);
    const int64_t rows = w.size(0), cols = w.size(1), gpr = parts[1].size(1);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        const float s = bf16_to_f32(parts[1].data<uint16_t>()[r * gpr + c / group]);
        const float mn = bf16_to_f32(parts[2].data<uint16_t>()[r * gpr + c / group]);
        const double err = std::abs(static_cast<double>(back.data<float>()[r * cols + c]) - w.data<float>()[r * cols + c]);
        const double bound = 0.5 * s + std::ldexp(std::abs(mn), -8) + std::ldexp(15.0 * s, -8);
        if (err > bound) {
          ADD_FAILURE() << "[" << r << ", " << c << "]: error " << err << " > bound " << bound;
          return -1;
        }
        beyond_half_step += err > 0.5 * s;
      }
    }
  }
  return beyond_half_step;
}

TEST(Quantize, Stories260KTiedHeadRaggedGroups) {
  TempDir tmp;
  const fs::path src = test::model_dir("stories260K");
  for (int g : {64, 128}) {
    const fs::path out = tmp / fmt::format("q{}", g);
    const QuantizeResult r = quantize_model(src, out, quiet_options(g));
    EXPECT_EQ(r.format, fmt::format("int4_g{}_asym", g));
    EXPECT_EQ(check_packed_against_source(src, out, g, false), 0);
    EXPECT_FALSE(fs::exists(out / "model.safetensors.index.json"));
    EXPECT_TRUE(fs::exists(out / "tokenizer.json"));
    EXPECT_TRUE(fs::exists(out / "tokenizer_config.json"));
    EXPECT_FALSE(fs::exists(out / "stories260K.bin"));  // not a carried file
    const auto j = read_json(out / "nibble.json");
    EXPECT_EQ(j["method"], "rtn");
    EXPECT_EQ(j["group_size"], g);
    EXPECT_EQ(j["source"]["sha256"]["model.safetensors"], sha256_file(src / "model.safetensors"));
    EXPECT_EQ(j["tensors"]["model.embed_tokens.weight"]["quantized"], false);
    EXPECT_EQ(j["summary"]["quantized_tensors"], 35);  // 5 layers x 7 linears; the tied head stays tied
    EXPECT_GT(j["tensors"]["model.layers.0.mlp.down_proj.weight"]["rel_error"].get<double>(), 0.0);
    EXPECT_LT(j["tensors"]["model.layers.0.mlp.down_proj.weight"]["rel_error"].get<double>(), 0.2);
  }
}

TEST(Quantize, Qwen3ShardedBf16UntiedHead) {
  TempDir tmp;
  const fs::path src = test::model_dir("qwen3-26M-linux");
  const fs::path out = tmp / "q";
  const QuantizeResult r = quantize_model(src, out, quiet_options(128));
  EXPECT_EQ(check_packed_against_source(src, out, 128, true), 0);
  EXPECT_DOUBLE_EQ(r.quantized_bits_per_weight, 4.25);  // every width is a multiple of 128
  const auto j = read_json(out / "nibble.json");
  EXPECT_EQ(j["tensors"]["lm_head.weight"]["quantized"], true);
  EXPECT_DOUBLE_EQ(j["tensors"]["lm_head.weight"]["bits_per_weight"].get<double>(), 4.25);
  for (int i = 1; i <= 4; ++i)
    EXPECT_TRUE(j["source"]["sha256"].contains(fmt::format("model-0000{}-of-00004.safetensors", i)));

  // dequantize: a plain checkpoint whose weights equal the packed dequantization.
  for (DType dt : {DType::F32, DType::BF16}) {
    const fs::path plain = tmp / fmt::format("plain-{}", dtype_name(dt));
    DequantizeOptions d;
    d.dtype = dt;
    d.progress = false;
    dequantize_model(out, plain, d);
    auto a = CheckpointDir::open(out), b = CheckpointDir::open(plain);
    EXPECT_FALSE(b->is_packed());
    b->validate_against_config();
    for (const std::string& name : a->names()) {
      const Tensor x = a->load(name).to_f32().to(dt), y = b->load(name);
      ASSERT_EQ(y.dtype(), dt) << name;
      ASSERT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << name;
    }
    EXPECT_EQ(read_json(plain / "config.json")["dtype"], dt == DType::F32 ? "float32" : "bfloat16");
  }
}

TEST(Quantize, ShardsAndKeepRegex) {
  TempDir tmp;
  const fs::path src = test::model_dir("qwen3-26M-linux");
  QuantizeOptions o = quiet_options(64);
  o.max_shard_bytes = 3 << 20;  // force several shards
  o.keep_regex = "layers\\.[02]\\.mlp\\.down_proj|q_proj";
  quantize_model(src, tmp / "q", o);
  EXPECT_TRUE(fs::exists(tmp / "q" / "model.safetensors.index.json"));
  auto packed = CheckpointDir::open(tmp / "q");
  auto orig = CheckpointDir::open(src);
  const size_t n = packed->weight_files().size();
  EXPECT_GE(n, 5u);  // ~16 MiB in 3 MiB shards
  EXPECT_TRUE(fs::exists(tmp / "q" / fmt::format("model-00001-of-{:05}.safetensors", n)));
  for (const std::string& name : orig->names()) {
    const bool keep = name.find("q_proj") != std::string::npos || name == "model.layers.0.mlp.down_proj.weight" ||
                      name == "model.layers.2.mlp.down_proj.weight";
    if (keep) {
      EXPECT_FALSE(packed->meta(name).format.has_value()) << name;
      EXPECT_EQ(packed->meta(name).dtype, DType::BF16) << name;
    }
    if (name == "model.layers.1.mlp.down_proj.weight") {
      EXPECT_TRUE(packed->meta(name).format.has_value());
    }
  }
  // Same content as an unsharded run.
  QuantizeOptions o1 = o;
  o1.max_shard_bytes = 1ull << 40;
  quantize_model(src, tmp / "q1", o1);
  auto single = CheckpointDir::open(tmp / "q1");
  EXPECT_EQ(single->weight_files().size(), 1u);
  for (const std::string& name : single->names()) {
    const Tensor a = single->load(name), b = packed->load(name);
    ASSERT_EQ(a.nbytes(), b.nbytes());
    ASSERT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << name;
  }
}

// --- Bad input, through the CLI -----------------------------------------------

// A copy of stories260K whose tensors went through `mutate`.
fs::path make_model(const TempDir& tmp, const std::string& name,
                    const std::function<void(std::vector<std::pair<std::string, Tensor>>&)>& mutate) {
  const fs::path src = test::model_dir("stories260K"), dir = tmp / name;
  fs::create_directories(dir);
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"}) fs::copy_file(src / f, dir / f);
  auto cp = CheckpointDir::open(src);
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& n : cp->names()) tensors.emplace_back(n, cp->load(n).contiguous());
  mutate(tensors);
  io::save_safetensors(dir / "model.safetensors", tensors);
  return dir;
}

struct Cli {
  int code;
  std::string err;
};

Cli quantize_cli(const fs::path& model, const fs::path& out, const std::string& extra = "") {
  const auto r = test::run_command(test::nibble_bin() + " quantize --method rtn --model '" + model.string() +
                                   "' --out '" + out.string() + "' " + extra);
  return {r.exit_code, r.err};
}

void expect_clean_failure(const Cli& r, const std::vector<std::string>& needles, const fs::path& out) {
  EXPECT_NE(r.code, 0);
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
  EXPECT_FALSE(fs::exists(out)) << "output written despite the error";
  // no staging leftovers beside it either
  for (const auto& de : fs::directory_iterator(out.parent_path()))
    EXPECT_EQ(de.path().filename().string().find(".nibble-partial"), std::string::npos) << de.path();
}

TEST(QuantizeBadInput, MissingTensor) {
  TempDir tmp;
  auto dir = make_model(tmp, "m", [](auto& t) {
    std::erase_if(t, [](auto& p) { return p.first == "model.layers.3.mlp.up_proj.weight"; });
  });
  expect_clean_failure(quantize_cli(dir, tmp / "out"), {"model.layers.3.mlp.up_proj.weight", "missing"}, tmp / "out");
}

TEST(QuantizeBadInput, ShapeDisagreesWithConfig) {
  TempDir tmp;
  auto dir = make_model(tmp, "m", [](auto& t) {
    for (auto& [n, x] : t)
      if (n == "model.layers.1.self_attn.k_proj.weight") x = x.reshape({64, 32});
  });
  expect_clean_failure(quantize_cli(dir, tmp / "out"), {"k_proj.weight", "[64, 32]", "[32, 64]"}, tmp / "out");
}

TEST(QuantizeBadInput, NonTwoDimensionalLinear) {
  TempDir tmp;
  auto dir = make_model(tmp, "m", [](auto& t) {
    for (auto& [n, x] : t)
      if (n == "model.layers.0.self_attn.o_proj.weight") x = x.reshape({4096});
  });
  expect_clean_failure(quantize_cli(dir, tmp / "out"), {"o_proj.weight", "[4096]", "[64, 64]"}, tmp / "out");
}

TEST(QuantizeBadInput, NonFiniteWeight) {
  TempDir tmp;
  auto dir = make_model(tmp, "m", [](auto& t) {
    for (auto& [n, x] : t)
      if (n == "model.layers.2.mlp.gate_proj.weight") x.template data_mut<float>()[5 * 64 + 7] = NAN;
  });
  expect_clean_failure(quantize_cli(dir, tmp / "out"),
                       {"model.layers.2.mlp.gate_proj.weight", "[5, 7]", "--allow-nonfinite"}, tmp / "out");
  // A calibrated method scans beside its calibration: the same message, and
  // no state is kept for a --resume that would fail the same way.
  std::string text;
  for (int i = 0; i < 40; ++i) text += "Once upon a time there was a little girl who liked to play in the park. ";
  write_file_atomic(tmp / "calib.txt", text);
  const auto g = test::run_command(test::nibble_bin() + " quantize --method gptq --calib-samples 2 --calib-len 32 " +
                                   "--calib '" + (tmp / "calib.txt").string() + "' --model '" + dir.string() +
                                   "' --out '" + (tmp / "out").string() + "'");
  expect_clean_failure({g.exit_code, g.err}, {"model.layers.2.mlp.gate_proj.weight", "[5, 7]", "--allow-nonfinite"},
                       tmp / "out");
  // With --allow-nonfinite the tensor stays unquantized, with a warning.
  const Cli ok = quantize_cli(dir, tmp / "out", "--allow-nonfinite -q");
  ASSERT_EQ(ok.code, 0) << ok.err;
  EXPECT_NE(ok.err.find("warning"), std::string::npos);
  auto packed = CheckpointDir::open(tmp / "out");
  EXPECT_FALSE(packed->meta("model.layers.2.mlp.gate_proj.weight").format.has_value());
  EXPECT_TRUE(packed->meta("model.layers.2.mlp.up_proj.weight").format.has_value());
  EXPECT_NE(read_json(tmp / "out" / "nibble.json")["warnings"].dump().find("gate_proj"), std::string::npos);
}

TEST(QuantizeBadInput, TruncatedWeights) {
  TempDir tmp;
  auto dir = make_model(tmp, "m", [](auto&) {});
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 100);
  expect_clean_failure(quantize_cli(dir, tmp / "out"), {(dir / "model.safetensors").string()}, tmp / "out");
}

TEST(QuantizeBadInput, OutputCannotBeWritten) {
  TempDir tmp;
  std::ofstream(tmp / "a-file") << "x";
  const Cli r = quantize_cli(test::model_dir("stories260K"), tmp / "a-file" / "out");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("a-file"), std::string::npos) << r.err;
  // An existing non-empty output is not replaced without --force.
  fs::create_directory(tmp / "full");
  std::ofstream(tmp / "full" / "keep.txt") << "precious";
  const Cli r2 = quantize_cli(test::model_dir("stories260K"), tmp / "full", "-q");
  EXPECT_NE(r2.code, 0);
  EXPECT_NE(r2.err.find("--force"), std::string::npos) << r2.err;
  EXPECT_TRUE(fs::exists(tmp / "full" / "keep.txt"));
  const Cli r3 = quantize_cli(test::model_dir("stories260K"), tmp / "full", "-q --force");
  EXPECT_EQ(r3.code, 0) << r3.err;
  EXPECT_FALSE(fs::exists(tmp / "full" / "keep.txt"));
  EXPECT_TRUE(fs::exists(tmp / "full" / "nibble.json"));
}

TEST(QuantizeBadInput, MiscUsageErrors) {
  TempDir tmp;
  expect_clean_failure(quantize_cli(tmp / "no-such-model", tmp / "out"), {"no-such-model", "not a directory"},
                       tmp / "out");
  expect_clean_failure(quantize_cli(test::model_dir("stories260K"), tmp / "out", "--keep '(['"),
                       {"--keep", "not a valid regular expression"}, tmp / "out");
  // A packed checkpoint is not quantized twice.
  ASSERT_EQ(quantize_cli(test::model_dir("stories260K"), tmp / "p", "-q").code, 0);
  expect_clean_failure(quantize_cli(tmp / "p", tmp / "out"), {"already quantized"}, tmp / "out");
  // Group sizes outside the format's list are refused by the CLI.
  const Cli g = quantize_cli(test::model_dir("stories260K"), tmp / "out", "--group 48");
  EXPECT_NE(g.code, 0);
  EXPECT_FALSE(fs::exists(tmp / "out"));
  // Counts and sizes say what they want (CLI11's own range validators printed their bound as 309 digits).
  const Cli d = quantize_cli(test::model_dir("stories260K"), tmp / "out", "--damp -0.5");
  EXPECT_NE(d.code, 0);
  EXPECT_NE(d.err.find("--damp: must be >= 0, found -0.5"), std::string::npos) << d.err;
  const Cli c = quantize_cli(test::model_dir("stories260K"), tmp / "out", "--calib-samples 0");
  EXPECT_NE(c.code, 0);
  EXPECT_NE(c.err.find("--calib-samples: must be > 0, found 0"), std::string::npos) << c.err;
  EXPECT_EQ(c.err.find("00000000"), std::string::npos) << c.err;
  // The rotation's seed is unsigned: -1 is refused, not wrapped to 2^64 - 1.
  const Cli r = quantize_cli(test::model_dir("stories260K"), tmp / "out", "--rotate-seed -1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--rotate-seed: must be >= 0, found -1"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

// --device cuda fails at once (one line, nothing written) where it cannot run:
// rtn has no GPU backend anywhere; gptq needs a CUDA build and a visible GPU.
TEST(QuantizeBadInput, DeviceCudaFailsBeforeAnyWork) {
  TempDir tmp;
  const fs::path model = test::model_dir("stories260K");
  expect_clean_failure(quantize_cli(model, tmp / "out", "--device cuda"), {"--device cuda", "only the gptq method"},
                       tmp / "out");
  const Cli bad = quantize_cli(model, tmp / "out", "--device tpu");
  EXPECT_NE(bad.code, 0);
  EXPECT_FALSE(fs::exists(tmp / "out"));
#ifdef NIBBLE_HAVE_CUDA
  if (cuda::device_available()) GTEST_SKIP() << "a CUDA device is present: gptq --device cuda would run";
  const char* why = "no CUDA device";
#else
  const char* why = "no CUDA backend";
#endif
  // --calib names any existing file: the device check comes before it is read.
  const auto r = test::run_command(test::nibble_bin() + " quantize --method gptq --device cuda --model '" +
                                   model.string() + "' --out '" + (tmp / "out").string() + "' --calib '" +
                                   (model / "config.json").string() + "'");
  expect_clean_failure({r.exit_code, r.err}, {"--device cuda", why}, tmp / "out");
}

TEST(Inspect, SummaryAndTensorValues) {
  TempDir tmp;
  ASSERT_EQ(quantize_cli(test::model_dir("qwen3-26M-linux"), tmp / "p", "-q").code, 0);
  auto r = test::run_command(test::nibble_bin() + " inspect " + (tmp / "p").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("format: int4_g128_asym"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lm_head.weight"), std::string::npos);
  EXPECT_NE(r.out.find("quantized: 43 matrices, 22.282 M params"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("4.250"), std::string::npos);
  // A single shard file of the source, and one tensor's values.
  r = test::run_command(test::nibble_bin() + " inspect " +
                        (test::model_dir("qwen3-26M-linux") / "model-00001-of-00004.safetensors").string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("BF16"), std::string::npos);
  r = test::run_command(test::nibble_bin() + " inspect " + (tmp / "p").string() +
                        " --tensor model.layers.0.mlp.down_proj.weight --rows 1 --cols 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto packed = CheckpointDir::open(tmp / "p");
  const Tensor w = packed->load("model.layers.0.mlp.down_proj.weight");
  EXPECT_NE(r.out.find(fmt::format("{:.6g}", w.data<float>()[0])), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(dequantized)"), std::string::npos);
  r = test::run_command(test::nibble_bin() + " inspect " + (tmp / "p").string() + " --tensor nope");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no tensor named 'nope'"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace nibble
