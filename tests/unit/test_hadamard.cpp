// Hadamard matrices and the randomized rotation against independent
// references: the literature's 4×4 example, the Sylvester formula
// (−1)^popcount(i & j), H·Hᵀ = n·I in exact integer arithmetic, the known
// necessary condition on Hadamard orders (1, 2 or a multiple of 4), and dense
// fp64 products x · diag(s) · H / √n with the signs drawn here from the
// documented Mersenne-twister recipe.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>

#include "nibble/error.h"
#include "nibble/hadamard.h"
#include "test_util.h"

namespace nibble::quant {
namespace {

using test::randn;

int sylvester(int64_t i, int64_t j) { return std::popcount(static_cast<uint64_t>(i & j)) % 2 ? -1 : 1; }

// The sign recipe as hadamard.h documents it, written out independently.
std::vector<int> documented_signs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> s(static_cast<size_t>(n));
  for (auto& v : s) v = (rng() >> 63) ? -1 : 1;
  return s;
}

// H·Hᵀ == n·I exactly (integer sums) and every entry ±1.
void expect_hadamard(const std::vector<int8_t>& h, int64_t n) {
  ASSERT_EQ(h.size(), static_cast<size_t>(n * n)) << "order " << n;
  for (auto v : h) ASSERT_TRUE(v == 1 || v == -1) << "order " << n;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      int64_t dot = 0;
      for (int64_t k = 0; k < n; ++k) dot += h[i * n + k] * h[j * n + k];
      ASSERT_EQ(dot, i == j ? n : 0) << "order " << n << " rows " << i << ", " << j;
    }
}

// Tolerance for an f32 result of an fp64 computation: the final rounding to
// float (2^-24 relative) dominates; 1e-6 absolute covers results near zero.
void expect_close(float got, double ref, const std::string& what) {
  EXPECT_NEAR(got, ref, 1e-6 + 2.5e-7 * std::abs(ref)) << what;
}

TEST(HadamardFwht, LiteratureExample) {
  // (8, 0, 0, 0) · H4 / 2 = (4, 4, 4, 4): the normalized 4×4 Sylvester matrix spreads one spike evenly.
  double x[4] = {8, 0, 0, 0};
  fwht(x, 4);
  for (double v : x) EXPECT_EQ(v / 2, 4.0);
  const std::vector<int8_t> h4 = {1, 1, 1, 1, 1, -1, 1, -1, 1, 1, -1, -1, 1, -1, -1, 1};
  EXPECT_EQ(hadamard_matrix(4), h4);
  // With random signs the magnitudes stay 4, for every seed.
  for (uint64_t seed : {0u, 1u, 7u, 12345u}) {
    float y[4] = {8, 0, 0, 0};
    HadamardRotation(4, seed).apply(y, 1);
    for (float v : y) EXPECT_FLOAT_EQ(std::abs(v), 4.0f) << "seed " << seed;
  }
}

TEST(HadamardFwht, MatchesSylvesterAndIsItsOwnInverseUpToN) {
  for (int64_t n = 1; n <= 4096; n *= 2) {
    const auto x = randn(n, 10 + n);
    std::vector<double> y(x.begin(), x.end());
    fwht(y.data(), n);
    if (n <= 256)
      for (int64_t i = 0; i < n; ++i) {
        double ref = 0;
        for (int64_t j = 0; j < n; ++j) ref += sylvester(i, j) * static_cast<double>(x[j]);
        EXPECT_NEAR(y[i], ref, 1e-12 * n) << "n " << n << " i " << i;
      }
    fwht(y.data(), n);
    std::vector<float> yf(x);
    fwht(yf.data(), n);
    fwht(yf.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      EXPECT_NEAR(y[i], n * static_cast<double>(x[i]), 1e-12 * n) << "n " << n;
      // float: log2(n)·2 roundings of sums up to ~n·|x|.
      EXPECT_NEAR(yf[i], n * x[i], 1e-5 * n) << "n " << n;
    }
  }
  float bad[12] = {};
  EXPECT_THROW(fwht(bad, 12), Error);
}

TEST(HadamardMatrix, SylvesterForPowersOfTwo) {
  for (int64_t n = 1; n <= 128; n *= 2) {
    ASSERT_TRUE(hadamard_supported(n));
    const auto h = hadamard_matrix(n);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) ASSERT_EQ(h[i * n + j], sylvester(i, j)) << n;
  }
}

TEST(HadamardMatrix, OrthogonalForEverySupportedOrderUpTo300) {
  std::string list;
  int count = 0;
  for (int64_t n = 1; n <= 300; ++n) {
    if (!hadamard_supported(n)) continue;
    // A Hadamard matrix of order n > 2 needs 4 | n: a claim otherwise is wrong.
    EXPECT_TRUE(n <= 2 || n % 4 == 0) << n;
    expect_hadamard(hadamard_matrix(n), n);
    list += std::to_string(n) + " ";
    ++count;
  }
  // Orders a Paley construction over a prime field cannot reach: 92 (91 = 7·13, 45 = 3²·5), 116, 156, 172, 184, 188, 232,
  // 236, 260, 268, 292; and 52, 100, 244, which would need the prime-power fields GF(25), GF(49), GF(121) or GF(243).
  for (int64_t n : {52, 92, 100, 116, 156, 172, 184, 188, 232, 236, 244, 260, 268, 292}) EXPECT_FALSE(hadamard_supported(n)) << n;
  for (int64_t n : {12, 20, 28, 36, 44, 60, 68, 76, 84, 108, 124, 132, 140, 148, 164, 180, 196, 204, 212, 220, 228, 252, 276, 284, 300})
    EXPECT_TRUE(hadamard_supported(n)) << n;
  EXPECT_GT(count, 0);
  std::printf("supported orders <= 300 (%d): %s\n", count, list.c_str());
}

TEST(HadamardMatrix, ModelWidthsAndKroneckerCombos) {
  for (int64_t n : {12, 20, 28, 36, 44, 60, 148, 28 * 4, 12 * 8, 36 * 16, 20 * 32}) expect_hadamard(hadamard_matrix(n), n);
  // The widths the rotation pipeline needs (too big for a dense check here).
  for (int64_t n : {576, 14336, 18944, 4096, 5120, 13824, 8960, 4864, 29568}) EXPECT_TRUE(hadamard_supported(n)) << n;
  // The Kronecker layout: H_224 = H_28 ⊗ H_8, H[a·8 + b, c·8 + d] = H_28[a, c] · H_8[b, d].
  const auto h28 = hadamard_matrix(28), h224 = hadamard_matrix(224);
  for (int64_t i = 0; i < 224; ++i)
    for (int64_t j = 0; j < 224; ++j)
      ASSERT_EQ(h224[i * 224 + j], h28[(i / 8) * 28 + j / 8] * sylvester(i % 8, j % 8)) << i << ", " << j;
  EXPECT_EQ(HadamardRotation(224, 0).factor(), 28);
  EXPECT_EQ(HadamardRotation(576, 0).factor(), 36);
  EXPECT_EQ(HadamardRotation(18944, 0).factor(), 148);
  EXPECT_EQ(HadamardRotation(4096, 0).factor(), 1);
}

TEST(HadamardMatrix, UnsupportedOrderNamesTheSize) {
  for (int64_t n : {11008, 172, 6, 0, -4}) {
    EXPECT_FALSE(hadamard_supported(n)) << n;
    for (int which = 0; which < 2; ++which) {
      try {
        if (which == 0) (void)hadamard_matrix(n);
        else HadamardRotation(n, 1);
        ADD_FAILURE() << "no error for " << n;
      } catch (const Error& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find(std::to_string(n)), std::string::npos) << msg;
        EXPECT_NE(msg.find("Paley"), std::string::npos) << msg;
      }
    }
  }
}

TEST(HadamardRotation, MatchesDenseProduct) {
  for (int64_t n : {1, 2, 8, 64, 12, 24, 20, 28 * 8, 576}) {
    const uint64_t seed = 1000 + n;
    const auto h = hadamard_matrix(n);
    const auto s = documented_signs(n, seed);
    const int64_t rows = 5, ld = n + 3;  // a padded stride: the padding must stay untouched
    const auto x = randn(rows * ld, n);
    std::vector<float> y(x), yt(x);
    HadamardRotation rot(n, seed);
    rot.apply(y.data(), rows, ld);
    rot.apply_transpose(yt.data(), rows, ld);
    const double inv = 1.0 / std::sqrt(static_cast<double>(n));
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * ld;
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0, ref_t = 0;  // (x Q)_j = Σ_i x_i s_i H[i, j] / √n;  (x Qᵀ)_j = Σ_i x_i H[j, i] s_j / √n
        for (int64_t i = 0; i < n; ++i) {
          ref += xr[i] * s[i] * h[i * n + j] * inv;
          ref_t += xr[i] * h[j * n + i] * s[j] * inv;
        }
        expect_close(y[r * ld + j], ref, fmt::format("apply n {} row {} col {}", n, r, j));
        expect_close(yt[r * ld + j], ref_t, fmt::format("apply_transpose n {} row {} col {}", n, r, j));
      }
      for (int64_t j = n; j < ld; ++j) EXPECT_EQ(y[r * ld + j], xr[j]);
    }
  }
}

TEST(HadamardRotation, MatchesKroneckerFormulaAt14336) {
  // 14336 = 28·512 (Llama-3 / Mistral intermediate): two rows against Σ_i x_i s_i H_28[i/512, j/512] H_512[i%512, j%512] / √n.
  const int64_t n = 14336, p = 512;
  const auto h28 = hadamard_matrix(28);
  const auto s = documented_signs(n, 3);
  const auto x = randn(2 * n, 4);
  std::vector<float> y(x);
  HadamardRotation(n, 3).apply(y.data(), 2);
  const double inv = 1.0 / std::sqrt(static_cast<double>(n));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t j = 0; j < n; j += 37) {  // every 37th column keeps this under a second
      double ref = 0;
      for (int64_t i = 0; i < n; ++i) ref += x[r * n + i] * s[i] * h28[(i / p) * 28 + j / p] * sylvester(i % p, j % p);
      expect_close(y[r * n + j], ref * inv, fmt::format("row {} col {}", r, j));
    }
}

TEST(HadamardRotation, PreservesNormAndInvertsWithTranspose) {
  for (int64_t n : {12, 576, 4096, 14336, 18944}) {
    const int64_t rows = n > 4096 ? 3 : 200;  // 200 rows of 576/4096 take the parallel path
    const auto x = randn(rows * n, 77 + n);
    std::vector<float> y(x);
    HadamardRotation rot(n, 42);
    rot.apply(y.data(), rows);
    for (int64_t r = 0; r < rows; ++r) {
      double nx = 0, ny = 0;
      for (int64_t i = 0; i < n; ++i) {
        nx += static_cast<double>(x[r * n + i]) * x[r * n + i];
        ny += static_cast<double>(y[r * n + i]) * y[r * n + i];
      }
      // Each entry is rounded to float once (2^-24 relative), so ‖y‖² moves by ≲ 2^-23 relative.
      EXPECT_NEAR(ny, nx, 1e-6 * nx) << "n " << n << " row " << r;
    }
    // Rows one at a time (the serial path) give the same bits as the batch.
    std::vector<float> y1(x.begin(), x.begin() + n);
    rot.apply(y1.data(), 1);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y1[i], y[i]) << "n " << n;
    rot.apply_transpose(y.data(), rows);
    for (int64_t i = 0; i < rows * n; ++i)  // two float roundings of O(1) values
      ASSERT_NEAR(y[i], x[i], 1e-6 + 1e-6 * std::abs(x[i])) << "n " << n << " i " << i;
  }
}

TEST(HadamardRotation, SeedsAreReproducible) {
  const int64_t n = 576;
  HadamardRotation a(n, 5), b(n, 5), c(n, 6);
  EXPECT_EQ(a.size(), n);
  EXPECT_EQ(a.seed(), 5u);
  EXPECT_EQ(a.signs(), b.signs());
  EXPECT_NE(a.signs(), c.signs());  // equal with probability 2^-576
  const auto s = documented_signs(n, 5);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(a.signs()[i], s[i]) << i;
  int minus = 0;
  for (auto v : a.signs()) minus += v < 0;
  EXPECT_GT(minus, n / 4);  // a fair coin: 288 ± 12 expected
  EXPECT_LT(minus, 3 * n / 4);
  const auto x = randn(n, 9);
  std::vector<float> ya(x), yb(x), yc(x);
  a.apply(ya.data(), 1);
  b.apply(yb.data(), 1);
  c.apply(yc.data(), 1);
  EXPECT_EQ(ya, yb);
  EXPECT_NE(ya, yc);
}

}  // namespace
}  // namespace nibble::quant
