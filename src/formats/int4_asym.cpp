// int4_asym: 4-bit asymmetric integer codes with a bf16 scale and a bf16 min
// per group of G consecutive inputs (G = 32, 64 or 128). docs/FORMAT.md is the
// normative description; this file is its reference implementation.
//
//   scale = bf16((max - min) / 15), min = bf16(min)         (fp32 arithmetic)
//   code  = clamp(round_half_even((w - min) / scale), 0, 15)  (0 when scale == 0)
//   w'    = code * scale + min                               (fp32, no FMA)
//   qweight byte j of a row = code[2j] | code[2j+1] << 4
//
// int4_asym_f32 (FORMAT.md §7.8) is the same with the scale and min kept in
// fp32: the format that holds the field's 4-bit affine layouts exactly where
// bf16 pairs cannot (AWQ and asymmetric GPTQ's (q − z)·s, llama.cpp's Q4_1 and
// Q4_K). Both rows are one template over the parameters' stored type.
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

// The parameters' stored type: BF16 (int4_asym) or F32 (int4_asym_f32).
template <DType P>
float stored(float v) {
  return P == DType::BF16 ? round_to_bf16(v) : v;
}

template <DType P>
std::string canonical_name(int g) {
  return P == DType::BF16 ? fmt::format("int4_g{}_asym", g) : fmt::format("int4_g{}_asym_f32", g);
}

template <DType P>
std::vector<PartSpec> parts(int64_t rows, int64_t cols, int g) {
  return {
      {"qweight", DType::U8, {rows, ceil_div(cols, 2)}},
      {"scales", P, {rows, ceil_div(cols, g)}},
      {"mins", P, {rows, ceil_div(cols, g)}},
  };
}

template <DType P>
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
  // Both parameters are rounded to their stored type before any code is
  // chosen, so codes are picked against exactly the numbers the dequantizer
  // will use.
  GroupParams p;
  p.scale = stored<P>(range / static_cast<float>(kLevels));
  p.min = stored<P>(lo);
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
template <DType P>
GroupParams affine_store(const GroupParams&, double scale, double min) {
  GroupParams p;
  p.scale = stored<P>(static_cast<float>(scale));
  p.min = stored<P>(static_cast<float>(min));
  if (p.min == 0.0f) p.min = 0.0f;  // -0 -> +0, as fit_group stores it
  return p;
}
template <DType P>
constexpr AffineParams kAffine{affine_scale, true, affine_store<P>};

template <DType P>
const FormatSpec& spec();

template <DType P>
std::vector<Tensor> pack(const QuantizedMatrix& q) {
  // qweight byte j of a row = code[2j] | code[2j+1] << 4 (pack_codes with 4 bits)
  return {pack_codes(q, 4), params_part(q, &GroupParams::scale, P), params_part(q, &GroupParams::min, P)};
}

template <DType P>
QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(spec<P>(), in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(spec<P>(), rows, cols, g);
  unpack_codes(in[0], 4, q);
  params_from_part(in[1], &GroupParams::scale, q);
  params_from_part(in[2], &GroupParams::min, q);
  return q;
}

template <DType P>
FormatSpec make_spec(std::string_view family, std::string_view description) {
  return FormatSpec{
      .family = family,
      .description = description,
      .code_bits = 4,
      .group_sizes = {32, 64, 128},
      .canonical_name = canonical_name<P>,
      .parts = parts<P>,
      .fit_tensor = nullptr,
      .fit_group = fit_group<P>,
      .encode = encode,
      .decode = decode,
      .pack = pack<P>,
      .unpack = unpack<P>,
      .affine = &kAffine<P>,
  };
}

template <>
const FormatSpec& spec<DType::BF16>() {
  return kInt4Asym;
}
template <>
const FormatSpec& spec<DType::F32>() {
  return kInt4AsymF32;
}

}  // namespace

const FormatSpec kInt4Asym = make_spec<DType::BF16>(
    "int4_asym", "4-bit asymmetric codes, bf16 scale + bf16 min per group of G inputs (4.25 bits/weight at G=128)");
const FormatSpec kInt4AsymF32 = make_spec<DType::F32>(
    "int4_asym_f32",
    "4-bit asymmetric codes, fp32 scale + fp32 min per group of G inputs: AWQ, asymmetric GPTQ and llama.cpp's "
    "Q4_1/Q4_K exactly (4.5 bits/weight at G=128)");

}  // namespace nibble::formats
