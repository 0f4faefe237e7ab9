// nvfp4: NVIDIA's FP4: FP4 E2M1 codes, an FP8 E4M3 scale per block of 16
// inputs and an fp32 second-level scale per tensor, with NVIDIA's published
// recipe (TensorRT Model Optimizer): the global scale maps the tensor's absmax
// onto the largest block scale times the largest element (448 · 6), and each
// block scale is the block's absmax / 6 in units of the global scale, rounded
// to E4M3. docs/FORMAT.md §7.7.
//
//   global = absmax(tensor) / 2688                        (fp32; 2688 = 448 · 6)
//   scale  = e4m3_rne_saturating(absmax(block) / (6 · global))   (0 when global == 0)
//   code   = e2m1_rne_saturating(w / (scale · global))    (0 when scale · global == 0)
//   w'     = e2m1_value(code) * (scale · global)          (fp32: the product first, then times the value)
#include "formats/common.h"
#include "formats/registry_rows.h"

namespace nibble::formats {
namespace {

constexpr int kBlock = 16;
constexpr float kElemMax = 6.0f, kScaleMax = 448.0f;

std::string canonical_name(int) { return "nvfp4"; }

std::vector<PartSpec> parts(int64_t rows, int64_t cols, int) {
  return {
      {"qweight", DType::U8, {rows, ceil_div(cols, 2)}},
      {"scales", DType::F8_E4M3, {rows, ceil_div(cols, kBlock)}},
      {"global_scale", DType::F32, {1}},
  };
}

GroupParams fit_tensor(const float* w, int64_t rows, int64_t cols) {
  GroupParams p;
  p.global = abs_max(w, rows * cols) / (kScaleMax * kElemMax);
  return p;
}

GroupParams fit_group(const float* w, int64_t n, float shrink, const GroupParams& tensor) {
  GroupParams p;
  p.global = tensor.global;
  if (p.global > 0.0f) p.scale = f8_e4m3_to_f32(f32_to_f8_e4m3(abs_max(w, n) * shrink / (kElemMax * p.global)));
  return p;
}

uint8_t encode(float w, const GroupParams& p) {
  const float s = p.scale * p.global;
  return s == 0.0f ? 0 : f32_to_e2m1(w / s);
}

float decode(uint8_t code, const GroupParams& p) { return e2m1_to_f32(code) * (p.scale * p.global); }

// The codes' multiplier is scale · global; only the block's E4M3 scale is refitted.
double affine_scale(const GroupParams& p) { return static_cast<double>(p.scale * p.global); }
GroupParams affine_store(const GroupParams& old, double scale, double) {
  GroupParams p = old;
  p.scale = old.global > 0.0f ? f8_e4m3_to_f32(f32_to_f8_e4m3(static_cast<float>(scale / old.global))) : 0.0f;
  return p;
}
const AffineParams kAffine{affine_scale, false, affine_store};

std::vector<Tensor> pack(const QuantizedMatrix& q) {
  Tensor scales = Tensor::zeros(DType::F8_E4M3, {q.rows, q.groups_per_row()});
  Tensor global = Tensor::zeros(DType::F32, {1});
  const float g = q.params.empty() ? 0.0f : q.params[0].global;
  for (size_t i = 0; i < q.params.size(); ++i) {
    NIBBLE_CHECK(q.params[i].global == g, "nvfp4: blocks carry different global scales ({} and {})", g,
                 q.params[i].global);
    const uint8_t b = f32_to_f8_e4m3(q.params[i].scale);
    NIBBLE_CHECK(f8_e4m3_to_f32(b) == q.params[i].scale, "nvfp4: block scale {} is not an E4M3 value",
                 q.params[i].scale);
    static_cast<uint8_t*>(scales.raw_mut())[i] = b;
  }
  global.data_mut<float>()[0] = g;
  return {pack_codes(q, 4), scales, global};
}

QuantizedMatrix unpack(const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  check_parts(kNvfp4, in, rows, cols, g);
  QuantizedMatrix q = empty_matrix(kNvfp4, rows, cols, g);
  unpack_codes(in[0], 4, q);
  const Tensor sc = in[1].contiguous();
  const float global = part_f32(in[2].contiguous(), 0);
  for (size_t i = 0; i < q.params.size(); ++i) {
    q.params[i].scale = f8_e4m3_to_f32(part_u8(sc, static_cast<int64_t>(i)));
    NIBBLE_CHECK(!std::isnan(q.params[i].scale), "nvfp4: block scale {} is E4M3's NaN", i);
    q.params[i].global = global;
  }
  return q;
}

}  // namespace

const FormatSpec kNvfp4{
    .family = "nvfp4",
    .description = "NVFP4: FP4 E2M1 codes, E4M3 scale per block of 16 inputs, fp32 global scale (4.5 bits/weight)",
    .code_bits = 4,
    .group_sizes = {kBlock},
    .canonical_name = canonical_name,
    .parts = parts,
    .fit_tensor = fit_tensor,
    .fit_group = fit_group,
    .encode = encode,
    .decode = decode,
    .pack = pack,
    .unpack = unpack,
    .affine = &kAffine,
};

}  // namespace nibble::formats
