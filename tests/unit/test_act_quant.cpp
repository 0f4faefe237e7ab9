// Activation quantizers (simulated W8A8) against hand-worked values, and the
// registry loop every quantizer goes through.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "nibble/act_quant.h"
#include "test_util.h"

namespace nibble {
namespace {

// Rows of different ranges: row 0 absmax 127 (scale 1 per tensor and per
// token), row 1 absmax 63.5 (per token scale 0.5), row 2 all zero. Every
// quotient x / scale is exact, so the codes are worked by hand, ties included.
const std::vector<float> kMatrix = {
    127.0f, -0.5f, 1.5f,  2.5f,   //
    -3.25f, 0.75f, 63.5f, -1.25f,  //
    0.0f,   0.0f,  0.0f,  0.0f,    //
};

TEST(ActQuant, Int8TensorHandWorked) {
  std::vector<float> x = kMatrix;
  find_act_quant("int8_tensor")->apply(x.data(), 3, 4);
  // scale = 127 / 127 = 1: codes round half to even (-0.5 -> -0, 1.5 -> 2,
  // 2.5 -> 2, 63.5 -> 64, -3.25 -> -3, 0.75 -> 1, -1.25 -> -1).
  const std::vector<float> expect = {127, -0.0f, 2, 2, -3, 1, 64, -1, 0, 0, 0, 0};
  EXPECT_EQ(x, expect);
  EXPECT_TRUE(std::signbit(x[1]));  // -0.5 rounds to -0, not +0
}

TEST(ActQuant, Int8TokenHandWorked) {
  std::vector<float> x = kMatrix;
  find_act_quant("int8_token")->apply(x.data(), 3, 4);
  // Row 0: scale 1, as above. Row 1: scale 63.5 / 127 = 0.5, quotients -6.5,
  // 1.5, 127, -2.5 -> codes -6, 2, 127, -2 -> -3, 1, 63.5, -1. Row 2: zeros stay.
  const std::vector<float> expect = {127, -0.0f, 2, 2, -3, 1, 63.5f, -1, 0, 0, 0, 0};
  EXPECT_EQ(x, expect);
}

TEST(ActQuant, Int8ClampsAndScalesPerTensor) {
  // absmax 254 -> scale 2: 3 -> code 1.5 -> 2 -> 4; 5 -> 2.5 -> 2 -> 4; -254 -> -127 -> -254.
  std::vector<float> x = {3, 5, -254, 0.9f};
  find_act_quant("int8_tensor")->apply(x.data(), 1, 4);
  EXPECT_EQ(x, (std::vector<float>{4, 4, -254, 0}));
}

TEST(ActQuant, Fp8E4m3TensorKnownRoundings) {
  // absmax 448 -> scale 1, the values are E4M3 roundings worked by hand:
  //  300 -> 288 (step 32 in [256, 512): 288 and 320, 288 nearer)
  //  304 -> 320 (tie between 288 = 1.001b·2^8 and 320 = 1.010b·2^8: even mantissa)
  //  1.0625 -> 1 (tie between 1 and 1.125: even)
  //  0.3 -> 0.3125 (step 1/32 in [0.25, 0.5): 0.28125 and 0.3125)
  //  0.003 -> 0.00390625 (subnormal, step 2^-9: 1.536 steps -> 2)
  //  -17 -> -16 (tie between 16 and 18: even), -5.5 exact
  const std::vector<float> in = {448, 300, 304, 1.0625f, 0.3f, 0.003f, -17, -5.5f};
  const std::vector<float> out = {448, 288, 320, 1, 0.3125f, 0.00390625f, -16, -5.5f};
  std::vector<float> x = in;
  find_act_quant("fp8_e4m3_tensor")->apply(x.data(), 2, 4);
  EXPECT_EQ(x, out);
  // Twice the values: absmax 896, scale 2, every result doubles.
  for (float& v : x) v = 0;
  for (size_t i = 0; i < in.size(); ++i) x[i] = 2 * in[i];
  find_act_quant("fp8_e4m3_tensor")->apply(x.data(), 1, 8);
  for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(x[i], 2 * out[i]) << i;
}

TEST(ActQuant, EveryQuantizerInTheRegistry) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 6, dim = 40;
  std::vector<float> base(n * dim);
  for (auto& v : base) v = nd(rng);
  base[5] = 9.0f;  // one outlier: a per-token scale helps the other rows
  for (const ActQuantSpec& a : act_quants()) {
    SCOPED_TRACE(std::string(a.name));
    EXPECT_EQ(find_act_quant(a.name), &a);
    EXPECT_EQ(a.bits, 8);
    EXPECT_FALSE(a.description.empty());
    std::vector<float> x = base;
    a.apply(x.data(), n, dim);
    double err = 0, ref = 0;
    bool changed = false;
    for (int64_t i = 0; i < n * dim; ++i) {
      // Fake quantization keeps signs and never grows a value past the absmax.
      EXPECT_TRUE(x[i] == 0 || std::signbit(x[i]) == std::signbit(base[i])) << i;
      EXPECT_LE(std::abs(x[i]), 9.0f * (1 + 1e-6f)) << i;
      err += (x[i] - base[i]) * (x[i] - base[i]);
      ref += base[i] * base[i];
      changed = changed || x[i] != base[i];
    }
    EXPECT_TRUE(changed);
    // 8-bit codes: a relative MSE of about 1e-3 at most (int8 per tensor with
    // the outlier: step 9/127, MSE step²/12 = 4e-4 against values ~1; E4M3:
    // 3 mantissa bits, relative MSE about 8e-4).
    EXPECT_LT(err / ref, 3e-3);
    // Zeros stay zeros (no division by a zero scale).
    std::vector<float> z(8, 0.0f);
    a.apply(z.data(), 2, 4);
    EXPECT_EQ(z, std::vector<float>(8, 0.0f));
  }
  EXPECT_EQ(find_act_quant("none"), nullptr);
  const std::string e = test::error_of([] { find_act_quant("int3"); });
  EXPECT_NE(e.find("int3"), std::string::npos) << e;
  for (const ActQuantSpec& a : act_quants()) EXPECT_NE(e.find(std::string(a.name)), std::string::npos) << e;
}

}  // namespace
}  // namespace nibble
