#include "nibble/synth.h"

#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "nibble/arch.h"
#include "nibble/checkpoint_writer.h"
#include "nibble/error.h"
#include "nibble/model_config.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"

namespace nibble {
namespace fs = std::filesystem;

int64_t synthesize_model(const fs::path& out_dir, const SynthOptions& o) {
  find_arch(o.model_type);
  NIBBLE_CHECK(o.hidden > 0 && o.intermediate > 0 && o.layers > 0 && o.heads > 0 && o.kv_heads > 0 && o.vocab > 0,
               "synth: every size must be positive");
  NIBBLE_CHECK(o.hidden % o.heads == 0, "synth: hidden {} is not a multiple of heads {}", o.hidden, o.heads);
  NIBBLE_CHECK(o.heads % o.kv_heads == 0, "synth: heads {} is not a multiple of kv heads {}", o.heads, o.kv_heads);
  NIBBLE_CHECK((o.hidden / o.heads) % 2 == 0, "synth: head dim {} must be even (RoPE)", o.hidden / o.heads);
  int64_t vocab = o.vocab;
  if (!o.tokenizer_from.empty()) {
    const Tokenizer tok = Tokenizer::from_file(o.tokenizer_from / "tokenizer.json");
    NIBBLE_CHECK(tok.vocab_size() <= vocab, "synth: the tokenizer of {} has {} tokens, more than --vocab {}",
                 o.tokenizer_from.string(), tok.vocab_size(), vocab);
  }
  nlohmann::ordered_json cfg = {
      {"architectures", {o.model_type == "llama" ? "LlamaForCausalLM" : o.model_type}},
      {"model_type", o.model_type},
      {"hidden_size", o.hidden},
      {"intermediate_size", o.intermediate},
      {"num_hidden_layers", o.layers},
      {"num_attention_heads", o.heads},
      {"num_key_value_heads", o.kv_heads},
      {"head_dim", o.hidden / o.heads},
      {"vocab_size", vocab},
      {"max_position_embeddings", o.context},
      {"rms_norm_eps", 1e-5},
      {"rope_theta", o.rope_theta},
      {"hidden_act", "silu"},
      {"tie_word_embeddings", o.tie_embeddings},
      {"torch_dtype", "bfloat16"},
      {"bos_token_id", 1},
      {"eos_token_id", 2},
      {"nibble_synthetic", {{"seed", o.seed}, {"init_std", o.init_std}}},
  };
  io::OutputDir out(out_dir, o.force);
  write_file_atomic(out.staging() / "config.json", cfg.dump(2) + "\n");
  const ModelConfig c = parse_model_config(out.staging() / "config.json");

  std::vector<io::OutputUnit> plan;
  int64_t params = 0;
  const auto expected = expected_tensors(c);
  for (const ExpectedTensor& t : expected) {
    plan.push_back({t.name, {{t.name, DType::BF16, t.shape}}, ""});
    params += shape_numel(t.shape);
  }
  io::ShardedWriter writer(out.staging(), plan, 4ull << 30, {{"format", "pt"}});
  Progress bar("synth", static_cast<int64_t>(expected.size()), o.progress, "tensors");
  for (size_t k = 0; k < expected.size(); ++k) {
    const ExpectedTensor& t = expected[k];
    bar.set_note(t.name);
    Tensor w = Tensor::empty(DType::BF16, t.shape);
    uint16_t* p = w.data_mut<uint16_t>();
    const int64_t n = w.numel();
    const bool gain = t.shape.size() == 1 && t.name.find("norm") != std::string::npos;
    // One generator per tensor (seeded from the seed and the tensor's index),
    // so a tensor's values do not depend on the others' sizes.
    std::mt19937_64 rng(o.seed * 1000003ull + k);
    std::normal_distribution<float> d(0.0f, o.init_std);
    for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(gain ? 1.0f : d(rng));
    writer.write(t.name, w);
    bar.advance();
  }
  bar.finish();
  writer.finish();
  if (!o.tokenizer_from.empty())
    for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
      if (fs::exists(o.tokenizer_from / f)) fs::copy_file(o.tokenizer_from / f, out.staging() / f);
  out.commit();
  return params;
}

}  // namespace nibble
