#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "nibble/error.h"
#include "nibble/sample_math.h"
#include "nibble/sampler.h"

namespace nibble {
namespace {

TEST(Sampler, GreedyAndDegenerateFilters) {
  const float l[5] = {0.1f, 2.0f, -1.0f, 1.99f, 2.0f};
  EXPECT_EQ(argmax(l, 5), 1);  // first of the ties
  Sampler greedy({});
  EXPECT_EQ(greedy.sample(l, 5), 1);
  EXPECT_EQ(greedy.draws(), 0u);  // greedy draws nothing
  Sampler top1({.temperature = 5.0f, .top_k = 1, .top_p = 1.0f, .seed = 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(top1.sample(l, 5), argmax(l, 5));
  EXPECT_EQ(top1.draws(), 50u);
  Sampler tiny_p({.temperature = 1.0f, .top_k = 0, .top_p = 1e-6f, .seed = 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(tiny_p.sample(l, 5), 1);
  EXPECT_THROW(Sampler({.temperature = -1.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = std::numeric_limits<float>::infinity()}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = -1}), Error);
  // NaN logits are never drawn; all NaN gives 0.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float some[4] = {nan, -3.0f, nan, -3.5f};
  Sampler hot({.temperature = 100.0f, .seed = 9});
  for (int i = 0; i < 200; ++i) {
    const int32_t x = hot.sample(some, 4);
    EXPECT_TRUE(x == 1 || x == 3) << x;
  }
  const float none[3] = {nan, nan, nan};
  EXPECT_EQ(hot.sample(none, 3), 0);
}

TEST(Sampler, FrequenciesFollowSoftmaxAndSeedReproduces) {
  const float l[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler a({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 42});
  Sampler b({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 42});
  Sampler other({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 43});
  int counts[3] = {0, 0, 0}, same = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = a.sample(l, 3);
    ASSERT_EQ(x, b.sample(l, 3));
    same += x == other.sample(l, 3);
    ++counts[x];
  }
  // 4.5 standard deviations of a binomial(20000, p) frequency is < 0.016.
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.016);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.016);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.016);
  // Another seed: independent draws agree with probability 0.25 + 0.09 + 0.04.
  EXPECT_NEAR(same / double(n), 0.38, 0.016);
  // top-p 0.75 keeps {0.5, 0.3}: renormalized 0.625 / 0.375, never the third;
  // top-k 2 the same.
  for (SamplerConfig c : {SamplerConfig{.temperature = 1.0f, .top_k = 0, .top_p = 0.75f, .seed = 1},
                          SamplerConfig{.temperature = 1.0f, .top_k = 2, .top_p = 1.0f, .seed = 1}}) {
    Sampler p(c);
    int c0 = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t x = p.sample(l, 3);
      ASSERT_NE(x, 2);
      c0 += x == 0;
    }
    EXPECT_NEAR(c0 / double(n), 0.625, 0.016);
  }
  // Temperature 2 flattens: p ∝ sqrt(0.5), sqrt(0.3), sqrt(0.2).
  Sampler warm({.temperature = 2.0f, .seed = 5});
  int c2 = 0;
  for (int i = 0; i < n; ++i) c2 += warm.sample(l, 3) == 2;
  const double z = std::sqrt(0.5) + std::sqrt(0.3) + std::sqrt(0.2);
  EXPECT_NEAR(c2 / double(n), std::sqrt(0.2) / z, 0.016);
}

// The sampler's own log and exp against the C library's.
TEST(Sampler, MathMatchesTheLibrary) {
  namespace s = sampling;
  double worst_log = 0, worst_exp = 0;
  std::mt19937 g(7);
  std::uniform_real_distribution<float> e(-26.0f, 4.0f), x(-30.0f, 0.0f);
  for (int i = 0; i < 200000; ++i) {
    const float v = std::exp2(e(g));
    const double want = std::log(static_cast<double>(v));
    worst_log = std::max(worst_log, std::abs(s::log(v) - want) / std::max(std::abs(want), 1e-30));
    const float y = x(g);
    const double m = std::exp(static_cast<double>(y)) * s::kMassOne;
    if (m >= 1e9) worst_exp = std::max(worst_exp, std::abs(static_cast<double>(s::exp_mass(y)) - m) / m);
  }
  EXPECT_LT(worst_log, 4e-7);  // about 3 ulp (relative; log(1 ± ε) is covered by the absolute check below)
  EXPECT_LT(worst_exp, 4e-7);
  for (float v : {1.0f - 5.9604645e-08f, 1.0f + 1.1920929e-07f, 5.9604645e-08f, 16.635532f})
    EXPECT_NEAR(s::log(v), std::log(static_cast<double>(v)), 1e-6 * std::abs(std::log(static_cast<double>(v))));
  EXPECT_EQ(s::exp_mass(0.0f), static_cast<uint64_t>(s::kMassOne));
  EXPECT_EQ(s::exp_mass(-31.0f), 0u);
  EXPECT_EQ(s::mass(std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity(), 1.0f),
            static_cast<uint64_t>(s::kMassOne));
  // The Gumbel variables: mean γ = 0.5772, variance π²/6 = 1.645.
  double sum = 0, sq = 0;
  const int n = 400000;
  for (int i = 0; i < n; ++i) {
    const double v = s::gumbel(11, static_cast<uint64_t>(i / 1000), i % 1000);
    sum += v;
    sq += v * v;
  }
  const double mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 0.5772, 0.01);  // the mean's standard error is 0.002
  EXPECT_NEAR(var, 1.6449, 0.03);
}

// sample_logits (chunked selection) against the definition written out with
// a full sort, on logits with ties, -0, infinities and NaN.
int32_t reference_draw(const std::vector<float>& l, const SamplerConfig& c, uint64_t draw) {
  namespace s = sampling;
  std::vector<int64_t> ids;
  for (int64_t i = 0; i < static_cast<int64_t>(l.size()); ++i)
    if (!std::isnan(l[i])) ids.push_back(i);
  if (ids.empty()) return 0;
  std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) { return l[a] > l[b]; });
  if (c.top_k > 0 && static_cast<size_t>(c.top_k) < ids.size()) ids.resize(static_cast<size_t>(c.top_k));
  if (c.top_p < 1.0f) {
    const float lmax = l[ids[0]];
    uint64_t total = 0, cum = 0;
    for (int64_t i : ids) total += s::mass(l[i], lmax, c.temperature);
    size_t keep = ids.size();
    for (size_t j = 0; j < ids.size(); ++j) {
      cum += s::mass(l[ids[j]], lmax, c.temperature);
      if (static_cast<double>(cum) >= static_cast<double>(c.top_p) * static_cast<double>(total)) {
        keep = j + 1;
        break;
      }
    }
    ids.resize(keep);
  }
  int64_t best = -1;
  float bz = 0;
  for (int64_t i : ids) {
    const float z = s::score(l[i], c.temperature, c.seed, draw, i);
    if (best < 0 || z > bz || (z == bz && i < best)) best = i, bz = z;
  }
  return static_cast<int32_t>(best);
}

TEST(Sampler, DrawMatchesTheDefinition) {
  std::mt19937 g(3);
  std::normal_distribution<float> n(0.0f, 4.0f);
  for (int trial = 0; trial < 12; ++trial) {
    std::vector<float> l(trial < 6 ? 3000 : 40);
    for (float& v : l) v = n(g);
    // Ties (rounded values), both zeros, infinities, NaN.
    for (size_t i = 0; i < l.size(); i += 3) l[i] = std::round(l[i]);
    l[5] = -0.0f;
    l[6] = 0.0f;
    l[7] = -std::numeric_limits<float>::infinity();
    l[8] = std::numeric_limits<float>::quiet_NaN();
    if (trial % 4 == 3) l[9] = std::numeric_limits<float>::infinity();
    for (SamplerConfig c : {SamplerConfig{.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .seed = 1},
                            SamplerConfig{.temperature = 1.3f, .top_k = 40, .top_p = 1.0f, .seed = 2},
                            SamplerConfig{.temperature = 0.7f, .top_k = 0, .top_p = 0.95f, .seed = 3},
                            SamplerConfig{.temperature = 1.0f, .top_k = 50, .top_p = 0.6f, .seed = 4},
                            SamplerConfig{.temperature = 20.0f, .top_k = 0, .top_p = 0.999f, .seed = 5},
                            SamplerConfig{.temperature = 0.01f, .top_k = 7, .top_p = 0.3f, .seed = 6}}) {
      std::set<int32_t> seen;
      for (uint64_t d = 0; d < 25; ++d) {
        const int32_t got = sample_logits(l.data(), static_cast<int64_t>(l.size()), c, d);
        ASSERT_EQ(got, reference_draw(l, c, d)) << "trial " << trial << " T " << c.temperature << " k " << c.top_k
                                                << " p " << c.top_p << " draw " << d;
        seen.insert(got);
      }
      if (c.temperature >= 20.0f && trial % 4 != 3) {
        EXPECT_GT(seen.size(), 5u);  // the draws move (no +inf logit)
      }
    }
  }
}

// sampling::draw_kept (the GPU's check before top-k / top-p's select, on the
// host: sample_check_keeps) against the sampler itself: where it says the
// draw over every id is kept, the filtered draw must be that id; with one
// filter, where it says not, the filtered draw must differ (the id is not
// kept). Both answers must come up many times.
TEST(Sampler, CheckAgreesWithTheFilteredDraw) {
  std::mt19937 g(7);
  int kept = 0, not_kept = 0;
  for (int trial = 0; trial < 8; ++trial) {
    std::normal_distribution<float> n(0.0f, trial < 4 ? 4.0f : 0.5f);  // peaked and flat
    std::vector<float> l(trial % 2 == 0 ? 2000 : 64);
    for (float& v : l) v = n(g);
    for (size_t i = 0; i < l.size(); i += 4) l[i] = std::round(l[i]);  // ties
    l[3] = std::numeric_limits<float>::quiet_NaN();
    const auto N = static_cast<int64_t>(l.size());
    for (SamplerConfig c : {SamplerConfig{.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = 1},
                            SamplerConfig{.temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .seed = 2},
                            SamplerConfig{.temperature = 1.0f, .top_k = 20, .top_p = 0.8f, .seed = 3},
                            SamplerConfig{.temperature = 2.0f, .top_k = 3, .top_p = 0.5f, .seed = 4},
                            SamplerConfig{.temperature = 1.0f, .top_k = 0, .top_p = 0.3f, .seed = 5}}) {
      SamplerConfig all = c;
      all.top_k = 0;
      all.top_p = 1.0f;
      for (uint64_t d = 0; d < 40; ++d) {
        const int32_t id = sample_logits(l.data(), N, all, d);
        const bool says = sample_check_keeps(l.data(), N, c, id);
        const int32_t want = sample_logits(l.data(), N, c, d);
        if (says) {
          ASSERT_EQ(want, id) << "trial " << trial << " k " << c.top_k << " p " << c.top_p << " draw " << d;
        } else if (c.top_k == 0 || c.top_p == 1.0f) {
          ASSERT_NE(want, id) << "trial " << trial << " k " << c.top_k << " p " << c.top_p << " draw " << d;
        }
        ++(says ? kept : not_kept);
      }
    }
  }
  EXPECT_GT(kept, 300);
  EXPECT_GT(not_kept, 300);
}

}  // namespace
}  // namespace nibble
