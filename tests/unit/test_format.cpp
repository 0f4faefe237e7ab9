// The format registry and int4_asym: worked examples, an independent scalar
// reference for RTN, bit-exact packing, and properties every row must have.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/quantizer.h"

namespace nibble {
namespace {

// --- An independent reference, written from docs/FORMAT.md -----------------
// bf16 rounding by picking the nearer of the two neighbouring bf16 values in
// double arithmetic (ties to even mantissa): no bit tricks shared with dtype.cpp.
float ref_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t down_bits = u & 0xFFFF0000u, up_bits = down_bits + 0x10000u;
  float down, up;
  std::memcpy(&down, &down_bits, 4);
  std::memcpy(&up, &up_bits, 4);
  const double dd = std::abs(static_cast<double>(x) - down), du = std::abs(static_cast<double>(up) - x);
  if (dd < du) return down;
  if (du < dd) return up;
  return ((down_bits >> 16) & 1) ? up : down;
}

struct RefGroup {
  float scale, min;
  std::vector<uint8_t> codes;
};

RefGroup ref_rtn_group(const std::vector<float>& x) {
  float lo = x[0], hi = x[0];
  for (float v : x) lo = v < lo ? v : lo, hi = v > hi ? v : hi;
  RefGroup g;
  volatile float range = hi - lo;  // volatile: one fp32 rounding per operation, as the doc says
  volatile float s = range / 15.0f;
  g.scale = ref_bf16(s);
  g.min = ref_bf16(lo);
  for (float v : x) {
    if (g.scale == 0.0f) {
      g.codes.push_back(0);
      continue;
    }
    volatile float diff = v - g.min;
    volatile float q = diff / g.scale;
    double r = std::nearbyint(static_cast<double>(q));  // q is exact in double; ties-to-even
    if (r < 0) r = 0;
    if (r > 15) r = 15;
    g.codes.push_back(static_cast<uint8_t>(r));
  }
  return g;
}

const FormatSpec& int4() { return *find_format("int4_asym").spec; }

TEST(Format, RegistryNamesAndLookup) {
  EXPECT_EQ(find_format("int4_g128_asym").group_size, 128);
  EXPECT_EQ(find_format("int4_asym", 64).canonical_name(), "int4_g64_asym");
  EXPECT_EQ(find_format("int4_asym").group_size, 128);  // default: largest supported
  EXPECT_THROW(find_format("int4_asym", 48), Error);
  EXPECT_THROW(find_format("int4_g128_asym", 64), Error);
  try {
    find_format("int3_g128_sym");
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int4_g128_asym"), std::string::npos) << e.what();  // lists known names
  }
}

TEST(Format, WorkedExampleFromFormatDoc) {
  const FormatChoice f = find_format("int4_asym", 32);
  const float w[4] = {-1.0f, 0.0f, 0.5f, 2.0f};
  QuantizedMatrix q = quant::quantize_rtn(f, w, 1, 4);
  ASSERT_EQ(q.params.size(), 1u);
  EXPECT_EQ(q.params[0].scale, 0.2001953125f);
  EXPECT_EQ(q.params[0].min, -1.0f);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0, 5, 7, 15}));
  const std::vector<Tensor> parts = f.spec->pack(q);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].shape(), (Shape{1, 2}));
  EXPECT_EQ(parts[0].data<uint8_t>()[0], 0x50);
  EXPECT_EQ(parts[0].data<uint8_t>()[1], 0xF7);
  EXPECT_EQ(parts[1].data<uint16_t>()[0], 0x3E4D);
  EXPECT_EQ(parts[2].data<uint16_t>()[0], 0xBF80);
  const Tensor back = dequantize_parts(f, parts, 1, 4);
  const float expect[4] = {-1.0f, 0.0009765625f, 0.4013671875f, 2.0029296875f};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(back.data<float>()[i], expect[i]) << i;
}

TEST(Format, TiesRoundToEven) {
  // scale = 15/15 = 1 exactly, min = 0: 2.5 -> 2, 3.5 -> 4, 0.5 -> 0, 14.5 -> 14.
  const float w[6] = {0.0f, 2.5f, 3.5f, 0.5f, 14.5f, 15.0f};
  QuantizedMatrix q = quant::quantize_rtn(find_format("int4_asym", 32), w, 1, 6);
  EXPECT_EQ(q.params[0].scale, 1.0f);
  EXPECT_EQ(q.codes, (std::vector<uint8_t>{0, 2, 4, 0, 14, 15}));
}

TEST(Format, ConstantGroupGivesCodeZeroAndNoNan) {
  std::vector<float> w(64, 0.3f);
  w.resize(128, -2.0f);  // second group constant too
  QuantizedMatrix q = quant::quantize_rtn(find_format("int4_asym", 64), w.data(), 1, 128);
  EXPECT_EQ(q.params[0].scale, 0.0f);
  for (uint8_t c : q.codes) EXPECT_EQ(c, 0);
  std::vector<float> back(128);
  dequantize(q, back.data());
  for (int i = 0; i < 128; ++i) {
    EXPECT_FALSE(std::isnan(back[i]));
    EXPECT_EQ(back[i], ref_bf16(w[i]));
  }
}

// RTN against the independent reference on random and adversarial groups,
// every group size, ragged last groups (172 = stories260K's down_proj width).
TEST(Format, RtnMatchesScalarReference) {
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (int g : {32, 64, 128}) {
    const FormatChoice f = find_format("int4_asym", g);
    for (int64_t cols : {int64_t{64}, int64_t{172}, int64_t{129}, int64_t{7}, int64_t{300}}) {
      const int64_t rows = 9;
      std::vector<float> w(static_cast<size_t>(rows * cols));
      for (auto& v : w) v = normal(rng);
      // Adversarial rows: one outlier, negative-only, constant, tiny range far
      // from zero, exact ties, huge magnitudes, subnormal range.
      for (int64_t c = 0; c < cols; ++c) {
        w[1 * cols + c] = (c == 3) ? 5.0f : normal(rng);
        w[2 * cols + c] = -std::abs(normal(rng)) - 0.5f;
        w[3 * cols + c] = 0.125f;
        w[4 * cols + c] = 100.0f + 0.001f * static_cast<float>(c % 11);
        w[5 * cols + c] = static_cast<float>(c % 16) * 0.5f;  // ties: scale exactly 0.5
        w[6 * cols + c] = (c % 2 ? 1e30f : -1e30f) * normal(rng);
        w[7 * cols + c] = 1e-40f * static_cast<float>(c % 5);
      }
      const QuantizedMatrix q = quant::quantize_rtn(f, w.data(), rows, cols);
      const int64_t gpr = (cols + g - 1) / g;
      ASSERT_EQ(q.groups_per_row(), gpr);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = 0; k < gpr; ++k) {
          const int64_t c0 = k * g, n = std::min<int64_t>(g, cols - c0);
          const RefGroup ref = ref_rtn_group(std::vector<float>(w.begin() + r * cols + c0, w.begin() + r * cols + c0 + n));
          ASSERT_EQ(q.group(r, k).scale, ref.scale) << "g=" << g << " cols=" << cols << " row " << r << " group " << k;
          ASSERT_EQ(q.group(r, k).min, ref.min) << "row " << r << " group " << k;
          for (int64_t i = 0; i < n; ++i)
            ASSERT_EQ(q.codes[r * cols + c0 + i], ref.codes[i]) << "row " << r << " col " << c0 + i;
        }
      }
    }
  }
}

// Every weight of a group that straddles zero is within half a step of its
// original (FORMAT.md's bound without the far-from-zero allowance).
TEST(Format, RtnErrorWithinHalfStep) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const FormatChoice f = find_format("int4_asym", 128);
  const int64_t rows = 64, cols = 1000;
  std::vector<float> w(rows * cols);
  for (auto& v : w) v = normal(rng);
  const QuantizedMatrix q = quant::quantize_rtn(f, w.data(), rows, cols);
  std::vector<float> back(w.size());
  dequantize(q, back.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const GroupParams& p = q.group(r, c / 128);
      // half a step plus the two bf16 roundings FORMAT.md allows for
      const double bound = 0.5 * p.scale + std::ldexp(std::abs(p.min), -8) + std::ldexp(15.0 * p.scale, -8);
      ASSERT_LE(std::abs(back[r * cols + c] - w[r * cols + c]), bound) << r << "," << c;
    }
}

// int4_asym's packing with arbitrary bf16 parameters (every registry row's
// pack/unpack identity is tests/unit/test_format_registry.cpp's).
TEST(Format, PackUnpackBitExactRoundTrip) {
  std::mt19937 rng(99);
  const FormatSpec* spec = &int4();
  for (int g : spec->group_sizes) {
    for (int64_t cols : {int64_t{1}, int64_t{2}, int64_t{31}, int64_t{172}, int64_t{256}, int64_t{333}}) {
      QuantizedMatrix q;
      q.format = spec;
      q.group_size = g;
      q.rows = 5;
      q.cols = cols;
      q.codes.resize(q.rows * cols);
      for (auto& c : q.codes) c = static_cast<uint8_t>(rng() % (1u << spec->code_bits));
      q.params.resize(q.rows * q.groups_per_row());
      for (auto& p : q.params) {
        p.scale = ref_bf16(std::ldexp(static_cast<float>(rng() % 1000 + 1), -12));
        p.min = ref_bf16(-std::ldexp(static_cast<float>(rng() % 1000), -10));
      }
      const std::vector<Tensor> parts = spec->pack(q);
      const auto specs = spec->parts(q.rows, cols, g);
      ASSERT_EQ(parts.size(), specs.size());
      for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_EQ(parts[i].dtype(), specs[i].dtype);
        EXPECT_EQ(parts[i].shape(), specs[i].shape);
      }
      if (cols % 2) {  // odd width: the padding nibble is zero
        const int64_t bpr = (cols + 1) / 2;
        for (int64_t r = 0; r < q.rows; ++r) EXPECT_EQ(parts[0].data<uint8_t>()[r * bpr + bpr - 1] >> 4, 0);
      }
      const QuantizedMatrix u = spec->unpack(parts, q.rows, cols, g);
      EXPECT_EQ(u.codes, q.codes);
      ASSERT_EQ(u.params.size(), q.params.size());
      for (size_t i = 0; i < q.params.size(); ++i) {
        EXPECT_EQ(u.params[i].scale, q.params[i].scale);
        EXPECT_EQ(u.params[i].min, q.params[i].min);
      }
      EXPECT_EQ(spec->pack(u)[0].nbytes(), parts[0].nbytes());
      EXPECT_EQ(std::memcmp(spec->pack(u)[0].raw(), parts[0].raw(), parts[0].nbytes()), 0);
    }
  }
}

TEST(Format, LowNibbleHoldsEvenElement) {
  QuantizedMatrix q;
  q.format = &int4();
  q.group_size = 32;
  q.rows = 1;
  q.cols = 5;
  q.codes = {1, 2, 3, 4, 5};
  q.params = {{1.0f, 0.0f}};
  const auto parts = int4().pack(q);
  const uint8_t* b = parts[0].data<uint8_t>();
  EXPECT_EQ(b[0], 0x21);
  EXPECT_EQ(b[1], 0x43);
  EXPECT_EQ(b[2], 0x05);
}

TEST(Format, UnpackRejectsWrongParts) {
  const FormatChoice f = find_format("int4_asym", 64);
  const std::vector<float> w(2 * 128, 0.5f);
  auto parts = f.spec->pack(quant::quantize_rtn(f, w.data(), 2, 128));
  EXPECT_THROW(f.spec->unpack(parts, 2, 130, 64), Error);  // shapes disagree with [2, 130]
  parts[1] = parts[1].to_f32();
  EXPECT_THROW(f.spec->unpack(parts, 2, 128, 64), Error);  // scales must be BF16
}

TEST(Format, BitsPerWeight) {
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g128_asym"), 4096, 4096), 4.25);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g64_asym"), 10, 128), 4.5);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g32_asym"), 10, 128), 5.0);
  // 172 inputs at G=64: 86 bytes + 3 groups x 4 bytes per row = 98 bytes = 784 bits / 172
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g64_asym"), 1, 172), 784.0 / 172.0);
}

TEST(Format, MethodRegistry) {
  EXPECT_EQ(quant::find_method("rtn").name, "rtn");
  EXPECT_THROW(quant::find_method("awq-but-not-yet"), Error);
}

}  // namespace
}  // namespace nibble
