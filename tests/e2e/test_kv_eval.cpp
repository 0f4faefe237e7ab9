// KV-cache and activation quantization end to end: through the KL yardstick on
// the real fixtures, a checkpoint's nibble.json "activations", and the CLI.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/kl.h"
#include "nibble/model.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

// Eval options for a test: `chunks` windows of `ctx`, no progress bar, no bootstrap.
eval::KlOptions quiet_options(const Tokenizer& tok, int64_t ctx, int64_t chunks) {
  eval::KlOptions o;
  o.ctx = ctx;
  o.chunks = chunks;
  o.bos = leading_bos(tok);
  o.progress = false;
  o.bootstrap = 0;
  return o;
}

// qwen3-26M-linux against itself: every setting costs something, int8 less
// than int4, and none of it much. ctx 384: the scored positions 192..382 all
// read the first one to seven 32-position blocks quantized (boundary(193) = 32).
TEST(KvEval, Qwen3AgainstItselfOrdersTheSettings) {
  const fs::path m = test::model_dir("qwen3-26M-linux");
  auto src = CheckpointDir::open(m);
  const Tokenizer tok = Tokenizer::from_file(m / "tokenizer.json");
  const std::string text = test::read_file(test::shared_dir() / "data/corpora/linux-eval.txt").substr(0, 40000);
  const eval::Corpus corpus{"linux", tok.encode(text, true), "x"};
  const eval::KlOptions o = quiet_options(tok, 384, 2);
  std::vector<std::string> notes;
  const eval::Reference ref = eval::build_reference(*src, {corpus}, o, "", notes);
  auto kl = [&](const char* kv, const char* act) {
    eval::CandidateOptions co;
    co.kv_quant = find_kv_quant(kv);
    if (act) co.act_quant = find_act_quant(act);
    return eval::score_candidate(*src, ref, {corpus}, o, co)[0].kl.mean;
  };
  const double int8 = kl("int8", nullptr), int4 = kl("int4", nullptr), fp8 = kl("fp8_e4m3", nullptr),
               w8a8 = kl("none", "int8_token");
  RecordProperty("kl_int8", std::to_string(int8));
  RecordProperty("kl_int4", std::to_string(int4));
  RecordProperty("kl_fp8", std::to_string(fp8));
  RecordProperty("kl_int8_token", std::to_string(w8a8));
  for (double k : {int8, int4, fp8, w8a8}) {
    EXPECT_GT(k, 0.0);
    EXPECT_LT(k, 0.05);  // small: a 4-bit weight RTN of this model costs about 0.05-0.1
  }
  EXPECT_LT(int8 * 4, int4);
  // Exact settings give exactly the reference.
  EXPECT_EQ(kl("none", "none"), 0.0);
}

// A checkpoint whose nibble.json declares "activations" runs with them: in
// Model::load, in the eval's layer stream, and --act-quant none undoes it.
TEST(KvEval, CheckpointActivationsComeFromNibbleJson) {
  test::TempDir tmp;
  const fs::path src = test::model_dir("stories260K"), dst = tmp / "w8a8";
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src))
    if (e.is_regular_file()) fs::copy_file(e.path(), dst / e.path().filename());
  std::ofstream(dst / "nibble.json") << R"({"method": "smoothquant", "activations": "int8_token"})";
  auto plain = CheckpointDir::open(src);
  auto w8a8 = CheckpointDir::open(dst);
  EXPECT_EQ(plain->activation_quant(), "");
  EXPECT_EQ(w8a8->activation_quant(), "int8_token");
  EXPECT_NE(w8a8->describe().find("int8_token"), std::string::npos) << w8a8->describe();

  auto a = Model::load(*w8a8), b = Model::load(*plain);
  ASSERT_NE(a->act_quant(), nullptr);
  EXPECT_EQ(a->act_quant()->name, "int8_token");
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 430, 271, 262};
  KVCache c1(a->config(), 8), c2(b->config(), 8), c3(b->config(), 8);
  const Tensor la = a->forward(ids, c1), lb = b->forward(ids, c2);
  b->set_act_quant(find_act_quant("int8_token"));
  const Tensor lc = b->forward(ids, c3);
  EXPECT_TRUE(std::equal(la.data<float>(), la.data<float>() + la.numel(), lc.data<float>()));
  float diff = 0;
  for (int64_t i = 0; i < la.numel(); ++i) diff = std::max(diff, std::abs(la.data<float>()[i] - lb.data<float>()[i]));
  EXPECT_GT(diff, 1e-4f);

  // The eval: KL > 0 as declared, 0 with --act-quant none; the reference itself runs exact.
  const Tokenizer tok = Tokenizer::from_file(src / "tokenizer.json");
  const std::string text = test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").substr(96207, 20000);
  const eval::Corpus corpus{"ts", tok.encode(text, true), "x"};
  const eval::KlOptions o = quiet_options(tok, 64, 3);
  std::vector<std::string> notes;
  const eval::Reference ref = eval::build_reference(*plain, {corpus}, o, "", notes);
  EXPECT_GT(eval::score_candidate(*w8a8, ref, {corpus}, o)[0].kl.mean, 0.0);
  eval::CandidateOptions none;
  none.act_quant = nullptr;
  EXPECT_EQ(eval::score_candidate(*w8a8, ref, {corpus}, o, none)[0].kl.max, 0.0);
  const eval::Reference ref2 = eval::build_reference(*w8a8, {corpus}, o, "", notes);
  EXPECT_EQ(eval::score_candidate(*plain, ref2, {corpus}, o)[0].kl.max, 0.0);
  EXPECT_NE(notes.back().find("exact activations"), std::string::npos) << notes.back();

  // A name nibble does not know: the file, the key and the known names.
  std::ofstream(dst / "nibble.json") << R"({"activations": "int4_token"})";
  const std::string e = test::error_of([&] { CheckpointDir::open(dst); });
  for (const char* want : {"nibble.json", "activations", "int4_token", "int8_token", "fp8_e4m3_tensor"})
    EXPECT_NE(e.find(want), std::string::npos) << want << ": " << e;
}

TEST(KvEval, CliLabelsCandidatesAndRunsWithAQuantizedCache) {
  test::TempDir tmp;
  const std::string m = test::model_dir("stories260K").string();
  std::ofstream(tmp / "t.txt") << test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").substr(96207, 20000);
  const std::string base = test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m + " --corpus ts=" +
                           (tmp / "t.txt").string() + " --ctx 256 --chunks 2 --bootstrap 0";
  auto r = test::run_command(base + " --kv none,int4 --kv fp8_e4m3 --act-quant int8_token --json " +
                             (tmp / "r.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto j = nlohmann::json::parse(test::read_file(tmp / "r.json"));
  ASSERT_EQ(j["candidates"].size(), 3u);
  const char* kv[] = {"none", "int4", "fp8_e4m3"};
  for (int i = 0; i < 3; ++i) {
    const auto& c = j["candidates"][i];
    EXPECT_EQ(c["kv_cache"], kv[i]);
    EXPECT_EQ(c["activations"], "int8_token");
    EXPECT_GT(c["overall"]["kl_mean"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["candidates"][0]["name"], m + " [act int8_token]");
  EXPECT_EQ(j["candidates"][1]["name"], m + " [kv int4, act int8_token]");
  EXPECT_NE(r.out.find("| " + m + " [kv fp8_e4m3, act int8_token] |"), std::string::npos) << r.out;
  // No settings: the plain candidate, labelled as before.
  r = test::run_command(base + " --json " + (tmp / "p.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto p = nlohmann::json::parse(test::read_file(tmp / "p.json"));
  EXPECT_EQ(p["candidates"][0]["name"], m);
  EXPECT_EQ(p["candidates"][0]["kv_cache"], "none");
  EXPECT_EQ(p["candidates"][0]["activations"], "none");
  // Unknown names list the known ones.
  r = test::run_command(base + " --kv int3");
  EXPECT_NE(r.exit_code, 0);
  for (const char* want : {"int3", "none", "int8", "int4", "fp8_e4m3"}) EXPECT_NE(r.err.find(want), std::string::npos) << r.err;
  r = test::run_command(base + " --act-quant int7");
  EXPECT_NE(r.exit_code, 0);
  for (const char* want : {"int7", "int8_tensor", "int8_token", "fp8_e4m3_tensor"})
    EXPECT_NE(r.err.find(want), std::string::npos) << r.err;

  // nibble run with a quantized cache: a prompt of some 400 tokens, so that
  // the prefill leaves quantized blocks behind and every decode step reads them.
  const std::string q = test::model_dir("qwen3-26M-linux").string();
  const std::string prompt = test::read_file(test::shared_dir() / "data/corpora/linux-eval.txt").substr(0, 1500);
  std::ofstream(tmp / "prompt.txt") << prompt;
  r = test::run_command(test::nibble_bin() + " run -q --model " + q + " --prompt \"$(cat " + (tmp / "prompt.txt").string() +
                        ")\" -n 24 --temp 0.8 --seed 3 --kv int4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(r.out.size(), prompt.size() + 8) << r.out;  // the prompt echoed, then new text
  r = test::run_command(test::nibble_bin() + " run -q --model " + m + " --prompt 'Once' -n 4 --kv int9");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("int9"), std::string::npos) << r.err;
  r = test::run_command(test::nibble_bin() + " run -q --model " + m + " --prompt 'Once' -n 4 --act-quant int8_token");
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

}  // namespace
}  // namespace nibble
