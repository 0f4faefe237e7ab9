// fp8_e4m3_{tensor,channel}, fp8_e5m2_{tensor,channel}: OCP FP8 codes (the
// element conversions are src/core/dtype.cpp's) times one fp32 scale per
// tensor or per output channel, scale = absmax / fmax, the scaling of FP8
// weight checkpoints (vLLM, compressed-tensors, TensorRT). docs/FORMAT.md §7.4.
//
//   scale = absmax / fmax            (fp32; fmax = 448 for E4M3, 57344 for E5M2)
//   code  = fp8_rne_saturating(w / scale)       (0 when scale == 0)
//   w'    = fp8_value(code) * scale             (fp32)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

struct E4M3 {
  static constexpr float kMax = 448.0f;
  static constexpr DType kDType = DType::F8_E4M3;
  static uint8_t encode(float x) { return f32_to_f8_e4m3(x); }
  static float decode(uint8_t b) { return f8_e4m3_to_f32(b); }
};
struct E5M2 {
  static constexpr float kMax = 57344.0f;
  static constexpr DType kDType = DType::F8_E5M2;
  // Finite in, finite out: a quotient that overflowed fp32 saturates like any
  // other value beyond the range (E5M2 would keep an infinity).
  static uint8_t encode(float x) { return f32_to_f8_e5m2(std::isinf(x) ? std::copysign(kMax, x) : x); }
  static float decode(uint8_t b) { return f8_e5m2_to_f32(b); }
};

template <typename E, bool kPerChannel>
struct Fp8 {
  static const FormatSpec& spec();
  static std::string canonical_name(int) { return std::string(spec().family); }

  static std::vector<PartSpec> parts(int64_t rows, int64_t cols, int) {
    if (kPerChannel) return {{"qweight", E::kDType, {rows, cols}}, {"scales", DType::F32, {rows, 1}}};
    return {{"qweight", E::kDType, {rows, cols}}, {"scale", DType::F32, {1}}};
  }

  static GroupParams fit_tensor(const float* w, int64_t rows, int64_t cols) {
    GroupParams p;
    p.scale = abs_max(w, rows * cols) / E::kMax;
    return p;
  }

  static GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams& tensor) {
    if (!kPerChannel) return tensor;  // every row carries the tensor's scale
    GroupParams p;
    p.scale = abs_max(w, n) * shrink / E::kMax;
    return p;
  }

  static uint8_t encode(float w, const GroupParams& p) { return p.scale == 0.0f ? 0 : E::encode(w / p.scale); }
  static float decode(uint8_t code, const GroupParams& p) { return E::decode(code) * p.scale; }

  static std::vector<Tensor> pack(const QuantizedMatrix& q) {
    if (kPerChannel) return {pack_codes(q, 8, E::kDType), params_part(q, &GroupParams::scale, DType::F32)};
    for (const GroupParams& o : q.params)
      NIBBLE_CHECK(o.scale == q.params[0].scale, "{}: rows carry different tensor scales", spec().family);
    Tensor scale = Tensor::zeros(DType::F32, {1});
    scale.data_mut<float>()[0] = q.params.empty() ? 0.0f : q.params[0].scale;
    return {pack_codes(q, 8, E::kDType), scale};
  }

  static QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
    check_parts(spec(), in, rows, cols, g);
    QuantizedMatrix q = empty_matrix(spec(), rows, cols, g);
    unpack_codes(in[0], 8, q);
    const Tensor sc = in[1].contiguous();
    for (int64_t r = 0; r < rows; ++r) q.params[r].scale = part_f32(sc, kPerChannel ? r : 0);
    return q;
  }

  static FormatSpec row(std::string_view family, std::string_view description) {
    return FormatSpec{
        .family = family,
        .description = description,
        .code_bits = 8,
        .group_sizes = {0},
        .canonical_name = canonical_name,
        .parts = parts,
        .fit_tensor = kPerChannel ? nullptr : fit_tensor,
        .fit_group = fit_group,
        .encode = encode,
        .decode = decode,
        .pack = pack,
        .unpack = unpack,
    };
  }
};

template <> const FormatSpec& Fp8<E4M3, false>::spec() { return kFp8E4m3Tensor; }
template <> const FormatSpec& Fp8<E4M3, true>::spec() { return kFp8E4m3Channel; }
template <> const FormatSpec& Fp8<E5M2, false>::spec() { return kFp8E5m2Tensor; }
template <> const FormatSpec& Fp8<E5M2, true>::spec() { return kFp8E5m2Channel; }

}  // namespace

const FormatSpec kFp8E4m3Tensor = Fp8<E4M3, false>::row(
    "fp8_e4m3_tensor", "OCP FP8 E4M3 codes (max 448), one fp32 scale = absmax/448 per tensor (8 bits/weight)");
const FormatSpec kFp8E4m3Channel = Fp8<E4M3, true>::row(
    "fp8_e4m3_channel", "OCP FP8 E4M3 codes (max 448), fp32 scale = absmax/448 per output channel");
const FormatSpec kFp8E5m2Tensor = Fp8<E5M2, false>::row(
    "fp8_e5m2_tensor", "OCP FP8 E5M2 codes (max 57344), one fp32 scale = absmax/57344 per tensor (8 bits/weight)");
const FormatSpec kFp8E5m2Channel = Fp8<E5M2, true>::row(
    "fp8_e5m2_channel", "OCP FP8 E5M2 codes (max 57344), fp32 scale = absmax/57344 per output channel");

}  // namespace nibble::formats
