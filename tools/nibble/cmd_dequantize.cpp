// nibble dequantize: packed checkpoint -> plain HF checkpoint.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "nibble/convert.h"

namespace nibble::cli {

void register_dequantize(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("dequantize", "Write a plain Hugging Face checkpoint of the dequantized weights");
  auto model = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto dtype = std::make_shared<std::string>("f32");
  auto force = std::make_shared<bool>(false);
  cmd->add_option("--model", *model, "Model: " + model_help())->required();
  cmd->add_option("--out", *out, "Output directory")->required();
  cmd->add_option("--dtype", *dtype,
                  "Output dtype: f32 is exact; bf16/f16 round the dequantized values")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  cmd->add_flag("--force", *force, "Replace --out if it exists and is not empty");
  cmd->footer("Examples:\n  nibble dequantize --model out/stories-rtn --out out/stories-rtn-hf --dtype f32\n"
              "  nibble dequantize --model ../shared/models/stories260K/gguf/stories260K-Q4_K_M.gguf --out out/q4km-hf\n"
              "\nA GGUF file becomes a Hugging Face checkpoint: its weights dequantized as llama.cpp defines each type "
              "(q/k rows in\nHF order), config.json from its metadata, tokenizer.json and tokenizer_config.json from "
              "tokenizer.ggml.*.");
  cmd->callback([&global, model, out, dtype, force] {
    DequantizeOptions o;
    o.dtype = *dtype == "f32" ? DType::F32 : *dtype == "bf16" ? DType::BF16 : DType::F16;
    o.force = *force;
    o.progress = !global.quiet;
    dequantize_model(*model, *out, o);
    std::printf("wrote %s (%s)\n", out->c_str(), dtype->c_str());
  });
}

}  // namespace nibble::cli
