// GPTQ and the grids against independent references: RTN on an identity
// Hessian, the literature's two-input worked example, the algorithm's own
// cost identity (per-step costs add up to the damped output error), and the
// behaviour the paper predicts on correlated inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/quantizer.h"
#include "test_util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda.h"
#endif

namespace nibble::quant {
namespace {

using test::randn;

// X [tokens, cols] = a few shared factors plus a little noise, with per-column
// scales spread over two orders of magnitude (so act-order has work to do).
std::vector<float> correlated_inputs(int64_t tokens, int64_t cols, uint64_t seed, int factors = 4) {
  const auto f = randn(tokens * factors, seed), mix = randn(factors * cols, seed + 1), noise = randn(tokens * cols, seed + 2, 0.05f);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      float s = noise[t * cols + j];
      for (int k = 0; k < factors; ++k) s += f[t * factors + k] * mix[k * cols + j];
      x[t * cols + j] = s * std::pow(10.0f, static_cast<float>(j % 7) / 3.0f - 1.0f);
    }
  return x;
}

// ‖X Δᵀ‖² and ‖Δ‖² for Δ = Q − W, in double.
std::pair<double, double> errors(const std::vector<float>& x, int64_t tokens, const float* w, const std::vector<float>& q,
                                 int64_t rows, int64_t cols) {
  double out = 0, wt = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 0; t < tokens; ++t) {
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) s += static_cast<double>(x[t * cols + j]) * (q[r * cols + j] - w[r * cols + j]);
      out += s * s;
    }
    for (int64_t j = 0; j < cols; ++j) wt += std::pow(static_cast<double>(q[r * cols + j]) - w[r * cols + j], 2);
  }
  return {out, wt};
}

MatrixStats stats_of(const std::vector<float>& x, int64_t tokens, int64_t cols) {
  MatrixStats s(cols);
  s.add(x.data(), tokens);
  s.finalize();
  return s;
}

TEST(Gptq, StatsMatchNaiveAccumulation) {
  // More tokens than one fp64 chunk; 600 inputs are three tiles of H's upper triangle per side (256, 256, 88).
  for (const int64_t C : {37, 600}) {
    const int64_t T = 300;
    const auto x = randn(T * C, 7);
    MatrixStats s(C);
    s.add(x.data(), 100);
    s.add(x.data() + 100 * C, T - 100);
    s.finalize();
    EXPECT_EQ(s.tokens, T);
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < C; ++j) {
        double ref = 0;
        for (int64_t t = 0; t < T; ++t) ref += static_cast<double>(x[t * C + i]) * x[t * C + j];
        ASSERT_NEAR(s.H[i * C + j], ref, 1e-9 * (1 + std::abs(ref))) << C << ": " << i << "," << j;
      }
  }
}

// MatrixStats::add updates H by fixed tiles, each one single-threaded OpenBLAS call, so H has the same bits on any
// number of threads, as the rest of calibration has (test_cpu_dense.cpp, Gptq.QwenWritesTheSameBytesOnAnyThreadCount).
// One threaded DSYRK over H did too with OpenBLAS's Prescott kernels, and not with its SkylakeX ones (session 66).
TEST(Gptq, StatsDoNotDependOnTheThreadCount) {
  const int64_t T = 300, C = 1500;
  const auto x = randn(T * C, 11);
  auto hessian = [&] {
    MatrixStats s(C);
    s.add(x.data(), T);
    return s.H;
  };
  EXPECT_TRUE(test::with_threads(1, hessian) == test::with_threads(2, hessian));
}

TEST(Gptq, IdentityHessianGivesRtnCodes) {
  const int64_t R = 24, C = 200;  // ragged last group for every group size
  const auto w = randn(R * C, 11, 0.02f);
  MatrixStats s(C);
  for (int64_t j = 0; j < C; ++j) s.H[j * C + j] = 1.0;
  s.tokens = 1;
  for (int g : {32, 64, 128}) {
    for (bool mse : {false, true}) {
      for (bool act : {false, true}) {
        const auto grid = make_format_grid(find_format("int4_asym", g), mse);
        GptqOptions o;
        o.act_order = act;
        const GptqResult a = gptq(w.data(), R, C, s, *grid, o);
        const GptqResult b = rtn(w.data(), R, C, *grid);
        ASSERT_EQ(a.codes, b.codes) << "g=" << g << " mse=" << mse << " act=" << act;
        ASSERT_EQ(a.dequant, b.dequant);
        for (size_t k = 0; k < a.params.size(); ++k) {
          ASSERT_EQ(a.params[k].scale, b.params[k].scale);
          ASSERT_EQ(a.params[k].min, b.params[k].min);
        }
      }
    }
  }
  // And the plain RTN of the method registry is the same quantizer.
  const auto grid = make_format_grid(find_format("int4_asym", 64), false);
  const QuantizedMatrix q = quantize_rtn(find_format("int4_asym", 64), w.data(), R, C);
  EXPECT_EQ(q.codes, rtn(w.data(), R, C, *grid).codes);
}

TEST(Gptq, LiteratureWorkedExample) {
  // Two input channels over four tokens; one output; grid step 0.25.
  const std::vector<float> x = {1, 1, 2, 1.8f, -1, -1.2f, 0.5f, 0.6f};  // [4 tokens, 2 inputs]
  const std::vector<float> w = {0.62f, 0.37f};
  const MatrixStats s = stats_of(x, 4, 2);
  const auto grid = make_uniform_grid(0.25f);
  const GptqResult r = rtn(w.data(), 1, 2, *grid);
  EXPECT_FLOAT_EQ(r.dequant[0], 0.5f);
  EXPECT_FLOAT_EQ(r.dequant[1], 0.25f);
  EXPECT_NEAR(errors(x, 4, w.data(), r.dequant, 1, 2).first, 0.3527, 5e-4);
  const GptqResult g = gptq(w.data(), 1, 2, s, *grid, {});
  EXPECT_FLOAT_EQ(g.dequant[0], 0.5f);
  EXPECT_FLOAT_EQ(g.dequant[1], 0.5f);
  EXPECT_NEAR(errors(x, 4, w.data(), g.dequant, 1, 2).first, 0.00176, 2e-5);
  EXPECT_TRUE(g.codes.empty());
}

TEST(Gptq, CorrelatedInputsTradeWeightErrorForOutputError) {
  const int64_t R = 64, C = 256, T = 512;
  const auto w = randn(R * C, 21, 0.05f);
  const auto x = correlated_inputs(T, C, 22);
  const MatrixStats s = stats_of(x, T, C);
  for (int g : {64, 128}) {
    const auto grid = make_format_grid(find_format("int4_asym", g), false);
    const GptqResult q = gptq(w.data(), R, C, s, *grid, {});
    const GptqResult r = rtn(w.data(), R, C, *grid);
    const auto [qo, qw] = errors(x, T, w.data(), q.dequant, R, C);
    const auto [ro, rw] = errors(x, T, w.data(), r.dequant, R, C);
    EXPECT_LT(qo, 0.5 * ro) << "g=" << g;  // output error well below RTN's
    EXPECT_GT(qw, rw) << "g=" << g;        // bought with larger weight error
    GptqOptions act;
    act.act_order = true;
    const GptqResult a = gptq(w.data(), R, C, s, *grid, act);
    EXPECT_LT(errors(x, T, w.data(), a.dequant, R, C).first, ro) << "act-order g=" << g;
  }
}

TEST(Gptq, SweepCostsAddUpToTheDampedOutputError) {
  const int64_t R = 16, C = 200, T = 400;  // C not a multiple of the group or block
  const auto w = randn(R * C, 31, 0.05f);
  const auto x = correlated_inputs(T, C, 32, 8);
  const MatrixStats s = stats_of(x, T, C);
  for (bool act : {false, true}) {
    for (int g : {32, 128}) {
      GptqOptions o;
      o.act_order = act;
      const auto grid = make_format_grid(find_format("int4_asym", g), true);
      const GptqResult q = gptq(w.data(), R, C, s, *grid, o);
      const auto [out, wt] = errors(x, T, w.data(), q.dequant, R, C);
      const double total = out + q.lambda * wt;
      EXPECT_NEAR(q.sweep_cost, total, 2e-3 * total) << "act=" << act << " g=" << g;
      // Lazy blocks change the order of arithmetic, not the algorithm.
      o.block_size = 128 * 3;
      const GptqResult wide = gptq(w.data(), R, C, s, *grid, o);
      const double total_wide = errors(x, T, w.data(), wide.dequant, R, C).first;
      EXPECT_NEAR(total_wide, out, 1e-2 * out);
    }
  }
  // The uniform grid too (no groups, no clamp).
  const auto grid = make_uniform_grid(0.02f);
  const GptqResult q = gptq(w.data(), R, C, s, *grid, {});
  const auto [out, wt] = errors(x, T, w.data(), q.dequant, R, C);
  EXPECT_NEAR(q.sweep_cost, out + q.lambda * wt, 2e-3 * (out + q.lambda * wt));
}

TEST(Gptq, DampingIsRaisedWhenCholeskyFailsAndReported) {
  // An indefinite "Hessian" (eigenvalues 4 and -2): damping 0.01, 0.1 and 1
  // fail, 10 succeeds.
  MatrixStats s(2);
  s.H = {1, 3, 3, 1};
  s.tokens = 2;
  const std::vector<float> w = {0.3f, -0.2f};
  const auto grid = make_uniform_grid(0.25f);
  const GptqResult r = gptq(w.data(), 1, 2, s, *grid, {});
  EXPECT_EQ(r.damp_retries, 3);
  EXPECT_DOUBLE_EQ(r.damp_used, 10.0);
  GptqOptions o;
  o.max_damp_retries = 2;
  try {
    gptq(w.data(), 1, 2, s, *grid, o);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not positive definite"), std::string::npos) << e.what();
  }
}

TEST(Gptq, DeadInputsAreZeroed) {
  const int64_t R = 4, C = 64, T = 100;
  auto x = randn(T * C, 41);
  for (int64_t t = 0; t < T; ++t) x[t * C + 5] = 0.0f;  // input 5 never fires
  const auto w = randn(R * C, 42, 0.05f);
  const auto grid = make_uniform_grid(0.01f);
  const GptqResult r = gptq(w.data(), R, C, stats_of(x, T, C), *grid, {});
  EXPECT_EQ(r.dead_columns, 1);
  for (int64_t i = 0; i < R; ++i) EXPECT_EQ(r.dequant[i * C + 5], 0.0f);
}

TEST(Gptq, MseRangeSearchNeverLosesToThePlainFit) {
  const FormatSpec& f = *find_format("int4_asym", 32).spec;
  auto w = randn(32 * 50, 51, 0.02f);
  for (int k = 0; k < 50; k += 5) w[k * 32 + 3] = 0.3f;  // outliers in some groups
  auto err = [&](const float* v, const GroupParams& p) {
    double e = 0;
    for (int i = 0; i < 32; ++i) e += std::pow(std::abs(static_cast<double>(v[i]) - f.decode(f.encode(v[i], p), p)), 2.4);
    return e;
  };
  int shrunk = 0;
  for (int k = 0; k < 50; ++k) {
    const float* v = &w[k * 32];
    const GroupParams plain = f.fit_group(v, 32, 1.0f, {}), best = fit_group_mse(f, v, 32);
    EXPECT_LE(err(v, best), err(v, plain));
    // The result is one of the 33 candidates, each the format's own fit.
    bool found = false;
    for (int s = 0; s <= 32 && !found; ++s) {
      const GroupParams c = f.fit_group(v, 32, static_cast<float>(1.0 - 0.4 * s / 32), {});
      found = c.scale == best.scale && c.min == best.min;
    }
    EXPECT_TRUE(found);
    shrunk += best.scale < plain.scale;
  }
  EXPECT_GT(shrunk, 0);
}

TEST(Gptq, BadInputsFailClearly) {
  MatrixStats s(8);
  const std::vector<float> w(4 * 16, 0.1f);
  const auto grid = make_format_grid(find_format("int4_asym", 32), false);
  EXPECT_THROW(gptq(w.data(), 4, 16, s, *grid, {}), Error);  // dims differ
  MatrixStats empty(16);
  EXPECT_THROW(gptq(w.data(), 4, 16, empty, *grid, {}), Error);  // no tokens
  EXPECT_THROW(parse_grid("uniform:step=abc", 128, false), Error);
  EXPECT_THROW(parse_grid("uniform:step=-1", 128, false), Error);
  EXPECT_THROW(parse_grid("int3_nonsense", 128, false), Error);
  EXPECT_NO_THROW(parse_grid("int4_g64_asym", 128, false));
}

// QuantizerConfig::device: "cuda" fails when the quantizer is made (before any
// calibration work) unless the build has CUDA and a device is visible; only
// gptq has a GPU backend. Where a GPU is present, test_cuda_gptq.cpp takes over.
TEST(GptqDevice, CudaFailsClearlyWithoutBackendOrDevice) {
  const FormatChoice f = find_format("int4_asym", 128);
  const QuantizerConfig bad{f, false, false, 0.01, "tpu"};
  EXPECT_NE(test::error_of([&] { find_method("gptq").make(bad); }).find("cpu or cuda"), std::string::npos);
  const QuantizerConfig rtn_cuda{f, false, false, 0.01, "cuda"};
  EXPECT_NE(test::error_of([&] { find_method("rtn").make(rtn_cuda); }).find("only the gptq method"), std::string::npos);
  const QuantizerConfig cuda{f, false, false, 0.01, "cuda"};
#ifdef NIBBLE_HAVE_CUDA
  if (cuda::device_available()) GTEST_SKIP() << "a CUDA device is present (Cuda.Gptq* cover it)";
  const char* expect = "no CUDA device";
#else
  const char* expect = "no CUDA backend";
#endif
  const std::string e = test::error_of([&] { find_method("gptq").make(cuda); });
  EXPECT_NE(e.find(expect), std::string::npos) << e;
  EXPECT_NO_THROW(find_method("gptq").make(QuantizerConfig{f, false, false, 0.01, "cpu"}));
}

}  // namespace
}  // namespace nibble::quant
