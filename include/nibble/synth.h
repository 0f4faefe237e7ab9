// Synthetic Llama-family checkpoints with random weights, of any shape (e.g.
// Llama-3-8B's), for benchmarks and memory measurements where a real model of
// that size is not at hand. The output is a plain HF directory
// (config.json + bf16 safetensors) that every verb accepts.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace nibble {

struct SynthOptions {
  std::string model_type = "llama";
  int64_t hidden = 4096, intermediate = 14336, layers = 32, heads = 32, kv_heads = 8, vocab = 128256;
  int64_t context = 8192;
  double rope_theta = 500000.0;
  bool tie_embeddings = false;
  uint64_t seed = 0;
  float init_std = 0.02f;                 // weights ~ N(0, std²); norm gains 1
  std::filesystem::path tokenizer_from;   // copy tokenizer files from this model dir (optional)
  bool force = false;
  bool progress = true;
};

// Writes the checkpoint; returns its total parameter count.
int64_t synthesize_model(const std::filesystem::path& out, const SynthOptions& o);

}  // namespace nibble
