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
// Q4_K). int8_asym_f32 (§7.10) is int4_asym_f32 with 8-bit codes (0..255, one
// byte each) and groups of 16 besides: llama.cpp's Q5_1, IQ4_XS and K-quant
// blocks but Q4_K exactly. The three rows are one template over the parameters'
// stored type and the code width.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "formats/common.h"
#include "formats/registry_rows.h"
#include "nibble/error.h"
#include "nibble/format.h"

namespace nibble::formats {
namespace {

// P: the parameters' stored type, BF16 (int4_asym) or F32 (int4_asym_f32, int8_asym_f32). B: the code width, 4
// (two codes a byte, §3's packing) or 8 (a byte each).
template <DType P>
float stored(float v) {
  return P == DType::BF16 ? round_to_bf16(v) : v;
}

template <DType P, int B>
std::string canonical_name(int g) {
  return fmt::format("int{}_g{}_asym{}", B, g, P == DType::BF16 ? "" : "_f32");
}

template <DType P, int B>
std::vector<PartSpec> parts(int64_t rows, int64_t cols, int g) {
  return {
      {"qweight", DType::U8, {rows, B == 4 ? ceil_div(cols, 2) : cols}},
      {"scales", P, {rows, ceil_div(cols, g)}},
      {"mins", P, {rows, ceil_div(cols, g)}},
  };
}

template <DType P, int B>
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
  p.scale = stored<P>(range / static_cast<float>((1 << B) - 1));
  p.min = stored<P>(lo);
  return p;
}

template <int B>
uint8_t encode(float w, const GroupParams& p) {
  if (p.scale == 0.0f) return 0;  // constant group: every weight decodes to min
  // Division (not a reciprocal multiply) and nearbyint in the default rounding
  // mode (ties to even), both in fp32: this is the arithmetic FORMAT.md fixes.
  float q = std::nearbyint((w - p.min) / p.scale);
  q = std::clamp(q, 0.0f, static_cast<float>((1 << B) - 1));
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

template <DType P, int B>
const FormatSpec& spec();

template <DType P, int B>
std::vector<Tensor> pack(const QuantizedMatrix& q) {
  // B = 4: qweight byte j of a row = code[2j] | code[2j+1] << 4 (pack_codes with 4 bits); B = 8: byte j = code[j]
  return {pack_codes(q, B), params_part(q, &GroupParams::scale, P), params_part(q, &GroupParams::min, P)};
}

template <DType P, int B>
QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(spec<P, B>(), in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(spec<P, B>(), rows, cols, g);
  unpack_codes(in[0], B, q);
  params_from_part(in[1], &GroupParams::scale, q);
  params_from_part(in[2], &GroupParams::min, q);
  return q;
}

template <DType P, int B>
FormatSpec make_spec(std::string_view family, std::string_view description, std::vector<int> group_sizes) {
  return FormatSpec{
      .family = family,
      .description = description,
      .code_bits = B,
      .group_sizes = std::move(group_sizes),
      .canonical_name = canonical_name<P, B>,
      .parts = parts<P, B>,
      .fit_tensor = nullptr,
      .fit_group = fit_group<P, B>,
      .encode = encode<B>,
      .decode = decode,
      .pack = pack<P, B>,
      .unpack = unpack<P, B>,
      .affine = &kAffine<P>,
  };
}

template <>
const FormatSpec& spec<DType::BF16, 4>() {
  return kInt4Asym;
}
template <>
const FormatSpec& spec<DType::F32, 4>() {
  return kInt4AsymF32;
}
template <>
const FormatSpec& spec<DType::F32, 8>() {
  return kInt8AsymF32;
}

}  // namespace

const FormatSpec kInt4Asym = make_spec<DType::BF16, 4>(
    "int4_asym", "4-bit asymmetric codes, bf16 scale + bf16 min per group of G inputs (4.25 bits/weight at G=128)",
    {32, 64, 128});
const FormatSpec kInt4AsymF32 = make_spec<DType::F32, 4>(
    "int4_asym_f32",
    "4-bit asymmetric codes, fp32 scale + fp32 min per group of G inputs: AWQ, asymmetric GPTQ and llama.cpp's "
    "Q4_1/Q4_K exactly (4.5 bits/weight at G=128)",
    {32, 64, 128});
const FormatSpec kInt8AsymF32 = make_spec<DType::F32, 8>(
    "int8_asym_f32",
    "8-bit asymmetric codes in [0, 255], fp32 scale + fp32 min per group of G inputs: llama.cpp's Q5_1/Q5_K/IQ4_XS "
    "(G=32) and Q2_K/Q3_K/Q6_K (G=16) exactly (8.5 bits/weight at G=128, 12 at G=16)",
    {16, 32, 64, 128});

}  // namespace nibble::formats
