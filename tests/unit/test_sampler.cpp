#include <gtest/gtest.h>

#include <cmath>

#include "nibble/error.h"
#include "nibble/sampler.h"

namespace nibble {
namespace {

TEST(Sampler, GreedyAndDegenerateFilters) {
  const float l[5] = {0.1f, 2.0f, -1.0f, 1.99f, 2.0f};
  EXPECT_EQ(argmax(l, 5), 1);  // first of the ties
  Sampler greedy({});
  EXPECT_EQ(greedy.sample(l, 5), 1);
  Sampler top1({.temperature = 5.0f, .top_k = 1, .top_p = 1.0f, .seed = 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(top1.sample(l, 5), argmax(l, 5));
  Sampler tiny_p({.temperature = 1.0f, .top_k = 0, .top_p = 1e-6f, .seed = 3});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(tiny_p.sample(l, 5), 1);
  EXPECT_THROW(Sampler({.temperature = -1.0f}), Error);
  EXPECT_THROW(Sampler({.temperature = 1.0f, .top_k = 0, .top_p = 0.0f}), Error);
}

TEST(Sampler, FrequenciesFollowSoftmaxAndSeedReproduces) {
  const float l[3] = {std::log(0.5f), std::log(0.3f), std::log(0.2f)};
  Sampler a({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 42});
  Sampler b({.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .seed = 42});
  int counts[3] = {0, 0, 0};
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const int32_t x = a.sample(l, 3);
    ASSERT_EQ(x, b.sample(l, 3));
    ++counts[x];
  }
  // 4.5 standard deviations of a binomial(20000, p) frequency is < 0.016.
  EXPECT_NEAR(counts[0] / double(n), 0.5, 0.016);
  EXPECT_NEAR(counts[1] / double(n), 0.3, 0.016);
  EXPECT_NEAR(counts[2] / double(n), 0.2, 0.016);
  // top-p 0.75 keeps {0.5, 0.3}: renormalized 0.625 / 0.375, never the third.
  Sampler p({.temperature = 1.0f, .top_k = 0, .top_p = 0.75f, .seed = 1});
  int c0 = 0;
  for (int i = 0; i < n; ++i) {
    const int32_t x = p.sample(l, 3);
    ASSERT_NE(x, 2);
    c0 += x == 0;
  }
  EXPECT_NEAR(c0 / double(n), 0.625, 0.016);
}

}  // namespace
}  // namespace nibble
