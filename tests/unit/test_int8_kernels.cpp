// The int8_channel_sym GEMM (src/backend/cpu/int8_gemm.cpp) against a float64
// sum of the format's own decoded weights: a worked example by hand,
// integer-valued data where every path must be bit exact, a sweep over M
// (one token, tiles of 4 and their remainders), ragged K and odd N, and from
// 64 rows on the bits of gemm_f32 on the decoded matrix.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "nibble/error.h"
#include "nibble/format.h"

namespace nibble {
namespace {

using cpu::Isa;

std::vector<Isa> isas_to_test() {
  std::vector<Isa> v;
  for (Isa i : {Isa::Scalar, Isa::Avx2, Isa::Avx512})
    if (cpu::isa_supported(i)) v.push_back(i);
  return v;
}

struct Int8Matrix {
  int64_t N, K;
  std::vector<int8_t> q;
  std::vector<float> s;
  float w(int64_t n, int64_t k) const { return static_cast<float>(q[static_cast<size_t>(n * K + k)]) * s[n]; }
};

Int8Matrix random_matrix(int64_t N, int64_t K, std::mt19937& rng) {
  std::uniform_int_distribution<int> code(-127, 127);
  std::uniform_real_distribution<float> scale(1e-3f, 2e-2f);
  Int8Matrix m{N, K, std::vector<int8_t>(static_cast<size_t>(N * K)), std::vector<float>(static_cast<size_t>(N))};
  for (int8_t& c : m.q) c = static_cast<int8_t>(code(rng));
  for (float& v : m.s) v = scale(rng);
  return m;
}

std::vector<float> random_x(int64_t M, int64_t K, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (float& v : x) v = nd(rng);
  return x;
}

// Each output against Σ_k fl(code·s)·x_k in float64: fp32 sums of K terms in any order are within
// K·2^-24·Σ|terms| of it (the decode fl(code·s) is the format's, so it adds nothing).
void expect_close(const Int8Matrix& w, int64_t M, const std::vector<float>& x, const std::vector<float>& y) {
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

// The worked example: rows (1, −2, 3) · 0.5 and (127, 0, −127) · 0.25 against x = (2, 1, −1):
// y0 = 0.5·(2 − 2 − 3) = −1.5, y1 = 0.25·(254 + 127) = 95.25.
TEST(Int8Kernel, WorkedExampleByHand) {
  const std::vector<int8_t> q{1, -2, 3, 127, 0, -127};
  const std::vector<float> s{0.5f, 0.25f}, x{2.0f, 1.0f, -1.0f};
  for (Isa isa : isas_to_test()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    std::vector<float> y(2, std::nanf(""));
    cpu::gemm_int8_channel_isa(isa, x.data(), 1, q.data(), s.data(), 2, 3, y.data());
    EXPECT_EQ(y[0], -1.5f);
    EXPECT_EQ(y[1], 95.25f);
  }
  std::vector<float> y(2, std::nanf(""));
  cpu::gemm_int8_channel_ref(x.data(), 1, q.data(), s.data(), 2, 3, y.data());
  EXPECT_EQ(y[0], -1.5f);
  EXPECT_EQ(y[1], 95.25f);
}

// Integer codes, power-of-two scales and small integer x: every product and partial sum is exact in fp32, so every
// path, in any order, gives the reference's bits.
TEST(Int8Kernel, BitExactOnIntegerValuedData) {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> xi(-8, 8), si(-3, 2);
  for (int64_t K : {1, 7, 8, 31, 33, 300}) {
    Int8Matrix w = random_matrix(37, K, rng);
    for (float& v : w.s) v = std::ldexp(1.0f, si(rng));
    for (int64_t M : {1, 2, 3, 4, 5, 9, 64, 70}) {
      SCOPED_TRACE("K=" + std::to_string(K) + " M=" + std::to_string(M));
      std::vector<float> x(static_cast<size_t>(M * K));
      for (float& v : x) v = static_cast<float>(xi(rng));
      std::vector<float> want(static_cast<size_t>(M * w.N)), got(want.size(), std::nanf(""));
      cpu::gemm_int8_channel_ref(x.data(), M, w.q.data(), w.s.data(), w.N, K, want.data());
      for (Isa isa : isas_to_test()) {
        std::fill(got.begin(), got.end(), std::nanf(""));
        cpu::gemm_int8_channel_isa(isa, x.data(), M, w.q.data(), w.s.data(), w.N, K, got.data());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << cpu::isa_name(isa);
      }
      std::fill(got.begin(), got.end(), std::nanf(""));
      cpu::gemm_int8_channel(x.data(), M, w.q.data(), w.s.data(), w.N, K, got.data());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0) << "dispatch";
    }
  }
}

TEST(Int8Kernel, MatchesTheDecodedWeightsSweep) {
  std::mt19937 rng(5);
  for (int64_t K : {5, 8, 40, 129, 1000})
    for (int64_t N : {1, 9, 33, 67}) {
      const Int8Matrix w = random_matrix(N, K, rng);
      for (int64_t M : {1, 2, 3, 4, 6, 13, 63}) {
        SCOPED_TRACE("K=" + std::to_string(K) + " N=" + std::to_string(N) + " M=" + std::to_string(M));
        const std::vector<float> x = random_x(M, K, rng);
        std::vector<float> y(static_cast<size_t>(M * N), std::nanf(""));
        cpu::gemm_int8_channel_ref(x.data(), M, w.q.data(), w.s.data(), N, K, y.data());
        expect_close(w, M, x, y);
        for (Isa isa : isas_to_test()) {
          std::fill(y.begin(), y.end(), std::nanf(""));
          cpu::gemm_int8_channel_isa(isa, x.data(), M, w.q.data(), w.s.data(), N, K, y.data());
          expect_close(w, M, x, y);
        }
      }
    }
}

// From 64 rows on, gemm_int8_channel decodes W (decode_int8_channel_row: the format's decode) and runs the dense
// GEMM: the bits of gemm_f32 on the dequantized matrix.
TEST(Int8Kernel, ManyRowsRunTheDenseGemmOnTheDecodedWeights) {
  std::mt19937 rng(9);
  const Int8Matrix w = random_matrix(300, 257, rng);
  const FormatChoice f = find_format("int8_channel_sym");
  std::vector<float> dense(static_cast<size_t>(w.N * w.K));
  for (int64_t n = 0; n < w.N; ++n) {
    cpu::decode_int8_channel_row(w.q.data(), w.s.data(), n, w.K, dense.data() + n * w.K);
    for (int64_t k = 0; k < w.K; ++k) {  // the registry row's own decode
      GroupParams p;
      p.scale = w.s[n];
      ASSERT_EQ(dense[static_cast<size_t>(n * w.K + k)],
                f.spec->decode(static_cast<uint8_t>(w.q[static_cast<size_t>(n * w.K + k)]), p));
    }
  }
  for (int64_t M : {64, 65, 200}) {
    SCOPED_TRACE(M);
    const std::vector<float> x = random_x(M, w.K, rng);
    std::vector<float> want(static_cast<size_t>(M * w.N)), got(want.size(), std::nanf(""));
    cpu::gemm_f32(x.data(), M, dense.data(), w.N, w.K, want.data());
    cpu::gemm_int8_channel(x.data(), M, w.q.data(), w.s.data(), w.N, w.K, got.data());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * 4), 0);
    expect_close(w, M, x, got);
  }
}

TEST(Int8Kernel, RejectsBadShapes) {
  const std::vector<int8_t> q(4);
  const std::vector<float> s(2), x(2);
  std::vector<float> y(4);
  EXPECT_THROW(cpu::gemm_int8_channel(x.data(), 1, q.data(), s.data(), 2, 0, y.data()), Error);
  EXPECT_THROW(cpu::gemm_int8_channel(x.data(), -1, q.data(), s.data(), 2, 2, y.data()), Error);
  EXPECT_THROW(cpu::gemm_int8_channel_ref(x.data(), 1, q.data(), s.data(), -2, 2, y.data()), Error);
}

}  // namespace
}  // namespace nibble
