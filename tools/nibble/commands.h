// The CLI's verbs. Each cmd_*.cpp registers one subcommand; the code there
// parses arguments and calls into libnibble, nothing else.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

namespace nibble::cli {

// Options every verb shares.
struct GlobalOptions {
  bool quiet = false;  // no progress bars or info lines on stderr
  std::string command_line;  // argv, shell-quoted where needed (for reports)
};

// Adds a subcommand to `app`; the subcommand's callback does the work.
using Registrar = void (*)(CLI::App& app, const GlobalOptions& global);

void register_quantize(CLI::App& app, const GlobalOptions& global);
void register_inspect(CLI::App& app, const GlobalOptions& global);
void register_dequantize(CLI::App& app, const GlobalOptions& global);
void register_run(CLI::App& app, const GlobalOptions& global);
void register_ppl(CLI::App& app, const GlobalOptions& global);
void register_layer(CLI::App& app, const GlobalOptions& global);
void register_probe(CLI::App& app, const GlobalOptions& global);
void register_synth(CLI::App& app, const GlobalOptions& global);
void register_eval(CLI::App& app, const GlobalOptions& global);
void register_gsm8k(CLI::App& app, const GlobalOptions& global);
void register_flips(CLI::App& app, const GlobalOptions& global);

// Fails now, before a verb's work, when the output file `path` (given with
// `flag`; empty: none) has no directory to go in.
void require_output_dir(const char* flag, const std::string& path);

// Validators for counts and sizes: CLI11's NonNegativeNumber / PositiveNumber
// print their bounds as "0.000000 to 1797693…" (309 digits) on a bad value;
// these say "must be >= 0 (> 0), found X" (help still shows :NONNEGATIVE /
// :POSITIVE).
CLI::Validator nonnegative();
CLI::Validator positive();

// The format registry as text for --help footers and `nibble inspect --formats`:
// one line per canonical name with its bits per weight (on a 4096×4096 matrix)
// and the row's description.
std::string format_list_text();

// --help words for a model named on the command line (open_model_source's
// forms; the rivals' quant_methods from their registry, rival_method_names):
// a directory or a GGUF file ...
std::string model_help();
// ... and every form a candidate may take.
std::string candidate_help();

}  // namespace nibble::cli
