// The CPU's dense linear algebra over OpenBLAS: the f32 GEMM behind the forward
// (cpu::sgemm, cpu::gemm_f32) and GPTQ's fp64 factorizations (cpu::potrf_upper,
// cpu::trtri_upper), against scalar fp64 references, and with bits independent
// of the number of threads, so that calibrated quantization writes the same
// checkpoint on any core count.
#include <cblas.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "test_util.h"

namespace nibble {
namespace {

struct Problem {
  int64_t M, N, K;
  std::vector<float> x, w;
};

Problem make(int64_t M, int64_t N, int64_t K, uint32_t seed) {
  Problem p{M, N, K, std::vector<float>(static_cast<size_t>(M * K)), std::vector<float>(static_cast<size_t>(N * K))};
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  for (float& v : p.x) v = nd(rng);
  for (float& v : p.w) v = nd(rng);
  return p;
}

std::vector<float> run(const Problem& p, int threads) {
  return test::with_threads(threads, [&] {
    std::vector<float> y(static_cast<size_t>(p.M * p.N), std::nanf(""));
    cpu::gemm_f32(p.x.data(), p.M, p.w.data(), p.N, p.K, y.data());
    return y;
  });
}

TEST(CpuGemm, MatchesAnFp64Reference) {
  for (const auto& [M, N, K] : std::vector<std::array<int64_t, 3>>{
           {1, 1, 1}, {1, 1000, 300}, {2, 7, 5}, {37, 255, 300}, {37, 257, 64}, {64, 1000, 300}, {300, 513, 17}}) {
    const Problem p = make(M, N, K, static_cast<uint32_t>(M * 7 + N));
    const std::vector<float> y = run(p, 2);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t n = 0; n < N; ++n) {
        double ref = 0, mag = 0;
        for (int64_t k = 0; k < K; ++k) {
          const double t = static_cast<double>(p.x[i * K + k]) * p.w[n * K + k];
          ref += t;
          mag += std::abs(t);
        }
        // fp32 sums of K products: |error| ≤ K·2^-24·Σ|x_k w_k| (and far less in practice).
        ASSERT_NEAR(y[i * N + n], ref, static_cast<double>(K) * 0x1p-24 * mag + 1e-30)
            << "M=" << M << " N=" << N << " K=" << K << " at (" << i << ", " << n << ")";
      }
  }
}

TEST(CpuGemm, BitsDoNotDependOnTheThreadCount) {
  // Shapes of the calibration forward (tokens × a layer's outputs × its inputs),
  // with ragged ends, and products of one 256 × 256 tile of C with a long K:
  // OpenBLAS's own threading splits such products in ways that change the
  // rounding.
  for (const auto& [M, N, K] :
       std::vector<std::array<int64_t, 3>>{
           {256, 1536, 512}, {300, 1000, 384}, {97, 3072, 1024}, {2, 4096, 256}, {200, 250, 4096}, {256, 64, 2048}}) {
    const Problem p = make(M, N, K, static_cast<uint32_t>(N + K));
    const std::vector<float> one = run(p, 1);
    for (int threads : {2, 3, 4}) {
      const std::vector<float> many = run(p, threads);
      EXPECT_EQ(std::memcmp(one.data(), many.data(), one.size() * sizeof(float)), 0)
          << "M=" << M << " N=" << N << " K=" << K << ": " << threads << " threads give other bits than one";
    }
  }
}

// A random symmetric positive definite matrix, column-major, condition number
// about 10^3 (BᵀB over more rows than columns, plus a ridge).
std::vector<double> spd(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> nd;
  const int64_t m = n + 16;
  std::vector<double> b(static_cast<size_t>(m * n)), a(static_cast<size_t>(n * n), 0.0);
  for (double& v : b) v = nd(rng);
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i <= j; ++i) {
      double s = 0;
      for (int64_t k = 0; k < m; ++k) s += b[k * n + i] * b[k * n + j];
      a[i + j * n] = a[j + i * n] = s + (i == j ? 0.05 * static_cast<double>(m) : 0.0);
    }
  return a;
}

TEST(CpuCholesky, FactorsAndInvertsAgainstAScalarReference) {
  // Sizes below, at and across the 256-wide blocks (ragged last blocks).
  for (int64_t n : {1, 5, 256, 300, 600}) {
    const std::vector<double> a = spd(n, static_cast<uint32_t>(n));
    std::vector<double> u = a;
    // The strictly lower triangle is neither read nor written.
    for (int64_t j = 0; j < n; ++j)
      for (int64_t i = j + 1; i < n; ++i) u[i + j * n] = std::nan("");
    ASSERT_TRUE(test::with_threads(2, [&] { return cpu::potrf_upper(u.data(), n); })) << n;
    double worst = 0;
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_GT(u[j + j * n], 0.0);
      for (int64_t i = 0; i <= j; ++i) {
        double s = 0;  // (UᵀU)_ij = Σ_k≤i U_ki U_kj
        for (int64_t k = 0; k <= i; ++k) s += u[k + i * n] * u[k + j * n];
        worst = std::max(worst, std::abs(s - a[i + j * n]) / std::sqrt(a[i + i * n] * a[j + j * n]));
      }
      for (int64_t i = j + 1; i < n; ++i) ASSERT_TRUE(std::isnan(u[i + j * n])) << n << ": wrote below the diagonal";
    }
    EXPECT_LT(worst, 1e-13) << "n=" << n << ": UᵀU differs from A";
    std::vector<double> x = u;
    ASSERT_TRUE(test::with_threads(2, [&] { return cpu::trtri_upper(x.data(), n); })) << n;
    worst = 0;
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i <= j; ++i) {
        double s = 0;  // (U X)_ij = Σ_{i≤k≤j} U_ik X_kj
        for (int64_t k = i; k <= j; ++k) s += u[i + k * n] * x[k + j * n];
        worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
      }
      for (int64_t i = j + 1; i < n; ++i) ASSERT_TRUE(std::isnan(x[i + j * n])) << n << ": wrote below the diagonal";
    }
    EXPECT_LT(worst, 1e-12) << "n=" << n << ": U·U⁻¹ differs from I";
  }
}

TEST(CpuCholesky, FailuresAreReported) {
  // A negative pivot in the second block: not positive definite.
  const int64_t n = 600;
  std::vector<double> a = spd(n, 3);
  a[400 + 400 * n] = -1.0;
  EXPECT_FALSE(test::with_threads(2, [&] { return cpu::potrf_upper(a.data(), n); }));
  // A zero on the diagonal: singular.
  std::vector<double> u = spd(n, 4);
  ASSERT_TRUE(cpu::potrf_upper(u.data(), n));
  u[300 + 300 * n] = 0.0;
  EXPECT_FALSE(cpu::trtri_upper(u.data(), n));
}

TEST(CpuCholesky, BitsDoNotDependOnTheThreadCount) {
  const int64_t n = 700;
  const std::vector<double> a = spd(n, 9);
  auto factor = [&](int threads) {
    std::vector<double> u = a;
    EXPECT_TRUE(
        test::with_threads(threads, [&] { return cpu::potrf_upper(u.data(), n) && cpu::trtri_upper(u.data(), n); }));
    return u;
  };
  const std::vector<double> one = factor(1);
  for (int threads : {2, 3, 4})
    EXPECT_EQ(std::memcmp(one.data(), factor(threads).data(), one.size() * sizeof(double)), 0)
        << threads << " threads give other bits than one";
}

// cpu::attention_row's arithmetic written out one operation at a time: 16 partial sums of products in order of d,
// reduced 8 + 4 + 2 + 1, no fused multiply-add; softmax and the weighted sum in order of the rows.
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("fp-contract=off")))
#endif
std::vector<float> attention_scalar(const std::vector<float>& q, const std::vector<cpu::AttentionRun>& runs,
                                    int64_t hd, int64_t stride, float scale) {
  std::vector<float> s;
  for (const cpu::AttentionRun& r : runs)
    for (int64_t t = 0; t < r.rows; ++t) {
      float p[16] = {};
      for (int64_t d = 0; d < hd; ++d) p[d % 16] = p[d % 16] + q[static_cast<size_t>(d)] * r.keys[t * stride + d];
      for (int w = 8; w > 0; w /= 2)
        for (int j = 0; j < w; ++j) p[j] = p[j] + p[j + w];
      s.push_back(p[0] * scale);
    }
  float mx = -INFINITY, sum = 0.0f;
  for (float v : s) mx = std::max(mx, v);
  for (float& v : s) sum += (v = std::exp(v - mx));
  std::vector<float> out(static_cast<size_t>(hd), 0.0f);
  size_t k = 0;
  for (const cpu::AttentionRun& r : runs)
    for (int64_t t = 0; t < r.rows; ++t, ++k) {
      const float w = s[k] / sum;
      for (int64_t d = 0; d < hd; ++d) out[static_cast<size_t>(d)] += w * r.values[t * stride + d];
    }
  return out;
}

// The attention row kernel (cloned for AVX2 and AVX-512) gives the bits of the scalar arithmetic above on this CPU,
// for head sizes it specializes (64, 128) and others, over one or two runs of rows; and it is softmax attention:
// within fp32 rounding of an fp64 reference.
TEST(CpuAttention, RowMatchesItsScalarArithmeticBitForBit) {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd;
  for (const int64_t hd : {64, 128, 40, 8}) {
    const int64_t stride = 3 * hd + 5, rows_a = 37, rows_b = 300;
    std::vector<float> q(static_cast<size_t>(hd)), ka(static_cast<size_t>(rows_a * stride)),
        va(ka.size()), kb(static_cast<size_t>(rows_b * stride)), vb(kb.size());
    for (auto* v : {&q, &ka, &va, &kb, &vb})
      for (float& x : *v) x = nd(rng);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    for (const bool two : {false, true}) {
      SCOPED_TRACE("hd " + std::to_string(hd) + (two ? ", two runs" : ", one run"));
      std::vector<cpu::AttentionRun> runs = {{kb.data(), vb.data(), rows_b}};
      if (two) runs.insert(runs.begin(), {ka.data(), va.data(), rows_a});
      std::vector<float> scores(static_cast<size_t>(rows_a + rows_b)), out(static_cast<size_t>(hd), std::nanf(""));
      cpu::attention_row(q.data(), hd, scale, runs.data(), static_cast<int>(runs.size()), stride, scores.data(),
                         out.data());
      const std::vector<float> want = attention_scalar(q, runs, hd, stride, scale);
      EXPECT_EQ(std::memcmp(out.data(), want.data(), out.size() * sizeof(float)), 0);
      // fp64 softmax attention.
      std::vector<double> s, o(static_cast<size_t>(hd), 0.0);
      for (const cpu::AttentionRun& r : runs)
        for (int64_t t = 0; t < r.rows; ++t) {
          double d = 0;
          for (int64_t j = 0; j < hd; ++j) d += static_cast<double>(q[static_cast<size_t>(j)]) * r.keys[t * stride + j];
          s.push_back(d * scale);
        }
      double mx = -INFINITY, sum = 0;
      for (double v : s) mx = std::max(mx, v);
      for (double& v : s) sum += (v = std::exp(v - mx));
      size_t k = 0;
      for (const cpu::AttentionRun& r : runs)
        for (int64_t t = 0; t < r.rows; ++t, ++k)
          for (int64_t j = 0; j < hd; ++j) o[static_cast<size_t>(j)] += s[k] / sum * r.values[t * stride + j];
      for (int64_t j = 0; j < hd; ++j) EXPECT_NEAR(out[static_cast<size_t>(j)], o[static_cast<size_t>(j)], 2e-5) << j;
    }
  }
}

// test_main.cpp calls select_blas_kernels, as every nibble binary's main does: on a CPU with AVX2 and FMA, OpenBLAS
// must not run its pre-AVX kernels (0.3.21 falls back to Prescott's on VMs that report a generic Xeon model), unless
// the user chose a core.
TEST(CpuDense, OpenBlasRunsTheCpusVectorKernels) {
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) GTEST_SKIP() << "no AVX2 + FMA";
  // select_blas_kernels sets SkylakeX or Haswell itself, and leaves any other choice alone.
  const std::string chosen = std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "";
  if (!chosen.empty() && chosen != "SkylakeX" && chosen != "Haswell") GTEST_SKIP() << "OPENBLAS_CORETYPE=" << chosen;
  const std::string core = openblas_get_corename();
  for (const char* old : {"Katmai", "Coppermine", "Northwood", "Prescott", "Banias", "Atom", "Core2", "Penryn",
                          "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3", "Barcelona", "Nano"})
    EXPECT_NE(core, old) << "OPENBLAS_CORETYPE=" << chosen;
}

}  // namespace
}  // namespace nibble
