// int8_sym: 8-bit symmetric integer codes with an f16 scale per group of G
// consecutive inputs (G = 32, 64 or 128): llama.cpp's Q8_0 at G = 32 (an f16 d
// and 32 int8 codes per block, x = q·d), which GgufSource reads into this row
// exactly, as it does Q5_0 ((q − 16)·d) and IQ4_NL (d·grid[q]).
// docs/FORMAT.md §7.9 is normative.
//
//   scale = f16(absmax / 127)                               (fp32 division, then round to f16)
//   code  = clamp(round_half_even(w / scale), -127, 127)    (0 when scale == 0)
//   w'    = code * scale                                    (fp32)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

constexpr float kMaxCode = 127.0f;

std::string canonical_name(int g) { return fmt::format("int8_g{}_sym", g); }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int g) {
  return {
      {"qweight", DType::I8, {rows, cols}},
      {"scales", DType::F16, {rows, ceil_div(cols, g)}},
  };
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams&) {
  GroupParams p;
  p.scale = f16_absmax_scale(abs_max(w, n) * shrink, kMaxCode, "int8_sym");
  return p;
}

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  return {pack_codes(q, 8, DType::I8), params_part(q, &GroupParams::scale, DType::F16)};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kInt8Sym, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kInt8Sym, rows, cols, g);
  unpack_codes(in[0], 8, q);
  params_from_part(in[1], &GroupParams::scale, q);
  return q;
}

}  // namespace

const FormatSpec kInt8Sym{
    .family = "int8_sym",
    .description = "8-bit symmetric codes in [-127, 127], f16 scale = absmax/127 per group of G inputs "
                   "(llama.cpp's Q8_0 at G=32; 8.5 bits/weight there)",
    .code_bits = 8,
    .group_sizes = {32, 64, 128},
    .canonical_name = canonical_name,
    .parts = parts,
    .fit_tensor = nullptr,
    .fit_group = fit_group,
    .encode = encode_int8_sym,
    .decode = decode_int8_sym,
    .pack = pack,
    .unpack = unpack,
    .affine = &kF16ScaleAffine,
};

}  // namespace nibble::formats
