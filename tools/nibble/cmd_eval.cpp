// nibble eval: the KL yardstick. Candidates against a reference, over the whole
// vocabulary, per corpus, with the ruler's own noise floor.
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nibble/arch.h"
#include "nibble/error.h"
#include "nibble/kl.h"
#include "nibble/kv_quant.h"
#include "nibble/act_quant.h"
#include "nibble/match_rows.h"
#include "nibble/report.h"
#include "nibble/calibration.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda.h"
#endif
#include "nibble/tokenizer.h"
#include "nibble/util.h"

namespace nibble::cli {
namespace {

struct EvalCli {
  std::string reference, cache, json, html;
  std::vector<std::string> candidates, corpora;
  std::vector<std::string> kv = {"none"}, act_quant;  // every candidate runs once per (kv, act_quant) pair
  bool noise_floor_only = false, match_rows = false;
  eval::KlOptions opt;
};

eval::Corpus load_corpus(const std::string& spec, const Tokenizer* tok, int64_t vocab) {
  const size_t eq = spec.find('=');
  NIBBLE_CHECK(eq != std::string::npos && eq > 0, "--corpus '{}': expected NAME=FILE", spec);
  eval::Corpus c;
  c.name = spec.substr(0, eq);
  const std::filesystem::path file = spec.substr(eq + 1);
  NIBBLE_CHECK(std::filesystem::is_regular_file(file), "--corpus {}: no such file {}", c.name, file.string());
  std::ifstream f(file, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string bytes = ss.str();
  c.sha256 = sha256_hex(bytes.data(), bytes.size());
  if (file.extension() == ".npy") {
    c.tokens = read_token_ids_npy(file, vocab, "--corpus");
  } else {
    NIBBLE_CHECK(tok != nullptr, "--corpus {}: text needs the reference's tokenizer.json", file.string());
    try {
      c.tokens = tok->encode(bytes, true);
    } catch (const Error& e) {
      NIBBLE_FAIL("--corpus {}: {}", file.string(), e.what());
    }
  }
  return c;
}

// Stored bits per weight over the decoder linears and a separate head.
double linear_bits_per_weight(const ModelSource& src) {
  double bytes = 0, params = 0;
  for (const ExpectedTensor& t : expected_tensors(src.config())) {
    if (t.role != TensorRole::Linear && t.role != TensorRole::Head) continue;
    bytes += static_cast<double>(src.meta(t.name).stored_bytes);
    params += static_cast<double>(shape_numel(t.shape));
  }
  return params > 0 ? 8 * bytes / params : 0;
}

nlohmann::ordered_json summary_json(const eval::KlSummary& r) {
  return {{"positions", r.positions},
          {"windows", r.chunks},
          {"kl_mean", r.kl.mean},
          {"kl_mean_ci95", r.has_ci ? nlohmann::ordered_json{r.kl_ci_lo, r.kl_ci_hi} : nullptr},
          {"kl_median", r.kl.median},
          {"kl_p90", r.kl.p90},
          {"kl_p99", r.kl.p99},
          {"kl_p999", r.kl.p999},
          {"kl_max", r.kl.max},
          {"top1", r.top1},
          {"top1_ci95", r.has_ci ? nlohmann::ordered_json{r.top1_ci_lo, r.top1_ci_hi} : nullptr},
          {"ppl_ref", r.ppl_ref},
          {"ppl", r.ppl_cand},
          {"noise_floor", r.noise_floor},
          {"within_3x_noise_floor", r.kl.mean <= 3 * r.noise_floor}};
}

// One way of running a candidate: its KV cache and activation settings.
struct RunVariant {
  std::string kv = "none";
  std::optional<std::string> act_quant;  // unset: the candidate's own
  eval::CandidateOptions options() const {
    eval::CandidateOptions o;
    o.kv_quant = find_kv_quant(kv);
    if (act_quant) o.act_quant = find_act_quant(*act_quant);
    return o;
  }
  // " [kv int4, act int8_token]" after the candidate's spec; "" for the plain run.
  std::string label() const {
    std::vector<std::string> parts;
    if (kv != "none") parts.push_back("kv " + kv);
    if (act_quant) parts.push_back("act " + *act_quant);
    if (parts.empty()) return "";
    std::string s = " [" + parts[0];
    for (size_t i = 1; i < parts.size(); ++i) s += ", " + parts[i];
    return s + "]";
  }
};

}  // namespace

void register_eval(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand(
      "eval", "KL(reference || candidate) over the full vocabulary per position, top-1 agreement, perplexity");
  auto o = std::make_shared<EvalCli>();
  cmd->add_option("--reference", o->reference, "Reference model (DIR, hf:DIR, or a GGUF file)")->required();
  cmd->add_option("--candidate", o->candidates, "Candidate (repeatable): " + candidate_help());
  cmd->add_option("--corpus", o->corpora, "NAME=FILE (repeatable): UTF-8 text (reference tokenizer) or .npy ids")
      ->required();
  cmd->add_option("--ctx", o->opt.ctx, "Window length in tokens")->capture_default_str();
  cmd->add_option("--chunks", o->opt.chunks, "Windows per corpus (0 = all)")
      ->capture_default_str()
      ->check(nonnegative());
  cmd->add_option("--reference-cache", o->cache,
                  "Directory caching the reference's fp32 log-probabilities (reused when inputs match)");
  cmd->add_option("--bootstrap", o->opt.bootstrap,
                  "Bootstrap resamples of windows for the 95 % intervals (0 = none: the tables print [–])")
      ->capture_default_str()
      ->check(nonnegative());
  cmd->add_option("--seed", o->opt.seed, "Bootstrap seed")->capture_default_str();
  cmd->add_flag("--noise-floor", o->noise_floor_only, "Only measure the noise floor (no candidates needed)");
  cmd->add_option("--json", o->json, "Also write the summaries as JSON");
  cmd->add_option("--html", o->html,
                  "Also write a self-contained HTML report: tables, KL histograms and CDFs per candidate");
  cmd->add_option("--kv", o->kv,
                  "KV-cache quantization of the candidates (repeatable or comma-separated: each candidate is scored "
                  "once per setting): none, " + kv_quant_names() + ". The reference stays exact")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--act-quant", o->act_quant,
                  "Simulated activation quantization of the candidates (repeatable or comma-separated), replacing "
                  "what a checkpoint declares: none, " + act_quant_names() + ". The reference stays exact")
      ->delimiter(',');
  cmd->add_option("--device", o->opt.device,
                  "Where the forward runs: cpu (one layer at a time, any model size) or cuda (the whole model on the "
                  "GPU in fp32: the same numbers up to fp32 summation order; --kv none or bf16 only; simulated "
                  "activation quantization runs through the host)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_flag("--match-rows", o->match_rows,
                "Check every candidate tensor against the reference row by row; report layout differences and undo "
                "row permutations before scoring");
  cmd->footer(
      "Example:\n  nibble eval --reference ../shared/models/qwen3-26M-linux --candidate out/qwen3-rtn \\\n"
      "      --candidate out/qwen3-gptq --corpus linux=../shared/data/corpora/linux-eval.txt --ctx 512 --chunks 40\n\n"
      "Scores positions ctx/2 .. ctx-2 of each window (llama.cpp's protocol). The noise floor is the KL between\n"
      "the reference and itself computed with bf16 activations; candidates within 3x of it are marked.\n"
      "--kv int4 scores each candidate with a quantized KV cache (each query reads the cache as a\n"
      "token-by-token decode would); --act-quant int8_token with simulated W8A8 activations.\n"
      "--device cuda runs every forward on the GPU in fp32, with the weights held as stored (bf16: 2 bytes per\n"
      "parameter, int4 g128 about 0.53) and each linear widened to f32 just before its GEMM.");
  cmd->callback([o, &global] {
    NIBBLE_CHECK(o->noise_floor_only || !o->candidates.empty(), "eval: give at least one --candidate (or --noise-floor)");
    o->opt.progress = !global.quiet;
    // Every (kv, act_quant) pair, names checked before any work.
    std::vector<RunVariant> variants;
    NIBBLE_CHECK(!o->kv.empty(), "eval: --kv needs a setting (none, {})", kv_quant_names());
    for (const auto& kv : o->kv) {
      find_kv_quant(kv);
      if (o->act_quant.empty()) variants.push_back({kv, std::nullopt});
      for (const auto& a : o->act_quant) {
        find_act_quant(a);
        variants.push_back({kv, a});
      }
    }
    if (o->opt.device == "cuda")  // refused before any work, not after the reference has run
      for (const RunVariant& v : variants) kv_device_dtype(find_kv_quant(v.kv), "eval --device cuda");  // none, bf16
    require_output_dir("--json", o->json);  // written at the end: checked before the work
    require_output_dir("--html", o->html);
    auto ref = open_model_source(o->reference);
    ref->check_loadable();
    // Every candidate opened and checked before the reference pass, which can
    // take hours: a wrong path or a tensor nibble cannot load is reported now.
    std::vector<std::unique_ptr<ModelSource>> cands;
    for (const auto& spec : o->candidates) {
      cands.push_back(open_model_source(spec, ref.get()));
      cands.back()->check_loadable();
    }
    const std::optional<Tokenizer> tok = ref->tokenizer();
    if (tok) o->opt.bos = leading_bos(*tok);
    std::vector<eval::Corpus> corpora;
    for (const auto& c : o->corpora) corpora.push_back(load_corpus(c, tok ? &*tok : nullptr, ref->config().vocab_size));
    std::vector<std::string> notes;
    const eval::Reference reference = eval::build_reference(*ref, corpora, o->opt, o->cache, notes);
    if (!global.quiet)
      for (const auto& n : notes) std::fprintf(stderr, "nibble: %s\n", n.c_str());

    std::printf("reference %s; %lld-token windows, positions %lld..%lld scored%s\n", o->reference.c_str(),
                static_cast<long long>(o->opt.ctx), static_cast<long long>(o->opt.ctx / 2),
                static_cast<long long>(o->opt.ctx - 2),
                o->opt.device == "cuda" ? "; forward on the GPU (fp32)" : "");
    for (size_t i = 0; i < corpora.size(); ++i)
      std::printf("noise floor (bf16 activations vs f32), %s: KL %.3g over %lld windows\n", corpora[i].name.c_str(),
                  reference.noise_floor[i], static_cast<long long>(reference.corpora[i].chunks));
    nlohmann::ordered_json report;
    report["reference"] = o->reference;
    report["ctx"] = o->opt.ctx;
    report["device"] = o->opt.device;
    {
      nlohmann::ordered_json nf = {{"kl_mean", reference.noise_floor_all},
                                   {"method", "reference with bf16 activations vs f32"},
                                   {"corpora", nlohmann::ordered_json::object()}};
      for (size_t i = 0; i < corpora.size(); ++i) nf["corpora"][corpora[i].name] = {{"kl_mean", reference.noise_floor[i]}};
      report["noise_floor"] = nf;
    }
    report["candidates"] = nlohmann::ordered_json::array();
    // The comparison table and the HTML page come from one EvalReport.
    eval::EvalReport summary;
    summary.reference = o->reference;
    summary.ctx = o->opt.ctx;
    summary.noise_floor_all = reference.noise_floor_all;
    for (size_t i = 0; i < corpora.size(); ++i)
      summary.corpora.push_back({corpora[i].name, reference.corpora[i].chunks,
                                 reference.corpora[i].chunks * reference.corpora[i].per_chunk, reference.noise_floor[i]});
    if (!o->candidates.empty()) {
      const auto header = eval::detail_header();
      std::printf("\n%s\n|", eval::markdown_row(header).c_str());
      for (size_t i = 0; i < header.size(); ++i) std::printf("---|");
      std::printf("\n");
      std::fflush(stdout);
    }
    for (size_t ci = 0; ci < o->candidates.size(); ++ci) {
      const std::string& spec = o->candidates[ci];
      std::unique_ptr<ModelSource> cand = std::move(cands[ci]);  // released once scored
      nlohmann::ordered_json cj = {{"name", spec},
                                   {"source", cand->describe()},
                                   {"bits_per_weight", linear_bits_per_weight(*cand)},
                                   {"overall", nullptr},
                                   {"corpora", nlohmann::ordered_json::object()}};
      if (o->match_rows) {
        const auto matches = eval::match_rows(*ref, *cand);
        nlohmann::ordered_json mj = nlohmann::ordered_json::array();
        for (const auto& m : matches) {
          if (!m.checked_rows) continue;
          const std::string what =
              m.permutation ? fmt::format("rows permuted (worst row cosine {:.4f}); undone: rel. error {:.4f} -> {:.4f}",
                                          m.min_cosine, m.rel_error, m.rel_error_after)
                            : fmt::format("rel. error {:.4f} and rows do not match one to one: unrelated rows, not a "
                                          "permutation (worst best-match cosine {:.4f})",
                                          m.rel_error, m.min_cosine);
          std::fprintf(stderr, "nibble: --match-rows %s: %s: %s\n", spec.c_str(), m.name.c_str(), what.c_str());
          mj.push_back({{"tensor", m.name}, {"rel_error", m.rel_error}, {"permutation", m.permutation},
                        {"min_cosine", m.min_cosine}, {"rel_error_after", m.rel_error_after}});
        }
        cj["match_rows"] = mj;
        cand = eval::undo_permutations(std::move(cand), matches);
      }
      for (const RunVariant& variant : variants) {
        const std::string name = spec + variant.label();
        const std::string act = variant.act_quant ? *variant.act_quant : cand->activation_quant();
        nlohmann::ordered_json vj = {{"name", name},
                                     {"source", cj["source"]},
                                     {"kv_cache", variant.kv},
                                     {"activations", act.empty() ? "none" : act},
                                     {"bits_per_weight", cj["bits_per_weight"]},
                                     {"overall", nullptr},
                                     {"corpora", nlohmann::ordered_json::object()}};
        if (cj.contains("match_rows")) vj["match_rows"] = cj["match_rows"];
        eval::ReportCandidate rc;
        rc.name = name;
        rc.source = cand->describe();
        rc.bits_per_weight = cj["bits_per_weight"].get<double>();
        // The per-position KL only when a page will plot it (8 bytes per scored position).
        rc.rows = eval::score_candidate(*cand, reference, corpora, o->opt, variant.options(),
                                        o->html.empty() ? nullptr : &rc.kl);
        for (const auto& r : rc.rows) {
          std::vector<std::string> cells = {name};
          for (auto& c : eval::detail_cells(r)) cells.push_back(std::move(c));
          std::printf("%s\n", eval::markdown_row(cells).c_str());
          std::fflush(stdout);
          vj["corpora"][r.corpus] = summary_json(r);
          if (r.corpus == "all" || rc.rows.size() == 1) vj["overall"] = summary_json(r);
        }
        report["candidates"].push_back(vj);
        summary.candidates.push_back(std::move(rc));
      }
    }
    // The comparison table: one row per candidate, pooled over the corpora.
    if (!summary.candidates.empty()) std::printf("\n%s", eval::comparison_markdown(summary).c_str());
#ifdef NIBBLE_HAVE_CUDA
    if (o->opt.device == "cuda") {  // one model on the GPU at a time: the largest sets the peak
      const size_t peak = cuda::device_bytes_peak(), device_peak = cuda::device_memory_peak();
      report["gpu_peak_bytes"] = peak;
      report["gpu_device_peak_bytes"] = device_peak;
      std::fflush(stdout);  // the report first
      if (!global.quiet)
        std::fprintf(stderr,
                     "cuda memory: peak %s in nibble's buffers; the device had at most %s in use after a model's "
                     "windows (with the CUDA context, cuBLAS workspace, memory pools and any other process)\n",
                     human_bytes(peak).c_str(), human_bytes(device_peak).c_str());
    }
#endif
    if (!o->json.empty()) write_file_atomic(o->json, report.dump(2) + "\n");
    if (!o->html.empty()) eval::write_html_report(o->html, summary);
  });
}

}  // namespace nibble::cli
