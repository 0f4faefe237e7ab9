// The 8-bit-code GEMM (src/backend/cpu/int8_gemm.cpp: int8_channel_sym, int8_g{G}_sym,
// int8_g{G}_asym_f32 and the FP8 formats) against the formats' own decode and a float64 sum of the decoded
// weights: worked examples by hand, every one of the 256 codes of each kind
// decoded exactly (NaN included), integer-valued data where every path must be
// bit exact, a sweep over M (one token, tiles of 4 and their remainders), ragged
// K, odd N, per-row and per-tensor scales, and from 64 rows on the bits of
// gemm_f32 on the decoded matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "unit/cpu_isas.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/tensor.h"

namespace nibble {
namespace {

using cpu::Code8;
using cpu::Isa;

using test::isas_to_test;

const char* kind_name(Code8 c) {
  return c == Code8::Int8         ? "int8"
         : c == Code8::E4M3       ? "e4m3"
         : c == Code8::E4M3Finite ? "e4m3 finite"
         : c == Code8::E5M2       ? "e5m2"
                                  : "uint8";
}
// The registry row whose decode each kind's codes follow (per row).
const char* format_of(Code8 c) {
  return c == Code8::Int8 ? "int8_channel_sym" : c == Code8::E5M2 ? "fp8_e5m2_channel" : "fp8_e4m3_channel";
}
bool finite_code(Code8 c, uint8_t b) {
  if (c == Code8::E4M3 || c == Code8::E4M3Finite) return (b & 0x7F) != 0x7F;
  if (c == Code8::E5M2) return (b & 0x7C) != 0x7C;
  return true;
}

struct Matrix {
  Code8 kind;
  int64_t N, K, stride;  // stride: 1 per-row scales, 0 one per tensor
  std::vector<uint8_t> q;
  std::vector<float> s;
  float w(int64_t n, int64_t k) const {
    return cpu::code8_value(kind, q[static_cast<size_t>(n * K + k)]) * s[static_cast<size_t>(n * stride)];
  }
};

Matrix random_matrix(Code8 kind, int64_t N, int64_t K, int64_t stride, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  // Scales that put every kind's largest values near 1.
  const float top = kind == Code8::Int8 ? 127.0f : kind == Code8::E5M2 ? 57344.0f : 448.0f;
  std::uniform_real_distribution<float> scale(0.2f / top, 2.0f / top);
  Matrix m{kind, N, K, stride, std::vector<uint8_t>(static_cast<size_t>(N * K)),
           std::vector<float>(static_cast<size_t>(stride ? N : 1))};
  for (uint8_t& c : m.q) do c = static_cast<uint8_t>(byte(rng)); while (!finite_code(kind, c));
  for (float& v : m.s) v = scale(rng);
  return m;
}

std::vector<float> random_x(int64_t M, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (float& v : x) v = nd(rng);
  return x;
}

// Each output against Σ_k fl(value·s)·x_k in float64: fp32 sums of K terms in any order are within
// K·2^-24·Σ|terms| of it (the decode is the format's, so it adds nothing).
void expect_close(const Matrix& w, int64_t M, const std::vector<float>& x, const std::vector<float>& y) {
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.N; ++n) {
      double want = 0, mag = 0;
      for (int64_t k = 0; k < w.K; ++k) {
        const double t = static_cast<double>(w.w(n, k)) * x[static_cast<size_t>(m * w.K + k)];
        want += t;
        mag += std::abs(t);
      }
      const float got = y[static_cast<size_t>(m * w.N + n)];
      ASSERT_LE(std::abs(got - want), static_cast<double>(w.K) * 0x1p-24 * mag + 1e-30)
          << "m=" << m << " n=" << n << " got " << got << " want " << want;
    }
}

// Rows (1, −2, 3)·0.5 and (127, 0, −127)·0.25 against x = (2, 1, −1): −1.5 and 95.25. The FP8 kinds: values
// (1, 2, −1)·0.5 (E4M3 0x38 0x40 0xB8, E5M2 0x3C 0x40 0xBC) and the smallest subnormals (E4M3 0x01 = 2^-9,
// E5M2 0x01 = 2^-16) times 4: 0.5·(2 + 2 + 1) = 2.5 and 2^-7·2 = 2^-6, 2^-14·2 = 2^-13.
TEST(Int8Kernel, WorkedExamplesByHand) {
  struct Case {
    Code8 kind;
    std::vector<uint8_t> q;
    std::vector<float> s, want;
  };
  const std::vector<Case> cases{
      {Code8::Int8, {1, 0xFE, 3, 127, 0, 0x81}, {0.5f, 0.25f}, {-1.5f, 95.25f}},
      {Code8::E4M3, {0x38, 0x40, 0xB8, 0x01, 0, 0}, {0.5f, 4.0f}, {2.5f, 0x1p-6f}},
      {Code8::E5M2, {0x3C, 0x40, 0xBC, 0x01, 0, 0}, {0.5f, 4.0f}, {2.5f, 0x1p-13f}},
  };
  const std::vector<float> x{2.0f, 1.0f, -1.0f};
  for (const Case& c : cases) {
    SCOPED_TRACE(kind_name(c.kind));
    std::vector<float> y(2, std::nanf(""));
    cpu::gemm_code8_ref(c.kind, x.data(), 1, c.q.data(), c.s.data(), 1, 2, 3, y.data());
    EXPECT_EQ(y, c.want);
    for (Isa isa : isas_to_test()) {
      SCOPED_TRACE(cpu::isa_name(isa));
      std::fill(y.begin(), y.end(), std::nanf(""));
      cpu::gemm_code8_isa(isa, c.kind, x.data(), 1, c.q.data(), c.s.data(), 1, 2, 3, y.data());
      EXPECT_EQ(y, c.want);
    }
  }
}

// Every code of each kind through every path: row r holds codes 8r .. 8r + 7 and x is the identity, so each output
// is one decoded weight (the other products are zeros). Rows with a non-finite code (E4M3's NaNs, E5M2's
// infinities and NaNs) give NaN everywhere (0·inf, 0·NaN), and so must every path. The decode itself is the
// registry row's.
TEST(Int8Kernel, EveryCodeDecodesAsTheFormatSays) {
  for (Code8 kind : {Code8::Int8, Code8::E4M3, Code8::E5M2}) {
    SCOPED_TRACE(kind_name(kind));
    const FormatChoice f = find_format(format_of(kind));
    std::vector<uint8_t> q(256);
    for (int i = 0; i < 256; ++i) q[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
    std::vector<float> s(32);
    for (int r = 0; r < 32; ++r) s[static_cast<size_t>(r)] = std::ldexp(0.75f, r % 5 - 2);
    std::vector<float> row(8);
    for (int r = 0; r < 32; ++r) {
      cpu::decode_code8_row(kind, q.data(), s.data(), 1, r, 8, row.data());
      for (int j = 0; j < 8; ++j) {
        GroupParams p;
        p.scale = s[static_cast<size_t>(r)];
        const float want = f.spec->decode(static_cast<uint8_t>(8 * r + j), p);
        ASSERT_TRUE(std::memcmp(&row[static_cast<size_t>(j)], &want, 4) == 0 || (std::isnan(want) && std::isnan(row[j])))
            << "code " << 8 * r + j;
      }
    }
    std::vector<float> eye(64, 0.0f);
    for (int j = 0; j < 8; ++j) eye[static_cast<size_t>(9 * j)] = 1.0f;
    for (Isa isa : isas_to_test()) {
      SCOPED_TRACE(cpu::isa_name(isa));
      for (int64_t M : {1, 8}) {  // one token at a time (x = e_j), and the tiles (x = I)
        std::vector<float> y(static_cast<size_t>(8 * 32), std::nanf(""));
        if (M == 8) {
          cpu::gemm_code8_isa(isa, kind, eye.data(), 8, q.data(), s.data(), 1, 32, 8, y.data());
        } else {
          for (int j = 0; j < 8; ++j)
            cpu::gemm_code8_isa(isa, kind, eye.data() + 8 * j, 1, q.data(), s.data(), 1, 32, 8, y.data() + 32 * j);
        }
        for (int r = 0; r < 32; ++r) {
          bool finite = true;
          for (int j = 0; j < 8; ++j) finite = finite && finite_code(kind, static_cast<uint8_t>(8 * r + j));
          cpu::decode_code8_row(kind, q.data(), s.data(), 1, r, 8, row.data());
          for (int j = 0; j < 8; ++j) {
            const float got = y[static_cast<size_t>(j * 32 + r)];
            if (finite)
              ASSERT_EQ(got, row[static_cast<size_t>(j)]) << "M=" << M << " code " << 8 * r + j;
            else
              ASSERT_TRUE(std::isnan(got)) << "M=" << M << " row " << r << ": " << got;
          }
        }
      }
    }
  }
}

// Integer codes (int8, and FP8 codes whose values are small integers), power-of-two scales and small integer x:
// every product and partial sum is exact in fp32, so every path, in any order, gives the reference's bits.
TEST(Int8Kernel, BitExactOnIntegerValuedData) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> xi(-8, 8), si(-3, 2);
  for (Code8 kind : {Code8::Int8, Code8::E4M3, Code8::E4M3Finite, Code8::E5M2}) {
    std::vector<uint8_t> pool;  // codes whose values are integers of magnitude at most 127
    for (int b = 0; b < 256; ++b) {
      const float v = finite_code(kind, static_cast<uint8_t>(b)) ? cpu::code8_value(kind, static_cast<uint8_t>(b)) : 0.5f;
      if (v == std::nearbyint(v) && std::abs(v) <= 127.0f) pool.push_back(static_cast<uint8_t>(b));
    }
    std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
    for (int64_t K : {1, 7, 8, 31, 33, 300})
      for (int64_t stride : {1, 0}) {
        Matrix w = random_matrix(kind, 37, K, stride, rng);
        for (uint8_t& c : w.q) c = pool[pick(rng)];
        for (float& v : w.s) v = std::ldexp(1.0f, si(rng));
        for (int64_t M : {1, 2, 3, 4, 5, 9, 64, 70}) {
          SCOPED_TRACE(std::string(kind_name(kind)) + " K=" + std::to_string(K) + " stride=" + std::to_string(stride) +
                       " M=" + std::to_string(M));
          std::vector<float> x(static_cast<size_t>(M * K));
          for (float& v : x) v = static_cast<float>(xi(rng));
          std::vector<float> want(static_cast<size_t>(M * w.N)), got(want.size(), std::nanf(""));
          cpu::gemm_code8_ref(kind, x.data(), M, w.q.data(), w.s.data(), stride, w.N, K, want.data());
          for (Isa isa : isas_to_test()) {
            std::fill(got.begin(), got.end(), std::nanf(""));
            cpu::gemm_code8_isa(isa, kind, x.data(), M, w.q.data(), w.s.data(), stride, w.N, K, got.data());
            ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << cpu::isa_name(isa);
          }
          std::fill(got.begin(), got.end(), std::nanf(""));
          cpu::gemm_code8(kind, x.data(), M, w.q.data(), w.s.data(), stride, w.N, K, got.data());
          ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "dispatch";
        }
      }
  }
}

TEST(Int8Kernel, MatchesTheDecodedWeightsSweep) {
  std::mt19937 rng(5);
  for (Code8 kind : {Code8::Int8, Code8::E4M3, Code8::E4M3Finite, Code8::E5M2})
    for (int64_t K : {5, 8, 40, 129, 1000})
      for (int64_t N : {1, 9, 33, 67}) {
        const Matrix w = random_matrix(kind, N, K, N % 2, rng);
        for (int64_t M : {1, 2, 3, 4, 6, 13, 63}) {
          SCOPED_TRACE(std::string(kind_name(kind)) + " K=" + std::to_string(K) + " N=" + std::to_string(N) +
                       " M=" + std::to_string(M));
          const std::vector<float> x = random_x(M, K, rng);
          std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
          cpu::gemm_code8_ref(kind, x.data(), M, w.q.data(), w.s.data(), w.stride, N, K, y.data());
          expect_close(w, M, x, y);
          for (Isa isa : isas_to_test()) {
            std::fill(y.begin(), y.end(), std::nanf(""));
            cpu::gemm_code8_isa(isa, kind, x.data(), M, w.q.data(), w.s.data(), w.stride, N, K, y.data());
            expect_close(w, M, x, y);
          }
        }
      }
}

// From 64 rows on, gemm_code8 decodes W and runs the dense GEMM: the bits of gemm_f32 on the dequantized matrix.
TEST(Int8Kernel, ManyRowsRunTheDenseGemmOnTheDecodedWeights) {
  std::mt19937 rng(9);
  for (Code8 kind : {Code8::Int8, Code8::E4M3, Code8::E5M2}) {
    SCOPED_TRACE(kind_name(kind));
    const Matrix w = random_matrix(kind, 300, 257, 1, rng);
    std::vector<float> dense(static_cast<size_t>(w.N * w.K));
    for (int64_t n = 0; n < w.N; ++n) cpu::decode_code8_row(kind, w.q.data(), w.s.data(), 1, n, w.K, dense.data() + n * w.K);
    for (int64_t M : {64, 65, 200}) {
      SCOPED_TRACE(M);
      const std::vector<float> x = random_x(M, w.K, rng);
      std::vector<float> want(static_cast<size_t>(M * w.N)), got(want.size(), std::nanf(""));
      cpu::gemm_f32(x.data(), M, dense.data(), w.N, w.K, want.data());
      cpu::gemm_code8(kind, x.data(), M, w.q.data(), w.s.data(), 1, w.N, w.K, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
      expect_close(w, M, x, got);
    }
  }
}

// The fp8_e4m3 rows' CPU kernel (packed_kernels.cpp) takes the decode without the NaN blend only for a matrix whose
// codes hold no NaN, which its prepare checks once: a matrix with one NaN code keeps NaN in that row's outputs,
// as its dequantized weights give, and the others' outputs are the same either way.
TEST(Int8Kernel, E4M3KernelRowKeepsANanCodesNan) {
  const FormatChoice f = find_format("fp8_e4m3_channel");
  const cpu::PackedKernel* k = cpu::find_packed_kernel(*f.spec);
  ASSERT_NE(k, nullptr);
  ASSERT_NE(k->prepare, nullptr);
  const int64_t N = 3, K = 40;
  std::mt19937 rng(13);
  const Matrix w = random_matrix(Code8::E4M3, N, K, 1, rng);
  const std::vector<float> x = random_x(1, K, rng);
  for (bool with_nan : {false, true}) {
    SCOPED_TRACE(with_nan);
    Tensor codes = Tensor::zeros(DType::F8_E4M3, {N, K}), scales = Tensor::zeros(DType::F32, {N, 1});
    std::memcpy(codes.raw_mut(), w.q.data(), w.q.size());
    if (with_nan) static_cast<uint8_t*>(codes.raw_mut())[K + 17] = 0xFF;  // row 1
    std::memcpy(scales.raw_mut(), w.s.data(), w.s.size() * 4);
    const std::vector<Tensor> parts = k->prepare({codes, scales}, N, K, f.group_size);
    std::vector<float> y(N, std::nanf("")), want(N);
    k->gemm(x.data(), 1, parts, N, K, f.group_size, y.data());
    cpu::gemm_code8_ref(Code8::E4M3, x.data(), 1, static_cast<const uint8_t*>(codes.raw()), w.s.data(), 1, N, K,
                        want.data());
    for (int64_t n = 0; n < N; ++n) {
      if (with_nan && n == 1) {
        EXPECT_TRUE(std::isnan(y[n]));
        EXPECT_TRUE(std::isnan(want[n]));
      } else {
        EXPECT_NEAR(y[n], want[n], 1e-5 * (1 + std::abs(want[n])));
      }
    }
  }
}

// Group scales: int8_g{G}_sym (a scale per group of G inputs; llama.cpp's Q8_0 at G = 32) and int8_g{G}_asym_f32
// (unsigned codes, a scale and a min per group, decoded fl(fl(code·s) + m); llama.cpp's Q5_1 / Q5_K at G = 32,
// Q6_K at G = 16): every path against a float64 sum of the decoded weights, bit exact on integer-valued data
// (power-of-two scales, mins an integer multiple of their scale, small integer x), and from 64 rows on the bits of
// gemm_f32 on decode_code8_row's matrix. Ragged K (a short last group, a K % 8 tail), odd N.
TEST(Int8Kernel, GroupScales) {
  std::mt19937 rng(17);
  std::uniform_int_distribution<int> byte(0, 255), xi(-8, 8), si(-9, -4), mi(-255, 0);
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f), mins(-2.0f, 0.0f);
  for (bool asym : {false, true})
    for (int64_t G : {16, 32, 64, 128})
      for (int64_t K : {5, 40, 129, 300})
        for (bool integer : {false, true}) {
          const Code8 kind = asym ? Code8::UInt8 : Code8::Int8;
          const int64_t N = 37, groups = (K + G - 1) / G;
          std::vector<uint8_t> q(static_cast<size_t>(N * K));
          std::vector<float> s(static_cast<size_t>(N * groups)), mn(asym ? s.size() : 0);
          for (uint8_t& c : q) c = static_cast<uint8_t>(byte(rng));
          for (float& v : s) v = integer ? std::ldexp(1.0f, si(rng)) : scale(rng);
          for (size_t i = 0; i < mn.size(); ++i) mn[i] = integer ? static_cast<float>(mi(rng)) * s[i] : mins(rng);
          const float* m_ptr = asym ? mn.data() : nullptr;
          auto w = [&](int64_t n, int64_t k) {
            const uint8_t c = q[static_cast<size_t>(n * K + k)];
            const size_t g = static_cast<size_t>(n * groups + k / G);
            if (!asym) return static_cast<float>(static_cast<int8_t>(c)) * s[g];
            const float cs = static_cast<float>(c) * s[g];  // rounded, then the min added: the format's two steps
            return cs + mn[g];
          };
          // |w| for the error bound: asym's one-token row factors each group into s·Σq·x + m·Σx, whose roundings
          // are bounded by |fl(q·s)·x| + |m·x| per input rather than by |w·x| (3 more roundings: s·A, m·X, the
          // two sums' sum).
          auto w_mag = [&](int64_t n, int64_t k) {
            if (!asym) return static_cast<double>(std::abs(w(n, k)));
            const size_t g = static_cast<size_t>(n * groups + k / G);
            return std::abs(static_cast<double>(static_cast<float>(q[static_cast<size_t>(n * K + k)]) * s[g])) +
                   std::abs(static_cast<double>(mn[g]));
          };
          std::vector<float> row(static_cast<size_t>(K)), dense(static_cast<size_t>(N * K));
          for (int64_t n = 0; n < N; ++n) {
            cpu::decode_code8_row(kind, q.data(), s.data(), 1, n, K, dense.data() + n * K, G, m_ptr);
            for (int64_t k = 0; k < K; ++k) ASSERT_EQ(dense[static_cast<size_t>(n * K + k)], w(n, k));
          }
          for (int64_t M : {1, 2, 3, 4, 5, 9, 63, 64, 70}) {
            SCOPED_TRACE(std::string(asym ? "asym" : "sym") + " G=" + std::to_string(G) + " K=" + std::to_string(K) +
                         " M=" + std::to_string(M) + (integer ? " integer" : ""));
            std::vector<float> x(static_cast<size_t>(M * K));
            for (float& v : x) v = integer ? static_cast<float>(xi(rng)) : std::normal_distribution<float>()(rng);
            std::vector<float> ref(static_cast<size_t>(M * N)), got(ref.size());
            cpu::gemm_code8_ref(kind, x.data(), M, q.data(), s.data(), 1, N, K, ref.data(), G, m_ptr);
            auto check = [&](const std::vector<float>& y, const char* what) {
              for (int64_t m = 0; m < M; ++m)
                for (int64_t n = 0; n < N; ++n) {
                  double want = 0, mag = 0;
                  for (int64_t k = 0; k < K; ++k) {
                    const double xk = x[static_cast<size_t>(m * K + k)];
                    want += static_cast<double>(w(n, k)) * xk;
                    mag += w_mag(n, k) * std::abs(xk);
                  }
                  const float v = y[static_cast<size_t>(m * N + n)];
                  if (integer)
                    ASSERT_EQ(v, want) << what << " m=" << m << " n=" << n;
                  else
                    ASSERT_LE(std::abs(v - want), static_cast<double>(K + (asym ? 3 : 0)) * 0x1p-24 * mag + 1e-30)
                        << what << " m=" << m << " n=" << n;
                }
            };
            check(ref, "reference");
            for (Isa isa : isas_to_test()) {
              std::fill(got.begin(), got.end(), std::nanf(""));
              cpu::gemm_code8_isa(isa, kind, x.data(), M, q.data(), s.data(), 1, N, K, got.data(), G, m_ptr);
              check(got, cpu::isa_name(isa));
            }
            std::fill(got.begin(), got.end(), std::nanf(""));
            cpu::gemm_code8(kind, x.data(), M, q.data(), s.data(), 1, N, K, got.data(), G, m_ptr);
            check(got, "dispatch");
            if (M >= 64) {
              std::vector<float> want(ref.size());
              cpu::gemm_f32(x.data(), M, dense.data(), N, K, want.data());
              ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
            }
          }
        }
}

TEST(Int8Kernel, RejectsBadShapes) {
  const std::vector<uint8_t> q(4);
  const std::vector<float> s(2), x(2);
  std::vector<float> y(4);
  EXPECT_THROW(cpu::gemm_code8(Code8::Int8, x.data(), 1, q.data(), s.data(), 1, 2, 0, y.data()), Error);
  EXPECT_THROW(cpu::gemm_code8(Code8::E4M3, x.data(), -1, q.data(), s.data(), 1, 2, 2, y.data()), Error);
  EXPECT_THROW(cpu::gemm_code8_ref(Code8::E5M2, x.data(), 1, q.data(), s.data(), 2, 2, 2, y.data()), Error);
  EXPECT_THROW(cpu::gemm_code8(Code8::Int8, x.data(), 1, q.data(), s.data(), 1, 2, 2, y.data(), 12), Error);
  // Unsigned codes come with a min per group, and only they.
  EXPECT_THROW(cpu::gemm_code8(Code8::UInt8, x.data(), 1, q.data(), s.data(), 1, 2, 2, y.data(), 8), Error);
  EXPECT_THROW(cpu::gemm_code8(Code8::Int8, x.data(), 1, q.data(), s.data(), 1, 2, 2, y.data(), 8, s.data()), Error);
  EXPECT_THROW(cpu::gemm_code8(Code8::UInt8, x.data(), 1, q.data(), s.data(), 1, 2, 2, y.data(), 0, s.data()), Error);
}

}  // namespace
}  // namespace nibble
