// int4_asym: 4-bit asymmetric integer codes with a bf16 scale and a bf16 min
// per group of G consecutive inputs (G = 32, 64 or 128). docs/FORMAT.md is the
// normative description; this file is its reference implementation.
//
//   scale = bf16((max - min) / 15), min = bf16(min)         (fp32 arithmetic)
//   code  = clamp(round_half_even((w - min) / scale), 0, 15)  (0 when scale == 0)
//   w'    = code * scale + min                               (fp32, no FMA)
//   qweight byte j of a row = code[2j] | code[2j+1] << 4
#include <algorithm>
#include <cmath>
#include <cstring>

#include "formats/registry_rows.h"
#include "nibble/error.h"
#include "nibble/format.h"

namespace nibble::formats {
namespace {

constexpr int kLevels = 15;  // codes 0..15

std::string canonical_name(int g) { return fmt::format("int4_g{}_asym", g); }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int g) {
  return {
      {"qweight", DType::U8, {rows, ceil_div(cols, 2)}},
      {"scales", DType::BF16, {rows, ceil_div(cols, g)}},
      {"mins", DType::BF16, {rows, ceil_div(cols, g)}},
  };
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams&) {
  float lo = w[0], hi = w[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, w[i]);
    hi = std::max(hi, w[i]);
  }
  lo *= shrink;
  hi *= shrink;
  if (lo == 0.0f) lo = 0.0f;  // -0 -> +0: FORMAT.md stores a zero min as +0 whatever the order of signed zeros
  const float range = hi - lo;
  NIBBLE_CHECK(std::isfinite(range), "group range max - min = {} - {} is not finite in fp32", hi, lo);
  // Both parameters are rounded to bf16 before any code is chosen, so codes
  // are picked against exactly the numbers the dequantizer will use.
  GroupParams p;
  p.scale = round_to_bf16(range / static_cast<float>(kLevels));
  p.min = round_to_bf16(lo);
  return p;
}

uint8_t encode(float w, const GroupParams& p) {
  if (p.scale == 0.0f) return 0;  // constant group: every weight decodes to min
  // Division (not a reciprocal multiply) and nearbyint in the default rounding
  // mode (ties to even), both in fp32: this is the arithmetic FORMAT.md fixes.
  float q = std::nearbyint((w - p.min) / p.scale);
  q = std::clamp(q, 0.0f, static_cast<float>(kLevels));
  return static_cast<uint8_t>(q);
}

float decode(uint8_t code, const GroupParams& p) { return static_cast<float>(code) * p.scale + p.min; }

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  const int64_t rows = q.rows, cols = q.cols, bytes_per_row = ceil_div(cols, 2), gpr = q.groups_per_row();
  Tensor qweight = Tensor::zeros(DType::U8, {rows, bytes_per_row});
  Tensor scales = Tensor::zeros(DType::BF16, {rows, gpr});
  Tensor mins = Tensor::zeros(DType::BF16, {rows, gpr});
  uint8_t* qw = qweight.data_mut<uint8_t>();
  uint16_t* sc = scales.data_mut<uint16_t>();
  uint16_t* mn = mins.data_mut<uint16_t>();
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* c = q.codes.data() + r * cols;
    uint8_t* out = qw + r * bytes_per_row;
    for (int64_t j = 0; j < cols / 2; ++j) out[j] = static_cast<uint8_t>((c[2 * j] & 0xF) | (c[2 * j + 1] << 4));
    if (cols % 2) out[cols / 2] = c[cols - 1] & 0xF;  // odd width: high nibble of the last byte is 0
    for (int64_t g = 0; g < gpr; ++g) {
      sc[r * gpr + g] = f32_to_bf16(q.group(r, g).scale);
      mn[r * gpr + g] = f32_to_bf16(q.group(r, g).min);
    }
  }
  return {qweight, scales, mins};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  const auto expect = parts(rows, cols, g);
  NIBBLE_CHECK(in.size() == expect.size(), "int4_asym: expected {} parts, found {}", expect.size(), in.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    NIBBLE_CHECK(in[i].dtype() == expect[i].dtype && in[i].shape() == expect[i].shape,
                 "int4_asym {}: expected {} {}, found {} {}", expect[i].suffix, dtype_name(expect[i].dtype),
                 shape_str(expect[i].shape), dtype_name(in[i].dtype()), shape_str(in[i].shape()));
  }
  QuantizedMatrix q;
  q.format = &kInt4Asym;
  q.group_size = g;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(static_cast<size_t>(rows * cols));
  q.params.resize(static_cast<size_t>(rows * q.groups_per_row()));
  const Tensor qw = in[0].contiguous(), sc = in[1].contiguous(), mn = in[2].contiguous();
  const int64_t bytes_per_row = ceil_div(cols, 2), gpr = q.groups_per_row();
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* b = qw.data<uint8_t>() + r * bytes_per_row;
    uint8_t* c = q.codes.data() + r * cols;
    for (int64_t i = 0; i < cols; ++i) c[i] = (i % 2 == 0) ? (b[i / 2] & 0xF) : (b[i / 2] >> 4);
    for (int64_t k = 0; k < gpr; ++k) {
      q.params[r * gpr + k].scale = bf16_to_f32(sc.data<uint16_t>()[r * gpr + k]);
      q.params[r * gpr + k].min = bf16_to_f32(mn.data<uint16_t>()[r * gpr + k]);
    }
  }
  return q;
}

}  // namespace

const FormatSpec kInt4Asym{
    .family = "int4_asym",
    .description = "4-bit asymmetric codes, bf16 scale + bf16 min per group of G inputs (4.25 bits/weight at G=128)",
    .code_bits = 4,
    .group_sizes = {32, 64, 128},
    .canonical_name = canonical_name,
    .parts = parts,
    .fit_tensor = nullptr,
    .fit_group = fit_group,
    .encode = encode,
    .decode = decode,
    .pack = pack,
    .unpack = unpack,
};

}  // namespace nibble::formats
