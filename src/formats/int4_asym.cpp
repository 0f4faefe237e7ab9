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

#include "formats/common.h"
#include "formats/registry_rows.h"
#include "nibble/error.h"
#include "nibble/format.h"

namespace nibble::formats {
namespace {

constexpr int kLevels = 15;  // codes 0..15

std::string canonical_name(int g) { return fmt::format("int4_g{}_asym", g); }

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

double affine_scale(const GroupParams& p) { return p.scale; }
GroupParams affine_store(const GroupParams&, double scale, double min) {
  GroupParams p;
  p.scale = round_to_bf16(static_cast<float>(scale));
  p.min = round_to_bf16(static_cast<float>(min));
  if (p.min == 0.0f) p.min = 0.0f;  // -0 -> +0, as fit_group stores it
  return p;
}
const AffineParams kAffine{affine_scale, true, affine_store};

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  // qweight byte j of a row = code[2j] | code[2j+1] << 4 (pack_codes with 4 bits)
  return {pack_codes(q, 4), params_part(q, &GroupParams::scale, DType::BF16),
          params_part(q, &GroupParams::min, DType::BF16)};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kInt4Asym, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kInt4Asym, rows, cols, g);
  unpack_codes(in[0], 4, q);
  params_from_part(in[1], &GroupParams::scale, q);
  params_from_part(in[2], &GroupParams::min, q);
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
    .affine = &kAffine,
};

}  // namespace nibble::formats
