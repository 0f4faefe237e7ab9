// The CPU forward's packed linears: every format with a CPU kernel (int4_asym, int4_asym_f32, int4_sym, the 8-bit
// formats, int2..7_tensor_asym, the FP8 and FP4 formats) and the rivals' linears one of them holds exactly (GGUF
// Q4_0 → int4_g32_sym, Q4_1 and Q4_K → int4_g32_asym_f32, Q5_0 and Q8_0 → int8_g32_sym,
// IQ4_NL → int8_g32_sym, Q5_1, Q5_K and IQ4_XS → int8_g32_asym_f32, Q2_K, Q3_K and Q6_K → int8_g16_asym_f32) stay
// packed when a model loads, and give what the same linear dequantized to f32 gives, at one token (the integer
// GEMV), a few (the fp32 tiles) and many (decode + sgemm).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "nibble/convert.h"
#include "nibble/gguf.h"
#include "nibble/format.h"
#include "nibble/model.h"
#include "nibble/quantizer.h"
#include "nibble/source.h"
#include "test_util.h"
#include "unit/gguf_q4k.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;

// Every linear of layer 0, and of the last layer, through both loads. The bound: each output's error is at most
// 1e-5 · Σ_i |x_i| · max_i |w_i| (its fp32 sums, and the GEMV's 24-bit activations: 2^-23 of a group's largest
// |x|, on inputs ~ N(0, 1)); one wrong code costs about |x_i| · (range / 15), a hundred times that or more here.
// packed_count: how many of the 14 are in want_format (the rest load dense, or packed in another exact format).
void expect_packed_matches_dense(const ModelSource& src, const std::string& want_format, int packed_count) {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t last = src.config().num_layers - 1;
  int checked = 0;
  for (int64_t layer : {int64_t{0}, last})
    for (const LinearSlot& s : decoder_linears()) {
      const std::string prefix = "model.layers." + std::to_string(layer) + "." + s.name;
      SCOPED_TRACE(prefix);
      const std::optional<FormatChoice> f = src.exact_format(prefix + ".weight");
      if (!f) {  // e.g. a GGUF matrix whose rows are not whole blocks: stored in another type, loaded dense
        EXPECT_FALSE(load_linear(src, prefix).is_packed());
        continue;
      }
      const bool counted = f->canonical_name() == want_format;  // the others are checked all the same
      const LinearWeight packed = load_linear(src, prefix), dense = load_linear(src, prefix, /*dense=*/true);
      ASSERT_TRUE(packed.is_packed());
      ASSERT_FALSE(dense.is_packed());
      const int64_t K = dense.in_features(), N = dense.out_features();
      const float* w = dense.dense_weight().data<float>();
      for (int64_t M : {int64_t{1}, int64_t{3}, int64_t{70}}) {
        std::vector<float> x(static_cast<size_t>(M * K));
        for (float& v : x) v = nd(rng);
        std::vector<float> yp(static_cast<size_t>(M * N), std::nanf("")), yd(yp.size(), std::nanf(""));
        packed.forward(x.data(), M, yp.data());
        dense.forward(x.data(), M, yd.data());
        for (int64_t n = 0; n < N; ++n) {
          double wmax = 0;
          for (int64_t i = 0; i < K; ++i) wmax = std::max(wmax, std::abs(static_cast<double>(w[n * K + i])));
          for (int64_t m = 0; m < M; ++m) {
            double xs = 0;
            for (int64_t i = 0; i < K; ++i) xs += std::abs(static_cast<double>(x[static_cast<size_t>(m * K + i)]));
            const size_t o = static_cast<size_t>(m * N + n);
            ASSERT_LE(std::abs(static_cast<double>(yp[o]) - yd[o]), 1e-5 * xs * wmax)
                << "M=" << M << " m=" << m << " n=" << n << ": packed " << yp[o] << ", dense " << yd[o];
          }
        }
      }
      checked += counted;
    }
  EXPECT_EQ(checked, packed_count);
}

// The matrices the CPU holds as f32 for want of a kernel, which `nibble run` names in a note: int8_tensor_asym (nibble's
// only format without a CPU kernel: its code − zero reach ±255), none for a format with one, none for plain weights, and none for
// llama.cpp's Q4_K_M, Q5_K_M and IQ4_NL files of stories260K (every quantized matrix there is Q5_0, Q5_1, Q8_0 or
// IQ4_NL; down_proj, 172 inputs wide, is F16, plain).
TEST(CpuPackedLinears, DenseFallbacksNameTheFormatsWithoutACpuKernel) {
  test::TempDir tmp;
  const fs::path dir = test::model_dir("stories260K");
  QuantizeOptions o;
  o.progress = false;
  o.format = "int8_tensor_asym";
  const QuantizeResult r = quantize_model(dir, tmp / "tensor", o);
  const std::vector<DenseFallback> f = cpu_dense_fallbacks(*CheckpointDir::open(tmp / "tensor"));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].format, "int8_tensor_asym");
  int64_t matrices = 0;
  for (const TensorResult& t : r.tensors) matrices += t.quantized;
  EXPECT_EQ(f[0].matrices, matrices);
  EXPECT_EQ(static_cast<uint64_t>(f[0].params), r.quantized_params);
  for (const char* packed : {"int8_g16_asym_f32", "int4_tensor_asym"}) {
    o.format = packed;
    quantize_model(dir, tmp / packed, o);
    EXPECT_TRUE(cpu_dense_fallbacks(*CheckpointDir::open(tmp / packed)).empty()) << packed;
  }
  EXPECT_TRUE(cpu_dense_fallbacks(*CheckpointDir::open(dir)).empty());
  for (const char* g : {"stories260K-Q4_K_M.gguf", "stories260K-Q5_K_M.gguf", "stories260K-IQ4_NL.gguf"})
    EXPECT_TRUE(cpu_dense_fallbacks(*GgufSource::open(dir / "gguf" / g)).empty()) << g;
  // The CLI's note.
  const auto run = test::run_command(test::nibble_bin() + " run --model " + (tmp / "tensor").string() +
                                     " --prompt 'Once upon a time' -n 4");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find(fmt::format("note: {} matrices in int8_tensor_asym", matrices)), std::string::npos) << run.err;
  EXPECT_NE(run.err.find("have no CPU kernel"), std::string::npos) << run.err;
}

// int4_sym read as (s, −8·s) pairs: FORMAT.md's int4_asym_f32 decode of the converted parts gives int4_sym's own
// decode bit for bit, on scales across f16's range (subnormal to large) and a ragged last group.
TEST(CpuPackedLinears, Int4SymAsAsymF32DecodesTheSameBits) {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int g : {32, 64, 128}) {
    const int64_t rows = 40, cols = 300;
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)  // each row its own magnitude: 1e-6 (f16 subnormal scales) .. 3e3
        w[static_cast<size_t>(r * cols + c)] = nd(rng) * std::pow(10.0f, -6.0f + 9.5f * static_cast<float>(r) / rows);
    const FormatChoice sym = find_format("int4_sym", g), f32 = find_format("int4_asym_f32", g);
    const std::vector<Tensor> parts = sym.spec->pack(quant::quantize_rtn(sym, w.data(), rows, cols));
    const std::vector<Tensor> conv = int4_sym_as_asym_f32(parts, rows, cols, g);
    const Tensor want = dequantize_parts(sym, parts, rows, cols), got = dequantize_parts(f32, conv, rows, cols);
    ASSERT_EQ(want.nbytes(), got.nbytes());
    EXPECT_EQ(std::memcmp(want.raw(), got.raw(), want.nbytes()), 0) << "g" << g;
  }
}

// Every nibble format with a CPU kernel: the int4 kernels, and the 8-bit one (int8_channel_sym, the weight half of
// W8A8, and the FP8 formats: one byte a weight held instead of four).
TEST(CpuPackedLinears, NibbleFormatsRunPackedAndMatchDequantized) {
  test::TempDir tmp;
  for (const char* name : {"int4_g32_asym", "int4_g128_asym_f32", "int4_g32_asym_f32", "int4_g64_sym",
                           "int8_channel_sym", "fp8_e4m3_channel", "fp8_e4m3_tensor", "fp8_e5m2_channel",
                           "fp8_e5m2_tensor", "fp4_e2m1_g32", "mxfp4", "nvfp4", "int8_g32_sym", "int8_g128_sym",
                           "int8_g16_asym_f32", "int8_g128_asym_f32", "int2_tensor_asym", "int4_tensor_asym",
                           "int7_tensor_asym"}) {
    SCOPED_TRACE(name);
    QuantizeOptions o;
    o.format = name;
    o.progress = false;
    quantize_model(test::model_dir("stories260K"), tmp / name, o);
    expect_packed_matches_dense(*CheckpointDir::open(tmp / name), name, 14);
  }
}

TEST(CpuPackedLinears, GgufLegacyBlocksRunPackedAndMatchDequantized) {
  const fs::path dir = test::model_dir("stories260K") / "gguf";
  // down_proj reads 172 inputs, not whole blocks of 32: llama.cpp stores it in another type.
  expect_packed_matches_dense(*GgufSource::open(dir / "stories260K-Q4_0.gguf"), "int4_g32_sym", 12);
  expect_packed_matches_dense(*GgufSource::open(dir / "stories260K-Q4_1.gguf"), "int4_g32_asym_f32", 12);
  expect_packed_matches_dense(*GgufSource::open(dir / "stories260K-Q8_0.gguf"), "int8_g32_sym", 12);
  // Q4_K_M: Q5_0 (int8_g32_sym) but layer 4's v, Q8_0 (int8_g32_sym as well). Q5_K_M: Q5_1 (int8_g32_asym_f32) but
  // that v (Q8_0, checked, not counted).
  expect_packed_matches_dense(*GgufSource::open(dir / "stories260K-Q4_K_M.gguf"), "int8_g32_sym", 12);
  expect_packed_matches_dense(*GgufSource::open(dir / "stories260K-Q5_K_M.gguf"), "int8_g32_asym_f32", 11);
  expect_packed_matches_dense(*GgufSource::open(dir / "stories260K-IQ4_NL.gguf"), "int8_g32_sym", 12);
}

// Q4_K (no stories260K matrix is whole 256-wide blocks): gguf_q4k.h's one-layer llama, every matrix Q4_K with
// d and dmin of both signs, subnormal and zero, and every pair of 6-bit scale and min, so fp32 pairs far from
// bf16's and from each other's magnitudes.
TEST(CpuPackedLinears, GgufKQuantsRunPackedAndMatchDequantized) {
  test::TempDir tmp;
  ASSERT_EQ(test::write_k_quant_llama(tmp / "q4k.gguf").first, 8);
  expect_packed_matches_dense(*GgufSource::open(tmp / "q4k.gguf"), "int4_g32_asym_f32", 14);  // layer 0 twice
  // The other K-quants (the same llama, their own blocks: every scale, d of both signs, subnormal and zero).
  for (const auto& [type, format] : {std::pair{io::GgmlType::Q2_K, "int8_g16_asym_f32"},
                                     std::pair{io::GgmlType::Q3_K, "int8_g16_asym_f32"},
                                     std::pair{io::GgmlType::Q5_K, "int8_g32_asym_f32"},
                                     std::pair{io::GgmlType::Q6_K, "int8_g16_asym_f32"},
                                     std::pair{io::GgmlType::IQ4_XS, "int8_g32_asym_f32"}}) {
    SCOPED_TRACE(static_cast<int>(type));
    ASSERT_EQ(test::write_k_quant_llama(tmp / "k.gguf", type).first, 8);
    expect_packed_matches_dense(*GgufSource::open(tmp / "k.gguf"), format, 14);
  }
}

}  // namespace
}  // namespace nibble
