#include "nibble/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/arch.h"
#include "nibble/checkpoint_writer.h"
#include "nibble/error.h"
#include "nibble/model_config.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"

namespace nibble {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;  // splitmix64's increment

uint64_t mix64(uint64_t z) {  // splitmix64's output function
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// bf16 of x, round to nearest even (x is finite here: no NaN handling needed).
inline uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

// p[0, n) ~ N(0, sigma²) as bf16. Counter-based: the pair of elements (2j, 2j+1)
// comes from the 64-bit hash mix64(key + (j+1)·γ) (the j-th output of a
// splitmix64 stream seeded with key) through Box–Muller, so every value depends
// only on (key, j): the tensor fills in parallel blocks, and the bytes do not
// depend on the thread count.
void fill_normal_bf16(uint16_t* p, int64_t n, uint64_t key, float sigma) {
  constexpr int64_t kBlock = int64_t{1} << 16;  // elements per parallel task (even)
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  constexpr float kTwoPi = 6.28318530717958647692f, k2m24 = 1.0f / 16777216.0f;
#pragma omp parallel for schedule(dynamic, 4) if (blocks > 1)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i1 = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < i1; i += 2) {
      const uint64_t r = mix64(key + (static_cast<uint64_t>(i / 2) + 1) * kGamma);
      const float u1 = (static_cast<float>(r >> 40) + 0.5f) * k2m24;  // (0, 1): the log is finite
      const float u2 = static_cast<float>(r & 0xFFFFFFu) * k2m24;
      const float radius = sigma * std::sqrt(-2.0f * std::log(u1)), theta = kTwoPi * u2;
      p[i] = to_bf16(radius * std::cos(theta));
      if (i + 1 < i1) p[i + 1] = to_bf16(radius * std::sin(theta));
    }
  }
}

}  // namespace

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
    // One stream per tensor (keyed by the seed and the tensor's index), so a
    // tensor's values do not depend on the others' sizes.
    if (gain)
      std::fill(p, p + n, f32_to_bf16(1.0f));
    else
      fill_normal_bf16(p, n, mix64(o.seed * kGamma + k), o.init_std);
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
