// Next-token sampling: greedy at temperature 0, else temperature, top-k and
// top-p (nucleus) filtering, and a draw reproducible from its seed.
//
// What a draw at temperature T > 0 does (the same on the CPU and, bit for
// bit from the same logits, on the GPU: nibble/sample_math.h):
//   1. ids are ordered by logit, the smaller id first among equals; NaN
//      logits are never chosen;
//   2. top-k keeps the first k ids of that order (0: all);
//   3. top-p keeps the shortest prefix of those whose softmax mass at T
//      reaches top_p of theirs (the masses exp((l - max) / T) in units of
//      2^-40, summed exactly);
//   4. among the kept ids, the draw takes the largest l / T + g, where g is a
//      Gumbel variable hashed from (seed, draw number, id): the Gumbel-max
//      trick, which samples softmax(l / T) over the kept ids.
// The n-th draw of a Sampler (from 0) uses draw number n.
#pragma once

#include <cstdint>

namespace nibble {

struct SamplerConfig {
  float temperature = 0.0f;  // 0 = greedy (argmax)
  int top_k = 0;             // 0 = no top-k filter
  float top_p = 1.0f;        // 1 = no nucleus filter
  uint64_t seed = 0;
  bool filters() const { return top_k > 0 || top_p < 1.0f; }  // top-k or top-p cuts the candidates
};

// Checks a config: the errors name the CLI's flags.
void check_sampler_config(const SamplerConfig& c);

// One draw (steps 1-4 above; temperature > 0) over logits[0 .. vocab-1]; 0
// when every logit is NaN.
int32_t sample_logits(const float* logits, int64_t vocab, const SamplerConfig& c, uint64_t draw);

// Top-k / top-p's check on the host (sampling::draw_kept over the sums the
// GPU's sample_filter_kernel takes): whether `id`, the draw over every id
// (sample_logits at c's temperature and seed with no filter), is by the
// check the filtered draw too. For tests and benchmarks of the check.
bool sample_check_keeps(const float* logits, int64_t vocab, const SamplerConfig& c, int32_t id);

class Sampler {
 public:
  explicit Sampler(SamplerConfig c);
  // logits: [vocab]. Returns the chosen id (argmax at temperature 0).
  int32_t sample(const float* logits, int64_t vocab);
  const SamplerConfig& config() const { return c_; }
  // Draws made so far: the next draw's number. advance(n) counts n draws
  // made elsewhere (on the GPU) with numbers draws() .. draws() + n - 1.
  uint64_t draws() const { return draws_; }
  void advance(uint64_t n) { draws_ += n; }

 private:
  SamplerConfig c_;
  uint64_t draws_ = 0;
};

// Index of the largest logit (the first on ties).
int32_t argmax(const float* logits, int64_t vocab);

}  // namespace nibble
