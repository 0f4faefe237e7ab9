// int{B}_tensor_asym, B = 2..8: the textbook affine quantizer (Jacob et al.
// 2018; PyTorch's per-tensor MinMaxObserver): B-bit unsigned codes, one fp32
// scale and one integer zero point for the whole matrix. docs/FORMAT.md §7.3.
//
//   lo = min(min(w), 0), hi = max(max(w), 0)     (the range always holds 0, so 0 is exact)
//   scale = (hi - lo) / (2^B - 1)                (fp32)
//   zero  = clamp(round_half_even(-lo / scale), 0, 2^B - 1)     (0 when scale == 0)
//   code  = clamp(round_half_even(w / scale) + zero, 0, 2^B - 1)
//   w'    = (code - zero) * scale                (integer difference, one fp32 product)
//   codes packed as a little-endian bit stream per row (formats/common.h)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

constexpr const char* kNames[] = {"int2_tensor_asym", "int3_tensor_asym", "int4_tensor_asym", "int5_tensor_asym",
                                  "int6_tensor_asym", "int7_tensor_asym", "int8_tensor_asym"};
constexpr const char* kDescriptions[] = {
    "2-bit affine codes, one fp32 scale + integer zero point per tensor",
    "3-bit affine codes, one fp32 scale + integer zero point per tensor",
    "4-bit affine codes, one fp32 scale + integer zero point per tensor",
    "5-bit affine codes, one fp32 scale + integer zero point per tensor",
    "6-bit affine codes, one fp32 scale + integer zero point per tensor",
    "7-bit affine codes, one fp32 scale + integer zero point per tensor",
    "8-bit affine codes, one fp32 scale + integer zero point per tensor"};

template <int B>
struct Int {
  static constexpr int kMax = (1 << B) - 1;
  static const FormatSpec& spec() { return kIntTensorAsym[B - 2]; }

  static std::string canonical_name(int) { return kNames[B - 2]; }

  static std::vector<PartSpec> parts(int64_t rows, int64_t cols, int) {
    return {
        {"qweight", DType::U8, {rows, packed_row_bytes(cols, B)}},
        {"scale", DType::F32, {1}},
        {"zero", DType::U8, {1}},
    };
  }

  static GroupParams fit_tensor(const float* w, int64_t rows, int64_t cols) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < rows * cols; ++i) {
      lo = std::min(lo, w[i]);
      hi = std::max(hi, w[i]);
    }
    const float range = hi - lo;
    NIBBLE_CHECK(std::isfinite(range), "{}: tensor range max - min = {} - {} is not finite in fp32", kNames[B - 2],
                 hi, lo);
    GroupParams p;
    p.scale = range / static_cast<float>(kMax);
    // "+ 0.0f" turns the -0 that -lo / scale gives for lo == 0 into +0.
    p.zero = p.scale > 0.0f ? std::clamp(std::nearbyint(-lo / p.scale), 0.0f, static_cast<float>(kMax)) + 0.0f : 0.0f;
    return p;
  }

  // Every parameter is per tensor: the group (a row) takes the matrix's.
  static GroupParams fit_group(const float*, int64_t, float, const GroupParams& tensor) { return tensor; }

  static uint8_t encode(float w, const GroupParams& p) {
    if (p.scale == 0.0f) return static_cast<uint8_t>(p.zero);
    const float q = std::nearbyint(w / p.scale) + p.zero;
    return static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(kMax)));
  }

  static float decode(uint8_t code, const GroupParams& p) {
    return static_cast<float>(static_cast<int>(code) - static_cast<int>(p.zero)) * p.scale;
  }

  static std::vector<Tensor> pack(const QuantizedMatrix& q) {
    const GroupParams p = q.params.empty() ? GroupParams{} : q.params[0];
    for (const GroupParams& o : q.params)
      NIBBLE_CHECK(o.scale == p.scale && o.zero == p.zero, "{}: rows carry different tensor parameters",
                   kNames[B - 2]);
    Tensor scale = Tensor::zeros(DType::F32, {1}), zero = Tensor::zeros(DType::U8, {1});
    scale.data_mut<float>()[0] = p.scale;
    zero.data_mut<uint8_t>()[0] = static_cast<uint8_t>(p.zero);
    return {pack_codes(q, B), scale, zero};
  }

  static QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
    check_parts(spec(), in, rows, cols, g);
    QuantizedMatrix q = empty_matrix(spec(), rows, cols, g);
    unpack_codes(in[0], B, q);
    GroupParams p;
    p.scale = part_f32(in[1].contiguous(), 0);
    p.zero = static_cast<float>(part_u8(in[2].contiguous(), 0));
    NIBBLE_CHECK(p.zero <= kMax, "{}: zero point {} is beyond the largest code {}", kNames[B - 2], p.zero, kMax);
    for (GroupParams& o : q.params) o = p;
    return q;
  }

  static FormatSpec row() {
    return FormatSpec{
        .family = kNames[B - 2],
        .description = kDescriptions[B - 2],
        .code_bits = B,
        .group_sizes = {0},
        .canonical_name = canonical_name,
        .parts = parts,
        .fit_tensor = fit_tensor,
        .fit_group = fit_group,
        .encode = encode,
        .decode = decode,
        .pack = pack,
        .unpack = unpack,
    };
  }
};

}  // namespace

const FormatSpec kIntTensorAsym[7] = {Int<2>::row(), Int<3>::row(), Int<4>::row(), Int<5>::row(),
                                      Int<6>::row(), Int<7>::row(), Int<8>::row()};

}  // namespace nibble::formats
