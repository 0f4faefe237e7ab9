// nibble quantize: HF checkpoint -> nibble packed checkpoint.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "commands.h"
#include "nibble/act_quant.h"
#include "nibble/convert.h"
#include "nibble/format.h"
#include "nibble/quantizer.h"
#include "nibble/transform.h"
#include "nibble/util.h"

namespace nibble::cli {

void register_quantize(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("quantize", "Quantize the linear layers of a Hugging Face checkpoint or a GGUF file");
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto opt = std::make_shared<QuantizeOptions>();
  auto calib_files_ptr = std::make_shared<std::vector<std::string>>();
  std::vector<std::string>& calib_files = *calib_files_ptr;
  const std::vector<std::string> methods = quant::method_names();
  std::vector<std::string> formats;  // family names and canonical names ("int4_asym", "int4_g64_asym", ...)
  for (const auto* f : format_registry()) formats.emplace_back(f->family);
  for (const std::string& n : format_names())
    if (std::find(formats.begin(), formats.end(), n) == formats.end()) formats.push_back(n);

  cmd->add_option("--model", *model,
                  "Hugging Face model directory (config.json + safetensors), or a GGUF file whose linears are "
                  "F32/F16/BF16")
      ->required();
  cmd->add_option("--out", *out, "Output directory for the packed checkpoint")->required();
  cmd->add_option("--method", opt->method,
                  "Quantization method: a quantizer (rtn, gptq), optionally after a transform (awq, smoothquant, "
                  "rotate), e.g. awq+gptq; a transform alone means transform+rtn")
      ->check(CLI::IsMember(methods))
      ->capture_default_str();
  // Checked against the registry's names; the list itself is in the footer.
  const CLI::Validator known_format(
      [formats](std::string& name) -> std::string {
        if (std::find(formats.begin(), formats.end(), name) != formats.end()) return {};
        return "unknown format '" + name + "' (the list is below; `nibble inspect --formats` prints it too)";
      },
      "FORMAT");
  cmd->add_option("--format", opt->format, "Storage format: a family or canonical name from the list below")
      ->check(known_format)
      ->capture_default_str();
  cmd->add_option("--group", opt->group_size,
                  "Group size (inputs per scale) for formats that offer a choice; 0 = the format's default "
                  "(int4_asym: 128)")
      ->capture_default_str()
      ->check(nonnegative());
  cmd->add_option("--keep", opt->keep_regex,
                  "Tensors whose name this regex (PCRE2 syntax) matches anywhere stay unquantized, e.g. "
                  "'mlp\\.down_proj|lm_head'");
  cmd->add_flag("--allow-nonfinite", opt->allow_nonfinite,
                "Keep a weight with NaN/Inf unquantized (with a warning) instead of failing");
  cmd->add_flag("--force", opt->force, "Replace --out if it exists and is not empty (and discard an interrupted run)");
  cmd->add_flag("--mse", opt->mse, "Range search per group: 33 shrink factors of (min, max), minimizing sum |err|^2.4");
  cmd->add_flag("--act-order", opt->act_order, "GPTQ: sweep columns in decreasing diag(H) order (static groups)");
  cmd->add_option("--damp", opt->damp, "GPTQ: damping, lambda = damp * mean(diag H)")->capture_default_str()
      ->check(nonnegative());
  cmd->add_option("--refine", opt->refine,
                  "GPTQ: after the sweep, up to N passes of coordinate descent over the codes, each followed by a "
                  "least-squares refit of every group's scale (and min), against GPTQ's own objective (0: off; 30 is a "
                  "good choice; --device cuda: int4_asym, int4_sym)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  cmd->add_option("--device", opt->device,
                  "GPTQ: where it runs: cpu, or cuda (int4_asym, int4_sym, int4_asym_f32; needs a CUDA build and a GPU; "
                  "the calibration forward, the Hessians and the solve all run on the GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--alpha", opt->alpha, "SmoothQuant: migration strength alpha in [0, 1]")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  cmd->add_option("--rotate-seed", opt->rotate_seed, "rotate: seed of the Hadamard rotations' random signs")
      ->capture_default_str()
      ->check(nonnegative());  // the seed is unsigned: CLI11 would wrap -1 to 2^64 - 1
  cmd->add_option("--activations", opt->activations,
                  "Activation quantizer the checkpoint's linears run with (simulated W8A8: " + act_quant_names() +
                      "); recorded in nibble.json and applied by run/eval/ppl");
  auto* g_cal = "Calibration (gptq, awq, smoothquant)";
  cmd->add_option("--calib", calib_files, "Calibration data: UTF-8 text (tokenized with the model's tokenizer) or "
                                          ".npy token ids; several files are concatenated")
      ->group(g_cal)->check(CLI::ExistingFile);
  cmd->add_option("--calib-samples", opt->calib.samples, "Calibration sequences")->capture_default_str()
      ->check(positive())->group(g_cal);
  cmd->add_option("--calib-len", opt->calib.length, "Tokens per sequence (clipped to the model's context)")
      ->capture_default_str()->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->group(g_cal);
  cmd->add_option("--seed", opt->calib.seed, "Seed for sampling the calibration windows")->capture_default_str()
      ->group(g_cal);
  cmd->add_option("--calib-windows", opt->calib.windows,
                  "random: windows at random starts in the data (drawn with --seed); first: the data's first "
                  "samples x len tokens in consecutive windows (the sequences GPTQModel or AutoRound get from a "
                  "list of them)")
      ->capture_default_str()->check(CLI::IsMember({"random", "first"}))->group(g_cal);
  cmd->add_flag("--no-sequential{false}", opt->sequential,
                "Calibrate every layer on the unquantized model's activations (default: through the already-quantized "
                "layers)")->group(g_cal);
  cmd->add_flag("--resume", opt->resume, "Continue an interrupted calibrated run at its next layer")->group(g_cal);
  cmd->footer(
      "Examples:\n"
      "  nibble quantize --method rtn --model ../shared/models/stories260K --out out/stories-rtn --group 64\n"
      "  nibble quantize --method rtn --model ../shared/models/stories260K/gguf/stories260K-F32.gguf --out out/s-rtn\n"
      "  nibble quantize --method gptq --mse --model ../shared/models/qwen3-26M-linux --out out/qwen3-gptq \\\n"
      "      --calib ../shared/data/corpora/linux-calib.txt --calib-samples 128 --calib-len 512\n"
      "  nibble quantize --method gptq --device cuda --model ../shared/models/qwen3-26M-linux --out out/qwen3-gptq \\\n"
      "      --calib ../shared/data/corpora/linux-calib.txt   (all of GPTQ on the GPU; int4_asym)\n"
      "  nibble quantize --method awq+gptq --model ../shared/models/qwen3-26M-linux --out out/qwen3-awq-gptq \\\n"
      "      --calib ../shared/data/corpora/linux-calib.txt --calib-samples 64 --calib-len 512\n"
      "  nibble quantize --method smoothquant --format int8_channel_sym --activations int8_token \\\n"
      "      --model ../shared/models/qwen3-26M-linux --out out/qwen3-w8a8 --calib ../shared/data/corpora/linux-calib.txt\n"
      "\nA calibrated run checkpoints every finished layer in .OUT.nibble-partial/; if it is killed, run the same\n"
      "command with --resume to continue at the next layer.\n"
      "\nFormats (every one works with --method rtn and gptq; --mse searches the range of per-group and\n"
      "per-channel parameters and leaves per-tensor ones as they are):\n" +
      format_list_text());

  cmd->callback([&global, model, out, opt, calib_files_ptr] {
    opt->progress = !global.quiet;
    opt->command_line = global.command_line;
    opt->calib.files.assign(calib_files_ptr->begin(), calib_files_ptr->end());
    const QuantizeResult r = quantize_model(*model, *out, *opt);
    for (const auto& w : r.warnings) std::fprintf(stderr, "nibble: warning: %s\n", w.c_str());
    if (!global.quiet)
      for (const auto& n : r.notes) std::fprintf(stderr, "nibble: %s\n", n.c_str());
    size_t nq = 0;
    double worst = 0;
    quant::RefineReport refined;  // summed over the matrices
    std::string worst_name;
    for (const auto& t : r.tensors) {
      if (!t.quantized) continue;
      ++nq;
      if (t.rel_error > worst) worst = t.rel_error, worst_name = t.name;
      refined += t.refine;
    }
    std::printf("wrote %s\n", r.out_dir.c_str());
    std::printf("  %zu of %zu tensors quantized to %s (%s): %.2f M params at %.3f bits/weight\n", nq,
                r.tensors.size(), r.format.c_str(), quant::parse_method(opt->method).name.c_str(), r.quantized_params / 1e6,
                r.quantized_bits_per_weight);
    std::printf("  checkpoint: %s for %.2f M params, %.3f bits/weight overall\n", human_bytes(r.total_bytes).c_str(),
                r.total_params / 1e6, r.checkpoint_bits_per_weight);
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    std::printf("  peak memory (RSS) %s\n", human_bytes(static_cast<uint64_t>(ru.ru_maxrss) * 1024).c_str());
    if (r.seconds_calibration > 0)
      std::printf("  time %.1f s: calibration %.1f s, writing the checkpoint %.1f s\n", r.seconds_total,
                  r.seconds_calibration, r.seconds_write);
    else
      std::printf("  time %.1f s\n", r.seconds_total);
    if (nq) std::printf("  worst relative weight error %.4f (%s); per-tensor errors in nibble.json\n", worst,
                        worst_name.c_str());
    if (opt->refine > 0 && refined.cost_before > 0)
      std::printf("  refine: GPTQ's objective %.2f %% lower over all matrices (%lld weights moved, %lld groups refit)\n",
                  100.0 * (refined.cost_before - refined.cost_after) / refined.cost_before,
                  static_cast<long long>(refined.code_changes), static_cast<long long>(refined.group_refits));
  });
}

}  // namespace nibble::cli
