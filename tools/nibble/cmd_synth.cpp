// nibble synth: a random-weight Llama-family checkpoint of any shape.
#include <cstdio>
#include <memory>

#include "commands.h"
#include "nibble/synth.h"
#include "nibble/util.h"

namespace nibble::cli {

void register_synth(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("synth", "Write a random-weight Llama-family checkpoint of a given shape "
                                          "(default: Llama-3-8B's) for benchmarks and memory measurements");
  auto o = std::make_shared<SynthOptions>();
  auto out = std::make_shared<std::string>();
  auto tok = std::make_shared<std::string>();
  cmd->add_option("--out", *out, "Output directory")->required();
  cmd->add_option("--model-type", o->model_type, "Architecture row (llama, mistral, qwen2, qwen3)")->capture_default_str();
  cmd->add_option("--hidden", o->hidden, "Hidden size")->capture_default_str();
  cmd->add_option("--intermediate", o->intermediate, "MLP width")->capture_default_str();
  cmd->add_option("--layers", o->layers, "Decoder layers")->capture_default_str();
  cmd->add_option("--heads", o->heads, "Attention heads")->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "Key/value heads")->capture_default_str();
  cmd->add_option("--vocab", o->vocab, "Vocabulary size")->capture_default_str();
  cmd->add_option("--context", o->context, "max_position_embeddings")->capture_default_str();
  cmd->add_flag("--tie-embeddings", o->tie_embeddings, "Tie the head to the embedding");
  cmd->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  cmd->add_option("--tokenizer-from", *tok, "Copy tokenizer.json (+ tokenizer_config.json) from this model directory");
  cmd->add_flag("--force", o->force, "Replace --out if it exists and is not empty");
  cmd->footer("Example (two Llama-3-8B-shaped layers, 32k vocab):\n"
              "  nibble synth --out out/llama8b-2l --layers 2 --vocab 32000");
  cmd->callback([o, out, tok, &global] {
    o->progress = !global.quiet;
    o->tokenizer_from = *tok;
    const int64_t params = synthesize_model(*out, *o);
    std::printf("wrote %s: %.3f B params (bf16, %s)\n", out->c_str(), params / 1e9,
                human_bytes(static_cast<uint64_t>(params) * 2).c_str());
  });
}

}  // namespace nibble::cli
