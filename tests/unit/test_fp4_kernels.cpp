// The FP4 GEMM (src/backend/cpu/fp4_gemm.cpp: fp4_e2m1_g{G}, mxfp4 and nvfp4 on
// fp32 group scales) against the formats' own decode and a float64 sum of the
// decoded weights: FORMAT.md's worked examples through each format's kernel row
// (its prepare included), every code decoded exactly, integer-valued data where
// every path must be bit exact, a sweep over M (one token, tiles of 4 and their
// remainders), ragged K and last groups, odd N, groups of 16..128, and from 64
// rows on the bits of gemm_f32 on the decoded matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/fp4_rows.h"
#include "backend/cpu/kernels.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/tensor.h"
#include "unit/cpu_isas.h"

namespace nibble {
namespace {

using cpu::Isa;
using test::isas_to_test;

// Scales either fp32 per group (s) or a byte per group (sb) into a table of 256 (the mxfp4 / nvfp4 form).
struct Matrix {
  int64_t N, K;
  int G;
  std::vector<uint8_t> q;  // [N, ceil(K/2)]
  std::vector<float> s;    // [N, ceil(K/G)], or empty
  std::vector<uint8_t> sb;
  std::vector<float> table;
  int64_t groups() const { return (K + G - 1) / G; }
  cpu::Fp4Scales scales() const {
    cpu::Fp4Scales r;
    if (s.empty()) {
      r.codes = sb.data();
      r.table = table.data();
    } else {
      r.f32 = s.data();
    }
    return r;
  }
  float v(int64_t n, int64_t k) const {  // the code's E2M1 value
    const uint8_t b = q[static_cast<size_t>(n * ((K + 1) / 2) + k / 2)];
    return e2m1_to_f32(static_cast<uint8_t>(k % 2 ? b >> 4 : b & 0xF));
  }
  float w(int64_t n, int64_t k) const { return v(n, k) * cpu::fp4k::scale_at(scales(), n * groups() + k / G); }
};

Matrix random_matrix(int64_t N, int64_t K, int G, bool table, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.02f, 0.4f);
  Matrix m{N, K, G, std::vector<uint8_t>(static_cast<size_t>(N * ((K + 1) / 2))), {}, {}, {}};
  for (uint8_t& c : m.q) c = static_cast<uint8_t>(byte(rng));
  const size_t n = static_cast<size_t>(N * m.groups());
  if (table) {
    m.sb.resize(n);
    m.table.resize(256);
    for (uint8_t& c : m.sb) c = static_cast<uint8_t>(byte(rng));
    for (float& v : m.table) v = scale(rng);
  } else {
    m.s.resize(n);
    for (float& v : m.s) v = scale(rng);
  }
  return m;
}

std::vector<float> random_x(int64_t M, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (float& v : x) v = nd(rng);
  return x;
}

// Each output against Σ_k fl(e2m1·s)·x_k in float64: fp32 sums of K terms in any order are within
// K·2^-24·Σ|terms| of it (the decode is the format's, so it adds nothing).
// The integer GEMV (one token on an AVX2 CPU; fp4_rows.h) sums other terms: per group
// s/2·Σ c_i·x_i − 6·s·Σ x_i with c_i = 2·e2m1(code_i) + 12, whose magnitudes add up to
//   T = Σ_i |x_i|·(|c_i·s/2| + 6·|s|) ≥ Σ_i |w_i·x_i|,
// along a chain of at most n = K + NG + ceil(K/1024) + 16 additions (test_int4_kernels.cpp derives the same), so
// within γ_n·T; and with x rounded to 24-bit fixed point per group, |Δx_i| ≤ max|x over i's group|·2^-23, the c
// term moves by at most A = Σ_g max|x over g's activation group|·2^-23·Σ_{i in g}|c_i·s/2| (plus γ·A for its own
// rounding; the activation group is g, or for groups of 16 the 32 inputs around g).
void expect_close(const Matrix& w, int64_t M, const std::vector<float>& x, const std::vector<float>& y,
                  bool integer = false) {
  const double nu = static_cast<double>(w.K + w.groups() + (w.K + 1023) / 1024 + 16) * 0x1p-24;
  const double gamma = nu / (1.0 - nu);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.N; ++n) {
      double want = 0, mag = 0, t = 0, act = 0;
      for (int64_t g = 0; g < w.groups(); ++g) {
        const double s = cpu::fp4k::scale_at(w.scales(), n * w.groups() + g);
        double cs = 0;
        for (int64_t k = g * w.G; k < std::min<int64_t>(w.K, (g + 1) * w.G); ++k) {
          const double xk = x[static_cast<size_t>(m * w.K + k)], term = static_cast<double>(w.w(n, k)) * xk;
          want += term;
          mag += std::abs(term);
          const double c = std::abs((2.0 * w.v(n, k) + 12.0) * s / 2.0);  // |c·s/2|
          t += std::abs(xk) * (c + 6.0 * std::abs(s));
          cs += c;
        }
        // x's fixed point is per 32 inputs for groups of 16 (nvfp4), per group otherwise.
        const int64_t ag = std::max(w.G, 32), a0 = g * w.G / ag * ag;
        double amax = 0;
        for (int64_t k = a0; k < std::min<int64_t>(w.K, a0 + ag); ++k)
          amax = std::max(amax, std::abs(static_cast<double>(x[static_cast<size_t>(m * w.K + k)])));
        act += cs * amax * 0x1p-23;
      }
      const double tol = integer ? gamma * t + (1.0 + gamma) * act : static_cast<double>(w.K) * 0x1p-24 * mag;
      const float got = y[static_cast<size_t>(m * w.N + n)];
      ASSERT_LE(std::abs(got - want), tol + 1e-30) << "m=" << m << " n=" << n << " got " << got << " want " << want;
    }
}

// Whether gemm_fp4_isa takes the integer GEMV for this problem.
bool integer_gemv(Isa isa, int64_t M) { return isa != Isa::Scalar && M == 1; }

Tensor bytes_tensor(DType dt, std::vector<int64_t> shape, const std::vector<uint8_t>& b) {
  Tensor t = Tensor::zeros(dt, shape);
  std::memcpy(t.raw_mut(), b.data(), b.size());
  return t;
}

// FORMAT.md's worked examples (§7.5-7.7), their packed bytes written by hand, through each format's CPU kernel row
// (prepare, then gemm) and dotted with x:
// - fp4_e2m1_g32: codes 0x7 0xC 0x0 0x6 (bytes C7 60), scale 0.5: w' = (3, −1, 0, 2); x = (1, 2, 4, 0.5): 2;
// - mxfp4: block 0 bytes 67 24 D0 08 at X = 0 (byte 127): (6, 4, 2, 1, 0, −3, −0, 0); block 1 codes 0x6 0xA 0x3 at
//   X = −4 (byte 123): (0.25, −0.0625, 0.09375); block 2 all zero (byte 0); x all ones: 10.28125;
// - nvfp4: global 2^-8; block 0 codes 0x7 0x1 0xC at s = 448 (0x7E): (10.5, 0.875, −3.5); block 1 codes 0x7 0x4
//   0xA at s = 13 (0x55): (0.3046875, 0.1015625, −0.05078125); x all ones: 8.23046875.
TEST(Fp4Kernel, FormatWorkedExamplesThroughTheKernelRows) {
  struct Case {
    const char* format;
    int64_t K;
    std::vector<Tensor> parts;
    std::vector<float> x;
    float want;
  };
  std::vector<uint8_t> mx(48, 0);
  mx[0] = 0x67, mx[1] = 0x24, mx[2] = 0xD0, mx[3] = 0x08, mx[16] = 0xA6, mx[17] = 0x03;
  std::vector<uint8_t> nv(16, 0);
  nv[0] = 0x17, nv[1] = 0x0C, nv[8] = 0x47, nv[9] = 0x0A;
  Tensor global = Tensor::zeros(DType::F32, {1});
  global.data_mut<float>()[0] = 0x1p-8f;
  const std::vector<Case> cases{
      {"fp4_e2m1_g32",
       4,
       {bytes_tensor(DType::U8, {1, 2}, {0xC7, 0x60}), bytes_tensor(DType::BF16, {1, 1}, {0x00, 0x3F})},
       {1, 2, 4, 0.5f}, 2.0f},
      {"mxfp4", 96, {bytes_tensor(DType::U8, {1, 48}, mx), bytes_tensor(DType::U8, {1, 3}, {127, 123, 0})},
       std::vector<float>(96, 1.0f), 10.28125f},
      {"nvfp4", 32, {bytes_tensor(DType::U8, {1, 16}, nv), bytes_tensor(DType::F8_E4M3, {1, 2}, {0x7E, 0x55}), global},
       std::vector<float>(32, 1.0f), 8.23046875f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.format);
    const FormatChoice f = find_format(c.format);
    const cpu::PackedKernel* k = cpu::find_packed_kernel(*f.spec);
    ASSERT_NE(k, nullptr);
    const std::vector<Tensor> parts = k->prepare ? k->prepare(c.parts, 1, c.K, f.group_size) : c.parts;
    float y = std::nanf("");
    k->gemm(c.x.data(), 1, parts, 1, c.K, f.group_size, &y);
    EXPECT_EQ(y, c.want);
    // The same product through the format's own unpack and decode.
    const QuantizedMatrix qm = f.spec->unpack(c.parts, 1, c.K, f.group_size);
    double ref = 0;
    for (int64_t i = 0; i < c.K; ++i) ref += f.spec->decode(qm.codes[i], qm.params[i / f.group_size]) * c.x[i];
    EXPECT_EQ(ref, c.want);
  }
}

// Every one of the 16 codes through every path: row r holds codes 0..15 (bytes 10 32 54 76 98 BA DC FE) with
// scale s_r, and x is the identity, so each output is one decoded weight, which must be fp4_e2m1's registry decode.
TEST(Fp4Kernel, EveryCodeDecodesAsTheFormatSays) {
  const FormatChoice f = find_format("fp4_e2m1_g32");
  const int64_t N = 6, K = 16;
  std::vector<uint8_t> q(static_cast<size_t>(N * 8));
  for (int64_t r = 0; r < N; ++r)
    for (int j = 0; j < 8; ++j) q[static_cast<size_t>(r * 8 + j)] = static_cast<uint8_t>(2 * j | (2 * j + 1) << 4);
  const std::vector<float> sv{1.0f, 0.375f, 0x1p-130f, 3e38f / 6, 0.0f, 1.7e-5f};  // a subnormal, near overflow, zero
  cpu::Fp4Scales s;
  s.f32 = sv.data();
  std::vector<float> row(K), eye(static_cast<size_t>(K * K), 0.0f);
  for (int64_t j = 0; j < K; ++j) eye[static_cast<size_t>(j * K + j)] = 1.0f;
  for (int64_t r = 0; r < N; ++r) {
    cpu::decode_fp4_row(q.data(), s, r, K, 16, row.data());
    for (int c = 0; c < 16; ++c) {
      GroupParams p;
      p.scale = sv[static_cast<size_t>(r)];
      const float want = f.spec->decode(static_cast<uint8_t>(c), p);
      ASSERT_EQ(std::memcmp(&row[static_cast<size_t>(c)], &want, 4), 0) << "row " << r << " code " << c;
    }
  }
  for (Isa isa : isas_to_test()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    for (int64_t M : {int64_t{1}, K}) {  // one token at a time (x = e_j), and the tiles (x = I)
      std::vector<float> y(static_cast<size_t>(K * N), std::nanf(""));
      if (M == K)
        cpu::gemm_fp4_isa(isa, eye.data(), K, q.data(), s, N, K, 16, y.data());
      else
        for (int64_t j = 0; j < K; ++j)
          cpu::gemm_fp4_isa(isa, eye.data() + j * K, 1, q.data(), s, N, K, 16, y.data() + j * N);
      for (int64_t r = 0; r < N; ++r) {
        cpu::decode_fp4_row(q.data(), s, r, K, 16, row.data());
        const float sr = sv[static_cast<size_t>(r)];
        for (int64_t j = 0; j < K; ++j) {
          const float got = y[static_cast<size_t>(j * N + r)], want = row[static_cast<size_t>(j)];
          if (!integer_gemv(isa, M)) {
            ASSERT_EQ(got, want) << "M=" << M << " row " << r << " code " << j;
          } else if (sr == 0.0f || (std::isnormal(sr) && sr <= 0x1p123f)) {
            // The integer GEMV: s/2·c − 6·s with c ≤ 24, x = e_j exact in its fixed point, so within γ_34·18·|s|
            // (expect_close); exact for s = 0. It needs s/2 exact and 12·s finite: normal scales up to 2^123.
            ASSERT_LE(std::abs(static_cast<double>(got) - want), 34 * 0x1p-24 * 18 * sr)
                << "row " << r << " code " << j;
          }
        }
      }
    }
  }
}

// Power-of-two scales and small integer x: every product and partial sum is a multiple of 2^-4 below 2^20, exact in
// fp32, so every path, in any order, gives the reference's bits.
TEST(Fp4Kernel, BitExactOnIntegerValuedData) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> xi(-8, 8), si(-3, 2);
  for (int G : {16, 32, 128})
    for (int64_t K : {1, 7, 8, 15, 31, 33, 300})
      for (int64_t M : {1, 2, 3, 4, 5, 9, 64, 70}) {
        SCOPED_TRACE("G=" + std::to_string(G) + " K=" + std::to_string(K) + " M=" + std::to_string(M));
        Matrix w = random_matrix(37, K, G, M % 2 == 0, rng);
        for (float& v : w.s) v = std::ldexp(1.0f, si(rng));
        for (float& v : w.table) v = std::ldexp(1.0f, si(rng));
        std::vector<float> x(static_cast<size_t>(M * K));
        for (float& v : x) v = static_cast<float>(xi(rng));
        std::vector<float> want(static_cast<size_t>(M * w.N)), got(want.size(), std::nanf(""));
        cpu::gemm_fp4_ref(x.data(), M, w.q.data(), w.scales(), w.N, K, G, want.data());
        for (Isa isa : isas_to_test()) {
          std::fill(got.begin(), got.end(), std::nanf(""));
          cpu::gemm_fp4_isa(isa, x.data(), M, w.q.data(), w.scales(), w.N, K, G, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << cpu::isa_name(isa);
        }
        std::fill(got.begin(), got.end(), std::nanf(""));
        cpu::gemm_fp4(x.data(), M, w.q.data(), w.scales(), w.N, K, G, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "dispatch";
      }
}

// Every other matrix with a table of scales (nvfp4's form), the others fp32.
TEST(Fp4Kernel, MatchesTheDecodedWeightsSweep) {
  std::mt19937 rng(5);
  bool table = false;
  for (int G : {16, 32, 128})
    for (int64_t K : {5, 8, 40, 129, 1000})
      for (int64_t N : {1, 9, 33, 67}) {
        table = !table;
        const Matrix w = random_matrix(N, K, G, table, rng);
        for (int64_t M : {1, 2, 3, 4, 6, 13, 63}) {
          SCOPED_TRACE("G=" + std::to_string(G) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                       " M=" + std::to_string(M));
          const std::vector<float> x = random_x(M, K, rng);
          std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
          cpu::gemm_fp4_ref(x.data(), M, w.q.data(), w.scales(), N, K, G, y.data());
          expect_close(w, M, x, y);
          for (Isa isa : isas_to_test()) {
            std::fill(y.begin(), y.end(), std::nanf(""));
            cpu::gemm_fp4_isa(isa, x.data(), M, w.q.data(), w.scales(), N, K, G, y.data());
            expect_close(w, M, x, y, integer_gemv(isa, M));
          }
        }
      }
}

// From 64 rows on, gemm_fp4 decodes W (the AVX2 decode where the CPU has it) and runs the dense GEMM: the bits of
// gemm_f32 on the matrix decode_fp4_row (scalar) gives.
TEST(Fp4Kernel, ManyRowsRunTheDenseGemmOnTheDecodedWeights) {
  std::mt19937 rng(9);
  for (bool table : {false, true}) {
    SCOPED_TRACE(table);
    const Matrix w = random_matrix(300, 257, 16, table, rng);
    std::vector<float> dense(static_cast<size_t>(w.N * w.K));
    for (int64_t n = 0; n < w.N; ++n) cpu::decode_fp4_row(w.q.data(), w.scales(), n, w.K, w.G, dense.data() + n * w.K);
    for (int64_t M : {64, 65, 200}) {
      SCOPED_TRACE(M);
      const std::vector<float> x = random_x(M, w.K, rng);
      std::vector<float> want(static_cast<size_t>(M * w.N)), got(want.size(), std::nanf(""));
      cpu::gemm_f32(x.data(), M, dense.data(), w.N, w.K, want.data());
      cpu::gemm_fp4(x.data(), M, w.q.data(), w.scales(), w.N, w.K, w.G, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
      expect_close(w, M, x, got);
    }
  }
}

// The kernel rows' prepare refuses the scales the formats' unpack refuses: E8M0's NaN byte, E4M3's NaN code.
TEST(Fp4Kernel, PrepareRejectsNanScales) {
  const Tensor codes = Tensor::zeros(DType::U8, {1, 16});
  for (const char* name : {"mxfp4", "nvfp4"}) {
    SCOPED_TRACE(name);
    const FormatChoice f = find_format(name);
    const cpu::PackedKernel* k = cpu::find_packed_kernel(*f.spec);
    ASSERT_NE(k, nullptr);
    const int64_t blocks = 32 / f.group_size;
    std::vector<Tensor> parts{codes, bytes_tensor(f.group_size == 32 ? DType::U8 : DType::F8_E4M3, {1, blocks},
                                                  std::vector<uint8_t>(static_cast<size_t>(blocks), 0xFF))};
    if (f.group_size == 16) parts.push_back(Tensor::zeros(DType::F32, {1}));
    EXPECT_THROW(k->prepare(parts, 1, 32, f.group_size), Error);
  }
}

TEST(Fp4Kernel, RejectsBadShapes) {
  const std::vector<uint8_t> q(4);
  const std::vector<float> sv(2), x(8);
  cpu::Fp4Scales s;
  s.f32 = sv.data();
  std::vector<float> y(4);
  EXPECT_THROW(cpu::gemm_fp4(x.data(), 1, q.data(), s, 2, 0, 16, y.data()), Error);
  EXPECT_THROW(cpu::gemm_fp4(x.data(), -1, q.data(), s, 2, 4, 16, y.data()), Error);
  EXPECT_THROW(cpu::gemm_fp4_ref(x.data(), 1, q.data(), s, 2, 4, 12, y.data()), Error);
  EXPECT_THROW(cpu::gemm_fp4_isa(Isa::Scalar, x.data(), 1, q.data(), s, 2, 4, 4, y.data()), Error);
}

}  // namespace
}  // namespace nibble
