// mxfp4: the OCP Microscaling (MX) v1.0 FP4 format: blocks of 32 consecutive
// inputs share an E8M0 (power-of-two) scale, elements are FP4 E2M1. The scale
// follows the spec's conversion rule (§6.3): shared exponent
// X = floor(log2(absmax)) - emax_elem with emax_elem = 2 for E2M1 (6 = 1.5·2²),
// clamped to E8M0's [-127, 127]; elements are w / 2^X rounded to nearest even
// and saturated to ±6 (so a block's largest value can lose up to a quarter: the
// spec's rule puts absmax/2^X in [4, 8)). docs/FORMAT.md §7.6.
//
//   X     = floor(log2(absmax)) - 2, clamped to [-127, 127]   (-127 for an all-zero block)
//   code  = e2m1_rne_saturating(w / 2^X)                      (exact division by a power of two)
//   w'    = e2m1_value(code) * 2^X                            (exact)
//   scales byte = X + 127 (E8M0)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

constexpr int kBlock = 32, kEmaxElem = 2, kBias = 127;

std::string canonical_name(int) { return "mxfp4"; }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int) {
  return {
      {"qweight", DType::U8, {rows, ceil_div(cols, 2)}},
      {"scales", DType::U8, {rows, ceil_div(cols, kBlock)}},
  };
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams&) {
  const float amax = abs_max(w, n) * shrink;
  // ilogb is floor(log2) exactly, subnormals included.
  const int x = amax > 0.0f ? std::clamp(std::ilogb(amax) - kEmaxElem, -kBias, kBias) : -kBias;
  GroupParams p;
  p.scale = std::ldexp(1.0f, x);
  return p;
}

uint8_t encode(float w, const GroupParams& p) { return f32_to_e2m1(w / p.scale); }
float decode(uint8_t code, const GroupParams& p) { return e2m1_to_f32(code) * p.scale; }

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  Tensor scales = Tensor::zeros(DType::U8, {q.rows, q.groups_per_row()});
  for (size_t i = 0; i < q.params.size(); ++i) {
    const float s = q.params[i].scale;
    NIBBLE_CHECK(s > 0.0f && std::ldexp(1.0f, std::ilogb(s)) == s && std::ilogb(s) >= -kBias && std::ilogb(s) <= kBias,
                 "mxfp4: block scale {} is not a power of two in E8M0's range", s);
    scales.data_mut<uint8_t>()[i] = static_cast<uint8_t>(std::ilogb(s) + kBias);
  }
  return {pack_codes(q, 4), scales};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kMxfp4, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kMxfp4, rows, cols, g);
  unpack_codes(in[0], 4, q);
  const Tensor sc = in[1].contiguous();
  for (size_t i = 0; i < q.params.size(); ++i) {
    const uint8_t b = part_u8(sc, static_cast<int64_t>(i));
    NIBBLE_CHECK(b != 0xFF, "mxfp4: block scale {} is E8M0's NaN", i);
    q.params[i].scale = e8m0_to_f32(b);
  }
  return q;
}

}  // namespace

const FormatSpec kMxfp4{
    .family = "mxfp4",
    .description = "OCP MXFP4: FP4 E2M1 codes, E8M0 power-of-two scale per block of 32 inputs (4.25 bits/weight)",
    .code_bits = 4,
    .group_sizes = {kBlock},
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
