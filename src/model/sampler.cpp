#include "nibble/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "nibble/error.h"

namespace nibble {

int32_t argmax(const float* logits, int64_t vocab) {
  return static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
}

Sampler::Sampler(SamplerConfig c) : c_(c), rng_(c.seed) {
  NIBBLE_CHECK(c_.temperature >= 0, "--temp must be >= 0, found {}", c_.temperature);
  NIBBLE_CHECK(c_.top_k >= 0, "--top-k must be >= 0, found {}", c_.top_k);
  NIBBLE_CHECK(c_.top_p > 0 && c_.top_p <= 1, "--top-p must be in (0, 1], found {}", c_.top_p);
}

int32_t Sampler::sample(const float* logits, int64_t vocab) {
  if (c_.temperature == 0.0f) return argmax(logits, vocab);
  // Candidates sorted by logit, cut by top-k, softmax at the temperature, cut by top-p.
  std::vector<int32_t> idx(static_cast<size_t>(vocab));
  std::iota(idx.begin(), idx.end(), 0);
  const int64_t k = c_.top_k > 0 ? std::min<int64_t>(c_.top_k, vocab) : vocab;
  std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  idx.resize(static_cast<size_t>(k));
  std::vector<double> p(idx.size());
  const double mx = logits[idx[0]];
  double sum = 0;
  for (size_t i = 0; i < idx.size(); ++i) sum += (p[i] = std::exp((logits[idx[i]] - mx) / c_.temperature));
  size_t keep = idx.size();
  if (c_.top_p < 1.0f) {
    double cum = 0;
    for (size_t i = 0; i < idx.size(); ++i) {
      cum += p[i] / sum;
      if (cum >= c_.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  std::discrete_distribution<size_t> pick(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(keep));
  return idx[pick(rng_)];
}

}  // namespace nibble
