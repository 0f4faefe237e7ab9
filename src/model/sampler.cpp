#include "nibble/sampler.h"

#include <algorithm>
#include <functional>
#include <vector>

#include "nibble/error.h"
#include "nibble/sample_math.h"

namespace nibble {

int32_t argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

void check_sampler_config(const SamplerConfig& c) {
  NIBBLE_CHECK(c.temperature >= 0 && c.temperature <= 1e30f, "--temp must be a finite value >= 0, found {}",
               c.temperature);
  NIBBLE_CHECK(c.top_k >= 0, "--top-k must be >= 0, found {}", c.top_k);
  NIBBLE_CHECK(c.top_p > 0 && c.top_p <= 1, "--top-p must be in (0, 1], found {}", c.top_p);
}

namespace {

// Top-p over `keys` (the ids top-k kept, in any order; reordered here): the
// key of the last id of the shortest prefix, in descending key order, whose
// mass reaches top_p of theirs.
uint64_t nucleus_lowest(std::vector<uint64_t>& keys, const SamplerConfig& c) {
  namespace s = sampling;
  const float lmax = s::key_value(static_cast<uint32_t>(*std::max_element(keys.begin(), keys.end()) >> 32));
  auto mass = [&](uint64_t k) { return s::mass(s::key_value(static_cast<uint32_t>(k >> 32)), lmax, c.temperature); };
  uint64_t total = 0;
  for (uint64_t k : keys) total += mass(k);
  const double target = static_cast<double>(c.top_p) * static_cast<double>(total);
  // Walk the keys in descending order, sorting them a chunk at a time
  // (nucleus sets are usually far smaller than the vocabulary).
  const auto desc = std::greater<uint64_t>();
  uint64_t cum = 0;
  for (size_t done = 0; done < keys.size();) {
    const size_t end = std::min(keys.size(), std::max<size_t>(2 * done, 256));
    if (end < keys.size()) std::nth_element(keys.begin() + done, keys.begin() + end, keys.end(), desc);
    std::sort(keys.begin() + done, keys.begin() + end, desc);
    for (; done < end; ++done) {
      cum += mass(keys[done]);
      if (static_cast<double>(cum) >= target) return keys[done];
    }
  }
  return 0;  // not reached: the whole mass reaches any top_p <= 1
}

}  // namespace

int32_t sample_logits(const float* logits, int64_t vocab, const SamplerConfig& c, uint64_t draw) {
  namespace s = sampling;
  NIBBLE_CHECK(c.temperature > 0, "sample_logits: temperature {} (0 is greedy: argmax)", c.temperature);
  NIBBLE_CHECK(vocab > 0 && vocab < (int64_t{1} << 32) - 1, "sample_logits: {} logits", vocab);
  // The least key kept (0: every non-NaN id).
  uint64_t lowest = 0;
  if (c.filters()) {
    std::vector<uint64_t> keys;
    keys.reserve(static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i)
      if (const uint64_t k = s::key(logits[i], i); k != 0) keys.push_back(k);
    if (keys.empty()) return 0;
    const auto desc = std::greater<uint64_t>();
    if (c.top_k > 0 && static_cast<size_t>(c.top_k) < keys.size()) {
      std::nth_element(keys.begin(), keys.begin() + (c.top_k - 1), keys.end(), desc);
      lowest = keys[static_cast<size_t>(c.top_k - 1)];
      keys.resize(static_cast<size_t>(c.top_k));
    }
    if (c.top_p < 1.0f) lowest = std::max(lowest, nucleus_lowest(keys, c));
  }
  // The draw: one pass, on the OpenMP threads for a large vocabulary (a
  // maximum is the same in any order).
  uint64_t best = 0;
#pragma omp parallel for schedule(static) reduction(max : best) if (vocab >= (1 << 15))
  for (int64_t i = 0; i < vocab; ++i) {
    const uint64_t k = s::key(logits[i], i);
    if (k == 0 || k < lowest) continue;
    best = std::max(best, s::key(s::score(logits[i], c.temperature, c.seed, draw, i), i));
  }
  return s::key_row(best);
}

bool sample_check_keeps(const float* logits, int64_t vocab, const SamplerConfig& c, int32_t id) {
  namespace s = sampling;
  NIBBLE_CHECK(id >= 0 && id < vocab, "sample_check_keeps: id {} outside 0 .. {}", id, vocab - 1);
  uint64_t vmax = 0, valid = 0;
  for (int64_t i = 0; i < vocab; ++i)
    if (const uint64_t k = s::key(logits[i], i); k != 0) vmax = std::max(vmax, k), ++valid;
  const float lmax = s::key_value(static_cast<uint32_t>(vmax >> 32));
  auto mass = [&](uint64_t k) { return s::mass(s::key_value(static_cast<uint32_t>(k >> 32)), lmax, c.temperature); };
  const uint64_t kd = s::key(logits[id], id);
  uint64_t above = 0, m_above = 0, m_all = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    const uint64_t k = s::key(logits[i], i);
    if (k == 0) continue;
    if (k > kd) ++above, m_above += mass(k);
    m_all += mass(k);
  }
  return s::draw_kept(c.top_k, c.top_p, valid, above, m_above, m_above + mass(kd), m_all);
}

Sampler::Sampler(SamplerConfig c) : c_(c) { check_sampler_config(c_); }

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (c_.temperature == 0.0f) return argmax(logits, vocab);
  return sample_logits(logits, vocab, c_, draws_++);
}

}  // namespace nibble
