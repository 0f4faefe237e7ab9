// fp4_e2m1: OCP FP4 E2M1 codes (values ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}) times a
// bf16 scale per group of G inputs, scale = absmax / 6: the plain-scaled
// sibling of mxfp4 (power-of-two scale) and nvfp4 (E4M3 scale), with the same
// bf16 scale as int4_asym. docs/FORMAT.md §7.5.
//
//   scale = bf16(absmax / 6)                   (fp32 division, then round to bf16)
//   code  = e2m1_rne_saturating(w / scale)     (0 when scale == 0)
//   w'    = e2m1_value(code) * scale           (fp32)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

std::string canonical_name(int g) { return fmt::format("fp4_e2m1_g{}", g); }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int g) {
  return {
      {"qweight", DType::U8, {rows, ceil_div(cols, 2)}},
      {"scales", DType::BF16, {rows, ceil_div(cols, g)}},
  };
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams&) {
  GroupParams p;
  p.scale = round_to_bf16(abs_max(w, n) * shrink / 6.0f);
  return p;
}

uint8_t encode(float w, const GroupParams& p) { return p.scale == 0.0f ? 0 : f32_to_e2m1(w / p.scale); }
float decode(uint8_t code, const GroupParams& p) { return e2m1_to_f32(code) * p.scale; }

double affine_scale(const GroupParams& p) { return p.scale; }
GroupParams affine_store(const GroupParams&, double scale, double) {
  GroupParams p;
  p.scale = round_to_bf16(static_cast<float>(scale));
  return p;
}
const AffineParams kAffine{affine_scale, false, affine_store};

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  return {pack_codes(q, 4), params_part(q, &GroupParams::scale, DType::BF16)};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kFp4E2m1, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kFp4E2m1, rows, cols, g);
  unpack_codes(in[0], 4, q);
  params_from_part(in[1], &GroupParams::scale, q);
  return q;
}

}  // namespace

const FormatSpec kFp4E2m1{
    .family = "fp4_e2m1",
    .description = "FP4 E2M1 codes, bf16 scale = absmax/6 per group of G inputs (4.125 bits/weight at G=128)",
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
