// Hand-worked examples of each registry row beyond int4_asym (whose example is
// in test_format.cpp): parameters, codes, stored bytes and dequantized values
// exactly as docs/FORMAT.md's sections give them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "nibble/format.h"
#include "nibble/quantizer.h"

namespace nibble {
namespace {

struct Worked {
  QuantizedMatrix q;
  std::vector<Tensor> parts;
  std::vector<float> back;  // dequantized from the parts
};

Worked run(const FormatChoice& f, const std::vector<float>& w, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(w.size()) / rows;
  Worked r;
  r.q = quant::quantize_rtn(f, w.data(), rows, cols);
  r.parts = f.spec->pack(r.q);
  const Tensor t = dequantize_parts(f, r.parts, rows, cols);
  r.back.assign(t.data<float>(), t.data<float>() + t.numel());
  return r;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

float f32_of(const Tensor& t, int64_t i = 0) {
  float v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.raw()) + 4 * i, 4);
  return v;
}

// The bit patterns of fp32 values.
std::vector<uint32_t> bits_of(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), 4 * v.size());
  return b;
}

// FORMAT.md §4: scale = f16(absmax / 7); absmax 0.4375 = 7/16 gives 1/16 exactly.
TEST(FormatExamples, Int4SymG32) {
  const Worked r = run(find_format("int4_sym", 32), {0.4375f, -0.03125f, 0.09375f, -0.4375f, 0.2f, -0.15625f}, 1);
  EXPECT_EQ(r.q.params[0].scale, 0.0625f);
  // w/s = 7, -0.5 (tie -> 0), 1.5 (tie -> 2), -7, 3.2, -2.5 (tie -> -2); + 8
  EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{15, 8, 10, 1, 11, 6}));
  EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0x8F, 0x1A, 0x6B}));
  EXPECT_EQ(bytes_of(r.parts[1]), (std::vector<uint8_t>{0x00, 0x2C}));  // f16 0x2C00 = 2^-4
  EXPECT_EQ(r.back, (std::vector<float>{0.4375f, 0.0f, 0.125f, -0.4375f, 0.1875f, -0.125f}));
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g128_sym"), 4096, 4096), 4.125);
}

// FORMAT.md §7.8: §3's arithmetic with fp32 parameters (bf16 would move both).
TEST(FormatExamples, Int4AsymF32G32) {
  const Worked r = run(find_format("int4_asym_f32", 32), {-0.3f, 0.7f, 0.0f, 0.2f, 0.45f, -0.1f}, 1);
  EXPECT_EQ(bits_of({r.q.params[0].scale, r.q.params[0].min}),
            (std::vector<uint32_t>{0x3D888889u, 0xBE99999Au}));  // fl(1 / 15), fl(-0.3)
  // (w - min)/scale = 0, 14.999999, 4.5 (tie -> 4), 7.4999995, 11.249999, 3
  EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0, 15, 4, 7, 11, 3}));
  EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0xF0, 0x74, 0x3B}));
  EXPECT_EQ(f32_of(r.parts[1]), r.q.params[0].scale);
  EXPECT_EQ(f32_of(r.parts[2]), -0.3f);
  EXPECT_EQ(bits_of(r.back),
            (std::vector<uint32_t>{0xBE99999Au, 0x3F333333u, 0xBD088888u, 0x3E2AAAACu, 0x3EDDDDDEu, 0xBDCCCCCCu}));
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g128_asym_f32"), 4096, 4096), 4.5);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int4_g32_asym_f32"), 4096, 4096), 6.0);
}

// FORMAT.md §7.10: §7.8's weights with 8-bit codes in a group of 16 (one ragged group): scale fl(1/255).
TEST(FormatExamples, Int8AsymF32G16) {
  const Worked r = run(find_format("int8_asym_f32", 16), {-0.3f, 0.7f, 0.0f, 0.2f, 0.45f, -0.1f}, 1);
  EXPECT_EQ(bits_of({r.q.params[0].scale, r.q.params[0].min}),
            (std::vector<uint32_t>{0x3B808081u, 0xBE99999Au}));  // fl(1 / 255), fl(-0.3)
  // (w - min)/scale = 0, 254.99998, 76.5 (tie -> 76), 127.49999, 191.24998, 51
  EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0, 255, 76, 127, 191, 51}));
  EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0x00, 0xFF, 0x4C, 0x7F, 0xBF, 0x33}));
  EXPECT_EQ(r.parts[0].dtype(), DType::U8);
  EXPECT_EQ(f32_of(r.parts[1]), r.q.params[0].scale);
  EXPECT_EQ(f32_of(r.parts[2]), -0.3f);
  EXPECT_EQ(bits_of(r.back),
            (std::vector<uint32_t>{0xBE99999Au, 0x3F333333u, 0xBB008080u, 0x3E4ACACCu, 0x3EE5E5E6u, 0xBDCCCCCCu}));
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int8_g16_asym_f32"), 4096, 4096), 12.0);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int8_g32_asym_f32"), 4096, 4096), 10.0);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int8_g128_asym_f32"), 4096, 4096), 8.5);
}

// FORMAT.md §5: scale = absmax / 127 per row; absmax 127/128 gives 1/128.
TEST(FormatExamples, Int8ChannelSym) {
  const Worked r = run(find_format("int8_channel_sym"),
                       {0.9921875f, -0.5f, 0.00390625f, 0.01171875f, -0.9921875f, 0.1f,  //
                        0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                       2);
  EXPECT_EQ(r.q.params[0].scale, 0.0078125f);
  EXPECT_EQ(r.q.params[1].scale, 0.0f);  // an all-zero row
  // w/s = 127, -64, 0.5 (tie -> 0), 1.5 (tie -> 2), -127, 12.8
  EXPECT_EQ(bytes_of(r.parts[0]),
            (std::vector<uint8_t>{0x7F, 0xC0, 0x00, 0x02, 0x81, 0x0D, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r.parts[0].dtype(), DType::I8);
  EXPECT_EQ(f32_of(r.parts[1], 0), 0.0078125f);
  EXPECT_EQ(f32_of(r.parts[1], 1), 0.0f);
  EXPECT_EQ(std::vector<float>(r.back.begin(), r.back.begin() + 6),
            (std::vector<float>{0.9921875f, -0.5f, 0.0f, 0.015625f, -0.9921875f, 0.1015625f}));
}

// FORMAT.md §7.9: llama.cpp's Q8_0 at G = 32. scale = f16(absmax / 127): 1/127 rounds
// to the binary16 129·2^-14 (0x2008), and codes are chosen against that rounded scale.
TEST(FormatExamples, Int8SymG32) {
  const Worked r = run(find_format("int8_g32_sym"),
                       {1.0f, -0.5f, 0.25f, 0.1f, -0.019683837890625f,  // the last is -2.5·scale exactly
                        0.0f, 0.0f, 0.0f, 0.0f, 0.0f},
                       2);
  EXPECT_EQ(r.q.params[0].scale, 0.00787353515625f);  // 129·2^-14
  EXPECT_EQ(r.q.params[1].scale, 0.0f);               // an all-zero group
  // w/s = 127.00775, -63.503876, 31.751938, 12.700775, -2.5 (tie -> -2)
  EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0x7F, 0xC0, 0x20, 0x0D, 0xFE, 0, 0, 0, 0, 0}));
  EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0x7F, 0xC0, 0x20, 0x0D, 0xFE, 0, 0, 0, 0, 0}));
  EXPECT_EQ(r.parts[0].dtype(), DType::I8);
  EXPECT_EQ(r.parts[0].shape(), (Shape{2, 5}));
  EXPECT_EQ(bytes_of(r.parts[1]), (std::vector<uint8_t>{0x08, 0x20, 0x00, 0x00}));  // f16 0x2008, 0x0000
  EXPECT_EQ(r.parts[1].dtype(), DType::F16);
  EXPECT_EQ(r.parts[1].shape(), (Shape{2, 1}));
  // code · 129·2^-14: 16383, -8256, 4128, 1677, -258 times 2^-14, all exact in fp32
  EXPECT_EQ(r.back, (std::vector<float>{0.99993896484375f, -0.50390625f, 0.251953125f, 0.10235595703125f,
                                        -0.0157470703125f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}));
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int8_g32_sym"), 4096, 4096), 8.5);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("int8_g128_sym"), 4096, 4096), 8.125);
}

// FORMAT.md §6: the textbook affine quantizer, per tensor.
TEST(FormatExamples, IntTensorAsym) {
  {  // 2 bits: lo = -1, hi = 2 -> s = 1, z = round(1) = 1
    const Worked r = run(find_format("int2_tensor_asym"), {-1.0f, 0.5f, 2.0f, 0.9f}, 1);
    EXPECT_EQ(r.q.params[0].scale, 1.0f);
    EXPECT_EQ(r.q.params[0].zero, 1.0f);
    // round(w/s) + z: -1+1, 0 (tie -> 0)+1, 2+1, 1+1
    EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0, 1, 3, 2}));
    EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0xB4}));  // 0 | 1<<2 | 3<<4 | 2<<6
    EXPECT_EQ(f32_of(r.parts[1]), 1.0f);
    EXPECT_EQ(bytes_of(r.parts[2]), (std::vector<uint8_t>{1}));
    EXPECT_EQ(r.back, (std::vector<float>{-1.0f, 0.0f, 2.0f, 1.0f}));
  }
  {  // 3 bits, codes straddling a byte: lo = 0 (the range holds 0), hi = 7 -> s = 1, z = 0
    const Worked r = run(find_format("int3_tensor_asym"), {0.0f, 7.0f, 3.5f, 1.0f, 2.0f, 5.0f}, 2);
    EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0, 7, 4, 1, 2, 5}));  // 3.5: tie -> 4
    // row 0: bits 000 111 100 -> 0x38, 0x01; row 1: 001 010 101 -> 0x51, 0x01
    EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0x38, 0x01, 0x51, 0x01}));
  }
  {  // 4 bits, negative only: lo = -2, hi = 0 -> s = 2/15, z = 15
    const Worked r = run(find_format("int4_tensor_asym"), {-2.0f, -1.1f}, 1);
    EXPECT_EQ(r.q.params[0].scale, 2.0f / 15.0f);
    EXPECT_EQ(r.q.params[0].zero, 15.0f);
    EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0, 7}));  // -1.1/s = -8.25 -> -8, + 15
    EXPECT_EQ(r.back[0], -15.0f * (2.0f / 15.0f));
    EXPECT_EQ(r.back[1], -8.0f * (2.0f / 15.0f));
  }
  {  // 8 bits, positive only: lo = 0, hi = 3 -> s = 3/255, z = 0
    const Worked r = run(find_format("int8_tensor_asym"), {1.0f, 2.0f, 3.0f}, 1);
    EXPECT_EQ(r.q.params[0].zero, 0.0f);
    EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{85, 170, 255}));
  }
  EXPECT_NEAR(bits_per_weight(find_format("int3_tensor_asym"), 4096, 4096), 3.0, 1e-5);
}

// FORMAT.md §7: scale = absmax / fmax. absmax 28 gives 1/16 (E4M3) and 2^-11 (E5M2).
TEST(FormatExamples, Fp8PerTensorAndPerChannel) {
  const std::vector<float> w = {28.0f, -1.0f, 0.1f, 0.0f, 3.5f, -7.0f};
  {
    const Worked r = run(find_format("fp8_e4m3_channel"), w, 2);
    EXPECT_EQ(r.q.params[0].scale, 0.0625f);
    EXPECT_EQ(r.q.params[1].scale, 7.0f / 448.0f);
    // 448 -> 0x7E, -16 -> 0xD8, 1.6 -> 1.625 (0x3D)
    EXPECT_EQ(std::vector<uint8_t>(r.q.codes.begin(), r.q.codes.begin() + 3), (std::vector<uint8_t>{0x7E, 0xD8, 0x3D}));
    EXPECT_EQ(r.parts[0].dtype(), DType::F8_E4M3);
    EXPECT_EQ(r.back[0], 28.0f);
    EXPECT_EQ(r.back[1], -1.0f);
    EXPECT_EQ(r.back[2], 0.1015625f);
    EXPECT_EQ(r.back[5], -7.0f);
  }
  {
    const Worked r = run(find_format("fp8_e4m3_tensor"), w, 2);
    EXPECT_EQ(r.parts[1].shape(), (Shape{1}));
    EXPECT_EQ(f32_of(r.parts[1]), 0.0625f);
    EXPECT_EQ(r.back[4], 3.5f);  // 56 is E4M3
  }
  {
    const Worked r = run(find_format("fp8_e5m2_tensor"), w, 2);
    EXPECT_EQ(f32_of(r.parts[1]), 0x1p-11f);
    // 57344 -> 0x7B, -2048 -> 0xE8, 204.8 -> 192 (0x5A)
    EXPECT_EQ(std::vector<uint8_t>(r.q.codes.begin(), r.q.codes.begin() + 3), (std::vector<uint8_t>{0x7B, 0xE8, 0x5A}));
    EXPECT_EQ(r.back[2], 0.09375f);
  }
}

// FORMAT.md §8: fp4_e2m1 with scale = bf16(absmax / 6).
TEST(FormatExamples, Fp4E2m1G32) {
  const Worked r = run(find_format("fp4_e2m1", 32), {3.0f, -1.25f, 0.1f, 2.2f}, 1);
  EXPECT_EQ(r.q.params[0].scale, 0.5f);
  // w/s = 6, -2.5 (tie -> -2), 0.2 -> 0, 4.4 -> 4
  EXPECT_EQ(r.q.codes, (std::vector<uint8_t>{0x7, 0xC, 0x0, 0x6}));
  EXPECT_EQ(bytes_of(r.parts[0]), (std::vector<uint8_t>{0xC7, 0x60}));
  EXPECT_EQ(r.back, (std::vector<float>{3.0f, -1.0f, 0.0f, 2.0f}));
}

// FORMAT.md §9 / OCP MX v1.0 §6.3: X = floor(log2(absmax)) − 2, elements w / 2^X
// rounded to nearest even and saturated to ±6.
TEST(FormatExamples, Mxfp4SharedScaleRule) {
  std::vector<float> w(96, 0.0f);
  // block 0: absmax 7 -> X = 2 - 2 = 0, so 7 saturates to 6 (the rule's known clamp)
  const float b0[] = {7.0f, 5.0f, 2.5f, 0.75f, 0.25f, -3.2f, -0.1f};
  std::copy(std::begin(b0), std::end(b0), w.begin());
  // block 1: absmax 0.3 -> floor(log2 0.3) = -2, X = -4, scale 1/16 (E8M0 byte 123)
  w[32] = 0.3f;
  w[33] = -0.05f;
  w[34] = 0.1f;
  // block 2: all zero -> X = -127 (E8M0 byte 0)
  const Worked r = run(find_format("mxfp4"), w, 1);
  EXPECT_EQ(r.q.params[0].scale, 1.0f);
  EXPECT_EQ(r.q.params[1].scale, 0.0625f);
  EXPECT_EQ(bytes_of(r.parts[1]), (std::vector<uint8_t>{127, 123, 0}));
  // 7 -> 6 (0x7), 5 -> tie 4|6 -> 4 (0x6), 2.5 -> tie 2|3 -> 2 (0x4), 0.75 -> tie 0.5|1 -> 1 (0x2),
  // 0.25 -> tie 0|0.5 -> 0, -3.2 -> -3 (0xD), -0.1 -> -0 (0x8)
  EXPECT_EQ(std::vector<uint8_t>(r.q.codes.begin(), r.q.codes.begin() + 8),
            (std::vector<uint8_t>{0x7, 0x6, 0x4, 0x2, 0x0, 0xD, 0x8, 0x0}));
  const std::vector<uint8_t> qweight = bytes_of(r.parts[0]);
  EXPECT_EQ(std::vector<uint8_t>(qweight.begin(), qweight.begin() + 4), (std::vector<uint8_t>{0x67, 0x24, 0xD0, 0x08}));
  EXPECT_EQ(std::vector<float>(r.back.begin(), r.back.begin() + 7),
            (std::vector<float>{6.0f, 4.0f, 2.0f, 1.0f, 0.0f, -3.0f, -0.0f}));
  // 0.3*16 = 4.8 -> 4, -0.8 -> -1, 1.6 -> 1.5
  EXPECT_EQ(r.back[32], 0.25f);
  EXPECT_EQ(r.back[33], -0.0625f);
  EXPECT_EQ(r.back[34], 0.09375f);
  EXPECT_DOUBLE_EQ(bits_per_weight(find_format("mxfp4"), 4096, 4096), 4.25);
}

// FORMAT.md §10: global = absmax / (448·6); block scale = e4m3(absmax_b / (6·global)).
// absmax 10.5 = 2688/256 makes the global scale 2^-8 exactly.
TEST(FormatExamples, Nvfp4TwoLevelScale) {
  std::vector<float> w(32, 0.0f);
  w[0] = 10.5f;  // block 0: 10.5 / (6·2^-8) = 448 -> E4M3 448 (0x7E), effective scale 1.75
  w[1] = 1.0f;   // 0.571 -> 0.5
  w[2] = -4.0f;  // -2.286 -> -2
  w[16] = 0.3f;  // block 1: 0.3 / (6·2^-8) = 12.8 -> E4M3 13 (0x55), effective scale 13·2^-8
  w[17] = 0.1f;
  w[18] = -0.05f;
  const Worked r = run(find_format("nvfp4"), w, 1);
  EXPECT_EQ(r.q.params[0].global, 0x1p-8f);
  EXPECT_EQ(r.q.params[0].scale, 448.0f);
  EXPECT_EQ(r.q.params[1].scale, 13.0f);
  EXPECT_EQ(bytes_of(r.parts[1]), (std::vector<uint8_t>{0x7E, 0x55}));
  EXPECT_EQ(r.parts[1].dtype(), DType::F8_E4M3);
  EXPECT_EQ(f32_of(r.parts[2]), 0x1p-8f);
  EXPECT_EQ(r.q.codes[0], 0x7);
  EXPECT_EQ(r.q.codes[1], 0x1);
  EXPECT_EQ(r.q.codes[2], 0xC);
  EXPECT_EQ(r.back[0], 10.5f);
  EXPECT_EQ(r.back[1], 0.875f);
  EXPECT_EQ(r.back[2], -3.5f);
  // block 1: 0.3/0.05078125 = 5.91 -> 6, 0.1/.. = 1.97 -> 2, -0.05/.. = -0.98 -> -1
  EXPECT_EQ(r.back[16], 6 * 13 * 0x1p-8f);
  EXPECT_EQ(r.back[17], 2 * 13 * 0x1p-8f);
  EXPECT_EQ(r.back[18], -13 * 0x1p-8f);
  EXPECT_NEAR(bits_per_weight(find_format("nvfp4"), 4096, 4096), 4.5, 1e-5);  // + 32 bits of global scale
}

}  // namespace
}  // namespace nibble
