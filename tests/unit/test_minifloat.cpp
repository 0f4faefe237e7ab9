// The small float element types of the FP8/FP4 formats (src/core/dtype.cpp):
// the OCP worked values, every code's round trip, and the fp32 encoders
// against an independent encoder: an exhaustive nearest-value search over the
// decoded codes with ties to the even code.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble {
namespace {

uint32_t bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}

// The reference encoder: among the codes whose value is finite, the one
// nearest to x (in double); a tie goes to the code whose lowest bit (the
// mantissa's last bit) is 0. The sign of a zero result is x's. Values beyond
// the largest finite one get it (saturation), as a nearest search does anyway.
uint8_t nearest_code(float x, int ncodes, float (*decode)(uint8_t)) {
  // Beyond the largest finite value the nearest is the largest, with x's sign
  // (decided here, not by distances: for |x| ≫ max those round alike in double).
  float fmax = 0.0f;
  for (int c = 0; c < ncodes; ++c)
    if (std::isfinite(decode(static_cast<uint8_t>(c)))) fmax = std::max(fmax, decode(static_cast<uint8_t>(c)));
  if (std::abs(x) > fmax) x = std::copysign(fmax, x);
  int best = -1;
  double best_d = INFINITY;
  for (int c = 0; c < ncodes; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (!std::isfinite(v)) continue;
    // The nearest value has x's sign (a zero result too): searching only
    // those also keeps huge x, where |x − v| rounds alike for ±v in double, exact.
    if (std::signbit(v) != std::signbit(x)) continue;
    const double d = std::abs(static_cast<double>(x) - v);
    if (d < best_d || (d == best_d && (c & 1) == 0)) {
      best = c;
      best_d = d;
    }
  }
  return static_cast<uint8_t>(best);
}

// Random floats that exercise an encoder whose finite range is [-fmax, fmax]:
// log-uniform magnitudes from far below the smallest subnormal to beyond the
// largest value, exact midpoints between neighbouring codes (ties), and the
// codes' own values nudged by one fp32 ulp either way.
std::vector<float> probe_values(int ncodes, float (*decode)(uint8_t), float fmax, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> log2mag(-24.0f, std::log2(fmax) + 3.0f);
  std::vector<float> xs;
  for (int i = 0; i < 100000; ++i) {
    const float m = std::exp2(log2mag(rng));
    xs.push_back(rng() % 2 ? m : -m);
  }
  std::vector<float> values;
  for (int c = 0; c < ncodes; ++c) {
    const float v = decode(static_cast<uint8_t>(c));
    if (std::isfinite(v) && v >= 0) values.push_back(v);
  }
  std::sort(values.begin(), values.end());
  for (size_t i = 0; i + 1 < values.size(); ++i) {
    const float mid = (values[i] + values[i + 1]) / 2;  // exact: one more bit than either
    for (float v : {mid, values[i], std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                    std::nextafter(values[i], INFINITY)}) {
      xs.push_back(v);
      xs.push_back(-v);
    }
  }
  for (float v : {0.0f, -0.0f, fmax, -fmax, fmax * 1.03f, fmax * 1.1f, 1e30f, -1e30f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()})
    xs.push_back(v);
  return xs;
}

TEST(Minifloat, E4M3RoundTripsEveryFiniteCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = f8_e4m3_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7F) == 0x7F) {  // S.1111.111: the only NaNs, no infinities
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    ASSERT_TRUE(std::isfinite(v)) << c;
    EXPECT_EQ(f32_to_f8_e4m3(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(f8_e4m3_to_f32(0x7E), 448.0f);  // the largest: S.1111.110
  EXPECT_EQ(f32_to_f8_e4m3(448.0f), 0x7E);
  EXPECT_EQ(f32_to_f8_e4m3(460.0f), 0x7E);   // saturates
  EXPECT_EQ(f32_to_f8_e4m3(1e6f), 0x7E);
  EXPECT_EQ(f32_to_f8_e4m3(-1e6f), 0xFE);
  EXPECT_EQ(f32_to_f8_e4m3(INFINITY), 0x7E);  // no infinity to go to
  EXPECT_EQ(f32_to_f8_e4m3(NAN), 0x7F);
  EXPECT_EQ(f32_to_f8_e4m3(-NAN), 0xFF);
  EXPECT_EQ(f32_to_f8_e4m3(0x1p-9f), 0x01);     // smallest subnormal
  EXPECT_EQ(f32_to_f8_e4m3(0x1p-10f), 0x00);    // half of it: tie to even (0)
  EXPECT_EQ(f32_to_f8_e4m3(0x1.8p-9f), 0x02);   // 1.5 units: tie to even (2)
  EXPECT_EQ(f32_to_f8_e4m3(-0.0f), 0x80);
  EXPECT_EQ(f32_to_f8_e4m3(1.0625f), 0x38);     // 1 + 1/16: tie between 1 and 1.125 -> 1
  EXPECT_EQ(f32_to_f8_e4m3(1.1875f), 0x3A);     // tie between 1.125 and 1.25 -> 1.25
}

TEST(Minifloat, E5M2RoundTripsEveryFiniteCodeAndItsInfinities) {
  for (int c = 0; c < 256; ++c) {
    const float v = f8_e5m2_to_f32(static_cast<uint8_t>(c));
    if ((c & 0x7C) == 0x7C && (c & 0x03) != 0) {  // S.11111.mm, mm != 0: NaN
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(f32_to_f8_e5m2(v), c) << "code " << c << " value " << v;
  }
  EXPECT_EQ(f8_e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f32_to_f8_e5m2(INFINITY), 0x7C);
  EXPECT_EQ(f32_to_f8_e5m2(-INFINITY), 0xFC);
  EXPECT_EQ(f32_to_f8_e5m2(1e6f), 0x7B);  // finite values saturate
  EXPECT_EQ(f32_to_f8_e5m2(-61440.0f), 0xFB);
  EXPECT_TRUE(std::isnan(f8_e5m2_to_f32(f32_to_f8_e5m2(NAN))));
  EXPECT_EQ(f32_to_f8_e5m2(0x1p-16f), 0x01);
  EXPECT_EQ(f32_to_f8_e5m2(0x1p-17f), 0x00);
}

TEST(Minifloat, E2M1DecodesToTheOcpTable) {
  const float expect[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                            -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  for (int c = 0; c < 16; ++c) {
    EXPECT_EQ(bits(e2m1_to_f32(static_cast<uint8_t>(c))), bits(expect[c])) << c;
    EXPECT_EQ(f32_to_e2m1(expect[c]), c) << c;
  }
  // Ties go to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float tie_values[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(ties[i])), tie_values[i]) << ties[i];
  EXPECT_EQ(f32_to_e2m1(7.9f), 0x7);  // saturates to 6
  EXPECT_EQ(f32_to_e2m1(-100.0f), 0xF);
  EXPECT_EQ(f32_to_e2m1(INFINITY), 0x7);
  EXPECT_THROW(f32_to_e2m1(NAN), Error);
}

// OCP MX spec, FP6 E2M3: the subnormals 0.125 .. 0.875, 1.0 at E = 1, the largest 7.5 (0b011111), and the sign in
// bit 5; the 32 magnitudes are strictly increasing.
TEST(Minifloat, E2M3DecodesToTheOcpValues) {
  EXPECT_EQ(e2m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(e2m3_to_f32(0x01), 0.125f);
  EXPECT_EQ(e2m3_to_f32(0x07), 0.875f);
  EXPECT_EQ(e2m3_to_f32(0x08), 1.0f);
  EXPECT_EQ(e2m3_to_f32(0x0F), 1.875f);
  EXPECT_EQ(e2m3_to_f32(0x10), 2.0f);
  EXPECT_EQ(e2m3_to_f32(0x1F), 7.5f);
  EXPECT_EQ(e2m3_to_f32(0x3F), -7.5f);
  EXPECT_EQ(e2m3_to_f32(0x21), -0.125f);
  EXPECT_EQ(e2m3_to_f32(0x40 | 0x08), 1.0f);  // bits above the low 6 ignored
  for (int c = 1; c < 32; ++c) {
    EXPECT_LT(e2m3_to_f32(static_cast<uint8_t>(c - 1)), e2m3_to_f32(static_cast<uint8_t>(c))) << c;
    EXPECT_EQ(e2m3_to_f32(static_cast<uint8_t>(c | 0x20)), -e2m3_to_f32(static_cast<uint8_t>(c))) << c;
  }
}

TEST(Minifloat, E8M0IsAPowerOfTwo) {
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), std::ldexp(1.0f, -127));
  EXPECT_EQ(e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_EQ(e8m0_to_f32(123), 0.0625f);
  EXPECT_TRUE(std::isnan(e8m0_to_f32(255)));
}

// The encoders against the exhaustive nearest-value search, on many floats.
TEST(Minifloat, EncodersMatchNearestValueSearch) {
  struct Case {
    const char* name;
    int ncodes;
    float (*decode)(uint8_t);
    uint8_t (*encode)(float);
    float fmax;
  };
  const Case cases[] = {
      {"e4m3", 256, f8_e4m3_to_f32, f32_to_f8_e4m3, 448.0f},
      {"e5m2", 256, f8_e5m2_to_f32, f32_to_f8_e5m2, 57344.0f},
      {"e2m1", 16, e2m1_to_f32, f32_to_e2m1, 6.0f},
  };
  for (const Case& c : cases) {
    int64_t n = 0;
    for (float x : probe_values(c.ncodes, c.decode, c.fmax, 2024)) {
      if (std::isinf(x)) continue;
      const uint8_t want = nearest_code(x, c.ncodes, c.decode);
      const uint8_t got = c.encode(x);
      ASSERT_EQ(got, want) << c.name << ": x = " << x << " (" << std::hexfloat << x << std::defaultfloat
                           << ") encodes to " << c.decode(got) << ", nearest is " << c.decode(want);
      ++n;
    }
    EXPECT_GT(n, 100000) << c.name;
  }
}

}  // namespace
}  // namespace nibble
