// nibble probe: where a candidate checkpoint loses, matrix by matrix.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nibble/error.h"
#include "nibble/probe.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"

namespace nibble::cli {

namespace {

struct ProbeCli {
  std::string reference, candidate, corpus, json;
  std::vector<int64_t> layers;
  bool no_head = false;
  eval::ProbeOptions opt;
};

}  // namespace

void register_probe(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand(
      "probe", "Relative output error ||(W'-W)x|| / ||Wx|| of every matrix on the reference's own activations");
  auto o = std::make_shared<ProbeCli>();
  cmd->add_option("--reference", o->reference, "Reference model directory (unquantized)")->required();
  cmd->add_option("--candidate", o->candidate, "Candidate: " + candidate_help())->required();
  cmd->add_option("--corpus", o->corpus, "Held-out UTF-8 text")->required()->check(CLI::ExistingFile);
  cmd->add_option("--ctx", o->opt.ctx, "Window length in tokens")->capture_default_str();
  cmd->add_option("--chunks", o->opt.chunks, "Windows used (0 = all)")->capture_default_str()->check(nonnegative());
  cmd->add_option("--layers", o->layers, "Only these decoder layers (comma-separated)")->delimiter(',');
  cmd->add_flag("--no-head", o->no_head, "Skip the head");
  cmd->add_option("--json", o->json, "Also write the rows as JSON to this file");
  cmd->footer(
      "Example:\n  nibble probe --reference ../shared/models/qwen3-26M-linux --candidate out/qwen3-gptq \\\n"
      "      --corpus ../shared/data/corpora/linux-eval.txt --ctx 512 --chunks 8");
  cmd->callback([o, &global] {
    require_output_dir("--json", o->json);
    auto ref = open_model_source(o->reference);
    auto cand = open_model_source(o->candidate, ref.get());
    ref->check_loadable();
    cand->check_loadable();
    const Tokenizer tok = require_tokenizer(*ref, o->reference);
    std::ifstream f(o->corpus, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::vector<int32_t> ids = tok.encode(ss.str(), true);
    o->opt.layers = std::set<int64_t>(o->layers.begin(), o->layers.end());
    o->opt.head = !o->no_head;
    o->opt.progress = !global.quiet;
    const auto rows = eval::probe(*ref, *cand, ids, leading_bos(tok), o->opt);

    std::printf("%-44s %12s\n", "matrix", "rel. output error");
    std::map<int64_t, std::pair<double, int>> per_layer;
    for (const auto& r : rows) {
      std::printf("%-44s %12.5f\n", r.name.c_str(), r.rel());
      auto& pl = per_layer[r.layer];
      pl.first += r.rel();
      pl.second += 1;
    }
    std::printf("\nper layer (mean over its matrices):");
    for (const auto& [l, v] : per_layer)
      if (l >= 0) std::printf(" %lld:%.4f", static_cast<long long>(l), v.first / v.second);
    if (per_layer.count(-1)) std::printf(" head:%.4f", per_layer[-1].first);
    std::printf("\n(%lld tokens of %s)\n", static_cast<long long>(rows.empty() ? 0 : rows.front().tokens),
                o->corpus.c_str());
    if (!o->json.empty()) {
      nlohmann::ordered_json j;
      j["reference"] = o->reference;
      j["candidate"] = o->candidate;
      j["corpus"] = o->corpus;
      j["ctx"] = o->opt.ctx;
      j["tokens"] = rows.empty() ? 0 : rows.front().tokens;
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& r : rows)
        m[r.name] = {{"layer", r.layer}, {"rel_output_error", r.rel()}, {"sq_err", r.sq_err}, {"sq_ref", r.sq_ref}};
      j["matrices"] = m;
      write_file_atomic(o->json, j.dump(2) + "\n");
    }
  });
}

}  // namespace nibble::cli
