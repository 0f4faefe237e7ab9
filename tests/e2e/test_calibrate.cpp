// End to end for calibrated quantization (GPTQ): the calibration sampler, the
// layer stream against the whole-model forward, GPTQ checkpoints of both real
// fixtures measured on held-out text, determinism, and resuming a killed run.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "nibble/calibration.h"
#include "nibble/convert.h"
#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/npy.h"
#include "nibble/tokenizer.h"
#include "stories_split.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

TEST(Calibration, SamplesAreDeterministicWindowsOfTheData) {
  TempDir tmp;
  const fs::path calib = test::write_stories_part(tmp, "calib.txt", 0, 96207);
  const fs::path model = test::model_dir("stories260K");
  const Tokenizer tok = Tokenizer::from_file(model / "tokenizer.json");
  const auto stream = tok.encode(test::read_file(calib), false);
  CalibrationOptions o;
  o.files = {calib};
  o.samples = 16;
  o.length = 100;
  o.seed = 7;
  const auto bos = leading_bos(tok);
  ASSERT_TRUE(bos.has_value());
  const CalibrationSet a = load_calibration(o, &tok, bos, 512, tok.vocab_size());
  const CalibrationSet b = load_calibration(o, &tok, bos, 512, tok.vocab_size());
  ASSERT_EQ(a.sequences, b.sequences);
  EXPECT_EQ(a.sha256, b.sha256);
  EXPECT_EQ(a.stream_tokens, static_cast<int64_t>(stream.size()));
  ASSERT_EQ(a.sequences.size(), 16u);
  for (const auto& s : a.sequences) {
    ASSERT_EQ(s.size(), 100u);
    EXPECT_EQ(s[0], *bos);
    // The rest is a contiguous window of the tokenized file.
    const auto it = std::search(stream.begin(), stream.end(), s.begin() + 1, s.end());
    EXPECT_NE(it, stream.end());
  }
  o.seed = 8;
  EXPECT_NE(load_calibration(o, &tok, bos, 512, tok.vocab_size()).sha256, a.sha256);
  // --calib-windows first: the data's first 16 x 99 tokens, window after window, whatever the seed.
  o.windows = "first";
  const CalibrationSet f = load_calibration(o, &tok, bos, 512, tok.vocab_size());
  ASSERT_EQ(f.sequences.size(), 16u);
  for (size_t s = 0; s < 16; ++s) {
    std::vector<int32_t> want = {*bos};
    want.insert(want.end(), stream.begin() + 99 * s, stream.begin() + 99 * (s + 1));
    EXPECT_EQ(f.sequences[s], want) << s;
  }
  o.seed = 7;
  EXPECT_EQ(load_calibration(o, &tok, bos, 512, tok.vocab_size()).sha256, f.sha256);
  o.samples = static_cast<int64_t>(stream.size()) / 99 + 1;  // one window more than the data holds
  EXPECT_NE(test::error_of([&] { load_calibration(o, &tok, bos, 512, tok.vocab_size()); })
                .find("--calib-windows first: "),
            std::string::npos);
  o.samples = 16;
  o.windows = "random";
  // Clipping to the context, noted.
  o.length = 4096;
  const CalibrationSet c = load_calibration(o, &tok, bos, 512, tok.vocab_size());
  EXPECT_EQ(c.length, 512);
  ASSERT_FALSE(c.notes.empty());
  EXPECT_NE(c.notes[0].find("context"), std::string::npos);
  // Token ids from .npy are used as they are.
  std::vector<int32_t> ids(300);
  for (int i = 0; i < 300; ++i) ids[i] = (i * 7) % 500;
  io::write_npy(tmp / "ids.npy", Tensor::view(DType::I32, {300}, ids.data(), nullptr));
  CalibrationOptions n;
  n.files = {tmp / "ids.npy"};
  n.samples = 3;
  n.length = 50;
  const CalibrationSet d = load_calibration(n, nullptr, std::nullopt, 512, 512);
  for (const auto& s : d.sequences) {
    ASSERT_EQ(s.size(), 50u);
    EXPECT_NE(std::search(ids.begin(), ids.end(), s.begin(), s.end()), ids.end());
  }
  ids[10] = 9999;  // outside the vocabulary
  io::write_npy(tmp / "bad.npy", Tensor::view(DType::I32, {300}, ids.data(), nullptr));
  n.files = {tmp / "bad.npy"};
  EXPECT_THROW(load_calibration(n, nullptr, std::nullopt, 512, 512), Error);
}

TEST(LayerStream, MatchesTheWholeModelForward) {
  for (const char* name : {"stories260K", "qwen3-26M-linux"}) {
    auto dir = CheckpointDir::open(test::model_dir(name));
    const auto model = Model::load(*dir);
    std::vector<std::vector<int32_t>> seqs = {{1, 5, 9, 200, 17, 3}, {4, 4, 4, 100}};
    LayerStream stream(*dir, seqs);
    // A tap sees every linear input of every layer with the right widths.
    const ModelConfig& c = dir->config();
    int64_t calls = 0;
    const InputTap tap = [&](LinearInput which, const float*, int64_t n, int64_t dim) {
      ++calls;
      EXPECT_EQ(n == 6 || n == 4, true);
      const int64_t want = which == LinearInput::O      ? c.num_heads * c.head_dim
                           : which == LinearInput::Down ? c.intermediate_size
                                                        : c.hidden_size;
      EXPECT_EQ(dim, want);
    };
    for (int64_t i = 0; i < c.num_layers; ++i) stream.apply(DecoderLayer::load(*dir, i), &tap, true);
    EXPECT_EQ(calls, c.num_layers * 4 * 2);
    const LinearWeight head = stream.load_head(*dir);
    for (size_t s = 0; s < seqs.size(); ++s) {
      KVCache cache(c, 16);
      const Tensor ref = model->forward(seqs[s], cache);
      const auto xn = stream.final_normed(s);
      std::vector<float> logits(seqs[s].size() * c.vocab_size);
      head.forward(xn.data(), static_cast<int64_t>(seqs[s].size()), logits.data());
      for (size_t k = 0; k < logits.size(); ++k) ASSERT_EQ(logits[k], ref.data<float>()[k]) << name << " " << k;
    }
  }
}

// Sequences whose lengths are whole GEMM tiles (256 rows) go through a layer together; each still gets the bits of
// its own whole-model forward, on the dense products (qwen3's bf16 weights) and the int4 kernel's (an RTN copy),
// and the tap still sees each sequence's rows apart and in order.
TEST(LayerStream, BatchesSequencesWithTheBitsOfEachAlone) {
  TempDir tmp;
  QuantizeOptions r;
  r.progress = false;
  quantize_model(test::model_dir("qwen3-26M-linux"), tmp / "rtn", r);
  for (const fs::path& path : {test::model_dir("qwen3-26M-linux"), tmp / "rtn"}) {
    SCOPED_TRACE(path.string());
    auto dir = CheckpointDir::open(path);
    const ModelConfig& c = dir->config();
    const auto model = Model::load(*dir);
    // 256 and 512 run together, 100 alone (not whole tiles), then 256 and 256 together.
    std::vector<std::vector<int32_t>> seqs;
    for (const int64_t n : {256, 512, 100, 256, 256}) {
      std::vector<int32_t> ids(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) ids[static_cast<size_t>(i)] = static_cast<int32_t>((i * 131 + n * 7) % c.vocab_size);
      seqs.push_back(std::move(ids));
    }
    LayerStream stream(*dir, seqs);
    std::map<LinearInput, std::vector<int64_t>> seen;  // rows per tap call, per input
    const InputTap tap = [&](LinearInput which, const float*, int64_t n, int64_t) { seen[which].push_back(n); };
    for (int64_t i = 0; i < c.num_layers; ++i) {
      seen.clear();
      stream.apply(DecoderLayer::load(*dir, i), &tap, true);
      for (const auto& [which, rows] : seen) EXPECT_EQ(rows, (std::vector<int64_t>{256, 512, 100, 256, 256}));
      EXPECT_EQ(seen.size(), 4u);
    }
    const LinearWeight head = stream.load_head(*dir);
    for (size_t s = 0; s < seqs.size(); ++s) {
      KVCache cache(c, 512);
      const Tensor ref = model->forward(seqs[s], cache, true);
      const auto xn = stream.final_normed(s);
      std::vector<float> logits(seqs[s].size() * c.vocab_size);
      head.forward(xn.data(), static_cast<int64_t>(seqs[s].size()), logits.data());
      ASSERT_EQ(std::memcmp(logits.data(), ref.data<float>(), logits.size() * sizeof(float)), 0) << "sequence " << s;
    }
  }
}

TEST(LayerStream, StreamingPerplexityEqualsTheModelsPerplexity) {
  auto dir = CheckpointDir::open(test::model_dir("qwen3-26M-linux"));
  const Tokenizer tok = Tokenizer::from_file(dir->dir() / "tokenizer.json");
  std::vector<int32_t> ids =
      tok.encode(test::read_file(test::shared_dir() / "data/corpora/linux-eval.txt").substr(0, 40000));
  ids.resize(4 * 256);
  const auto a = eval::perplexity(*Model::load(*dir), ids, 256, std::nullopt, false);
  const auto b = eval::perplexity_streaming(*dir, ids, 256, std::nullopt, false);
  EXPECT_EQ(a.scored_tokens, b.scored_tokens);
  EXPECT_DOUBLE_EQ(a.mean_nll, b.mean_nll);
}

TEST(Gptq, StoriesBeatsRtnOnHeldOutTextAndIsDeterministic) {
  TempDir tmp;
  const fs::path calib = test::write_stories_part(tmp, "calib.txt", 0, 96207);
  const fs::path eval_text = test::write_stories_part(tmp, "eval.txt", 96207, SIZE_MAX);
  const fs::path model = test::model_dir("stories260K");
  QuantizeOptions g = test::gptq_options(calib, 32, 256, 64);
  g.mse = true;
  quantize_model(model, tmp / "gptq", g);
  QuantizeOptions r;
  r.group_size = 64;
  r.progress = false;
  quantize_model(model, tmp / "rtn", r);
  const double p_ref = test::ppl_of(model, eval_text, 256, 16), p_rtn = test::ppl_of(tmp / "rtn", eval_text, 256, 16),
               p_gptq = test::ppl_of(tmp / "gptq", eval_text, 256, 16);
  // Measured (16 windows): 5.85 / 6.86 / 6.47: GPTQ+MSE takes a good part off RTN's loss.
  EXPECT_LT(p_gptq, p_rtn - 0.25 * (p_rtn - p_ref)) << p_ref << " " << p_rtn << " " << p_gptq;
  EXPECT_GT(p_gptq, p_ref);
  // Same inputs, same bytes.
  QuantizeOptions small = test::gptq_options(calib, 4, 64, 64);
  quantize_model(model, tmp / "a", small);
  quantize_model(model, tmp / "b", small);
  EXPECT_EQ(test::read_file(tmp / "a/model.safetensors"), test::read_file(tmp / "b/model.safetensors"));
  const auto j = read_json(tmp / "gptq/nibble.json");
  EXPECT_EQ(j["method"], "gptq");
  EXPECT_EQ(j["calibration"]["samples"], 32);
  EXPECT_EQ(j["calibration"]["length"], 256);
  EXPECT_EQ(j["calibration"]["sequential"], true);
  EXPECT_EQ(j["options"]["mse"], true);
  EXPECT_EQ(j["tensors"]["model.layers.0.mlp.down_proj.weight"]["damp_retries"], 0);
  EXPECT_FALSE(fs::exists(tmp / "gptq/.calib"));
  EXPECT_FALSE(fs::exists(tmp / ".gptq.nibble-partial"));
}

// --refine: every matrix's GPTQ objective (as quant::refine reports it) falls,
// and nibble.json records it.
TEST(Gptq, RefineLowersEveryMatrixsObjectiveAndIsRecorded) {
  TempDir tmp;
  const fs::path calib = test::write_stories_part(tmp, "calib.txt", 0, 96207);
  QuantizeOptions g = test::gptq_options(calib, 8, 128, 64);
  g.refine = 10;
  quantize_model(test::model_dir("stories260K"), tmp / "r", g);
  const auto j = read_json(tmp / "r/nibble.json");
  EXPECT_EQ(j["options"]["refine"], 10);
  int matrices = 0;
  double before = 0, after = 0;
  for (const auto& [name, t] : j["tensors"].items()) {
    if (!t["quantized"].get<bool>()) continue;
    ++matrices;
    const auto& r = t.at("refine");
    EXPECT_LE(r["objective_after"].get<double>(), r["objective_before"].get<double>()) << name;
    before += r["objective_before"].get<double>();
    after += r["objective_after"].get<double>();
  }
  EXPECT_GT(matrices, 0);
  EXPECT_LT(after, 0.99 * before);
}

TEST(Gptq, QwenHeadIsQuantizedLastOnTheQuantizedBody) {
  TempDir tmp;
  const fs::path calib = test::shared_dir() / "data/corpora/linux-calib.txt";
  QuantizeOptions g = test::gptq_options(calib, 8, 128, 128);
  quantize_model(test::model_dir("qwen3-26M-linux"), tmp / "q", g);
  const auto j = read_json(tmp / "q/nibble.json");
  EXPECT_EQ(j["tensors"]["lm_head.weight"]["quantized"], true);
  EXPECT_EQ(j["tensors"]["lm_head.weight"]["format"], "int4_g128_asym");
  EXPECT_TRUE(j["tensors"]["lm_head.weight"].contains("damp_used"));
  EXPECT_EQ(j["summary"]["quantized_tensors"], 43);
  // It runs.
  auto dir = CheckpointDir::open(tmp / "q");
  KVCache cache(dir->config(), 8);
  const Tensor logits = Model::load(*dir)->forward({1, 2, 3}, cache);
  for (int64_t k = 0; k < logits.numel(); ++k) ASSERT_TRUE(std::isfinite(logits.data<float>()[k]));
}

// The same command writes the same bytes on any number of threads: the
// forward's products (so the Hessians), GPTQ's block updates and --refine's
// products go through cpu::sgemm, whose tiles do not depend on the thread
// count (OpenBLAS's own threading did). AWQ's objective: Awq.ObjectiveDoesNot...
TEST(Gptq, QwenWritesTheSameBytesOnAnyThreadCount) {
  TempDir tmp;
  QuantizeOptions g = test::gptq_options(test::shared_dir() / "data/corpora/linux-calib.txt", 4, 64, 128);
  g.refine = 2;
  auto checkpoint = [&](int threads) {
    return test::with_threads(threads, [&] {
      const fs::path out = tmp / std::to_string(threads);
      quantize_model(test::model_dir("qwen3-26M-linux"), out, g);
      return test::read_file(out / "model.safetensors");
    });
  };
  EXPECT_TRUE(checkpoint(1) == checkpoint(2)) << "one thread and two wrote different checkpoints";
}

TEST(Gptq, KilledRunResumesAtTheNextLayerWithIdenticalResult) {
  TempDir tmp;
  const fs::path calib = test::write_stories_part(tmp, "calib.txt", 0, 96207);
  const std::string model = test::model_dir("stories260K").string();
  const std::string base = test::nibble_bin() + " quantize -q --method gptq --group 64 --model " + model +
                           " --calib " + calib.string() + " --calib-samples 16 --calib-len 128 --out ";
  auto r = test::run_command(base + (tmp / "whole").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  // Killed right after layer 2's checkpoint.
  r = test::run_command("NIBBLE_TEST_ABORT_AFTER_LAYER=2 " + base + (tmp / "part").string());
  ASSERT_EQ(r.exit_code, 3) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "part"));
  EXPECT_TRUE(fs::exists(tmp / ".part.nibble-partial/.calib/layer-00002.safetensors"));
  // Without --resume it refuses to throw the work away.
  r = test::run_command(base + (tmp / "part").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;
  // Different settings cannot resume it.
  r = test::run_command(base + (tmp / "part").string() + " --mse --resume");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("mse"), std::string::npos) << r.err;
  r = test::run_command(base + (tmp / "part").string() + " --refine 2 --resume");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("refine"), std::string::npos) << r.err;
  // The same command with --resume continues at layer 3.
  r = test::run_command(test::nibble_bin() + " quantize --method gptq --group 64 --model " + model + " --calib " +
                        calib.string() + " --calib-samples 16 --calib-len 128 --out " + (tmp / "part").string() +
                        " --resume 2>&1 | grep -v '\r'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("continuing at layer 3"), std::string::npos) << r.out;
  EXPECT_EQ(test::read_file(tmp / "part/model.safetensors"), test::read_file(tmp / "whole/model.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / ".part.nibble-partial"));
}

// A saved layer that is not a state file this nibble wrote (here the model's
// own weights in place of layer 1's) is refused with its name when the resumed
// run indexes the saved layers, not with a JSON library's message.
TEST(Gptq, ResumeRefusesAStateFileItDidNotWrite) {
  TempDir tmp;
  const fs::path calib = test::write_stories_part(tmp, "calib.txt", 0, 96207);
  const fs::path model = test::model_dir("stories260K");
  const std::string cmd = test::nibble_bin() + " quantize -q --method gptq --group 64 --model " + model.string() +
                          " --calib " + calib.string() + " --calib-samples 16 --calib-len 128 --out " +
                          (tmp / "part").string();
  auto r = test::run_command("NIBBLE_TEST_ABORT_AFTER_LAYER=2 " + cmd);
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const fs::path layer1 = tmp / ".part.nibble-partial/.calib/layer-00001.safetensors";
  ASSERT_TRUE(fs::exists(layer1));
  fs::copy_file(model / "model.safetensors", layer1, fs::copy_options::overwrite_existing);
  r = test::run_command(cmd + " --resume");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(layer1.string() + ": not a calibration state file this nibble wrote"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("--force"), std::string::npos) << r.err;
}

TEST(Gptq, BadCalibratedInputsFailClearly) {
  TempDir tmp;
  const std::string model = test::model_dir("stories260K").string();
  auto r = test::run_command(test::nibble_bin() + " quantize --method gptq --model " + model + " --out " +
                             (tmp / "o").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--calib"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "o"));
  r = test::run_command(test::nibble_bin() + " quantize --method rtn --act-order --model " + model + " --out " +
                        (tmp / "o").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("act-order"), std::string::npos) << r.err;
  r = test::run_command(test::nibble_bin() + " quantize --method rtn --refine 3 --model " + model + " --out " +
                        (tmp / "o").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--refine refines GPTQ's result"), std::string::npos) << r.err;
  std::ofstream(tmp / "bad.txt", std::ios::binary) << "\xff\xfe not utf-8";
  r = test::run_command(test::nibble_bin() + " quantize --method gptq --model " + model + " --out " +
                        (tmp / "o").string() + " --calib " + (tmp / "bad.txt").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad.txt"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "o"));
}

}  // namespace
}  // namespace nibble
