// int8_channel_sym: 8-bit symmetric integer codes, one fp32 scale per output
// channel (row): the weight half of W8A8 (SmoothQuant, LLM.int8()), whose
// weight quantizer is exactly this absmax/127 rule. docs/FORMAT.md §7.2.
//
//   scale = absmax(row) / 127                        (fp32)
//   code  = clamp(round_half_even(w / scale), -127, 127)   (0 when scale == 0)
//   w'    = code * scale                             (fp32)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

constexpr float kMaxCode = 127.0f;

std::string canonical_name(int) { return "int8_channel_sym"; }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int) {
  return {
      {"qweight", DType::I8, {rows, cols}},
      {"scales", DType::F32, {rows, 1}},
  };
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams&) {
  GroupParams p;
  p.scale = abs_max(w, n) * shrink / kMaxCode;
  return p;
}

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  return {pack_codes(q, 8, DType::I8), params_part(q, &GroupParams::scale, DType::F32)};  // [rows, 1]
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kInt8ChannelSym, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kInt8ChannelSym, rows, cols, g);
  unpack_codes(in[0], 8, q);
  params_from_part(in[1], &GroupParams::scale, q);
  return q;
}

}  // namespace

const FormatSpec kInt8ChannelSym{
    .family = "int8_channel_sym",
    .description = "8-bit symmetric codes in [-127, 127], fp32 scale = absmax/127 per output channel (~8 bits/weight)",
    .code_bits = 8,
    .group_sizes = {0},
    .canonical_name = canonical_name,
    .parts = parts,
    .fit_tensor = nullptr,
    .fit_group = fit_group,
    .encode = encode_int8_sym,
    .decode = decode_int8_sym,
    .pack = pack,
    .unpack = unpack,
};

}  // namespace nibble::formats
