// CUDA kernels against their CPU references. Compiled whenever the build has
// CUDA (CI compiles them); run where a GPU is present, skipped elsewhere.
#include <gtest/gtest.h>

#ifdef NIBBLE_HAVE_CUDA
#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "backend/cuda/sample_filter.h"
#include "backend/cuda/w4a16_gemv.h"
#include "formats/common.h"
#include "formats/registry_rows.h"
#include "nibble/convert.h"
#include "nibble/cuda.h"
#include "nibble/cuda_model.h"
#include "nibble/model.h"
#include "nibble/source.h"
#include "test_util.h"
#include "unit/gptq_checkpoint.h"
#include "nibble/format.h"
#include "nibble/dtype.h"
#include "nibble/quantizer.h"
#include "nibble/sample_math.h"
#include "nibble/sampler.h"

namespace nibble {
namespace {

TEST(Cuda, DequantInt4AsymBitExactWithCpuReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int g : {32, 64, 128}) {
    for (int64_t cols : {int64_t{172}, int64_t{4096}, int64_t{4099}, int64_t{1}}) {
      const int64_t rows = 24;
      std::vector<float> w(rows * cols);
      for (auto& v : w) v = normal(rng);
      const FormatChoice f = find_format("int4_asym", g);
      const auto parts = f.spec->pack(quant::quantize_rtn(f, w.data(), rows, cols));
      const Tensor cpu = dequantize_parts(f, parts, rows, cols);
      const Tensor gpu = cuda::dequantize_int4_asym(parts, rows, cols, g);
      ASSERT_EQ(gpu.shape(), cpu.shape());
      EXPECT_EQ(std::memcmp(gpu.raw(), cpu.raw(), cpu.nbytes()), 0) << "g=" << g << " cols=" << cols;
    }
  }
}


// Packs a random int4_asym matrix: random codes, scales and mins (bf16), so
// every code value and sign pattern occurs (not a quantized smooth matrix).
QuantizedMatrix random_int4_matrix(std::mt19937& rng, int64_t rows, int64_t cols, int g) {
  const FormatChoice f = find_format("int4_asym", g);
  QuantizedMatrix q;
  q.format = f.spec;
  q.group_size = g;
  q.rows = rows;
  q.cols = cols;
  q.codes.resize(static_cast<size_t>(rows * cols));
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f), mn(-0.2f, 0.05f);
  for (auto& c : q.codes) c = static_cast<uint8_t>(code(rng));
  q.params.resize(static_cast<size_t>(rows * q.groups_per_row()));
  for (auto& p : q.params) p = {round_to_bf16(scale(rng)), round_to_bf16(mn(rng))};
  return q;
}
std::vector<Tensor> random_int4_parts(std::mt19937& rng, int64_t rows, int64_t cols, int g) {
  return find_format("int4_asym", g).spec->pack(random_int4_matrix(rng, rows, cols, g));
}
// An all-zero matrix of int4_sym with groups of g.
QuantizedMatrix zero_int4_sym(int64_t rows, int64_t cols, int g) {
  return formats::empty_matrix(formats::kInt4Sym, rows, cols, g);
}
// The same for int4_sym: random codes and f16 scales, most of them with more
// significant bits than bf16 holds (the upload rounds them: int4_sym_as_asym).
std::vector<Tensor> random_int4_sym_parts(std::mt19937& rng, int64_t rows, int64_t cols, int g) {
  const FormatChoice f = find_format("int4_sym", g);
  QuantizedMatrix q = zero_int4_sym(rows, cols, g);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f);
  for (auto& c : q.codes) c = static_cast<uint8_t>(code(rng));
  for (auto& p : q.params) p.scale = f16_to_f32(f32_to_f16(scale(rng)));
  return f.spec->pack(q);
}

// The same for int4_asym_f32: random codes, fp32 scales and mins with more
// significant bits than bf16 holds (the upload rounds them: int4_asym_f32_as_asym).
std::vector<Tensor> random_int4_f32_parts(std::mt19937& rng, int64_t rows, int64_t cols, int g) {
  const FormatChoice f = find_format("int4_asym_f32", g);
  QuantizedMatrix q = formats::empty_matrix(formats::kInt4AsymF32, rows, cols, g);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.002f, 0.02f), mn(-0.2f, 0.05f);
  for (auto& c : q.codes) c = static_cast<uint8_t>(code(rng));
  for (auto& p : q.params) p = {scale(rng), mn(rng)};
  return f.spec->pack(q);
}
// A registry row's stored parts and the int4_asym parts its upload makes.
struct RowParts {
  std::vector<Tensor> file, asym;
};
RowParts random_row_parts(std::string_view family, std::mt19937& rng, int64_t rows, int64_t cols, int g) {
  RowParts p;
  if (family == "int4_sym") {
    p.file = random_int4_sym_parts(rng, rows, cols, g);
    p.asym = cuda::int4_sym_as_asym(p.file, rows, cols, g);
  } else if (family == "int4_asym_f32") {
    p.file = random_int4_f32_parts(rng, rows, cols, g);
    p.asym = cuda::int4_asym_f32_as_asym(p.file, rows, cols, g);
  } else {
    p.file = p.asym = random_int4_parts(rng, rows, cols, g);
  }
  return p;
}

// Ŵ as the W4A16 kernels use it: exact (fp32 c·s + m) or rounded once to 16
// bits, fl16(c·s + m) (fused), as cuda::w4a16_exact_weights says for the call.
std::vector<float> weights_kernel(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int g,
                                  cuda::Act act, bool exact) {
  const FormatChoice f = find_format("int4_asym", g);
  const QuantizedMatrix q = f.spec->unpack(parts, rows, cols, g);
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const GroupParams& p = q.group(r, c / g);
      const float v = std::fma(static_cast<float>(q.codes[r * cols + c]), p.scale, p.min);
      w[r * cols + c] = exact ? std::fma(static_cast<double>(q.codes[r * cols + c]), p.scale, p.min)
                        : act == cuda::Act::BF16 ? bf16_to_f32(f32_to_bf16(v))
                                                 : f16_to_f32(f32_to_f16(v));
    }
  return w;
}

uint16_t to_16bit(float v, cuda::Act act) { return act == cuda::Act::BF16 ? f32_to_bf16(v) : f32_to_f16(v); }
float from_16bit(uint16_t v, cuda::Act act) { return act == cuda::Act::BF16 ? bf16_to_f32(v) : f16_to_f32(v); }

struct GemmCase {
  int64_t N, K;
  int g;
};

// M rows of normal activations rounded to `act`, leading dimension ldx, NaN
// past K (a kernel must never read there): x, and xf ([M, K], widened to f32).
void random_activations(std::mt19937& rng, int64_t M, int64_t K, int64_t ldx, cuda::Act act, std::vector<uint16_t>& x,
                        std::vector<float>& xf) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  x.assign(static_cast<size_t>(M * ldx), 0);
  xf.assign(static_cast<size_t>(M * K), 0.0f);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t c = 0; c < ldx; ++c) {
      const float v = c < K ? normal(rng) : std::nanf("");
      x[m * ldx + c] = to_16bit(v, act);
      if (c < K) xf[m * K + c] = from_16bit(x[m * ldx + c], act);
    }
}

// ref[m·N + n] = Σ xf·w over K in float64 and mag = Σ |xf·w|, for M rows.
void w4a16_reference(const std::vector<float>& xf, const std::vector<float>& w, int64_t M, int64_t N, int64_t K,
                     std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(static_cast<size_t>(M * N), 0.0);
  mag.assign(ref.size(), 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int64_t c = 0; c < K; ++c) {
        const double p = static_cast<double>(xf[m * K + c]) * w[n * K + c];
        s += p;
        a += std::fabs(p);
      }
      ref[m * N + n] = s;
      mag[m * N + n] = a;
    }
}

// The W4A16 tests' bound on one output against its float64 reference r, mag = Σ |x·w| (check_w4a16 says why).
double w4a16_tolerance(double r, double mag, bool exact) {
  return std::ldexp(std::fabs(r), -8) + (exact ? 3e-5 : 1e-5) * mag;
}

// Runs the registered int4_asym kernel for every M in `ms` against a float64
// reference on the weights the kernel uses (exact or rounded to 16 bits).
// Bound: the output's rounding to 16 bits (2^-8 relative covers bf16's 2^-9)
// plus fp32 accumulation, 1e-5 of Σ|x·w|, and for the exact-weight path the
// cancellation in s·Σ(128 + c)x − 128·s·Σx, 3e-5 of Σ|x·w| (derivation in
// src/backend/cuda/w4a16.cu).
// Another family (int4_sym, int4_asym_f32): its registry row, on the weights
// its upload makes (int4_sym_as_asym, int4_asym_f32_as_asym; Cuda.Int4*AsAsym*
// hold those conversions to FORMAT.md).
void check_w4a16(const GemmCase& tc, cuda::Act act, const std::vector<int>& ms, bool pdl, uint32_t seed,
                 std::string_view family = "int4_asym") {
  std::mt19937 rng(seed);
  const RowParts rp = random_row_parts(family, rng, tc.N, tc.K, tc.g);
  const auto& file_parts = rp.file;
  const auto& parts = rp.asym;
  const cuda::LinearKernel* k = cuda::find_linear_kernel(family, tc.g);
  ASSERT_NE(k, nullptr);
  const cuda::DeviceLinear dw = k->upload(file_parts, tc.N, tc.K, tc.g);
  const int64_t Mmax = *std::max_element(ms.begin(), ms.end());
  const int64_t ldx = (tc.K + 7) / 8 * 8 + 8, ldy = tc.N + 3;  // padded leading dimensions
  std::vector<uint16_t> x;
  std::vector<float> xf;
  random_activations(rng, Mmax, tc.K, ldx, act, x, xf);
  std::vector<double> ref, mag;
  std::vector<float> w;
  bool w_exact = false;
  auto reference = [&](bool exact) {
    w = weights_kernel(parts, tc.N, tc.K, tc.g, act, exact);
    w_exact = exact;
    w4a16_reference(xf, w, Mmax, tc.N, tc.K, ref, mag);
  };
  cuda::DeviceBuffer dx(x.size() * 2), dy(static_cast<size_t>(Mmax * ldy) * 2);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  std::vector<uint16_t> y(static_cast<size_t>(Mmax * ldy));
  for (int M : ms) {
    const bool exact = cuda::w4a16_exact_weights(dw, M, act);
    if (w.empty() || exact != w_exact) reference(exact);
    ASSERT_EQ(cudaMemset(dy.get(), 0xFF, dy.bytes()), cudaSuccess);  // poison: NaN in both 16-bit types
    k->gemm(dw, dx.get(), M, ldx, dy.get(), ldy, act, false, nullptr, pdl);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    int bad = 0;
    for (int64_t m = 0; m < Mmax && bad < 5; ++m)
      for (int64_t n = 0; n < ldy && bad < 5; ++n) {
        const uint16_t got = y[m * ldy + n];
        if (m >= M || n >= tc.N) {  // outside the output: untouched
          if (got != 0xFFFF) {
            ++bad;
            ADD_FAILURE() << "wrote outside y at m=" << m << " n=" << n;
          }
          continue;
        }
        const double r = ref[m * tc.N + n];
        const double tol = w4a16_tolerance(r, mag[m * tc.N + n], exact);
        const double v = from_16bit(got, act);
        if (!(std::fabs(v - r) <= tol)) {
          ++bad;
          ADD_FAILURE() << "N=" << tc.N << " K=" << tc.K << " g=" << tc.g << " M=" << M << " act="
                        << (act == cuda::Act::BF16 ? "bf16" : "f16") << " y[" << m << "," << n << "]=" << v
                        << " ref=" << r << " tol=" << tol;
        }
      }
    if (bad) return;
  }
}

std::vector<int> all_m(int hi) {
  std::vector<int> v;
  for (int m = 1; m <= hi; ++m) v.push_back(m);
  return v;
}

TEST(Cuda, W4A16RegistryRows) {
  EXPECT_NE(cuda::find_linear_kernel("int4_asym", 128), nullptr);
  EXPECT_NE(cuda::find_linear_kernel("int4_asym", 32), nullptr);
  EXPECT_EQ(cuda::find_linear_kernel("int4_asym", 256), nullptr);
  for (int g : {32, 64, 128}) EXPECT_NE(cuda::find_linear_kernel("int4_sym", g), nullptr) << g;
  for (int g : {32, 64, 128}) EXPECT_NE(cuda::find_linear_kernel("int4_asym_f32", g), nullptr) << g;
  EXPECT_EQ(cuda::find_linear_kernel("mxfp4", 32), nullptr);
  EXPECT_EQ(cuda::find_linear_kernel("no_such_format", 128), nullptr);
}

// int4_sym's parts as the W4A16 kernels take them (no device needed): the
// codes unchanged; each f16 scale rounded once to bf16 (nearest, ties to
// even), the min −8 times it. Worked scales: f16 0x2C00 = 2⁻⁴ is a bf16 value;
// 0x2C01 = 2⁻⁴(1 + 2⁻¹⁰) and 0x2C04 = 2⁻⁴(1 + 2⁻⁸) round down (the latter a tie,
// to the even 0x3D80); 0x2C05 = 2⁻⁴(1 + 5·2⁻¹⁰) rounds up to 2⁻⁴(1 + 2⁻⁷) = bf16
// 0x3D81; 0x0001 = 2⁻²⁴ (an f16 subnormal) is bf16 0x3380; 0 stays 0. Then
// every decoded weight against FORMAT.md's (c − 8)·s: within 2⁻⁸ of it.
TEST(Cuda, Int4SymAsAsymRoundsEachScaleOnce) {
  const int64_t rows = 2, cols = 192;
  const int g = 32;
  const FormatChoice sym = find_format("int4_sym", g), asym = find_format("int4_asym", g);
  QuantizedMatrix q = zero_int4_sym(rows, cols, g);
  for (size_t i = 0; i < q.codes.size(); ++i) q.codes[i] = static_cast<uint8_t>((i * 7 + i / 5) % 16);
  const uint16_t f16[12] = {0x2C00, 0x2C01, 0x2C04, 0x2C05, 0x0001, 0x0000,
                            0x1A3F, 0x7BFF, 0x2E66, 0x3555, 0x0155, 0x2C06};
  for (size_t i = 0; i < q.params.size(); ++i) q.params[i].scale = f16_to_f32(f16[i]);
  const auto parts = sym.spec->pack(q);
  const auto conv = cuda::int4_sym_as_asym(parts, rows, cols, g);
  ASSERT_EQ(conv.size(), 3u);
  EXPECT_EQ(std::memcmp(conv[0].raw(), parts[0].raw(), parts[0].nbytes()), 0);
  const auto* sc = static_cast<const uint16_t*>(conv[1].raw());
  const auto* mn = static_cast<const uint16_t*>(conv[2].raw());
  EXPECT_EQ(sc[0], 0x3D80);
  EXPECT_EQ(sc[1], 0x3D80);
  EXPECT_EQ(sc[2], 0x3D80);
  EXPECT_EQ(sc[3], 0x3D81);
  EXPECT_EQ(sc[4], 0x3380);
  EXPECT_EQ(sc[5], 0x0000);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(bf16_to_f32(mn[i]), -8.0f * bf16_to_f32(sc[i])) << i;
  const QuantizedMatrix a = asym.spec->unpack(conv, rows, cols, g);
  std::vector<float> want(static_cast<size_t>(rows * cols)), got(want.size());
  dequantize(q, want.data());
  dequantize(a, got.data());
  for (size_t i = 0; i < want.size(); ++i) {
    const float s = f16_to_f32(f16[i / g]);
    EXPECT_LE(std::fabs(got[i] - want[i]), std::ldexp(std::fabs(want[i]), -8)) << i;
    EXPECT_EQ(got[i], (static_cast<int>(q.codes[i]) - 8) * round_to_bf16(s)) << i;
  }
}

// int4_asym_f32's parts as the W4A16 kernels take them (no device needed):
// the codes unchanged, each fp32 scale and min rounded once to bf16 (nearest,
// ties to even). Worked values: 0x3D888889 (fl(1/15)) rounds up to 0x3D89;
// 0x3F808000 is a tie and stays at the even 0x3F80; 0x3F818000 is a tie and
// goes to the even 0x3F82; 0xBE99999A (fl(-0.3)) rounds to 0xBE9A; 0x3F7FFFFF
// carries into the exponent, 0x3F80; -0 stays -0. Then every decoded weight:
// exactly c·bf16(s) + bf16(m), and within 2⁻⁸·(15·|s| + |m|) of FORMAT.md's.
TEST(Cuda, Int4AsymF32AsAsymRoundsEachParameterOnce) {
  const int64_t rows = 2, cols = 192;
  const int g = 32;
  const FormatChoice f32 = find_format("int4_asym_f32", g), asym = find_format("int4_asym", g);
  QuantizedMatrix q = formats::empty_matrix(formats::kInt4AsymF32, rows, cols, g);
  for (size_t i = 0; i < q.codes.size(); ++i) q.codes[i] = static_cast<uint8_t>((i * 7 + i / 5) % 16);
  const uint32_t bits[12][2] = {{0x3D888889, 0xBE99999A}, {0x3F808000, 0x3F818000}, {0x3F818000, 0x80000000},
                                {0x3F7FFFFF, 0x00000000}, {0x3C23D70A, 0xBDCCCCCD}, {0x3B03126F, 0x3D4CCCCD},
                                {0x3A83126F, 0xBE4CCCCD}, {0x3C8F5C29, 0x3CA3D70A}, {0x3BA3D70A, 0xBF000001},
                                {0x3D4CCCCD, 0x3E800000}, {0x00000000, 0xBC23D70A}, {0x3C75C28F, 0x3E19999A}};
  auto as_f32 = [](uint32_t b) {
    float v;
    std::memcpy(&v, &b, 4);
    return v;
  };
  for (size_t i = 0; i < q.params.size(); ++i) q.params[i] = {as_f32(bits[i][0]), as_f32(bits[i][1])};
  const auto parts = f32.spec->pack(q);
  const auto conv = cuda::int4_asym_f32_as_asym(parts, rows, cols, g);
  ASSERT_EQ(conv.size(), 3u);
  EXPECT_EQ(std::memcmp(conv[0].raw(), parts[0].raw(), parts[0].nbytes()), 0);
  const auto* sc = static_cast<const uint16_t*>(conv[1].raw());
  const auto* mn = static_cast<const uint16_t*>(conv[2].raw());
  EXPECT_EQ(sc[0], 0x3D89);
  EXPECT_EQ(mn[0], 0xBE9A);
  EXPECT_EQ(sc[1], 0x3F80);
  EXPECT_EQ(mn[1], 0x3F82);
  EXPECT_EQ(sc[2], 0x3F82);
  EXPECT_EQ(mn[2], 0x8000);
  EXPECT_EQ(sc[3], 0x3F80);
  EXPECT_EQ(mn[3], 0x0000);
  const QuantizedMatrix a = asym.spec->unpack(conv, rows, cols, g);
  std::vector<float> want(static_cast<size_t>(rows * cols)), got(want.size());
  dequantize(q, want.data());
  dequantize(a, got.data());
  for (size_t i = 0; i < want.size(); ++i) {
    const float s = as_f32(bits[i / g][0]), m = as_f32(bits[i / g][1]);
    EXPECT_LE(std::fabs(got[i] - want[i]), std::ldexp(15.0f * std::fabs(s) + std::fabs(m), -8)) << i;
    EXPECT_EQ(got[i], static_cast<float>(q.codes[i]) * round_to_bf16(s) + round_to_bf16(m)) << i;
  }
}

// The GEMV's warps per tile (one_wave_warps) on the Llama-3-8B shapes, worked
// by hand for 132 SMs and a kernel of 64 registers a thread: 32 warps fit on
// an SM, so per_sm(w) = 32 / (unit · w) blocks, at most 32. No device needed.
TEST(Cuda, W4A16OneWaveWarpsWorkedExamples) {
  auto on_132 = [](int64_t blocks, int64_t most, int64_t groups, int unit) {
    return cuda::one_wave_warps_for(blocks, most, groups, 132,
                                    [&](int64_t w) { return std::min<int64_t>(32 / (unit * w), 32); });
  };
  // q|k|v, 384 tiles of 32 groups: 16 and 11 warps fit 2 blocks per SM (264 <
  // 384); 10 fit 3 (396), i.e. 4 groups per warp, which 8 warps also give.
  EXPECT_EQ(on_132(384, 16, 32, 1), 8);
  // o, 256 tiles: 16 warps, 2 blocks per SM (264 >= 256), 2 groups each.
  EXPECT_EQ(on_132(256, 16, 32, 1), 16);
  // down, 256 tiles of 112 groups: 16 warps, 7 groups each.
  EXPECT_EQ(on_132(256, 16, 112, 1), 16);
  // gate|up with SwiGLU, 896 blocks of two tiles: 2 warps per tile, 8 blocks per SM (1056 >= 896).
  EXPECT_EQ(on_132(896, 8, 32, 2), 2);
  // The head, 8016 tiles: even one warp per tile is two waves (32 blocks per SM).
  EXPECT_EQ(on_132(8016, 16, 32, 1), 0);
  // Fewer groups than warps: one group per warp.
  EXPECT_EQ(on_132(64, 16, 3, 1), 3);
}

// Top-k / top-p's launch rule (sample_filter.h), worked by hand. No device needed.
TEST(Cuda, SampleFilterRuleWorkedExamples) {
  // Llama-3's 128256 logits on 132 SMs: ceil(128256 / 1024) = 126 blocks, ceil(128256 / 126) = 1018 logits
  // each, rounded up to 1024 (a multiple of 8); the last block holds 128256 - 125 * 1024 = 256.
  EXPECT_EQ(cuda::filter_blocks(128256, 132), 126);
  EXPECT_EQ(cuda::filter_per(128256, 126), 1024);
  // Qwen2's 151936: 149 blocks wanted, 128 at most; ceil(151936 / 128) = 1187 -> 1192.
  EXPECT_EQ(cuda::filter_blocks(151936, 132), 128);
  EXPECT_EQ(cuda::filter_per(151936, 128), 1192);
  // 16385: 17 blocks of ceil(16385 / 17) = 964 -> 968; 8192: 8 of 1024; 1: one block of 8.
  EXPECT_EQ(cuda::filter_blocks(16385, 132), 17);
  EXPECT_EQ(cuda::filter_per(16385, 17), 968);
  EXPECT_EQ(cuda::filter_blocks(8192, 132), 8);
  EXPECT_EQ(cuda::filter_per(8192, 8), 1024);
  EXPECT_EQ(cuda::filter_blocks(1, 132), 1);
  EXPECT_EQ(cuda::filter_per(1, 1), 8);
  // At most one block per SM: 16 SMs take 65536 logits, in 16 full blocks of 4096.
  EXPECT_EQ(cuda::filter_max_logits(16), 65536);
  EXPECT_EQ(cuda::filter_blocks(65536, 16), 16);
  EXPECT_EQ(cuda::filter_per(65536, 16), 4096);
  // 132 SMs: 128 blocks of 4096 at most; 108 (an A100): 108 of them.
  EXPECT_EQ(cuda::filter_max_logits(132), 524288);
  EXPECT_EQ(cuda::filter_max_logits(108), 442368);
  // Every size up to the limit: the blocks cover n, none holds more than 4096, and the blocks past the
  // first hold something.
  for (int sms : {1, 16, 108, 132}) {
    for (int64_t n = 1; n <= cuda::filter_max_logits(sms); n += n < 5000 ? 1 : 997) {
      const int b = cuda::filter_blocks(n, sms), per = cuda::filter_per(n, b);
      ASSERT_LE(b, sms);
      ASSERT_EQ(per % 8, 0);
      ASSERT_LE(per, 4096) << "n " << n << " sms " << sms;
      ASSERT_GE(int64_t{b} * per, n);
      ASSERT_LT(int64_t{b - 1} * per, n) << "n " << n << " sms " << sms;
    }
  }
}

// The Memo behind the launch rules' occupancy caches: each key's value is
// computed once, by its first call; later calls with that key return it
// without running their own computation. No device needed.
TEST(Cuda, W4A16MemoComputesEachKeyOnce) {
  cuda::Memo<std::tuple<int, size_t>, int64_t> memo;
  int runs = 0;
  auto square = [&](int a, size_t b) {
    return memo.get(std::make_tuple(a, b), [&] {
      ++runs;
      return int64_t{a} * a + static_cast<int64_t>(b);
    });
  };
  EXPECT_EQ(square(3, 1), 10);
  EXPECT_EQ(square(4, 1), 17);
  EXPECT_EQ(square(3, 2), 11);
  EXPECT_EQ(runs, 3);
  EXPECT_EQ(square(3, 1), 10);
  EXPECT_EQ(square(4, 1), 17);
  EXPECT_EQ(runs, 3);
  // A later call's computation does not replace the first value.
  EXPECT_EQ(memo.get(std::make_tuple(3, size_t{1}), [] { return int64_t{-1}; }), 10);
}

// The early-launched grid's shared memory (even_share_smem_for) worked by hand
// for 132 SMs of 233472 bytes, 1024 of them reserved per block, and a kernel
// whose registers allow 3 blocks per SM (80 a thread, 256 threads: the fp16
// wgmma kernel at groups of 64). No device needed.
TEST(Cuda, W4A16EvenShareSmemWorkedExamples) {
  auto per_sm = [](size_t s) { return std::min<int64_t>(3, static_cast<int64_t>(233472 / (s + 1024))); };
  auto even = [&](size_t smem, int64_t blocks, size_t most) {
    return cuda::even_share_smem_for(smem, blocks, 132, most, per_sm);
  };
  // gate|up's 224 blocks: an even share of 2. 3 fit while s + 1024 <= 77824,
  // so s must exceed 76800: 40000 + 128·288 = 76864 (76736 still fits 3).
  EXPECT_EQ(even(40000, 224, 232448), 76864u);
  EXPECT_EQ(per_sm(76864), 2);
  EXPECT_EQ(per_sm(76736), 3);
  // 132 blocks: a share of 1; 2 fit while 2·(s + 1024) <= 233472, i.e. s <= 115712:
  // 40000 + 128·592 = 115776.
  EXPECT_EQ(even(40000, 132, 232448), 115776u);
  EXPECT_EQ(per_sm(115776), 1);
  EXPECT_EQ(per_sm(115648), 2);
  // 300 blocks: a share of 3, which the registers already hold.
  EXPECT_EQ(even(40000, 300, 232448), 40000u);
  // Too little room to raise it to: unchanged.
  EXPECT_EQ(even(40000, 132, 100000), 40000u);
  // Already at its share.
  EXPECT_EQ(even(90000, 224, 232448), 90000u);
  // `most` itself where the next step of 128 would pass it (115776 > 115750),
  // and unchanged where `most` still holds 2 (115700 + 1024 <= 116736).
  EXPECT_EQ(even(40000, 132, 115750), 115750u);
  EXPECT_EQ(even(40000, 132, 115700), 40000u);
}

// The wgmma kernel's grid (wg_grid) on the Llama-3-8B shapes with groups of
// 128, worked by hand for 132 SMs. No device needed. {ks, nwg, blocks}.
TEST(Cuda, W4A16WgmmaGridWorkedExamples) {
  auto grid = [](int64_t rows, int64_t cols, int max_nwg, bool wide) {
    const cuda::WgGrid g = cuda::wg_grid((rows + 63) / 64, (cols + 127) / 128, 132, max_nwg, wide);
    return std::vector<int64_t>{g.ks, g.nwg, g.blocks};
  };
  using V = std::vector<int64_t>;
  // Up to 64 tokens: KS doubles while 2·row_wgs·KS stays within 4 warpgroups
  // per SM (528) and each block keeps 4 groups; then the most warpgroups per
  // block that still give 132 blocks.
  // o (64 row blocks, 32 groups): KS 8 (64·4·2 = 512 <= 528, 32 >= 4·8);
  // 4 warpgroups give 16·8 = 128 < 132 blocks, 2 give 256.
  EXPECT_EQ(grid(4096, 4096, 4, false), (V{8, 2, 32}));
  // q|k|v (96): 96·4·2 = 768 > 528 stops KS at 4; 24·4 = 96 < 132, 48·4 = 192.
  EXPECT_EQ(grid(6144, 4096, 4, false), (V{4, 2, 48}));
  // gate|up (448): 448·1·2 = 896 > 528, no split; 112 < 132 blocks of 4, 224 of 2.
  EXPECT_EQ(grid(28672, 4096, 4, false), (V{1, 2, 224}));
  // The head (2004): no split, 501 blocks of 4.
  EXPECT_EQ(grid(128256, 4096, 4, false), (V{1, 4, 501}));
  // 128 tokens (wide): the most warpgroups per block with ks_max·blocks >=
  // 105 (4/5 of 132), then the least KS that reaches 105.
  // o and down: ks_max 8, 16 blocks of 4 (128 >= 105); KS 8 (16·4 = 64 < 105).
  EXPECT_EQ(grid(4096, 4096, 4, true), (V{8, 4, 16}));
  EXPECT_EQ(grid(4096, 14336, 4, true), (V{8, 4, 16}));
  // gate|up: 112 blocks of 4 already reach 105, no split.
  EXPECT_EQ(grid(28672, 4096, 4, true), (V{1, 4, 112}));
  // 256 tokens (at most 2 warpgroups): o 32 blocks of 2, KS 4 (128 >= 105).
  EXPECT_EQ(grid(4096, 4096, 2, true), (V{4, 2, 32}));
  // Too few groups to split (5 groups: ks_max 1), too few rows to fill: 1 warpgroup.
  EXPECT_EQ(grid(264, 576, 4, true), (V{1, 1, 5}));
}

// Up to 32 tokens, matrices whose wgmma grid splits K 4 or more ways take the
// small-M kernel instead (w4a16_small_m_first), by the grids above on 132 SMs;
// up to 24 tokens also those it splits 2 ways where the small-M kernel takes
// three exact token tiles (w4a16_three_tiles_exact, next test), and those the
// resident-activation kernel takes (w4a16_resident_x_ks, below: gate|up and
// the head). No device needed.
TEST(Cuda, W4A16SmallMFirstWorkedExamples) {
  for (int64_t M : {17, 24, 25, 32}) {
    EXPECT_TRUE(cuda::w4a16_small_m_first(4096, 4096, 128, M, 132));     // o: KS 8
    EXPECT_TRUE(cuda::w4a16_small_m_first(4096, 14336, 128, M, 132));    // down: KS 8
    EXPECT_TRUE(cuda::w4a16_small_m_first(6144, 4096, 128, M, 132));     // q|k|v: KS 4
    // 224 row blocks: KS 2; 896 tiles, two-tile warps (exact at 17..24)
    EXPECT_EQ(cuda::w4a16_small_m_first(14336, 4096, 128, M, 132), M <= 24);
    // gate|up and the head: no split, resident activations at 17..24 tokens
    EXPECT_EQ(cuda::w4a16_small_m_first(28672, 4096, 128, M, 132), M <= 24);
    EXPECT_EQ(cuda::w4a16_small_m_first(128256, 4096, 128, M, 132), M <= 24);
  }
  // Groups of 64 (twice the groups): 14336 × 4096 still KS 2 (224·2·2 = 896 >
  // 528), and groups of 64 have no three exact tiles: the wgmma kernel; but
  // gate|up keeps its resident activations (up to 24 tokens).
  EXPECT_FALSE(cuda::w4a16_small_m_first(14336, 4096, 64, 24, 132));
  EXPECT_TRUE(cuda::w4a16_small_m_first(28672, 4096, 64, 17, 132));
  EXPECT_FALSE(cuda::w4a16_small_m_first(28672, 4096, 64, 25, 132));
  // 9 groups of 64 over 264 rows: KS 2 (KS 4 needs 16 groups); 5 groups of 128: no split.
  EXPECT_FALSE(cuda::w4a16_small_m_first(264, 576, 64, 20, 132));
  EXPECT_FALSE(cuda::w4a16_small_m_first(264, 576, 128, 20, 132));
  // 12 groups of 128 over 264 rows: KS 2 (KS 4 needs 16 groups), 17 tiles (fewer than SMs): three exact
  // tiles up to 24 tokens; 17 groups: KS 4, the small-M kernel up to 32.
  EXPECT_TRUE(cuda::w4a16_small_m_first(264, 1536, 128, 20, 132));
  EXPECT_FALSE(cuda::w4a16_small_m_first(264, 1536, 128, 28, 132));
  EXPECT_TRUE(cuda::w4a16_small_m_first(264, 2176, 128, 28, 132));
  // Beyond 32 tokens the small-M kernel takes two passes: always the wgmma kernel.
  EXPECT_FALSE(cuda::w4a16_small_m_first(4096, 4096, 128, 33, 132));
  // Groups of 32: the wgmma kernel's unit is a chunk of two, so its grid is that of groups of 64, and the small-M
  // kernel (its rounded path) goes first where that grid splits K 4 or more ways: o (64 chunks, KS 8), q|k|v (KS
  // 4); not 14336 × 4096 (KS 2), gate|up or the head (no three exact tiles, no resident activations).
  for (int64_t M : {17, 24, 32}) {
    EXPECT_TRUE(cuda::w4a16_small_m_first(4096, 4096, 32, M, 132));
    EXPECT_TRUE(cuda::w4a16_small_m_first(6144, 4096, 32, M, 132));
    EXPECT_FALSE(cuda::w4a16_small_m_first(14336, 4096, 32, M, 132));
    EXPECT_FALSE(cuda::w4a16_small_m_first(28672, 4096, 32, M, 132));
    EXPECT_FALSE(cuda::w4a16_small_m_first(128256, 4096, 32, M, 132));
  }
  EXPECT_FALSE(cuda::w4a16_small_m_first(4096, 4096, 32, 33, 132));
}

// The wgmma kernel's x image up to 64 tokens (the weight's scratch): per unit of
// max(G, 64) inputs, 64 tokens × that many 16-bit inputs; a ragged last unit
// takes a whole one. Groups of 32 share a chunk's image. No device needed.
TEST(Cuda, W4A16WgmmaScratchWorkedExamples) {
  EXPECT_EQ(cuda::w4a16_wgmma_scratch_bytes(4096, 128), size_t{32} * 64 * 128 * 2);
  EXPECT_EQ(cuda::w4a16_wgmma_scratch_bytes(4160, 128), size_t{33} * 64 * 128 * 2);
  EXPECT_EQ(cuda::w4a16_wgmma_scratch_bytes(4160, 64), size_t{65} * 64 * 64 * 2);
  EXPECT_EQ(cuda::w4a16_wgmma_scratch_bytes(4100, 32), size_t{65} * 64 * 64 * 2);  // 129 groups of 32 in 65 chunks
  EXPECT_EQ(cuda::w4a16_wgmma_scratch_bytes(96, 32), size_t{2} * 64 * 64 * 2);
}

// Which matrices the small-M kernel runs exactly on three token tiles at
// 17..24 tokens (w4a16_three_tiles_exact), worked by hand for 132 SMs: those
// whose grid (launch_small) has two-tile warps (at least 264 tiles), staged
// activations (at least 64 groups) or fewer tiles than SMs; not one-tile grids
// of 132..263 tiles with fewer groups. No device needed.
TEST(Cuda, W4A16ThreeTilesExactWorkedExamples) {
  EXPECT_TRUE(cuda::w4a16_three_tiles_exact(6144, 4096, 128, 132));    // q|k|v: 384 tiles
  EXPECT_FALSE(cuda::w4a16_three_tiles_exact(4096, 4096, 128, 132));   // o: 256 tiles, 32 groups
  EXPECT_TRUE(cuda::w4a16_three_tiles_exact(4096, 14336, 128, 132));   // down: 112 groups
  EXPECT_TRUE(cuda::w4a16_three_tiles_exact(1024, 4096, 128, 132));    // k, v: 64 tiles
  EXPECT_TRUE(cuda::w4a16_three_tiles_exact(14336, 4096, 128, 132));   // 896 tiles
  EXPECT_FALSE(cuda::w4a16_three_tiles_exact(4096, 4096, 64, 132));    // groups of 64 stay rounded
  EXPECT_FALSE(cuda::w4a16_three_tiles_exact(4096, 14336, 64, 132));
  EXPECT_FALSE(cuda::w4a16_three_tiles_exact(4104, 4096, 128, 132));   // 257 tiles, 32 groups
  EXPECT_TRUE(cuda::w4a16_three_tiles_exact(4232, 4096, 128, 132));    // 265 tiles
  EXPECT_TRUE(cuda::w4a16_three_tiles_exact(2088, 4096, 128, 132));    // 131 tiles (the last half full)
  EXPECT_FALSE(cuda::w4a16_three_tiles_exact(2104, 4096, 128, 132));   // 132 tiles
}

// f32 activations are a single-token feature (the integer GEMV, every group
// size since session 78): any other M is refused.
TEST(Cuda, W4A16F32ActivationsOnlyForOneToken) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(19);
  for (int g : {32, 128}) {
    const auto parts = random_int4_parts(rng, 16, 256, g);
    const cuda::DeviceLinear dw = cuda::find_linear_kernel("int4_asym", g)->upload(parts, 16, 256, g);
    EXPECT_TRUE(dw.kernel->single_token_f32(dw));
    cuda::DeviceBuffer dx(2 * 256 * 4), dy(2 * 16 * 4);
    ASSERT_EQ(cudaMemset(dx.get(), 0, dx.bytes()), cudaSuccess);
    EXPECT_THROW(dw.kernel->gemm(dw, dx.get(), 2, 256, dy.get(), 16, cuda::Act::F32, true, nullptr, false), Error);
  }
}

TEST(Cuda, W4A16LayoutOnDeviceMatchesHostReference) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(11);
  for (const GemmCase& tc : {GemmCase{24, 172, 32}, GemmCase{40, 4160, 128}, GemmCase{136, 4096, 64}}) {
    const auto parts = random_int4_parts(rng, tc.N, tc.K, tc.g);
    const cuda::DeviceLinear dw = cuda::find_linear_kernel("int4_asym", tc.g)->upload(parts, tc.N, tc.K, tc.g);
    const cuda::W4A16HostLayout host = cuda::w4a16_layout_host(parts, tc.N, tc.K, tc.g);
    ASSERT_EQ(dw.a.bytes(), host.codes.size());
    ASSERT_EQ(dw.b.bytes(), host.meta.size());
    std::vector<uint8_t> a(host.codes.size()), b(host.meta.size());
    ASSERT_EQ(cudaMemcpy(a.data(), dw.a.get(), a.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(b.data(), dw.b.get(), b.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(a, host.codes) << "N=" << tc.N << " K=" << tc.K;
    EXPECT_EQ(b, host.meta) << "N=" << tc.N << " K=" << tc.K;
  }
}

// The sweep the issue asks for: M = 1..64, K = 4096 / 14336 / a ragged last
// group, N odd multiples of 8, both activation types.
TEST(Cuda, W4A16SweepBf16) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({40, 4096, 128}, cuda::Act::BF16, all_m(64), false, 1);
  check_w4a16({24, 14336, 128}, cuda::Act::BF16, all_m(64), false, 2);
  check_w4a16({56, 4160, 128}, cuda::Act::BF16, all_m(64), false, 3);  // last group of 64
  check_w4a16({8, 4100, 128}, cuda::Act::BF16, all_m(64), false, 4);   // last chunk of 4
  // Groups of 32 (two per chunk; the small-M kernel's rounded path at M >= 2): a ragged last group and chunk.
  check_w4a16({40, 4096, 32}, cuda::Act::BF16, all_m(64), false, 21);
  check_w4a16({24, 4100, 32}, cuda::Act::BF16, all_m(64), true, 22);
}

TEST(Cuda, W4A16SweepF16) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({40, 4096, 128}, cuda::Act::F16, all_m(64), false, 5);
  check_w4a16({24, 14336, 128}, cuda::Act::F16, all_m(64), false, 6);
  check_w4a16({56, 4160, 128}, cuda::Act::F16, all_m(64), false, 7);
  check_w4a16({56, 4160, 32}, cuda::Act::F16, all_m(64), false, 23);
  check_w4a16({40, 4096, 32}, cuda::Act::F16, {65, 130}, false, 24);  // fp16 beyond 64 tokens: passes of 32
}

TEST(Cuda, W4A16GroupSizesWideMatricesAndTallM) {
  SKIP_WITHOUT_DEVICE();
  for (int g : {32, 64})
    for (auto act : {cuda::Act::BF16, cuda::Act::F16}) check_w4a16({72, 4160, g}, act, {1, 7, 16, 33, 64}, false, 8);
  check_w4a16({24, 172, 32}, cuda::Act::BF16, {1, 5, 64}, false, 9);  // K < one chunk beyond 128
  check_w4a16({4104, 4096, 128}, cuda::Act::BF16, {1, 4, 16, 64}, false, 10);
  check_w4a16({1032, 14336, 128}, cuda::Act::BF16, {1, 16}, false, 11);
  check_w4a16({40, 4096, 128}, cuda::Act::F16, {65, 130}, false, 12);  // M > 64, fp16: the kernels, blocks of tokens
  // M > 64, bf16: the kernels up to 256 tokens on Hopper (64 elsewhere), then cuBLAS on dequantized weights
  check_w4a16({40, 4096, 128}, cuda::Act::BF16, {65, 130, 257}, false, 16);
  check_w4a16({24, 4100, 128}, cuda::Act::BF16, {260}, false, 17);       // the same, a ragged row (scalar stores)
  check_w4a16({72, 4160, 64}, cuda::Act::BF16, {270}, true, 18);
  check_w4a16({40, 4096, 128}, cuda::Act::F16, {300}, false, 19);        // fp16 stays on the kernel
  check_w4a16({72, 4160, 32}, cuda::Act::BF16, {200, 257}, false, 20);   // groups of 32: two per chunk
  check_w4a16({40, 4100, 32}, cuda::Act::F16, {300}, false, 38);         // the same, fp16: passes of 256 and 44
}

// int4_sym's row: the same kernels on the parameters its upload rounds
// (int4_sym_as_asym), every dispatch path: the integer GEMV (1 token), the
// small-M kernel (2..16, 17..24), wgmma (33, 64; bf16 130), dequantize +
// cuBLAS (bf16 beyond 256), the rounded path (groups of 32), both activation
// types, a ragged last group and chunk.
TEST(Cuda, W4A16Int4SymRow) {
  SKIP_WITHOUT_DEVICE();
  for (auto act : {cuda::Act::BF16, cuda::Act::F16}) {
    check_w4a16({40, 4096, 128}, act, {1, 2, 7, 16, 17, 24, 33, 64}, false, 40, "int4_sym");
    check_w4a16({56, 4160, 64}, act, {1, 5, 16, 20, 64}, true, 41, "int4_sym");
    check_w4a16({24, 4100, 32}, act, {1, 9, 64}, false, 42, "int4_sym");
  }
  check_w4a16({72, 4096, 128}, cuda::Act::BF16, {130, 260}, false, 43, "int4_sym");
}

// int4_asym_f32's row (AWQ, asymmetric GPTQ, Q4_1 and Q4_K linears): the same
// kernels on the parameters its upload rounds (int4_asym_f32_as_asym), every
// dispatch path as above.
TEST(Cuda, W4A16Int4AsymF32Row) {
  SKIP_WITHOUT_DEVICE();
  for (auto act : {cuda::Act::BF16, cuda::Act::F16}) {
    check_w4a16({40, 4096, 128}, act, {1, 2, 7, 16, 17, 24, 33, 64}, false, 44, "int4_asym_f32");
    check_w4a16({56, 4160, 64}, act, {1, 5, 16, 20, 64}, true, 45, "int4_asym_f32");
    check_w4a16({24, 4100, 32}, act, {1, 9, 64}, false, 46, "int4_asym_f32");
  }
  check_w4a16({72, 4096, 128}, cuda::Act::BF16, {130, 260}, false, 47, "int4_asym_f32");
}

// One token on a grid of several waves (as the head's): 70008 rows are 4376
// one-warp tiles (the last half full), more than 132 SMs hold at 32 blocks
// each, so they take the 64-register instantiation (launch_gemv's `Lean`);
// K = 1092 ends in a ragged group at groups of 64.
TEST(Cuda, W4A16SingleTokenGridOfSeveralWaves) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({70008, 1092, 64}, cuda::Act::BF16, {1}, true, 29);
  check_w4a16({70008, 4096, 128}, cuda::Act::F16, {1}, false, 30);
}

// The 2..16-token kernel (w4a16_small_m.cu) gives each warp two row tiles on
// wide matrices (at least 256 tiles for one token tile, 4 per SM for two; at
// 9..16 tokens also 2 per SM, too few units for the resident kernel): an odd
// number of tiles, so the last block's second tile lies past the matrix (and
// 4232 rows end in half a tile). At 17..24 tokens 4232 rows take the same
// two-tile warps on three exact token tiles (wgmma splits them only 2 ways).
TEST(Cuda, W4A16SmallMTwoTilesPerWarp) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({8456, 4160, 128}, cuda::Act::BF16, {2, 9, 16}, false, 14);
  check_w4a16({8456, 4096, 64}, cuda::Act::F16, {5, 16}, true, 15);
  check_w4a16({4232, 4096, 128}, cuda::Act::BF16, {9, 16, 17, 24}, true, 25);
  check_w4a16({4232, 4096, 64}, cuda::Act::F16, {12, 20}, false, 26);
}

// Groups of 64 at 2..8 tokens on a staged grid of more than 4 blocks per SM
// (here 2113 tiles, 1057 blocks), which launches without the dependent launch
// even when asked for one; the last block's second tile past the matrix.
TEST(Cuda, W4A16StagedManyBlocksGroupsOf64) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({33800, 576, 64}, cuda::Act::BF16, {3, 8}, true, 27);
  check_w4a16({33800, 4160, 64}, cuda::Act::F16, {2}, false, 28);
}

// Groups of 64 at 2..8 tokens where the staged grid is more than one wave
// (the head) take four row tiles per warp: 140008 rows are 8751 tiles, 4376
// staged blocks, more than the H200's 132 SMs hold at 32 blocks each whatever
// the registers. The last tile is half full and the last unit of four tiles
// has three (its fourth lies past the matrix); K = 1092 ends in a ragged group
// (a chunk of 4 inputs).
TEST(Cuda, W4A16SmallMFourTilesGroupsOf64) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({140008, 576, 64}, cuda::Act::BF16, {2, 5, 8}, true, 29);
  check_w4a16({140008, 1092, 64}, cuda::Act::F16, {3, 8}, false, 30);
}

// Up to 8 tokens, grids that are resident at once (here 257 tiles) stage each
// lane's activations through its weight ring (w4a16_staged_x_kernel): a ragged
// last chunk of 4 inputs (a partial, zero-filled copy) and of 64 (a ragged last
// group of 128), both activation types, with and without the dependent launch.
TEST(Cuda, W4A16SmallMStagedActivations) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({4104, 4100, 128}, cuda::Act::BF16, {3, 8}, false, 21);
  check_w4a16({4104, 4100, 64}, cuda::Act::F16, {2, 7}, true, 22);
  check_w4a16({4104, 4160, 128}, cuda::Act::F16, {6}, false, 23);
}

// 9..16 tokens stage their activations on narrow matrices of at least 64
// groups whose two-tile grid is resident at once (here 257 and 129 tiles): 65
// groups of 128 with a ragged last chunk of 4 inputs, 129 groups of 64. On
// sm_90 these take the four-tile kernel with K halved over clusters of two
// (65 groups: 33 and 32, the ragged chunk in rank 1's; 257 tiles: the last
// block's tiles past the matrix), and with NIBBLE_W4A16_SPLIT=0 the two-tile
// kernel. At 17..24 tokens the same, on three exact token tiles (two-tile
// warps in the split).
TEST(Cuda, W4A16SmallMStagedActivationsSixteenTokens) {
  SKIP_WITHOUT_DEVICE();
  for (const char* split : {"1", "0"}) {
    SCOPED_TRACE(std::string("NIBBLE_W4A16_SPLIT=") + split);
    ASSERT_EQ(setenv("NIBBLE_W4A16_SPLIT", split, 1), 0);
    check_w4a16({4104, 8196, 128}, cuda::Act::BF16, {9, 16, 17, 24}, false, 31);
    check_w4a16({2056, 8256, 64}, cuda::Act::F16, {12, 16, 21}, true, 32);
  }
  ASSERT_EQ(unsetenv("NIBBLE_W4A16_SPLIT"), 0);
}

// 2..24 tokens: each call sums its own Σx per group and token (until session
// 39 a Σx kernel wrote them into the weight's scratch between calls). Calls
// back to back on one weight (no sync between them, programmatic dependent
// launch), each with new activations and its own token count, must each use
// their own sums: a stale Σx from the call before would give the previous
// activations' sums. The shapes take every kernel on the H200: a
// narrow grid of one-tile warps (257 tiles, 33 groups) at 9..16 tokens and the
// staged kernel at 2..8; staged two-tile warps at 9..16, and at 20 on three
// token tiles (65 groups, a ragged last chunk); wide two-tile warps (529
// tiles); 63 tiles of one-tile warps at 2..8 mixed with calls at 12, 16 and
// (three token tiles) 20 and 24; on sm_90, the resident-activation kernel
// (its own Σx; K whole per block and split over clusters of two) at 9..16
// mixed with a call at 4.
TEST(Cuda, W4A16SmallMSumsFollowEachCall) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    GemmCase tc;
    cuda::Act act;
    std::vector<int> ms;
  };
  const Case cases[] = {{{4104, 4160, 128}, cuda::Act::BF16, {16, 9, 16, 4, 12}},
                        {{4104, 8196, 128}, cuda::Act::F16, {16, 10, 20, 16}},
                        {{8456, 4160, 64}, cuda::Act::BF16, {16, 2, 16, 7}},
                        {{1000, 4160, 128}, cuda::Act::F16, {3, 12, 20, 8, 16, 5, 24}},
                        {{int64_t{16} * cuda::device_sm_count() * 32, 1024, 128}, cuda::Act::BF16, {16, 4, 12, 9}},
                        {{int64_t{7} * cuda::device_sm_count() * 32, 1024, 128}, cuda::Act::F16, {9, 16, 2, 16}}};
  uint32_t seed = 40;
  for (const Case& c : cases) {
    const GemmCase& tc = c.tc;
    std::mt19937 rng(seed++);
    const auto parts = random_int4_parts(rng, tc.N, tc.K, tc.g);
    const cuda::LinearKernel* k = cuda::find_linear_kernel("int4_asym", tc.g);
    ASSERT_NE(k, nullptr);
    const cuda::DeviceLinear dw = k->upload(parts, tc.N, tc.K, tc.g);
    const std::vector<float> w = weights_kernel(parts, tc.N, tc.K, tc.g, c.act, true);
    const int64_t ldx = (tc.K + 7) / 8 * 8 + 8;
    std::vector<std::vector<float>> xs;
    std::vector<cuda::DeviceBuffer> dx, dy;
    for (int M : c.ms) {  // every call's activations and output in their own buffers, launched together
      ASSERT_TRUE(cuda::w4a16_exact_weights(dw, M, c.act));
      std::vector<uint16_t> x;
      std::vector<float> xf;
      random_activations(rng, M, tc.K, ldx, c.act, x, xf);
      xs.push_back(std::move(xf));
      dx.emplace_back(x.size() * 2);
      dy.emplace_back(static_cast<size_t>(M * tc.N) * 2);
      ASSERT_EQ(cudaMemcpy(dx.back().get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
    }
    for (size_t i = 0; i < c.ms.size(); ++i)
      k->gemm(dw, dx[i].get(), c.ms[i], ldx, dy[i].get(), tc.N, c.act, false, nullptr, true);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    for (size_t i = 0; i < c.ms.size(); ++i) {
      const int M = c.ms[i];
      std::vector<uint16_t> y(static_cast<size_t>(M * tc.N));
      ASSERT_EQ(cudaMemcpy(y.data(), dy[i].get(), y.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      std::vector<double> ref, mag;
      w4a16_reference(xs[i], w, M, tc.N, tc.K, ref, mag);
      int bad = 0;
      for (int64_t m = 0; m < M && bad < 5; ++m)
        for (int64_t n = 0; n < tc.N && bad < 5; ++n) {
          const double r = ref[m * tc.N + n];
          const double tol = w4a16_tolerance(r, mag[m * tc.N + n], true);
          const double v = from_16bit(y[m * tc.N + n], c.act);
          if (!(std::fabs(v - r) <= tol)) {
            ++bad;
            ADD_FAILURE() << "N=" << tc.N << " K=" << tc.K << " call " << i << " M=" << M << " y[" << m << "," << n
                          << "]=" << v << " ref=" << r << " tol=" << tol;
          }
        }
    }
  }
}

// 17..64 tokens on Hopper take the wgmma kernel (w4a16_wgmma.cu). Its grid
// (on the H200's 132 SMs): a matrix of 529 warpgroup row blocks gets 4
// warpgroups per block and no K split, and 5 groups (a ragged last one of 64)
// are too few to split K; the sweep's narrow matrices split K over clusters
// of 4 and 8 blocks. Up to 24 tokens the image and the wgmma are 24 tokens
// wide for groups of 128 (fp16 here with a ragged last chunk of 4 inputs),
// 32 wide for groups of 64 and at 25..32 tokens.
TEST(Cuda, W4A16WgmmaGrids) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({33800, 576, 128}, cuda::Act::BF16, {17, 24, 25, 64}, false, 24);
  check_w4a16({33800, 1092, 128}, cuda::Act::F16, {20}, true, 33);
  check_w4a16({33800, 1092, 64}, cuda::Act::F16, {20}, false, 34);
  check_w4a16({264, 576, 64}, cuda::Act::F16, {20, 33}, true, 25);
  // Groups of 32 (a lane per group, WeightStream<1, 1, 2>): the tall matrix at 4 warpgroups per block, the narrow one
  // split over clusters (K 1092: a ragged last group and chunk).
  check_w4a16({33800, 576, 32}, cuda::Act::BF16, {17, 33, 64}, false, 35);
  check_w4a16({264, 1092, 32}, cuda::Act::F16, {20, 40}, true, 36);
}

// Grids whose clusters the device cannot hold at once take a smaller K split,
// launched without the dependent launch (launch_wgmma): on the H200 the 8B
// model's o and down at 33..64 tokens (32 clusters of 8 blocks, 30 resident)
// split K 7 ways instead of 8, 5 or 4 groups of o's 32 per block.
TEST(Cuda, W4A16WgmmaClustersThatFit) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({4096, 4096, 128}, cuda::Act::BF16, {40, 64}, true, 31);
  check_w4a16({4096, 14336, 128}, cuda::Act::F16, {48}, false, 32);
}

// Beyond 64 tokens on Hopper: passes of up to 256 tokens (two wgmma of 128
// per k-step), each on the narrowest image that holds it (128, 64, 32), with
// images beyond 64 tokens from the stream-ordered pool. Ragged last groups; on
// the H200's 132 SMs the narrow matrix splits K over clusters of 8 blocks of
// one warpgroup, and the tall one (422 warpgroup row blocks, 2 groups) takes
// 4 warpgroups per block at 128 tokens, 2 at 256, no K split.
TEST(Cuda, W4A16WgmmaBeyond64Tokens) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({264, 4160, 128}, cuda::Act::F16, {65, 128, 129, 256, 300, 545}, false, 28);
  check_w4a16({264, 4160, 64}, cuda::Act::BF16, {100, 256}, true, 29);
  check_w4a16({27008, 192, 128}, cuda::Act::BF16, {200, 97}, false, 30);
}

// Other GPUs run 17..64 tokens on the small-M kernel's rounded path (blocks of
// 32 tokens); NIBBLE_W4A16_WGMMA=0 sends Hopper there too.
TEST(Cuda, W4A16PortablePathBeyond16Tokens) {
  SKIP_WITHOUT_DEVICE();
  ASSERT_EQ(setenv("NIBBLE_W4A16_WGMMA", "0", 1), 0);
  check_w4a16({40, 4100, 128}, cuda::Act::BF16, {17, 32, 33, 64}, false, 26);
  check_w4a16({72, 4160, 64}, cuda::Act::F16, {24, 64, 65}, false, 27);
  check_w4a16({40, 4100, 32}, cuda::Act::BF16, {17, 33, 64}, false, 37);
  ASSERT_EQ(unsetenv("NIBBLE_W4A16_WGMMA"), 0);
}

TEST(Cuda, W4A16WithProgrammaticDependentLaunch) {
  SKIP_WITHOUT_DEVICE();
  check_w4a16({4104, 4096, 128}, cuda::Act::BF16, {1, 16, 20}, true, 13);
}

// Activations that stress x held per group in 24-bit fixed point (the integer
// kernels, w4a16_gemv.cu and w4a16_wgmma.cu), K inputs rounded to `act`:
// group (grp + rot) % 5 == 0 all zeros; 1 one outlier that sets the step for
// values 10^7 smaller; 2 subnormal in the type; 3 huge; 4 normal.
std::vector<float> extreme_activations(std::mt19937& rng, int64_t K, int g, cuda::Act act, int rot) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> xf(K);
  const bool f16 = act == cuda::Act::F16, f32 = act == cuda::Act::F32;
  for (int64_t k = 0; k < K; ++k) {
    const int64_t grp = (k / g + rot) % 5;
    float v = normal(rng);
    if (grp == 0)
      v = 0.0f;
    else if (grp == 1)
      v = (k % g == 5) ? (f16 ? 6e4f : 3e4f) : v * 1e-3f;
    else if (grp == 2)
      v = v * (f16 ? 1e-7f : 1e-39f);  // subnormal in each type
    else if (grp == 3)
      v = v * (f16 ? 1e3f : 1e30f);
    xf[k] = f32 ? v : from_16bit(to_16bit(v, act), act);
  }
  return xf;
}

// Row n of x·Ŵᵀ in float64 and its bound: the sweep's, plus the rounding of x
// to its group's step, 2^-22 of the group's largest |x| per input, times Σ|w|
// over the group.
std::pair<double, double> extreme_reference(const float* xf, const std::vector<float>& w, int64_t n, int64_t K, int g) {
  double r = 0, mag = 0, xerr = 0;
  for (int64_t c0 = 0; c0 < K; c0 += g) {
    double gmax = 0, wsum = 0;
    for (int64_t k = c0; k < std::min(K, c0 + g); ++k) {
      const double p = static_cast<double>(xf[k]) * w[n * K + k];
      r += p;
      mag += std::fabs(p);
      gmax = std::max(gmax, std::fabs(static_cast<double>(xf[k])));
      wsum += std::fabs(static_cast<double>(w[n * K + k]));
    }
    xerr += std::ldexp(gmax, -22) * wsum;
  }
  return {r, 3e-5 * mag + xerr};
}

// The single-token kernel (integer dot products on x held per group in 24-bit
// fixed point, w4a16_gemv.cu) on extreme_activations. A NaN input makes every
// output NaN, as a float dot product would. f32 activations (single-token
// calls only) take the same path without a 16-bit rounding first.
TEST(Cuda, W4A16SingleTokenExtremeActivations) {
  SKIP_WITHOUT_DEVICE();
  for (int g : {32, 64, 128})
    for (auto act : {cuda::Act::BF16, cuda::Act::F16, cuda::Act::F32}) {
      const int64_t N = 40, K = 4160;
      std::mt19937 rng(20 + g);
      const auto parts = random_int4_parts(rng, N, K, g);
      const cuda::DeviceLinear dw = cuda::find_linear_kernel("int4_asym", g)->upload(parts, N, K, g);
      const std::vector<float> w = weights_kernel(parts, N, K, g, act, true);
      const std::vector<float> xf = extreme_activations(rng, K, g, act, 0);
      const bool f32 = act == cuda::Act::F32;
      const size_t esize = f32 ? 4 : 2;
      std::vector<uint8_t> x(K * esize);
      auto set_x = [&](int64_t k, float v) {
        if (f32) {
          std::memcpy(&x[k * 4], &v, 4);
        } else {
          const uint16_t b = to_16bit(v, act);
          std::memcpy(&x[k * 2], &b, 2);
        }
      };
      for (int64_t k = 0; k < K; ++k) set_x(k, xf[k]);
      cuda::DeviceBuffer dx(x.size()), dy(static_cast<size_t>(N) * 4);
      auto run = [&](std::vector<float>& y) {
        ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size(), cudaMemcpyHostToDevice), cudaSuccess);
        dw.kernel->gemm(dw, dx.get(), 1, K, dy.get(), N, act, true, nullptr, false);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        y.resize(N);
        ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), N * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      };
      std::vector<float> y;
      run(y);
      for (int64_t n = 0; n < N; ++n) {
        const auto [r, tol] = extreme_reference(xf.data(), w, n, K, g);
        EXPECT_LE(std::fabs(y[n] - r), tol) << "g=" << g << " row " << n << " y=" << y[n] << " ref=" << r;
      }
      set_x(3 * g + 7, std::nanf(""));
      run(y);
      for (int64_t n = 0; n < N; ++n) EXPECT_TRUE(std::isnan(y[n])) << "g=" << g << " row " << n << " y=" << y[n];
    }
}

// 2..16 tokens (the small-M kernel's exact path: offset codes 128 + c times
// x in bf16/fp16, Σx per token and group) on extreme_activations, each
// token's patterns rotated by its index, held to the same bound. A NaN in one
// token makes that token's outputs NaN and leaves the others' bit for bit.
// The matrices: a narrow one (3 row tiles) and one of 2052 rows.
void check_extreme_few_tokens(int g, cuda::Act act, int64_t N, int64_t K, const std::vector<int>& ms) {
  const int64_t ldx = K + 8;
  std::mt19937 rng(static_cast<uint32_t>(40 + g + N));
  const auto parts = random_int4_parts(rng, N, K, g);
  const cuda::DeviceLinear dw = cuda::find_linear_kernel("int4_asym", g)->upload(parts, N, K, g);
  const std::vector<float> w = weights_kernel(parts, N, K, g, act, true);
  for (int M : ms) {
    ASSERT_TRUE(cuda::w4a16_exact_weights(dw, M, act)) << "M=" << M;
    std::vector<float> xf;
    for (int m = 0; m < M; ++m) {
      const auto t = extreme_activations(rng, K, g, act, m);
      xf.insert(xf.end(), t.begin(), t.end());
    }
    std::vector<uint16_t> x(static_cast<size_t>(M * ldx), to_16bit(std::nanf(""), act));
    for (int m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) x[m * ldx + k] = to_16bit(xf[m * K + k], act);
    cuda::DeviceBuffer dx(x.size() * 2), dy(static_cast<size_t>(M * N) * 4);
    std::vector<float> y(static_cast<size_t>(M * N));
    auto run = [&] {
      ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
      dw.kernel->gemm(dw, dx.get(), M, ldx, dy.get(), N, act, true, nullptr, false);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(y.data(), dy.get(), y.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    };
    run();
    int bad = 0;
    for (int m = 0; m < M && bad < 5; ++m)
      for (int64_t n = 0; n < N && bad < 5; ++n) {
        const auto [r, tol] = extreme_reference(&xf[m * K], w, n, K, g);
        const float v = y[m * N + n];
        if (!(std::fabs(v - r) <= tol)) {
          ++bad;
          ADD_FAILURE() << "g=" << g << " N=" << N << " M=" << M << " y[" << m << "," << n << "]=" << v
                        << " ref=" << r << " tol=" << tol;
        }
      }
    const std::vector<float> clean = y;
    const int m_nan = M / 2;
    x[m_nan * ldx + 3 * g + 7] = to_16bit(std::nanf(""), act);
    run();
    for (int m = 0; m < M && bad < 5; ++m)
      for (int64_t n = 0; n < N && bad < 5; ++n) {
        const float v = y[m * N + n];
        if (m == m_nan ? !std::isnan(v) : std::memcmp(&v, &clean[m * N + n], 4) != 0) {
          ++bad;
          ADD_FAILURE() << "NaN in token " << m_nan << ": g=" << g << " N=" << N << " M=" << M << " y[" << m
                        << "," << n << "]=" << v;
        }
      }
  }
}

TEST(Cuda, W4A16FewTokensExtremeActivations) {
  SKIP_WITHOUT_DEVICE();
  for (int g : {64, 128})
    for (auto act : {cuda::Act::BF16, cuda::Act::F16})
      for (int64_t N : {40, 2052})  // 20 and 24 tokens: three exact token tiles (groups of 128)
        check_extreme_few_tokens(g, act, N, 4160, g == 128 ? std::vector<int>{2, 9, 16, 20, 24} : std::vector<int>{2, 9, 16});
}

// 9..24 tokens on sm_90 with the activations resident in shared memory
// (w4a16_resident_x_kernel): which shapes
// take it, and with K split over how many blocks of a cluster, worked by hand
// for 132 SMs and bf16 (no device needed). Blocks of at most 16 warps with two
// row tiles each and 2 ring stages. KS = 1: at least 16 · 132 = 2112 units of
// two tiles (4223 tiles, 67553 rows); KS = 2 (66 clusters): an even number of
// groups and at least 12 · 66 = 792 units (25313 rows), min(16, ⌈units / 66⌉)
// warps. Shared memory per block, T = 16 token slots up to 16 tokens, 24 from
// 17: 1024 + T padded rows of 2·K/KS + 16 bytes (K/KS = 4096: 8208; 2048: 4112)
// + Σx (groups/KS · 4T) + warps · 2 stages · 2 tiles · (CPG · 512 + 256) + with
// KS = 2 the partial sums (warps · 32 lanes · 2·T/8·4 floats, two unit
// parities at T = 16, one at 24: warps · 4096 both ways), at most 227 KiB =
// 232448.
TEST(Cuda, W4A16ResidentShapeWorkedExamples) {
  auto on_132 = [](int64_t rows, int64_t cols, int g, int64_t M) {
    return cuda::w4a16_resident_x_ks(rows, cols, g, M, 132, 2);
  };
  // The head (128256 rows): 1024 + 131328 + 2048 + 81920 = 216320 bytes.
  EXPECT_EQ(on_132(128256, 4096, 128, 16), 1);
  EXPECT_EQ(on_132(128256, 4096, 128, 9), 1);
  // Groups of 64: Σx 4096 bytes, stages of 768: 1024 + 131328 + 4096 + 49152 = 185600.
  EXPECT_EQ(on_132(128256, 4096, 64, 12), 1);
  // gate|up (896 units, 14 warps): 1024 + 65792 + 1024 + 71680 + 57344 = 196864.
  EXPECT_EQ(on_132(28672, 4096, 128, 16), 2);
  EXPECT_EQ(on_132(28672, 4096, 128, 9), 2);
  // 17..24 tokens. gate|up: 1024 + 24 · 4112 + 16 · 96 + 71680 + 14 · 3072 = 215936 bytes. The head
  // takes KS = 2 (KS = 1: 1024 + 24 · 8208 + 32 · 96 + 81920 = 283008): 1024 + 98688 + 1536 + 81920 +
  // 16 · 3072 = 232320, 128 bytes to spare; with K = 4352 (34 groups) 1024 + 24 · 4368 + 17 · 96 + 81920
  // + 49152 = 238560 does not fit, where 16 tokens fit one block (1024 + 16 · 8720 + 34 · 64 + 81920 =
  // 224640).
  EXPECT_EQ(on_132(28672, 4096, 128, 17), 2);
  EXPECT_EQ(on_132(28672, 4096, 128, 24), 2);
  EXPECT_EQ(on_132(128256, 4096, 128, 24), 2);
  EXPECT_EQ(on_132(128256, 4352, 128, 24), 0);
  EXPECT_EQ(on_132(128256, 4352, 128, 16), 1);
  // Groups of 64 at 24 tokens (Σx 32 · 96 per rank, stages of 768): gate|up 1024 + 98688 + 3072 + 43008 +
  // 43008 = 188800; the head KS = 2 (KS = 1: 1024 + 196992 + 6144 + 49152 = 253312): 1024 + 98688 + 3072
  // + 49152 + 49152 = 201088. Not 9..24 tokens.
  EXPECT_EQ(on_132(28672, 4096, 64, 17), 2);
  EXPECT_EQ(on_132(128256, 4096, 64, 24), 2);
  EXPECT_EQ(on_132(128256, 4096, 128, 8), 0);
  EXPECT_EQ(on_132(28672, 4096, 128, 25), 0);
  // The unit counts at the edges: 67553 rows 2112 units, 67552 rows 2111 (KS = 2), 25344 rows 792, 25312 rows 791.
  EXPECT_EQ(on_132(67553, 4096, 128, 16), 1);
  EXPECT_EQ(on_132(67552, 4096, 128, 16), 2);
  EXPECT_EQ(on_132(25344, 4096, 128, 16), 2);
  EXPECT_EQ(on_132(25312, 4096, 128, 16), 0);
  // Too few units: 14336 rows (448), q|k|v, down.
  EXPECT_EQ(on_132(14336, 4096, 128, 16), 0);
  EXPECT_EQ(on_132(6144, 4096, 128, 16), 0);
  EXPECT_EQ(on_132(4096, 14336, 128, 16), 0);
  // K = 4480 (35 groups) fits one block: 1024 + 16 · 8976 + 2240 + 81920 = 228800. K = 4608 does not
  // (232960) and takes KS = 2: 1024 + 16 · 4624 + 1152 + 81920 + 65536 = 223616. K = 8192 fits neither
  // (KS = 2: 1024 + 131328 + 2048 + 81920 + 65536 = 281856).
  EXPECT_EQ(on_132(128256, 4480, 128, 16), 1);
  EXPECT_EQ(on_132(128256, 4608, 128, 16), 2);
  EXPECT_EQ(on_132(128256, 8192, 128, 16), 0);
  // An odd number of groups cannot split: gate|up with 33 groups.
  EXPECT_EQ(on_132(28672, 4224, 128, 16), 0);
  // K not a whole number of groups, or groups of 32.
  EXPECT_EQ(on_132(128256, 4160, 128, 16), 0);
  EXPECT_EQ(on_132(128256, 4096, 32, 16), 0);
}

// The resident-activation kernel against the float64 reference, with K whole
// per block (the least matrix that takes it plus 8 rows, so the last unit's
// second tile lies past the matrix and its first has 8 rows) and split over
// clusters of two (7 units per SM plus 8 rows): groups of 128 and 64, both
// activation types, with and without the dependent launch, tokens past M,
// three token tiles at 17..24; then extreme activations with a NaN in one
// token (f32 outputs).
TEST(Cuda, W4A16ResidentActivations) {
  SKIP_WITHOUT_DEVICE();
  const int sms = cuda::device_sm_count();
  const int64_t rows1 = int64_t{16} * sms * 32 + 8, rows2 = int64_t{7} * sms * 32 + 8;
  if (cuda::w4a16_wgmma_device()) {
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows1, 2048, 128, 9, sms, 2), 1);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows1, 1024, 64, 11, sms, 2), 1);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows2, 2048, 128, 10, sms, 2), 2);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows2, 1024, 64, 13, sms, 2), 2);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows1, 2048, 128, 24, sms, 2), 1);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows2, 2048, 128, 17, sms, 2), 2);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows1, 1024, 64, 22, sms, 2), 1);
    ASSERT_EQ(cuda::w4a16_resident_x_ks(rows2, 1024, 64, 24, sms, 2), 2);
  }
  check_w4a16({rows1, 2048, 128}, cuda::Act::BF16, {9, 16}, false, 33);
  check_w4a16({rows1, 1024, 64}, cuda::Act::F16, {12, 16}, true, 34);
  check_extreme_few_tokens(128, cuda::Act::BF16, rows1, 1024, {16});
  check_extreme_few_tokens(64, cuda::Act::F16, rows1, 1024, {11});
  check_w4a16({rows2, 2048, 128}, cuda::Act::BF16, {10, 16}, true, 35);
  check_w4a16({rows2, 1024, 64}, cuda::Act::F16, {16}, false, 36);
  check_w4a16({rows1, 2048, 128}, cuda::Act::BF16, {17, 24}, true, 37);
  check_w4a16({rows1, 2048, 128}, cuda::Act::F16, {20}, false, 38);
  check_w4a16({rows2, 2048, 128}, cuda::Act::BF16, {17, 24}, false, 39);
  check_w4a16({rows2, 2048, 128}, cuda::Act::F16, {21}, true, 40);
  check_extreme_few_tokens(128, cuda::Act::BF16, rows2, 1024, {16, 24});
  check_extreme_few_tokens(128, cuda::Act::F16, rows1, 1024, {19});
  check_w4a16({rows1, 1024, 64}, cuda::Act::BF16, {22}, true, 41);
  check_w4a16({rows2, 1024, 64}, cuda::Act::F16, {17, 24}, false, 42);
  check_extreme_few_tokens(64, cuda::Act::BF16, rows2, 1024, {23});
  check_extreme_few_tokens(64, cuda::Act::F16, rows2, 1024, {13});
}

// The reference path (dequantize to bf16 once, cuBLAS) computes the same thing.
TEST(Cuda, CublasReferencePathAgrees) {
  SKIP_WITHOUT_DEVICE();
  std::mt19937 rng(14);
  const int64_t N = 200, K = 4096, M = 16;
  const auto parts = random_int4_parts(rng, N, K, 128);
  const cuda::DeviceBuffer w = cuda::dequantize_to_bf16_device(parts, N, K, 128);
  const cuda::DeviceLinear dw = cuda::find_linear_kernel("int4_asym", 128)->upload(parts, N, K, 128);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<uint16_t> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = f32_to_bf16(normal(rng));
  cuda::DeviceBuffer dx(x.size() * 2), y1(static_cast<size_t>(M * N) * 2), y2(static_cast<size_t>(M * N) * 2);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), x.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  cuda::gemm_bf16_cublas(w.get(), N, K, dx.get(), M, K, y1.get(), N, nullptr);
  dw.kernel->gemm(dw, dx.get(), M, K, y2.get(), N, cuda::Act::BF16, false, nullptr, false);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> a(static_cast<size_t>(M * N)), b(a.size());
  ASSERT_EQ(cudaMemcpy(a.data(), y1.get(), a.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.data(), y2.get(), b.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = bf16_to_f32(a[i]) - bf16_to_f32(b[i]);
    num += d * d;
    den += static_cast<double>(bf16_to_f32(a[i])) * bf16_to_f32(a[i]);
  }
  EXPECT_LT(std::sqrt(num / den), 4e-3);
  // f32 output: the same sums before their rounding to bf16.
  cuda::DeviceBuffer y3(static_cast<size_t>(M * N) * 4);
  dw.kernel->gemm(dw, dx.get(), M, K, y3.get(), N, cuda::Act::BF16, true, nullptr, false);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> c(a.size());
  ASSERT_EQ(cudaMemcpy(c.data(), y3.get(), c.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < c.size(); ++i) EXPECT_EQ(f32_to_bf16(c[i]), b[i]) << i;
}


// Host <-> device copies for the GEMV tests.
std::vector<float> download_f32(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<float> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}
cuda::DeviceBuffer upload_f32(const std::vector<float>& v) {
  cuda::DeviceBuffer b(v.size() * 4);
  EXPECT_EQ(cudaMemcpy(b.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  return b;
}
std::vector<uint8_t> download_bytes(const cuda::DeviceBuffer& b) {
  std::vector<uint8_t> v(b.bytes());
  EXPECT_EQ(cudaMemcpy(v.data(), b.get(), v.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// GemvFusion (GpuModel's decode without norm and SiLU kernels) against the
// same steps done separately: the plain GEMV, then the residual add, the
// norm's z and SiLU(gate)·up on the host, prepared by the prepare kernel.
// Ragged everywhere: K = 4160 (a half group of 128), 200 outputs (a half
// 16-row tile; the second unit of 128 outputs has 5 tiles), F = 208.
TEST(Cuda, GemvFusionMatchesSeparateSteps) {
  SKIP_WITHOUT_DEVICE();
  const auto down = download_f32;
  const auto up = upload_f32;
  const auto bytes_of = download_bytes;
  for (int g : {32, 64, 128}) {
    SCOPED_TRACE("group " + std::to_string(g));
    const int64_t K = 4160, N = 200, F = 208;
    std::mt19937 rng(40 + g);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> pos(0.5f, 2.0f);
    const cuda::LinearKernel* kern = cuda::find_linear_kernel("int4_asym", g);
    ASSERT_NE(kern->prepare, nullptr);
    const cuda::DeviceLinear w = kern->upload(random_int4_parts(rng, N, K, g), N, K, g);
    const auto parts_gu = random_int4_parts(rng, 2 * F, K, g);
    const cuda::DeviceLinear wgu = kern->upload(parts_gu, 2 * F, K, g);
    std::vector<float> x(K);
    for (auto& v : x) v = normal(rng);
    const cuda::DeviceBuffer dx = up(x), px(cuda::w4a16_gemv_scratch_bytes(K));
    kern->prepare(w, dx.get(), cuda::Act::F32, px.get(), px.bytes(), nullptr, false);
    auto plain = [&](const cuda::DeviceLinear& l) {
      cuda::DeviceBuffer y(static_cast<size_t>(l.rows) * 4);
      kern->gemv_prepared(l, px.get(), px.bytes(), y.get(), nullptr, false, false, nullptr);
      return down(y, static_cast<size_t>(l.rows));
    };
    const std::vector<float> y = plain(w), ygu = plain(wgu);
    // The same prepared input a host-computed activation gets.
    auto prepared_of = [&](const std::vector<float>& v, const cuda::DeviceLinear& consumer_shape) {
      const cuda::DeviceBuffer dv = up(v);
      cuda::DeviceBuffer p(cuda::w4a16_gemv_scratch_bytes(static_cast<int64_t>(v.size())));
      EXPECT_EQ(cudaMemset(p.get(), 0xAB, p.bytes()), cudaSuccess);  // bytes no group writes (groups of 128)
      kern->prepare(consumer_shape, dv.get(), cuda::Act::F32, p.get(), p.bytes(), nullptr, false);
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return bytes_of(p);
    };
    const int units = static_cast<int>((std::max(N, F) + 127) / 128);
    cuda::DeviceBuffer stage(static_cast<size_t>(std::max(N, F)) * 4), tickets(static_cast<size_t>(units) * 4);
    ASSERT_EQ(cudaMemset(tickets.get(), 0, tickets.bytes()), cudaSuccess);
    auto tickets_zero = [&] {
      std::vector<unsigned> t(static_cast<size_t>(units));
      EXPECT_EQ(cudaMemcpy(t.data(), tickets.get(), t.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      return std::all_of(t.begin(), t.end(), [](unsigned v) { return v == 0; });
    };
    // GemvFusion::mail: a word per output, zero before and after each call.
    cuda::DeviceBuffer mail(static_cast<size_t>(std::max(N, F)) * 8);
    ASSERT_EQ(cudaMemset(mail.get(), 0, mail.bytes()), cudaSuccess);
    auto mail_zero = [&] {
      const std::vector<uint8_t> m = bytes_of(mail);
      return std::all_of(m.begin(), m.end(), [](uint8_t v) { return v == 0; });
    };

    // Input side: × 1 / sqrt(Σ parts / width + eps) over 300 parts.
    std::vector<float> parts(300);
    for (auto& v : parts) v = pos(rng);
    const cuda::DeviceBuffer dparts = up(parts);
    cuda::GemvFusion in;
    in.in_ss = static_cast<const float*>(dparts.get());
    in.in_parts = static_cast<int>(parts.size());
    in.in_width = 1000;
    in.eps = 1e-6f;
    double sum = 0;
    for (float v : parts) sum += v;
    const double r = 1.0 / std::sqrt(sum / 1000 + 1e-6);
    {
      cuda::DeviceBuffer ys(static_cast<size_t>(N) * 4);
      kern->gemv_prepared(w, px.get(), px.bytes(), ys.get(), nullptr, false, false, &in);
      const std::vector<float> got = down(ys, N);
      for (int64_t i = 0; i < N; ++i) EXPECT_NEAR(got[i], y[i] * r, 1e-6 * std::fabs(y[i] * r)) << i;
    }

    // Residual output: x += y, z = x · w_norm prepared, Σ x² per 16 rows. Run
    // twice with tickets, then twice with the mailbox: tickets and mailbox
    // must be back at zero for the next call.
    std::vector<float> resid0(N), norm_w(N);
    for (auto& v : resid0) v = normal(rng);
    for (auto& v : norm_w) v = pos(rng);
    const cuda::DeviceBuffer dnorm = up(norm_w);
    const int tiles = static_cast<int>((N + 15) / 16);
    cuda::DeviceBuffer ss(static_cast<size_t>(tiles) * 4), pz(cuda::w4a16_gemv_scratch_bytes(N));
    std::vector<float> resid(N), z(N);
    for (int64_t i = 0; i < N; ++i) {
      resid[i] = resid0[i] + y[i];
      z[i] = resid[i] * norm_w[i];
    }
    const cuda::DeviceLinear z_shape = kern->upload(random_int4_parts(rng, 16, N, g), 16, N, g);
    const std::vector<uint8_t> want_pz = prepared_of(z, z_shape);
    for (int call = 0; call < 4; ++call) {
      const bool use_mail = call >= 2;  // calls 2, 3: the mailbox handoff instead of tickets
      SCOPED_TRACE("residual call " + std::to_string(call));
      cuda::DeviceBuffer dres = up(resid0);
      cuda::GemvFusion f;
      f.residual = static_cast<float*>(dres.get());
      f.norm_w = static_cast<const float*>(dnorm.get());
      f.ss_out = static_cast<float*>(ss.get());
      f.prep_out = pz.get();
      f.prep_bytes = pz.bytes();
      f.prep_group = g;
      f.stage = static_cast<float*>(stage.get());
      f.tickets = static_cast<unsigned*>(tickets.get());
      if (use_mail) f.mail = static_cast<unsigned long long*>(mail.get());
      ASSERT_EQ(cudaMemset(pz.get(), 0xAB, pz.bytes()), cudaSuccess);
      kern->gemv_prepared(w, px.get(), px.bytes(), nullptr, nullptr, false, false, &f);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      const std::vector<float> got = down(dres, N), got_ss = down(ss, tiles);
      for (int64_t i = 0; i < N; ++i) EXPECT_EQ(got[i], resid[i]) << i;
      for (int t = 0; t < tiles; ++t) {
        double want = 0;
        for (int64_t i = 16 * t; i < std::min<int64_t>(N, 16 * t + 16); ++i) want += double{resid[i]} * resid[i];
        EXPECT_NEAR(got_ss[t], want, 1e-5 * want) << "tile " << t;
      }
      EXPECT_EQ(bytes_of(pz), want_pz);
      EXPECT_TRUE(tickets_zero());
      EXPECT_TRUE(mail_zero());
    }

    // SwiGLU output: SiLU(gate)·up of F = 208, with and without the input's
    // 1/rms. The fused call splits K over fewer warps per tile (two tiles per
    // block), so gate and up are summed in another order: their error bound is
    // 1e-6 of Σ|w·x| (fp32, a few dozen additions), carried through SiLU·up.
    std::vector<double> mag(static_cast<size_t>(2 * F), 0.0);
    {
      const std::vector<float> wf = weights_kernel(parts_gu, 2 * F, K, g, cuda::Act::F32, true);
      for (int64_t i = 0; i < 2 * F; ++i)
        for (int64_t k = 0; k < K; ++k) mag[i] += std::fabs(double{wf[i * K + k]} * x[k]);
    }
    const cuda::DeviceLinear h_shape = kern->upload(random_int4_parts(rng, 16, F, g), 16, F, g);
    std::vector<uint8_t> ticket_ph[2];  // the tickets' prepared bytes, unscaled and scaled
    for (int run = 0; run < 4; ++run) {
      const bool scaled = run % 2 == 1, use_mail = run >= 2;
      SCOPED_TRACE(std::string(scaled ? "swiglu, scaled input" : "swiglu") + (use_mail ? ", mailbox" : ""));
      cuda::DeviceBuffer ph(cuda::w4a16_gemv_scratch_bytes(F));
      ASSERT_EQ(cudaMemset(ph.get(), 0xAB, ph.bytes()), cudaSuccess);
      cuda::GemvFusion f = scaled ? in : cuda::GemvFusion{};
      f.swiglu = true;
      f.prep_out = ph.get();
      f.prep_bytes = ph.bytes();
      f.prep_group = g;
      f.stage = static_cast<float*>(stage.get());
      f.tickets = static_cast<unsigned*>(tickets.get());
      if (use_mail) f.mail = static_cast<unsigned long long*>(mail.get());
      kern->gemv_prepared(wgu, px.get(), px.bytes(), nullptr, nullptr, false, false, &f);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (use_mail) {  // the same values handed over another way: the same bytes
        EXPECT_EQ(bytes_of(ph), ticket_ph[scaled]);
        EXPECT_TRUE(mail_zero());
        continue;
      }
      const std::vector<float> h = down(stage, F);
      const double s = scaled ? r : 1.0;
      for (int64_t i = 0; i < F; ++i) {
        const double a = ygu[i] * s, b = ygu[F + i] * s, sig = 1 / (1 + std::exp(-a)), want = a * sig * b;
        const double dsilu = sig * (1 + a * (1 - sig));  // d SiLU / da
        const double tol = 1e-6 * s * (std::fabs(dsilu * b) * mag[i] + std::fabs(a * sig) * mag[F + i]);
        EXPECT_NEAR(h[i], want, tol + 2e-6 * std::fabs(want)) << i;
      }
      ticket_ph[scaled] = bytes_of(ph);
      EXPECT_EQ(ticket_ph[scaled], prepared_of(h, h_shape));
      EXPECT_TRUE(tickets_zero());
    }
  }
}

// GemvFusion's argmax (greedy decode in the head GEMV) against a scalar scan
// (std::max_element: the first largest) of the same call's outputs, which
// must be the plain GEMV's to the bit; sampled (HeadDraw::kSample), every
// key a row's score key and the largest the CPU's sample_logits draw over
// those outputs. Shapes: 200 × 4160 (one wave of
// blocks with several warps per tile, a ragged last tile) at groups of 64 and
// 128, and 70008 × 256 (more tiles than fit at once: one-warp blocks, several
// waves). The largest output is copied into two more rows (row 5 and the last
// row, other blocks), so the keys must break a three-way tie; limits below the
// tie, past the rows (clamped) and 0 (no key at all); a matrix whose outputs
// are all negative (scales 0, mins < 0, x > 0), with ties among equal bf16
// mins. Every key left in a slot must be an output's (its row below the
// limit, its high word that output's order bits), and the largest the scan's.
TEST(Cuda, GemvArgmaxMatchesScalarScan) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    int64_t N, K;
    int g;
  };
  constexpr int kSlots = cuda::GemvFusion::kArgmaxKeys;
  // The key's high word: the value's bits in unsigned order, -0 as +0.
  auto order_bits = [](float v) {
    if (v == 0.0f) v = 0.0f;
    uint32_t u;
    std::memcpy(&u, &v, 4);
    return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
  };
  for (const Case tc : {Case{200, 4160, 128}, Case{200, 4160, 64}, Case{70008, 256, 128}}) {
    SCOPED_TRACE("N " + std::to_string(tc.N) + " K " + std::to_string(tc.K) + " g " + std::to_string(tc.g));
    std::mt19937 rng(static_cast<unsigned>(tc.N + tc.g));
    const FormatChoice fmt = find_format("int4_asym", tc.g);
    const cuda::LinearKernel* kern = cuda::find_linear_kernel("int4_asym", tc.g);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> pos(0.5f, 1.5f), neg(-0.2f, -0.01f);
    // x prepared for w, and w's plain GEMV of it.
    auto prepared = [&](const cuda::DeviceLinear& w, const std::vector<float>& x) {
      const cuda::DeviceBuffer dx = upload_f32(x);
      cuda::DeviceBuffer px(cuda::w4a16_gemv_scratch_bytes(tc.K));
      kern->prepare(w, dx.get(), cuda::Act::F32, px.get(), px.bytes(), nullptr, false);
      return px;
    };
    auto plain = [&](const cuda::DeviceLinear& w, const cuda::DeviceBuffer& px) {
      cuda::DeviceBuffer y(static_cast<size_t>(tc.N) * 4);
      kern->gemv_prepared(w, px.get(), px.bytes(), y.get(), nullptr, false, false, nullptr);
      return download_f32(y, static_cast<size_t>(tc.N));
    };
    auto run = [&](const cuda::DeviceLinear& w, const std::vector<float>& x, bool negative) {
      const cuda::DeviceBuffer px = prepared(w, x);
      const std::vector<float> want_y = plain(w, px);
      cuda::DeviceBuffer keys(kSlots * 8), ddraw(sizeof(cuda::HeadDraw)), dpos(4);
      const int32_t position = 7;
      ASSERT_EQ(cudaMemcpy(dpos.get(), &position, 4, cudaMemcpyHostToDevice), cudaSuccess);
      cuda::GemvFusion f;
      f.argmax_keys = static_cast<unsigned long long*>(keys.get());
      f.argmax_draw = static_cast<const cuda::HeadDraw*>(ddraw.get());
      f.argmax_position = static_cast<const int32_t*>(dpos.get());
      // One call with `d`: the outputs must be the plain GEMV's to the bit; its key slots into k.
      auto call = [&](const cuda::HeadDraw& d, std::vector<unsigned long long>& k) {
        ASSERT_EQ(cudaMemcpy(ddraw.get(), &d, sizeof d, cudaMemcpyHostToDevice), cudaSuccess);
        ASSERT_EQ(cudaMemset(keys.get(), 0, keys.bytes()), cudaSuccess);
        cuda::DeviceBuffer y(static_cast<size_t>(tc.N) * 4);
        kern->gemv_prepared(w, px.get(), px.bytes(), y.get(), nullptr, false, false, &f);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        const std::vector<float> got_y = download_f32(y, static_cast<size_t>(tc.N));
        EXPECT_EQ(std::memcmp(got_y.data(), want_y.data(), want_y.size() * 4), 0);
        k.assign(kSlots, 0);
        ASSERT_EQ(cudaMemcpy(k.data(), keys.get(), keys.bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
      };
      std::vector<unsigned long long> k;
      const int64_t top = std::max_element(want_y.begin(), want_y.end()) - want_y.begin();
      std::vector<int64_t> limits = {tc.N, tc.N + 100, 0, 1};
      if (!negative) limits.push_back(5);  // below the tie
      // Sampled: every row's score key (draw number 100 + the position), the
      // largest the CPU's draw over the same outputs.
      const SamplerConfig hot{.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .seed = 9};
      for (const int64_t limit : {tc.N, int64_t{0}, int64_t{5}}) {
        SCOPED_TRACE("sampled, limit " + std::to_string(limit));
        cuda::HeadDraw d;
        d.limit = static_cast<int32_t>(limit);
        d.mode = cuda::HeadDraw::kSample;
        d.temperature = hot.temperature;
        d.seed = hot.seed;
        d.draw_base = 100;
        call(d, k);
        ASSERT_FALSE(::testing::Test::HasFatalFailure());
        int used = 0;
        for (const unsigned long long key : k) {
          if (key == 0) continue;
          ++used;
          const int32_t row = sampling::key_row(key);
          ASSERT_TRUE(row >= 0 && row < limit) << row;
          EXPECT_EQ(key, sampling::key(sampling::score(want_y[row], hot.temperature, hot.seed, 107, row), row)) << row;
        }
        EXPECT_EQ(used, std::min<int64_t>(kSlots, (limit + 15) / 16));
        if (limit > 0) {
          EXPECT_EQ(sampling::key_row(*std::max_element(k.begin(), k.end())),
                    sample_logits(want_y.data(), limit, hot, 107));
        }
      }
      for (const int64_t limit : limits) {
        SCOPED_TRACE("limit " + std::to_string(limit));
        cuda::HeadDraw d;
        d.limit = static_cast<int32_t>(limit);
        call(d, k);
        ASSERT_FALSE(::testing::Test::HasFatalFailure());
        const int64_t n = std::min(limit, tc.N);
        int used = 0;
        for (const unsigned long long key : k) {
          if (key == 0) continue;
          ++used;
          const int32_t row = sampling::key_row(key);
          ASSERT_TRUE(row >= 0 && row < n) << row;
          EXPECT_EQ(static_cast<uint32_t>(key >> 32), order_bits(want_y[row])) << row;
        }
        if (limit == 0) {
          EXPECT_EQ(used, 0);
          continue;
        }
        EXPECT_EQ(used, std::min<int64_t>(kSlots, (n + 15) / 16));  // one key per block below the limit
        const auto want = static_cast<int32_t>(std::max_element(want_y.begin(), want_y.begin() + n) - want_y.begin());
        EXPECT_EQ(sampling::key_row(*std::max_element(k.begin(), k.end())), want);
        if (!negative && limit >= tc.N) {  // the three-way tie, won by its first row
          EXPECT_EQ(want_y[5], want_y[top]);
          EXPECT_EQ(want_y[tc.N - 1], want_y[top]);
          EXPECT_EQ(want, 5);
        }
        if (negative) {
          EXPECT_LT(want_y[want], 0.0f);
        }
      }
      // The argmax takes plain outputs only.
      cuda::GemvFusion bad = f;
      bad.swiglu = true;
      EXPECT_THROW(kern->gemv_prepared(w, px.get(), px.bytes(), nullptr, nullptr, false, false, &bad), Error);
    };
    // Random weights with the largest output copied into rows 5 and N - 1.
    QuantizedMatrix q = random_int4_matrix(rng, tc.N, tc.K, tc.g);
    std::vector<float> x(static_cast<size_t>(tc.K));
    for (auto& v : x) v = normal(rng);
    {
      const cuda::DeviceLinear w0 = kern->upload(fmt.spec->pack(q), tc.N, tc.K, tc.g);
      const std::vector<float> y = plain(w0, prepared(w0, x));
      const int64_t top = std::max_element(y.begin(), y.end()) - y.begin();
      ASSERT_GT(top, 5);
      ASSERT_LT(top, tc.N - 1);
      const int64_t gpr = q.groups_per_row();
      for (int64_t r : {int64_t{5}, tc.N - 1}) {
        std::copy_n(q.codes.begin() + top * tc.K, tc.K, q.codes.begin() + r * tc.K);
        std::copy_n(q.params.begin() + top * gpr, gpr, q.params.begin() + r * gpr);
      }
    }
    run(kern->upload(fmt.spec->pack(q), tc.N, tc.K, tc.g), x, false);
    // All outputs negative: y[r] = m[r] · Σx.
    for (auto& p : q.params) p = {0.0f, 0.0f};
    for (int64_t r = 0; r < tc.N; ++r) {
      const float m = round_to_bf16(neg(rng));
      for (int64_t j = 0; j < q.groups_per_row(); ++j) q.params[static_cast<size_t>(r * q.groups_per_row() + j)].min = m;
    }
    for (auto& v : x) v = pos(rng);
    run(kern->upload(fmt.spec->pack(q), tc.N, tc.K, tc.g), x, true);
  }
}

// LinearKernel::gemv_chain against the same calls launched one by one: a
// decode layer's GEMVs (o with the residual output, gate|up with the input
// norm and SiLU·up, down with the residual output, then q, k, v as three
// plain calls with the input norm), each reading what the one before wrote,
// and a last, wide call (about three items per block) on down's output.
// The shapes keep every lone GEMV but the wide one at 16 warps per tile (8
// for gate|up), as the chain's blocks split K, so those results must be
// bit-identical: residual, sums of squares, outputs. The wide call splits K
// differently alone; it is held to 1e-6 of Σ|w·x|.
// The prepared bytes of the fused outputs must equal the lone calls', as one
// chain and as three (each reading the one before through those bytes).
// Ragged: hidden 1000 (a part group, a 16-row tile of 8 rows), F = 400 (a
// unit of 2 tiles). Each way twice: the tickets and the counters must be back
// at zero.
TEST(Cuda, GemvChainMatchesSingleCalls) {
  SKIP_WITHOUT_DEVICE();
  const auto up = upload_f32;
  const auto bytes_of = download_bytes;
  for (int g : {64, 128}) {
    SCOPED_TRACE("group " + std::to_string(g));
    const int64_t D = 1000, Q = 512, F = 400, NQ = 512, NKV = 128, WIDE = 5000;
    std::mt19937 rng(70 + g);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> pos(0.5f, 2.0f);
    const cuda::LinearKernel* kern = cuda::find_linear_kernel("int4_asym", g);
    ASSERT_NE(kern->gemv_chain, nullptr);
    const cuda::DeviceLinear wo = kern->upload(random_int4_parts(rng, D, Q, g), D, Q, g);
    const cuda::DeviceLinear wgu = kern->upload(random_int4_parts(rng, 2 * F, D, g), 2 * F, D, g);
    const cuda::DeviceLinear wd = kern->upload(random_int4_parts(rng, D, F, g), D, F, g);
    const cuda::DeviceLinear wq = kern->upload(random_int4_parts(rng, NQ, D, g), NQ, D, g);
    const cuda::DeviceLinear wk = kern->upload(random_int4_parts(rng, NKV, D, g), NKV, D, g);
    const cuda::DeviceLinear wv = kern->upload(random_int4_parts(rng, NKV, D, g), NKV, D, g);
    const auto parts_wide = random_int4_parts(rng, WIDE, D, g);
    const cuda::DeviceLinear ww = kern->upload(parts_wide, WIDE, D, g);
    std::vector<float> a(Q), x0(D), n1(D), n2(D);
    for (auto& v : a) v = normal(rng);
    for (auto& v : x0) v = normal(rng);
    for (auto& v : n1) v = pos(rng);
    for (auto& v : n2) v = pos(rng);
    const cuda::DeviceBuffer da = up(a), dn1 = up(n1), dn2 = up(n2);
    cuda::DeviceBuffer oq(cuda::w4a16_gemv_scratch_bytes(Q));
    kern->prepare(wo, da.get(), cuda::Act::F32, oq.get(), oq.bytes(), nullptr, false);

    // The state one run works on.
    struct Run {
      cuda::DeviceBuffer x, xq, hq, ss, stage, tickets, y, wide, sync;
    };
    auto make_run = [&] {
      const size_t wide_bytes = static_cast<size_t>(std::max(D, F)) * 4;
      Run r{up(x0),
            cuda::DeviceBuffer(cuda::w4a16_gemv_scratch_bytes(std::max(D, F))),
            cuda::DeviceBuffer(cuda::w4a16_gemv_scratch_bytes(F)),
            cuda::DeviceBuffer(static_cast<size_t>((D + 15) / 16) * 4),
            cuda::DeviceBuffer(wide_bytes),
            cuda::DeviceBuffer(static_cast<size_t>((std::max(D, F) + 127) / 128) * 4),
            cuda::DeviceBuffer(static_cast<size_t>(NQ + 2 * NKV) * 4),
            cuda::DeviceBuffer(static_cast<size_t>(WIDE) * 4),
            cuda::DeviceBuffer(cuda::kGemvChainSync * 4)};
      for (cuda::DeviceBuffer* b : {&r.xq, &r.hq, &r.ss, &r.stage, &r.y, &r.wide})
        EXPECT_EQ(cudaMemset(b->get(), 0xAB, b->bytes()), cudaSuccess);
      EXPECT_EQ(cudaMemset(r.tickets.get(), 0, r.tickets.bytes()), cudaSuccess);
      EXPECT_EQ(cudaMemset(r.sync.get(), 0, r.sync.bytes()), cudaSuccess);
      return r;
    };
    auto calls_of = [&](Run& r) {
      cuda::GemvFusion in;
      in.in_ss = static_cast<const float*>(r.ss.get());
      in.in_parts = static_cast<int>((D + 15) / 16);
      in.in_width = D;
      in.eps = 1e-5f;
      auto out = [&](cuda::GemvFusion f, const cuda::DeviceBuffer& prep) {
        f.prep_out = prep.get();
        f.prep_bytes = prep.bytes();
        f.prep_group = g;
        f.stage = static_cast<float*>(r.stage.get());
        f.tickets = static_cast<unsigned*>(r.tickets.get());
        return f;
      };
      cuda::GemvFusion res1, res2, swiglu = in;
      res1.residual = res2.residual = static_cast<float*>(r.x.get());
      res1.ss_out = res2.ss_out = static_cast<float*>(r.ss.get());
      res1.norm_w = static_cast<const float*>(dn1.get());
      res2.norm_w = static_cast<const float*>(dn2.get());
      swiglu.swiglu = true;
      auto* y = static_cast<float*>(r.y.get());
      std::vector<cuda::GemvCall> c(7);
      c[0] = {&wo, oq.get(), oq.bytes(), nullptr, out(res1, r.xq)};
      c[1] = {&wgu, r.xq.get(), r.xq.bytes(), nullptr, out(swiglu, r.hq)};
      c[2] = {&wd, r.hq.get(), r.hq.bytes(), nullptr, out(res2, r.xq)};
      c[3] = {&wq, r.xq.get(), r.xq.bytes(), y, in};
      c[4] = {&wk, r.xq.get(), r.xq.bytes(), y + NQ, in};
      c[5] = {&wv, r.xq.get(), r.xq.bytes(), y + NQ + NKV, in};
      c[6] = {&ww, r.xq.get(), r.xq.bytes(), static_cast<float*>(r.wide.get()), in};
      return c;
    };
    // Lone calls; the prepared bytes after o, gate|up and down.
    Run single = make_run();
    std::vector<std::vector<uint8_t>> prepared;
    {
      const auto calls = calls_of(single);
      for (size_t i = 0; i < calls.size(); ++i) {
        const cuda::GemvCall& c = calls[i];
        kern->gemv_prepared(*c.w, c.prepared, c.prepared_bytes, c.y, nullptr, false, false, &c.fuse);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        if (i == 0 || i == 2) prepared.push_back(bytes_of(single.xq));
        if (i == 1) prepared.push_back(bytes_of(single.hq));
      }
    }
    const std::vector<uint8_t> tickets_zero(single.tickets.bytes(), 0), sync_zero(single.sync.bytes(), 0);
    EXPECT_EQ(bytes_of(single.tickets), tickets_zero);
    std::vector<float> wide_single(WIDE);
    ASSERT_EQ(cudaMemcpy(wide_single.data(), single.wide.get(), WIDE * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    // Σ|w·x| of the wide call's rows: x = residual · n2 / rms.
    std::vector<float> xf(D);
    ASSERT_EQ(cudaMemcpy(xf.data(), single.x.get(), D * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    double ssum = 0;
    for (int64_t i = 0; i < D; ++i) ssum += double{xf[i]} * xf[i];
    const double inv_rms = 1 / std::sqrt(ssum / D + 1e-5);
    const std::vector<float> w_wide = weights_kernel(parts_wide, WIDE, D, g, cuda::Act::F32, true);
    for (int pass = 0; pass < 4; ++pass) {
      const bool split = pass >= 2;
      SCOPED_TRACE(std::string(split ? "separate chains" : "one chain") + ", call " + std::to_string(pass % 2));
      Run chained = make_run();
      const auto calls = calls_of(chained);
      auto* sync = static_cast<unsigned*>(chained.sync.get());
      if (!split) {
        kern->gemv_chain(calls.data(), 7, sync, nullptr, pass == 1);
      } else {  // o | gate|up | the rest, each chain's fused output read by the next through its prepared bytes
        kern->gemv_chain(calls.data(), 1, sync, nullptr, pass == 3);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(bytes_of(chained.xq), prepared[0]);
        kern->gemv_chain(calls.data() + 1, 1, sync, nullptr, true);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        EXPECT_EQ(bytes_of(chained.hq), prepared[1]);
        kern->gemv_chain(calls.data() + 2, 5, sync, nullptr, true);
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(bytes_of(chained.x), bytes_of(single.x));
      EXPECT_EQ(bytes_of(chained.ss), bytes_of(single.ss));
      EXPECT_EQ(bytes_of(chained.y), bytes_of(single.y));
      EXPECT_EQ(bytes_of(chained.tickets), tickets_zero);
      EXPECT_EQ(bytes_of(chained.sync), sync_zero);
      EXPECT_EQ(bytes_of(chained.hq), prepared[1]);
      EXPECT_EQ(bytes_of(chained.xq), prepared[2]);
      std::vector<float> wide(WIDE);
      ASSERT_EQ(cudaMemcpy(wide.data(), chained.wide.get(), WIDE * 4, cudaMemcpyDeviceToHost), cudaSuccess);
      for (int64_t r = 0; r < WIDE; ++r) {
        double mag = 0;
        for (int64_t k = 0; k < D; ++k) mag += std::fabs(double{w_wide[r * D + k]} * xf[k] * n2[k]) * inv_rms;
        EXPECT_NEAR(wide[r], wide_single[r], 1e-6 * mag) << r;
      }
    }
  }
}

// The GPU forward against the CPU forward on a real checkpoint: every
// position's logits of a prompt (prefill), then token-by-token decode through
// the KV cache. The GPU rounds the linears' inputs and outputs to bf16, so
// logits agree to bf16 tolerance, not bit for bit: per row, max |Δ| within 3 %
// of the row's largest |logit|; the argmax agrees at >= 97 % of positions.
// cache_positions > 0: the GPU's KV cache holds that many positions (more than
// the row-wise attention kernel can: decode then splits attention over the keys).
// Greedy picks must be identical, except with `near_ties` (int4_sym, whose f16
// scales the GPU rounds to bf16: a model whose weights differ by up to 2^-8 of
// themselves), where a pick may differ at a near tie: the CPU's own margin
// between the two candidates under 1 % of the row's largest |logit|.
void check_gpu_forward(const std::filesystem::path& dir, const std::vector<int32_t>& prompt, int decode_steps,
                       int64_t cache_positions = 0, bool near_ties = false) {
  auto src = open_model_source(dir.string());
  auto cpu = Model::load(*src);
  const ModelConfig& c = cpu->config();
  const int64_t total = static_cast<int64_t>(prompt.size()) + decode_steps;
  KVCache cache(c, total);
  auto gpu = cuda::GpuModel::load(*src, std::max(total, cache_positions));
  int agree = 0, rows = 0;
  double worst = 0;
  auto compare = [&](const Tensor& a, const Tensor& b, const std::string& what) {
    ASSERT_EQ(a.shape(), b.shape()) << what;
    const int64_t V = c.vocab_size;
    for (int64_t r = 0; r < a.shape()[0]; ++r) {
      const float* x = a.data<float>() + r * V;
      const float* y = b.data<float>() + r * V;
      double scale = 0, diff = 0;
      for (int64_t j = 0; j < V; ++j) {
        ASSERT_TRUE(std::isfinite(y[j])) << what << " row " << r;
        scale = std::max(scale, std::fabs(static_cast<double>(x[j])));
        diff = std::max(diff, std::fabs(static_cast<double>(x[j]) - y[j]));
      }
      worst = std::max(worst, diff / scale);
      EXPECT_LE(diff, 0.03 * scale) << what << " row " << r;
      agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
      ++rows;
    }
  };
  compare(cpu->forward(prompt, cache, true), gpu->forward(prompt, true), "prefill");
  // Decode: a fresh prefill (last row only), then both sides are fed the CPU's
  // greedy tokens, so their caches hold the same positions.
  std::vector<int32_t> greedy_cpu, greedy_gpu;
  cache = KVCache(c, total);
  gpu->reset();
  Tensor lc = cpu->forward(prompt, cache, false);
  Tensor lg = gpu->forward(prompt, false);
  for (int step = 0; step < decode_steps; ++step) {
    compare(lc, lg, "decode step " + std::to_string(step));
    const int64_t V = c.vocab_size;
    const auto next_c =
        static_cast<int32_t>(std::max_element(lc.data<float>(), lc.data<float>() + V) - lc.data<float>());
    const auto next_g =
        static_cast<int32_t>(std::max_element(lg.data<float>(), lg.data<float>() + V) - lg.data<float>());
    greedy_cpu.push_back(next_c);
    greedy_gpu.push_back(next_g);
    if (next_c != next_g && near_ties) {
      double row_max = 0;
      for (int64_t j = 0; j < V; ++j) row_max = std::max(row_max, std::fabs(static_cast<double>(lc.data<float>()[j])));
      EXPECT_LE(lc.data<float>()[next_c] - lc.data<float>()[next_g], 0.01 * row_max)
          << dir << ": decode step " << step << " picks differ at more than a near tie";
      greedy_gpu.back() = next_c;  // counted as agreeing; the margins are printed below
    }
    if (next_c != next_g)  // how close a call it was on each side
      std::printf(
          "[gpu forward] step %d: cpu picks %d (gpu's pick %d is %.5f below), gpu picks %d (cpu's pick %.5f below)\n",
          step, next_c, next_g, lc.data<float>()[next_c] - lc.data<float>()[next_g], next_g,
          lg.data<float>()[next_g] - lg.data<float>()[next_c]);
    if (step + 1 < decode_steps) {
      lc = cpu->forward({next_c}, cache, false);
      lg = gpu->forward({next_c}, false);
    }
  }
  EXPECT_GE(agree, rows * 97 / 100) << dir << ": top-1 agreed at " << agree << " of " << rows;
  EXPECT_EQ(greedy_cpu, greedy_gpu) << dir << ": greedy continuations differ";
  std::printf("[gpu forward] %s: worst row max|dlogit|/max|logit| %.4f, top-1 %d/%d\n", dir.filename().c_str(), worst,
              agree, rows);
}

std::vector<int32_t> prompt_ids(int n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> d(3, vocab - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = d(rng);
  ids[0] = 1;
  return ids;
}

TEST(Cuda, GpuForwardMatchesCpuOnStories) {
  SKIP_WITHOUT_DEVICE();
  const auto dir = test::model_dir("stories260K");
  check_gpu_forward(dir, prompt_ids(40, 512, 1), 24);
  check_gpu_forward(dir, {1, 403, 407, 261, 378}, 100);  // BOS "Once upon a time": nibble run's story
  // The same model packed (int4 g64: the W4A16 kernel, ragged 172-wide down_proj).
  test::TempDir tmp("nibble-gpu-fwd");
  QuantizeOptions q;
  q.group_size = 64;
  quantize_model(dir, tmp.path() / "rtn", q);
  check_gpu_forward(tmp.path() / "rtn", prompt_ids(40, 512, 2), 24);
  check_gpu_forward(tmp.path() / "rtn", {1, 403, 407, 261, 378}, 100);
  // int4_sym: the same kernels, on its scales rounded to bf16 at load (int4_sym_as_asym).
  q.format = "int4_sym";
  quantize_model(dir, tmp.path() / "sym", q);
  check_gpu_forward(tmp.path() / "sym", prompt_ids(40, 512, 6), 24, 0, true);
  check_gpu_forward(tmp.path() / "sym", {1, 403, 407, 261, 378}, 100, 0, true);
}

// Which quantized matrices the GPU forward holds dense: decided from the
// checkpoint's metadata and the kernel registry alone (no device needed), as
// `nibble run --device cuda`'s note says. mxfp4 has no W4A16 kernel; int4_asym and int4_sym g64 have.
TEST(Cuda, DenseFallbacksNameTheFormatsWithoutAKernel) {
  const auto dir = test::model_dir("stories260K");
  test::TempDir tmp("nibble-fallbacks");
  QuantizeOptions q;
  q.group_size = 64;
  q.progress = false;
  quantize_model(dir, tmp.path() / "asym", q);
  q.format = "int4_sym";
  quantize_model(dir, tmp.path() / "sym", q);
  q.format = "mxfp4";
  q.group_size = 32;
  const QuantizeResult mx = quantize_model(dir, tmp.path() / "mxfp4", q);
  EXPECT_TRUE(cuda::dense_fallbacks(*open_model_source((tmp.path() / "asym").string())).empty());
  EXPECT_TRUE(cuda::dense_fallbacks(*open_model_source((tmp.path() / "sym").string())).empty());
  const std::vector<DenseFallback> f =
      cuda::dense_fallbacks(*open_model_source((tmp.path() / "mxfp4").string()));
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].format, "mxfp4");
  int64_t matrices = 0;
  for (const TensorResult& t : mx.tensors) matrices += t.quantized;
  EXPECT_EQ(f[0].matrices, matrices);
  EXPECT_EQ(static_cast<uint64_t>(f[0].params), mx.quantized_params);
  EXPECT_TRUE(cuda::dense_fallbacks(*open_model_source(dir.string())).empty());  // plain weights: no format
  // Layouts load() dequantizes are named as their source names them: a GGUF's
  // ggml block types (llama.cpp's Q4_K_M of this model, as `nibble inspect`
  // lists it: 28 linears in Q5_0, the head and 2 v_proj in Q8_0; down_proj, 172
  // inputs, F16; the embedding is not a linear). GPTQ checkpoints have none:
  // the symmetric one is int4_sym exactly, the asymmetric one int4_asym_f32
  // (ModelSource::exact_format).
  const auto km = cuda::dense_fallbacks(*open_model_source((dir / "gguf" / "stories260K-Q4_K_M.gguf").string()));
  ASSERT_EQ(km.size(), 2u);
  EXPECT_EQ(km[0].format, "Q5_0");
  EXPECT_EQ(km[0].matrices, 28);
  EXPECT_EQ(km[1].format, "Q8_0");
  EXPECT_EQ(km[1].matrices, 3);
  // llama.cpp's Q4_0 file: its Q4_0 linears are int4_g32_sym exactly (GgufSource::exact_format); down_proj (F16) and
  // the head (Q8_0) stay dense.
  // So are its Q4_1 linears (int4_g32_asym_f32 exactly).
  for (const char* type : {"Q4_0", "Q4_1"}) {
    const auto q4 = cuda::dense_fallbacks(
        *open_model_source((dir / "gguf" / fmt::format("stories260K-{}.gguf", type)).string()));
    ASSERT_EQ(q4.size(), 1u) << type;
    EXPECT_EQ(q4[0].format, "Q8_0");
    EXPECT_EQ(q4[0].matrices, 1);
  }
  for (bool sym : {false, true}) {
    const auto out = tmp.path() / (sym ? "gptq-sym" : "gptq-asym");
    test::write_gptq_qwen3(out, /*zero_bias=*/false, sym);
    EXPECT_TRUE(cuda::dense_fallbacks(*open_model_source((out / "gptq").string())).empty()) << sym;
  }
}

TEST(Cuda, GpuForwardMatchesCpuOnQwen3) {
  SKIP_WITHOUT_DEVICE();
  const auto dir = test::model_dir("qwen3-26M-linux");
  check_gpu_forward(dir, prompt_ids(48, 2000, 3), 16);
  test::TempDir tmp("nibble-gpu-fwd");
  QuantizeOptions q;
  quantize_model(dir, tmp.path() / "rtn", q);
  check_gpu_forward(tmp.path() / "rtn", prompt_ids(48, 2000, 4), 16);
  // A KV cache of 70000 positions, beyond the row-wise decode kernel's shared
  // memory: decode runs the split-over-keys attention (and its prepared output).
  check_gpu_forward(tmp.path() / "rtn", prompt_ids(48, 2000, 5), 16, 70000);
  q.format = "int4_sym";  // its scales rounded to bf16 at load (int4_sym_as_asym)
  quantize_model(dir, tmp.path() / "sym", q);
  check_gpu_forward(tmp.path() / "sym", prompt_ids(48, 2000, 7), 16, 0, true);
}

// GPTQ checkpoints (f16 scales, no act-order) run on the W4A16 kernels:
// RivalSource re-encodes a symmetric one's linears (zeros of 8) as int4_sym and
// an asymmetric one's as int4_asym_f32, exactly (ModelSource::exact_format), so
// nothing is held dense and a decode step reads the packed bytes, not bf16's;
// the logits agree with the CPU forward's.
TEST(Cuda, GpuForwardRunsGptqOnTheW4A16Kernels) {
  SKIP_WITHOUT_DEVICE();
  for (bool sym : {true, false}) {
    SCOPED_TRACE(sym ? "sym" : "asym");
    test::TempDir tmp("nibble-gpu-gptq");
    test::write_gptq_qwen3(tmp.path(), /*zero_bias=*/false, sym);
    const auto rival = open_model_source((tmp.path() / "gptq").string());
    EXPECT_TRUE(cuda::dense_fallbacks(*rival).empty());
    const auto plain = CheckpointDir::open(tmp.path() / "plain");
    const size_t packed = cuda::GpuModel::load(*rival, 64)->decode_weight_bytes();
    const size_t dense = cuda::GpuModel::load(*plain, 64)->decode_weight_bytes();
    std::printf("[gptq %s on the gpu] decode weight bytes: %zu packed, %zu as bf16\n", sym ? "sym" : "asym", packed,
                dense);
    EXPECT_LT(packed, dense * 6 / 10);  // the linears at 4.25 bits instead of 16; the embedding, norms alike
    // f16 scales (and mins) rounded to bf16 at load
    check_gpu_forward(tmp.path() / "gptq", prompt_ids(48, 2000, sym ? 8 : 10), 16, 0, true);
  }
}

// llama.cpp's Q4_0 and Q4_1 GGUFs of stories260K run their 4-bit linears on the
// W4A16 kernels (int4_g32_sym and int4_g32_asym_f32 exactly, then their bf16
// parameters at load): a decode step reads fewer bytes than with them
// dequantized, and the logits and greedy tokens agree with the CPU forward's
// on ggml's exact values.
TEST(Cuda, GpuForwardRunsQ4GgufOnTheW4A16Kernels) {
  SKIP_WITHOUT_DEVICE();
  const auto gguf = test::model_dir("stories260K") / "gguf";
  const auto f32 = open_model_source((gguf / "stories260K-F32.gguf").string());
  const size_t dense = cuda::GpuModel::load(*f32, 64)->decode_weight_bytes();
  int seed = 9;
  for (const char* type : {"Q4_0", "Q4_1"}) {
    SCOPED_TRACE(type);
    const auto file = gguf / fmt::format("stories260K-{}.gguf", type);
    const auto src = open_model_source(file.string());
    const size_t packed = cuda::GpuModel::load(*src, 64)->decode_weight_bytes();
    std::printf("[%s on the gpu] decode weight bytes: %zu packed, %zu as bf16\n", type, packed, dense);
    EXPECT_LT(packed, dense);
    check_gpu_forward(file, prompt_ids(40, 512, seed++), 24, 0, true);
    check_gpu_forward(file, {1, 403, 407, 261, 378}, 100, 0, true);
  }
}

}  // namespace
}  // namespace nibble
#endif
