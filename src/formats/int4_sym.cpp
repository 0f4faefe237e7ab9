// int4_sym: 4-bit symmetric integer codes with zero point 8 and an f16 scale
// per group of G consecutive inputs (G = 32, 64 or 128): the layout of the
// community's symmetric GPTQ/AWQ int4 checkpoints (codes 0..15 with an implicit
// zero point of 8, fp16 scales). docs/FORMAT.md §7.1 is normative.
//
//   scale = f16(absmax / 7)                                    (fp32 division, then round to f16)
//   code  = clamp(round_half_even(w / scale) + 8, 0, 15)       (8 when scale == 0)
//   w'    = (code - 8) * scale                                 (fp32)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

constexpr int kZero = 8, kMaxCode = 15;

std::string canonical_name(int g) { return fmt::format("int4_g{}_sym", g); }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int g) {
  return {
      {"qweight", DType::U8, {rows, ceil_div(cols, 2)}},
      {"scales", DType::F16, {rows, ceil_div(cols, g)}},
  };
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams&) {
  GroupParams p;
  p.scale = f16_absmax_scale(abs_max(w, n) * shrink, 7.0f, "int4_sym");
  return p;
}

uint8_t encode(float w, const GroupParams& p) {
  if (p.scale == 0.0f) return kZero;  // an all-zero group
  const float q = std::nearbyint(w / p.scale) + static_cast<float>(kZero);
  return static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(kMaxCode)));
}

float decode(uint8_t code, const GroupParams& p) { return static_cast<float>(code - kZero) * p.scale; }

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  return {pack_codes(q, 4), params_part(q, &GroupParams::scale, DType::F16)};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kInt4Sym, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kInt4Sym, rows, cols, g);
  unpack_codes(in[0], 4, q);
  params_from_part(in[1], &GroupParams::scale, q);
  return q;
}

}  // namespace

const FormatSpec kInt4Sym{
    .family = "int4_sym",
    .description = "4-bit symmetric codes (zero point 8), f16 scale = absmax/7 per group of G inputs "
                   "(GPTQ/AWQ community layout; 4.125 bits/weight at G=128)",
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
    .affine = &kF16ScaleAffine,
};

}  // namespace nibble::formats

namespace nibble {

std::vector<Tensor> int4_sym_as_asym_f32(const std::vector<Tensor>& parts, int64_t rows, int64_t cols,
                                         int group_size) {
  check_parts(FormatChoice{&formats::kInt4Sym, group_size}, parts, rows, cols);
  const Tensor scale = parts[1].to(DType::F32);  // f16 -> f32: exact
  Tensor min = Tensor::empty(DType::F32, scale.shape());
  const float* s = scale.data<float>();
  float* m = min.data_mut<float>();
  for (int64_t i = 0; i < scale.numel(); ++i) m[i] = -8.0f * s[i];  // exact: a power of two times an f16 value
  return {parts[0], scale, min};
}

}  // namespace nibble
