// nibble quantize: HF checkpoint -> nibble packed checkpoint.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "nibble/convert.h"
#include "nibble/format.h"
#include "nibble/quantizer.h"
#include "nibble/util.h"

namespace nibble::cli {

void register_quantize(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("quantize", "Quantize the linear layers of a Hugging Face checkpoint");
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto opt = std::make_shared<QuantizeOptions>();
  std::vector<std::string> methods;
  for (const auto* m : quant::method_registry()) methods.emplace_back(m->name);
  std::vector<std::string> formats;
  for (const auto* f : format_registry()) formats.emplace_back(f->family);

  cmd->add_option("--model", *model, "Hugging Face model directory (config.json + safetensors)")->required();
  cmd->add_option("--out", *out, "Output directory for the packed checkpoint")->required();
  cmd->add_option("--method", opt->method, "Quantization method")->check(CLI::IsMember(methods))->capture_default_str();
  cmd->add_option("--format", opt->format, "Storage format")->check(CLI::IsMember(formats))->capture_default_str();
  cmd->add_option("--group", opt->group_size, "Group size (inputs per scale/min)")
      ->check(CLI::IsMember({32, 64, 128}))
      ->capture_default_str();
  cmd->add_option("--keep", opt->keep_regex, "Tensors whose name matches this regex stay unquantized");
  cmd->add_flag("--allow-nonfinite", opt->allow_nonfinite,
                "Keep a weight with NaN/Inf unquantized (with a warning) instead of failing");
  cmd->add_flag("--force", opt->force, "Replace --out if it exists and is not empty");
  cmd->footer(
      "Example:\n  nibble quantize --method rtn --model ../shared/models/stories260K --out out/stories-rtn --group 64");

  cmd->callback([&global, model, out, opt, cmd] {
    opt->progress = !global.quiet;
    opt->command_line = "nibble quantize --method " + opt->method + " --model " + *model + " --out " + *out +
                        " --group " + std::to_string(opt->group_size) +
                        (opt->keep_regex.empty() ? "" : " --keep '" + opt->keep_regex + "'");
    const QuantizeResult r = quantize_model(*model, *out, *opt);
    for (const auto& w : r.warnings) std::fprintf(stderr, "nibble: warning: %s\n", w.c_str());
    size_t nq = 0;
    double worst = 0;
    std::string worst_name;
    for (const auto& t : r.tensors) {
      if (!t.quantized) continue;
      ++nq;
      if (t.rel_error > worst) worst = t.rel_error, worst_name = t.name;
    }
    std::printf("wrote %s\n", r.out_dir.c_str());
    std::printf("  %zu of %zu tensors quantized to %s (%s): %.2f M params at %.3f bits/weight\n", nq,
                r.tensors.size(), r.format.c_str(), opt->method.c_str(), r.quantized_params / 1e6,
                r.quantized_bits_per_weight);
    std::printf("  checkpoint: %s for %.2f M params, %.3f bits/weight overall\n", human_bytes(r.total_bytes).c_str(),
                r.total_params / 1e6, r.checkpoint_bits_per_weight);
    if (nq) std::printf("  worst relative weight error %.4f (%s); per-tensor errors in nibble.json\n", worst,
                        worst_name.c_str());
  });
}

}  // namespace nibble::cli
