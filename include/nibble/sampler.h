// Next-token sampling: greedy at temperature 0, else temperature, top-k and
// top-p (nucleus) filtering, drawn from a seeded generator (reproducible).
#pragma once

#include <cstdint>
#include <random>

namespace nibble {

struct SamplerConfig {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int top_k = 0;             // 0 = no top-k filter
  float top_p = 1.0f;        // 1 = no nucleus filter
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(SamplerConfig c);
  // logits: [vocab]. Returns the chosen id.
  int32_t sample(const float* logits, int64_t vocab);

 private:
  SamplerConfig c_;
  std::mt19937_64 rng_;
};

// Index of the largest logit (the first on ties).
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace nibble
