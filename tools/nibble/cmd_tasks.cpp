// nibble gsm8k: greedy GSM8K answers as jsonl; nibble flips: compare two answer files.
#include <cmath>
#include <cstdio>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nibble/error.h"
#include "nibble/tasks.h"
#include "nibble/util.h"

namespace nibble::cli {

void register_gsm8k(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("gsm8k", "Greedy GSM8K answers (jsonl with correctness) and accuracy");
  struct Opts {
    std::string model, out;
    eval::Gsm8kOptions g;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Model (DIR, hf:DIR, packed:DIR, overlay:...)")->required();
  cmd->add_option("--data", o->g.data, "GSM8K jsonl ({\"question\", \"answer\"} per line)")->required();
  cmd->add_option("--n", o->g.n, "First N problems")->capture_default_str()->check(positive());
  cmd->add_option("--max-new", o->g.max_new_tokens, "Tokens generated at most per problem")
      ->capture_default_str()
      ->check(nonnegative());
  cmd->add_option("--out", o->out, "Answers jsonl")->required();
  cmd->add_option("--device", o->g.device,
                  "cpu, or cuda (CUDA builds: the GPU forward and greedy loop of nibble run --device cuda; its bf16 "
                  "activations can resolve a near-tie differently from the CPU)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_flag("--resume", o->g.resume, "Continue the interrupted run whose answers are in OUT.partial");
  cmd->add_flag("--force", o->g.force, "Discard an interrupted run's OUT.partial and start over");
  cmd->footer(
      "Example:\n  nibble gsm8k --model out/qwen3-gptq --data ../shared/data/corpora/gsm8k-test.jsonl --n 200 "
      "--out a.jsonl\n  nibble flips a.jsonl b.jsonl\n\n"
      "Each answer is appended to OUT.partial as it is made; if the run is stopped, the same command with\n"
      "--resume continues at the next problem (also with a larger --n). OUT is written, and OUT.partial\n"
      "removed, when every problem is answered.");
  cmd->callback([o, &global] {
    o->g.progress = !global.quiet;
    o->g.journal = o->out + ".partial";
    require_output_dir("--out", o->out);
    auto src = open_model_source(o->model);
    src->check_loadable();
    const Tokenizer tok = require_tokenizer(*src, o->model);
    std::string style;
    const auto items = eval::run_gsm8k(*src, tok, o->g, &style);
    std::string text;
    int64_t right = 0, resumed = 0;
    for (const auto& it : items) {
      right += it.correct;
      resumed += it.resumed;
      text += eval::answer_json(it).dump() + "\n";
    }
    write_file_atomic(o->out, text);
    std::filesystem::remove(o->g.journal);
    if (resumed) std::printf("gsm8k: %lld answers resumed from %s\n", static_cast<long long>(resumed), o->g.journal.c_str());
    const double n = static_cast<double>(items.size()), p = right / n;
    std::printf("gsm8k: %lld / %zu correct = %.1f %% (±%.1f points, 95 %% normal approximation); prompt style %s; "
                "answers in %s\n",
                static_cast<long long>(right), items.size(), 100 * p, 196 * std::sqrt(p * (1 - p) / n), style.c_str(),
                o->out.c_str());
  });
}

void register_flips(CLI::App& app, const GlobalOptions&) {
  auto* cmd = app.add_subcommand("flips", "Compare two answer files: flips and McNemar's exact test");
  auto a = std::make_shared<std::string>(), b = std::make_shared<std::string>();
  cmd->add_option("A", *a, "Answers of model A (jsonl with id, correct)")->required();
  cmd->add_option("B", *b, "Answers of model B")->required();
  cmd->footer("Example (answer files from nibble gsm8k, matched by id):\n  nibble flips rtn.jsonl gptq.jsonl");
  cmd->callback([a, b] {
    const eval::Flips f = eval::compare_answers(*a, *b);
    std::printf("n %lld  accuracy A %.2f %%  B %.2f %%  change %+.2f points\n", static_cast<long long>(f.n),
                100 * f.acc_a, 100 * f.acc_b, 100 * (f.acc_b - f.acc_a));
    std::printf("n01 (A wrong, B right) %lld  n10 (A right, B wrong) %lld  flip rate %.2f %%  McNemar exact p %.4g\n",
                static_cast<long long>(f.n01), static_cast<long long>(f.n10), 100 * f.flip_rate, f.p_value);
  });
}

}  // namespace nibble::cli
