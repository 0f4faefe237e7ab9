// The KL yardstick against independent computations: KL and top-1 from the
// two models' logits computed directly, perplexity against eval::perplexity,
// the reference cache, overlays, and the CLI's bad inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "nibble/convert.h"
#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/kl.h"
#include "nibble/match_rows.h"
#include "nibble/safetensors.h"
#include "nibble/model.h"
#include "nibble/report.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

struct Fixture {
  TempDir tmp;
  fs::path model = test::model_dir("stories260K");
  eval::Corpus corpus;
  eval::KlOptions opt;
  Fixture() {
    QuantizeOptions r;
    r.group_size = 32;
    r.progress = false;
    quantize_model(model, tmp / "rtn", r);
    const Tokenizer tok = Tokenizer::from_file(model / "tokenizer.json");
    const std::string text = test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").substr(96207, 30000);
    corpus = {"ts", tok.encode(text, true), "x"};
    opt.ctx = 64;
    opt.chunks = 6;
    opt.bos = leading_bos(tok);
    opt.progress = false;
    opt.bootstrap = 200;
  }
};

TEST(KlEval, QuantileIsNumpysLinearDefinition) {
  EXPECT_DOUBLE_EQ(eval::quantile({4, 1, 3, 2}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(eval::quantile({1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, 0.9), 9.1);
  EXPECT_DOUBLE_EQ(eval::quantile({7}, 0.99), 7.0);
}

TEST(KlEval, MatchesADirectComputationFromBothModelsLogits) {
  Fixture f;
  auto ref = CheckpointDir::open(f.model);
  auto cand = CheckpointDir::open(f.tmp / "rtn");
  std::vector<std::string> notes;
  const eval::Reference r = eval::build_reference(*ref, {f.corpus}, f.opt, "", notes);
  const auto rows = eval::score_candidate(*cand, r, {f.corpus}, f.opt);
  ASSERT_EQ(rows.size(), 1u);

  // Independent: both models' logits, softmax and KL per scored position in double.
  auto mr = Model::load(*ref), mc = Model::load(*cand);
  const int64_t V = mr->config().vocab_size, ctx = f.opt.ctx;
  double kl_sum = 0, agree = 0, nll_r = 0, nll_c = 0, kl_max = 0;
  int64_t n = 0;
  for (int64_t k = 0; k < f.opt.chunks; ++k) {
    std::vector<int32_t> w(f.corpus.tokens.begin() + k * ctx, f.corpus.tokens.begin() + (k + 1) * ctx);
    w[0] = *f.opt.bos;
    KVCache c1(mr->config(), ctx), c2(mc->config(), ctx);
    const Tensor lr = mr->forward(w, c1), lc = mc->forward(w, c2);
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      const float* a = lr.data<float>() + j * V;
      const float* b = lc.data<float>() + j * V;
      double za = 0, zb = 0, ma = a[0], mb = b[0];
      for (int64_t v = 0; v < V; ++v) ma = std::max<double>(ma, a[v]), mb = std::max<double>(mb, b[v]);
      for (int64_t v = 0; v < V; ++v) za += std::exp(a[v] - ma), zb += std::exp(b[v] - mb);
      double kl = 0;
      for (int64_t v = 0; v < V; ++v) {
        const double pa = std::exp(a[v] - ma) / za, pb = std::exp(b[v] - mb) / zb;
        kl += pa * std::log(pa / pb);
      }
      kl_sum += kl;
      kl_max = std::max(kl_max, kl);
      agree += std::max_element(a, a + V) - a == std::max_element(b, b + V) - b;
      nll_r += -(a[w[j + 1]] - ma - std::log(za));
      nll_c += -(b[w[j + 1]] - mb - std::log(zb));
      ++n;
    }
  }
  const eval::KlSummary& s = rows[0];
  EXPECT_EQ(s.positions, n);
  EXPECT_NEAR(s.kl.mean, kl_sum / n, 1e-5 * kl_sum / n);  // fp32 log-probs in the reference
  EXPECT_NEAR(s.kl.max, kl_max, 1e-4 * kl_max);
  EXPECT_DOUBLE_EQ(s.top1, agree / n);
  EXPECT_NEAR(s.ppl_ref, std::exp(nll_r / n), 1e-6 * s.ppl_ref);
  EXPECT_NEAR(s.ppl_cand, std::exp(nll_c / n), 1e-6 * s.ppl_cand);
  EXPECT_TRUE(s.has_ci);
  EXPECT_LE(s.kl_ci_lo, s.kl.mean);
  EXPECT_GE(s.kl_ci_hi, s.kl.mean);
  EXPECT_LE(s.kl.median, s.kl.p90);
  EXPECT_LE(s.kl.p99, s.kl.p999);
  // The same protocol as nibble ppl.
  std::vector<int32_t> ids(f.corpus.tokens.begin(), f.corpus.tokens.begin() + f.opt.chunks * ctx);
  EXPECT_NEAR(s.ppl_ref, eval::perplexity(*mr, ids, ctx, f.opt.bos, false).ppl, 1e-6 * s.ppl_ref);
  // The ruler's floor is small against a 4-bit candidate, but not zero.
  EXPECT_GT(r.noise_floor[0], 0.0);
  EXPECT_LT(r.noise_floor[0], 0.01 * s.kl.mean);
  // The reference against itself: nothing lost.
  const auto same = eval::score_candidate(*ref, r, {f.corpus}, f.opt);
  EXPECT_EQ(same[0].kl.max, 0.0);
  EXPECT_EQ(same[0].top1, 1.0);
}

TEST(KlEval, ReferenceCacheIsReusedOnlyForTheSameInputs) {
  Fixture f;
  auto ref = CheckpointDir::open(f.model);
  auto cand = CheckpointDir::open(f.tmp / "rtn");
  std::vector<std::string> notes;
  const auto r1 = eval::build_reference(*ref, {f.corpus}, f.opt, f.tmp / "cache", notes);
  notes.clear();
  const auto r2 = eval::build_reference(*ref, {f.corpus}, f.opt, f.tmp / "cache", notes);
  ASSERT_FALSE(notes.empty());
  EXPECT_NE(notes[0].find("loaded"), std::string::npos);
  EXPECT_EQ(r1.noise_floor, r2.noise_floor);
  const auto a = eval::score_candidate(*cand, r1, {f.corpus}, f.opt);
  const auto b = eval::score_candidate(*cand, r2, {f.corpus}, f.opt);
  EXPECT_EQ(a[0].kl.mean, b[0].kl.mean);
  EXPECT_EQ(a[0].kl_ci_lo, b[0].kl_ci_lo);  // bootstrap is seeded
  f.corpus.sha256 = "changed";
  notes.clear();
  eval::build_reference(*ref, {f.corpus}, f.opt, f.tmp / "cache", notes);
  EXPECT_NE(notes[0].find("recomputing"), std::string::npos);
}

TEST(KlEval, OverlaysTakeTensorsFromTheReference) {
  Fixture f;
  auto ref = open_model_source(f.model.string());
  std::vector<std::string> notes;
  const auto r = eval::build_reference(*ref, {f.corpus}, f.opt, "", notes);
  auto all = open_model_source("overlay:" + (f.tmp / "rtn").string() + ",keep=.*", ref.get());
  EXPECT_EQ(eval::score_candidate(*all, r, {f.corpus}, f.opt)[0].kl.max, 0.0);
  auto some = open_model_source("overlay:" + (f.tmp / "rtn").string() + ",keep=mlp", ref.get());
  auto none = open_model_source("packed:" + (f.tmp / "rtn").string(), ref.get());
  const double k_some = eval::score_candidate(*some, r, {f.corpus}, f.opt)[0].kl.mean;
  const double k_none = eval::score_candidate(*none, r, {f.corpus}, f.opt)[0].kl.mean;
  EXPECT_GT(k_some, 0.0);
  EXPECT_LT(k_some, k_none);
  // A tied head cannot be swapped; bad specs say what is wrong.
  EXPECT_THROW(open_model_source("overlay:" + (f.tmp / "rtn").string() + ",head=" + f.model.string()), Error);
  EXPECT_THROW(open_model_source("hf:" + (f.tmp / "rtn").string()), Error);
  EXPECT_THROW(open_model_source("packed:" + f.model.string()), Error);
  EXPECT_THROW(open_model_source("nonsense:abc"), Error);
  EXPECT_THROW(open_model_source("overlay:" + (f.tmp / "rtn").string() + ",keep=(", ref.get()), Error);
}

TEST(KlEval, CliReportsAndRejectsBadInput) {
  TempDir tmp;
  const std::string m = test::model_dir("stories260K").string();
  std::ofstream(tmp / "t.txt") << test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").substr(96207, 20000);
  auto r = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m +
                             " --corpus ts=" + (tmp / "t.txt").string() + " --ctx 64 --chunks 3 --json " +
                             (tmp / "r.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("noise floor"), std::string::npos);
  EXPECT_NE(r.out.find("≤3× noise floor"), std::string::npos) << r.out;  // itself: KL 0
  const auto j = nlohmann::json::parse(test::read_file(tmp / "r.json"));
  EXPECT_GT(j["noise_floor"]["kl_mean"].get<double>(), 0.0);
  const auto& c0 = j["candidates"][0];
  EXPECT_EQ(c0["name"], m);
  EXPECT_NEAR(c0["bits_per_weight"].get<double>(), 32.0, 1e-9);  // f32 linears
  for (const char* k : {"positions", "kl_mean", "kl_mean_ci95", "kl_median", "kl_p99", "kl_max", "top1", "ppl_ref", "ppl"})
    EXPECT_TRUE(c0["overall"].contains(k) && c0["corpora"]["ts"].contains(k)) << k;
  EXPECT_EQ(c0["overall"]["kl_max"].get<double>(), 0.0);
  EXPECT_NE(r.out.find("| candidate | bits/weight |"), std::string::npos) << r.out;
  EXPECT_TRUE(c0["overall"]["kl_mean_ci95"].is_array());
  // --bootstrap 0: no interval, and none is printed as if it were one (it was "[0.00000, 0.00000]").
  r = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m + " --corpus ts=" +
                        (tmp / "t.txt").string() + " --ctx 64 --chunks 3 --bootstrap 0 --json " +
                        (tmp / "r0.json").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0.00000 [–]"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("[0.00000, 0.00000]"), std::string::npos) << r.out;
  const auto j0 = nlohmann::json::parse(test::read_file(tmp / "r0.json"));
  EXPECT_TRUE(j0["candidates"][0]["overall"]["kl_mean_ci95"].is_null());
  EXPECT_TRUE(j0["candidates"][0]["corpora"]["ts"]["top1_ci95"].is_null());
  r = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m + " --corpus " +
                        (tmp / "t.txt").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("NAME=FILE"), std::string::npos) << r.err;
  r = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --corpus ts=" + (tmp / "t.txt").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--candidate"), std::string::npos) << r.err;
  // The model against itself on the corpus, with `args` added: each of these fails, with `error` in stderr.
  auto refused = [&](const std::string& args, const std::string& error) {
    const auto f = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m +
                                     " --corpus ts=" + (tmp / "t.txt").string() + " " + args);
    EXPECT_NE(f.exit_code, 0) << args;
    EXPECT_NE(f.err.find(error), std::string::npos) << args << ": " << f.err;
  };
  refused("--device tpu", "--device");
  refused("--chunks -1", "--chunks: must be >= 0, found -1");  // (was taken as 0: every window)
  // A candidate that cannot be opened is reported before the reference pass (whose line and table never print).
  const auto missing = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m +
                                         " --candidate " + (tmp / "no-such-model").string() + " --corpus ts=" +
                                         (tmp / "t.txt").string() + " --ctx 64 --chunks 3");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("no-such-model"), std::string::npos) << missing.err;
  EXPECT_EQ(missing.out, "") << missing.out;
  // So is a --json or --html path whose directory does not exist (both are written at the end).
  for (const char* flag : {"--json", "--html"}) {
    const auto nodir = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m +
                                         " --corpus ts=" + (tmp / "t.txt").string() + " --ctx 64 --chunks 3 " + flag +
                                         " " + (tmp / "no-dir" / "r").string());
    EXPECT_NE(nodir.exit_code, 0) << flag;
    EXPECT_NE(nodir.err.find(std::string(flag) + " " + (tmp / "no-dir" / "r").string() + ": directory " +
                             (tmp / "no-dir").string() + " does not exist"),
              std::string::npos)
        << nodir.err;
    EXPECT_EQ(nodir.out, "") << flag << ": " << nodir.out;
  }
  // Simulations the GPU forward does not do are refused at once, on any build and any machine.
  refused("--device cuda --kv none,int4", "--kv int4 is simulated on the CPU only");
#ifndef NIBBLE_HAVE_CUDA
  refused("--device cuda", "CUDA build");
#endif
}

TEST(KlEval, CliWritesAnHtmlReportWithTheTableItPrints) {
  Fixture f;  // f.tmp / "rtn": stories260K, RTN g32
  const std::string m = f.model.string(), rtn = (f.tmp / "rtn").string();
  const std::string overlay = "overlay:" + rtn + ",keep=mlp&?";  // a spec with a character HTML must escape
  std::ofstream(f.tmp / "t.txt") << test::read_file(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").substr(96207, 20000);
  const fs::path html_path = f.tmp / "report.html";
  const auto r = test::run_command(test::nibble_bin() + " eval -q --reference " + m + " --candidate " + m +
                                   " --candidate " + rtn + " --candidate '" + overlay + "' --corpus ts=" +
                                   (f.tmp / "t.txt").string() + " --ctx 64 --chunks 3 --html " + html_path.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::is_regular_file(html_path));
  EXPECT_FALSE(fs::exists(html_path.string() + ".tmp"));
  const std::string html = test::read_file(html_path);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>\n<html", 0), 0u);
  EXPECT_EQ(html.substr(html.size() - 8), "</html>\n");
  for (const char* tag : {"<head>", "</head>", "<body>", "</body>", "<meta charset=\"utf-8\">"})
    EXPECT_NE(html.find(tag), std::string::npos) << tag;
  for (const char* bad : {"http://", "https://", "src=", "href=", "url(", "<script", "<link"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  size_t svgs = 0;
  for (size_t p = html.find("<svg"); p != std::string::npos; p = html.find("<svg", p + 1)) ++svgs;
  EXPECT_EQ(svgs, 1u + 2 * 3);  // the overlay of all CDFs, then a histogram and a CDF per candidate
  EXPECT_EQ(html.find("mlp&?"), std::string::npos);
  for (const std::string& name : {m, rtn, overlay})
    EXPECT_NE(html.find("<h3>" + eval::html_escape(name) + "</h3>"), std::string::npos) << name;
  // The comparison table printed on stdout, cell for cell in the page.
  const size_t head = r.out.find("| candidate | bits/weight |");
  ASSERT_NE(head, std::string::npos) << r.out;
  std::istringstream lines(r.out.substr(head));
  std::string line;
  std::getline(lines, line);  // header
  std::getline(lines, line);  // |---|
  int rows = 0;
  while (std::getline(lines, line) && line.rfind("| ", 0) == 0) {
    ++rows;
    const std::string inner = line.substr(2, line.size() - 4);
    for (size_t a = 0, b; a <= inner.size(); a = b + 3) {
      b = inner.find(" | ", a);
      if (b == std::string::npos) b = inner.size();
      std::string_view cell = std::string_view(inner).substr(a, b - a);
      std::string badge;  // the page shows the Markdown's near-floor mark as a badge
      if (cell.ends_with(eval::kNearNoiseFloorMark)) {
        cell.remove_suffix(eval::kNearNoiseFloorMark.size());
        badge = " <span class=\"badge\">≤3× floor</span>";
      }
      EXPECT_NE(html.find(fmt::format(">{}{}</td>", eval::html_escape(cell), badge)), std::string::npos) << cell;
    }
  }
  EXPECT_EQ(rows, 3);
  // The reference against itself (KL 0) is within 3x the noise floor, in both tables.
  EXPECT_NE(html.find("<tr class=\"near\"><td class=\"text\">" + m + "</td>"), std::string::npos);
}

}  // namespace
}  // namespace nibble

namespace nibble {
namespace {

TEST(MatchRows, FindsAndUndoesARowPermutation) {
  test::TempDir tmp;
  const fs::path model = test::model_dir("stories260K");
  auto src = CheckpointDir::open(model);
  // A copy whose layer-1 q_proj rows are interleaved per head (what llama.cpp's
  // converter does to q/k), everything else as is.
  const std::string q = "model.layers.1.self_attn.q_proj.weight";
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::vector<int64_t> perm;
  for (const auto& n : src->names()) {
    Tensor t = src->load(n).to_f32().contiguous();
    if (n == q) {
      const int64_t R = t.size(0), C = t.size(1), hd = src->config().head_dim;
      Tensor p = Tensor::zeros(DType::F32, {R, C});
      for (int64_t i = 0; i < R; ++i) {  // row i of the copy holds row perm[i] of the original
        const int64_t h = i / hd, k = i % hd, src_row = h * hd + (k % 2) * (hd / 2) + k / 2;
        perm.push_back(src_row);
        std::copy_n(t.data<float>() + src_row * C, C, p.data_mut<float>() + i * C);
      }
      t = p;
    }
    tensors.emplace_back(n, t);
  }
  fs::create_directories(tmp / "perm");
  io::save_safetensors(tmp / "perm/model.safetensors", tensors, {{"format", "pt"}});
  for (const char* f : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(model / f, tmp / "perm" / f);

  auto ref = open_model_source(model.string());
  auto cand = open_model_source((tmp / "perm").string());
  const auto ms = eval::match_rows(*ref, *cand);
  int flagged = 0;
  for (const auto& m : ms) {
    if (!m.checked_rows) {
      EXPECT_EQ(m.rel_error, 0.0) << m.name;
      continue;
    }
    ++flagged;
    EXPECT_EQ(m.name, q);
    EXPECT_TRUE(m.permutation);
    EXPECT_EQ(m.perm, perm);
    EXPECT_EQ(m.rel_error_after, 0.0);
  }
  EXPECT_EQ(flagged, 1);
  auto fixed = eval::undo_permutations(std::move(cand), ms);
  eval::KlOptions o;
  o.ctx = 32;
  o.chunks = 2;
  o.progress = false;
  o.bootstrap = 10;
  std::vector<int32_t> ids;
  for (int i = 0; i < 64; ++i) ids.push_back((i * 13 + 5) % 512);
  const eval::Corpus c{"x", ids, "x"};
  std::vector<std::string> notes;
  const auto r = eval::build_reference(*ref, {c}, o, "", notes);
  EXPECT_EQ(eval::score_candidate(*fixed, r, {c}, o)[0].kl.max, 0.0);
  auto broken = open_model_source((tmp / "perm").string());
  EXPECT_GT(eval::score_candidate(*broken, r, {c}, o)[0].kl.mean, 1e-3);
}

}  // namespace
}  // namespace nibble
