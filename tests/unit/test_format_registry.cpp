// Properties every row of the format registry must have, checked by iterating
// over the registry (DESIGN.md: a new row is tested automatically): bit-exact
// pack/unpack identity, parts as parts() declares them, bits per weight from
// the stored bytes, RTN choosing the nearest representable value, re-quantizing
// a dequantized matrix changing nothing, and GPTQ working through the same
// primitives.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>

#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/gptq.h"
#include "nibble/quantizer.h"

namespace nibble {
namespace {

// Every (row, group size) the registry offers.
std::vector<FormatChoice> all_choices() {
  std::vector<FormatChoice> out;
  for (const FormatSpec* f : format_registry())
    for (int g : f->group_sizes) out.push_back({f, g});
  return out;
}

// A matrix like a linear's weights: N(0, 0.02²), an outlier in some rows, one
// all-zero row and one constant row, so groups of every kind appear.
std::vector<float> weights(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (auto& v : w) v = normal(rng);
  for (int64_t r = 0; r < rows; r += 3) w[r * cols + (r * 7) % cols] = 0.25f;  // outliers
  if (rows > 2) {
    for (int64_t c = 0; c < cols; ++c) w[1 * cols + c] = 0.0f;
    for (int64_t c = 0; c < cols; ++c) w[2 * cols + c] = -0.0123f;
  }
  return w;
}

bool same_params(const GroupParams& a, const GroupParams& b) { return std::memcmp(&a, &b, sizeof(GroupParams)) == 0; }

const int64_t kCols[] = {1, 7, 33, 172, 300};

TEST(FormatRegistry, EveryChoiceIsFoundByItsNamesAndHasADescription) {
  std::set<std::string> names;
  for (const FormatChoice& c : all_choices()) {
    SCOPED_TRACE(c.canonical_name());
    EXPECT_TRUE(names.insert(c.canonical_name()).second) << "canonical names must be unique";
    const FormatChoice by_name = find_format(c.canonical_name());
    EXPECT_EQ(by_name.spec, c.spec);
    EXPECT_EQ(by_name.group_size, c.group_size);
    EXPECT_EQ(find_format(c.spec->family, c.group_size).canonical_name(), c.canonical_name());
    EXPECT_FALSE(c.spec->description.empty());
    EXPECT_GE(c.spec->code_bits, 2);
    EXPECT_LE(c.spec->code_bits, 8);
  }
  EXPECT_EQ(names.size(), format_names().size());
  EXPECT_EQ(find_format("int4_asym").canonical_name(), "int4_g128_asym");  // the default stays what it was
  EXPECT_THROW(find_format("int8_channel_sym", 128), Error);  // no group size to choose
  EXPECT_THROW(find_format("mxfp4", 16), Error);
}

TEST(FormatRegistry, PackUnpackIsABitExactIdentity) {
  std::mt19937 rng(99);
  for (const FormatChoice& f : all_choices()) {
    for (int64_t cols : kCols) {
      SCOPED_TRACE(fmt::format("{} cols={}", f.canonical_name(), cols));
      const int64_t rows = 5;
      const auto w = weights(rows, cols, static_cast<uint32_t>(cols));
      QuantizedMatrix q = quant::quantize_rtn(f, w.data(), rows, cols);  // parameters the format can store
      for (auto& c : q.codes) c = static_cast<uint8_t>(rng() % (1u << f.spec->code_bits));  // any code
      const std::vector<Tensor> parts = f.spec->pack(q);
      const auto specs = f.spec->parts(rows, cols, f.group_size);
      ASSERT_EQ(parts.size(), specs.size());
      uint64_t bytes = 0;
      for (size_t i = 0; i < parts.size(); ++i) {
        EXPECT_EQ(parts[i].dtype(), specs[i].dtype) << specs[i].suffix;
        EXPECT_EQ(parts[i].shape(), specs[i].shape) << specs[i].suffix;
        bytes += parts[i].nbytes();
      }
      EXPECT_DOUBLE_EQ(bits_per_weight(f, rows, cols), 8.0 * static_cast<double>(bytes) / (rows * cols));
      const QuantizedMatrix u = f.spec->unpack(parts, rows, cols, f.group_size);
      EXPECT_EQ(u.format, f.spec);
      EXPECT_EQ(u.codes, q.codes);
      ASSERT_EQ(u.params.size(), q.params.size());
      for (size_t i = 0; i < q.params.size(); ++i) ASSERT_TRUE(same_params(u.params[i], q.params[i])) << "group " << i;
      const std::vector<Tensor> again = f.spec->pack(u);
      for (size_t i = 0; i < parts.size(); ++i) {
        ASSERT_EQ(again[i].nbytes(), parts[i].nbytes());
        EXPECT_EQ(std::memcmp(again[i].raw(), parts[i].raw(), parts[i].nbytes()), 0) << specs[i].suffix;
      }
      // Dequantizing from the parts is dequantizing the unpacked matrix.
      std::vector<float> a(static_cast<size_t>(rows * cols));
      dequantize(q, a.data());
      const Tensor b = dequantize_parts(f, parts, rows, cols);
      EXPECT_EQ(std::memcmp(a.data(), b.raw(), a.size() * 4), 0);
    }
  }
}

TEST(FormatRegistry, UnpackRejectsPartsOfTheWrongShapeOrType) {
  for (const FormatChoice& f : all_choices()) {
    SCOPED_TRACE(f.canonical_name());
    const auto w = weights(4, 64, 5);
    auto parts = f.spec->pack(quant::quantize_rtn(f, w.data(), 4, 64));
    EXPECT_THROW(f.spec->unpack(parts, 4, 66 + 64, f.group_size), Error);
    parts.pop_back();
    EXPECT_THROW(f.spec->unpack(parts, 4, 64, f.group_size), Error);
  }
}

// RTN's code is the nearest representable value under the group's parameters:
// |w − w'| is at most half the gap between the two values around w (within
// fp32 rounding of the format's arithmetic), or the distance to the largest
// value for a w beyond it.
TEST(FormatRegistry, RtnPicksTheNearestRepresentableValue) {
  for (const FormatChoice& f : all_choices()) {
    for (int64_t cols : kCols) {
      SCOPED_TRACE(fmt::format("{} cols={}", f.canonical_name(), cols));
      const int64_t rows = 7;
      const auto w = weights(rows, cols, static_cast<uint32_t>(3 * cols));
      const QuantizedMatrix q = quant::quantize_rtn(f, w.data(), rows, cols);
      ASSERT_EQ(q.params.size(), static_cast<size_t>(rows * q.groups_per_row()));
      const int ncodes = 1 << f.spec->code_bits;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const GroupParams& p = q.group(r, c / q.group_len());
          const float x = w[r * cols + c];
          const float got = f.spec->decode(q.codes[r * cols + c], p);
          double best = INFINITY;
          for (int k = 0; k < ncodes; ++k) {
            const float v = f.spec->decode(static_cast<uint8_t>(k), p);
            if (std::isfinite(v)) best = std::min(best, std::abs(static_cast<double>(x) - v));
          }
          const double err = std::abs(static_cast<double>(x) - got);
          ASSERT_LE(err, best + 1e-6 * std::abs(x) + 1e-30)
              << "[" << r << ", " << c << "] w = " << x << " -> " << got << ", nearest is " << best << " away";
        }
      }
    }
  }
}

// dequantize(quantize(dequantize(quantize(W)))) == dequantize(quantize(W)):
// a matrix already on the format's grid comes back as it is (up to the fp32
// rounding of parameters re-derived from it, e.g. (hi − lo) / 15).
TEST(FormatRegistry, RequantizingADequantizedMatrixIsIdempotent) {
  for (const FormatChoice& f : all_choices()) {
    for (int64_t cols : kCols) {
      SCOPED_TRACE(fmt::format("{} cols={}", f.canonical_name(), cols));
      const int64_t rows = 6;
      const auto w = weights(rows, cols, static_cast<uint32_t>(5 * cols));
      std::vector<float> y(w.size()), z(w.size());
      dequantize(quant::quantize_rtn(f, w.data(), rows, cols), y.data());
      dequantize(quant::quantize_rtn(f, y.data(), rows, cols), z.data());
      for (size_t i = 0; i < y.size(); ++i)
        ASSERT_LE(std::abs(static_cast<double>(z[i]) - y[i]), 1e-6 * std::abs(y[i])) << "at " << i;
    }
  }
}

// GPTQ runs on every format through the grid primitives: its codes decode to
// the values it reports, it beats RTN's output error on correlated inputs, and
// its result packs like RTN's.
TEST(FormatRegistry, GptqWorksThroughTheFormatPrimitives) {
  const int64_t rows = 24, cols = 160, tokens = 512;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t) {  // correlated inputs: a few shared factors plus noise
    const float a = normal(rng), b = normal(rng);
    for (int64_t j = 0; j < cols; ++j)
      x[t * cols + j] = a * std::sin(0.1f * j) + b * std::cos(0.37f * j) + 0.3f * normal(rng);
  }
  quant::MatrixStats stats(cols);
  stats.add(x.data(), tokens);
  stats.finalize();
  const auto w = weights(rows, cols, 17);
  auto output_err = [&](const std::vector<float>& q) {
    double e = 0;
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t r = 0; r < rows; ++r) {
        double d = 0;
        for (int64_t j = 0; j < cols; ++j) d += static_cast<double>(q[r * cols + j] - w[r * cols + j]) * x[t * cols + j];
        e += d * d;
      }
    return e;
  };
  for (const FormatChoice& f : all_choices()) {
    for (bool act_order : {false, true}) {
      SCOPED_TRACE(fmt::format("{} act_order={}", f.canonical_name(), act_order));
      const auto grid = quant::make_format_grid(f, false);
      quant::GptqOptions o;
      o.act_order = act_order;
      const quant::GptqResult g = quant::gptq(w.data(), rows, cols, stats, *grid, o);
      const QuantizedMatrix q = g.to_quantized(*f.spec, f.group_size);
      std::vector<float> back(w.size());
      dequantize(q, back.data());
      EXPECT_EQ(std::memcmp(back.data(), g.dequant.data(), back.size() * 4), 0);
      const QuantizedMatrix u = f.spec->unpack(f.spec->pack(q), rows, cols, f.group_size);
      EXPECT_EQ(u.codes, q.codes);
      std::vector<float> rtn(w.size());
      dequantize(quant::quantize_rtn(f, w.data(), rows, cols), rtn.data());
      EXPECT_LT(output_err(back), output_err(rtn));
    }
  }
}

}  // namespace
}  // namespace nibble
