// The dense f32 GEMM behind the CPU forward (cpu::gemm_f32, OpenBLAS): its
// products against a scalar fp64 reference, and its bits independent of the
// number of threads, so that calibrated quantization (whose Hessians come from
// the forward's activations) writes the same checkpoint on any core count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"

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
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  std::vector<float> y(static_cast<size_t>(p.M * p.N), std::nanf(""));
  cpu::gemm_f32(p.x.data(), p.M, p.w.data(), p.N, p.K, y.data());
  omp_set_num_threads(saved);
  return y;
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

}  // namespace
}  // namespace nibble
