// GPTQ on the GPU (include/nibble/cuda_gptq.h) against the CPU reference
// (include/nibble/gptq.h) on correlated synthetic inputs. Compiled whenever
// the build has CUDA; run where a GPU is present, skipped elsewhere.
#include <gtest/gtest.h>

#ifdef NIBBLE_HAVE_CUDA

#include <cmath>
#include <cstring>
#include <random>

#include "nibble/cuda_gptq.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/gptq.h"
#include "nibble/quantizer.h"
#include "test_util.h"

namespace nibble {
namespace {

using quant::GptqOptions;
using quant::GptqResult;
using quant::MatrixStats;

// X [tokens, cols] as bench/bench_gptq.cpp makes it: each token a mix of a few
// shared random factors plus 30 % independent noise, each input channel with
// its own scale, log-uniform over 0.1 .. 10 (so act-order has work to do).
std::vector<float> correlated_inputs(int64_t tokens, int64_t cols, uint64_t seed, int factors = 8) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> F(static_cast<size_t>(tokens * factors)), L(static_cast<size_t>(factors * cols)), scale(cols);
  for (auto& v : F) v = n01(rng);
  for (auto& v : L) v = n01(rng) / std::sqrt(static_cast<float>(factors));
  for (auto& s : scale) s = std::pow(10.0f, u(rng));
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      float s = 0.3f * n01(rng);
      for (int k = 0; k < factors; ++k) s += F[t * factors + k] * L[k * cols + j];
      x[t * cols + j] = scale[j] * s;
    }
  return x;
}

using test::randn;

MatrixStats stats_of(const std::vector<float>& x, int64_t tokens, int64_t cols) {
  MatrixStats s(cols);
  s.add(x.data(), tokens);
  s.finalize();
  return s;
}

// ‖X (Q − W)ᵀ‖² in fp64.
double output_sq_error(const std::vector<float>& x, int64_t tokens, const std::vector<float>& w,
                       const std::vector<float>& q, int64_t rows, int64_t cols) {
  double out = 0;
  std::vector<double> d(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) d[j] = static_cast<double>(q[r * cols + j]) - w[r * cols + j];
    for (int64_t t = 0; t < tokens; ++t) {
      double s = 0;
      for (int64_t j = 0; j < cols; ++j) s += x[t * cols + j] * d[j];
      out += s * s;
    }
  }
  return out;
}

// max over rows of max_j |A_ij − B_ij| / max_j |B_ij| (rows of U span orders of magnitude).
double max_row_rel_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t n) {
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    double num = 0, den = 0;
    for (int64_t j = 0; j < n; ++j) {
      num = std::max(num, std::abs(static_cast<double>(a[i * n + j]) - b[i * n + j]));
      den = std::max(den, std::abs(static_cast<double>(b[i * n + j])));
    }
    worst = std::max(worst, den > 0 ? num / den : num);
  }
  return worst;
}

TEST(Cuda, GptqHessianMatchesFp64Stats) {
  SKIP_WITHOUT_DEVICE();
  const int64_t C = 384, T = 9000;  // past two f32 flushes (kHessianFlushTokens) and ragged chunks
  const auto x = correlated_inputs(T, C, 1);
  const MatrixStats ref = stats_of(x, T, C);
  // Normalized by √(H_ii H_jj): the scale every entry of H is compared with.
  auto worst_diff = [&](const MatrixStats& s) {
    double worst = 0;
    for (int64_t i = 0; i < C; ++i)
      for (int64_t j = 0; j < C; ++j)
        worst = std::max(worst, std::abs(s.H[i * C + j] - ref.H[i * C + j]) /
                                    std::sqrt(ref.H[i * C + i] * ref.H[j * C + j]));
    return worst;
  };
  // Bounds: fp64 sums differ only in order (measured 1e-15); f32 sums of at
  // most 4096 terms stay below ~1e-5 of the scale (measured 1.2e-6); bf16
  // inputs carry 2⁻⁹ relative rounding per factor (measured 1.5e-4).
  const std::pair<cuda::HessianPrecision, double> modes[] = {
      {cuda::HessianPrecision::F64, 1e-12}, {cuda::HessianPrecision::F32, 1e-5}, {cuda::HessianPrecision::BF16, 1e-2}};
  for (const auto& [prec, bound] : modes) {
    cuda::GpuHessian h(C, prec);
    // Uneven pieces, one with a row stride wider than the row.
    h.add(x.data(), 1000);
    h.add(x.data() + 1000 * C, 5000);
    std::vector<float> padded(static_cast<size_t>((T - 6000) * (C + 5)));
    for (int64_t t = 0; t < T - 6000; ++t) std::memcpy(&padded[t * (C + 5)], &x[(6000 + t) * C], C * sizeof(float));
    h.add(padded.data(), T - 6000, C + 5);
    const MatrixStats s = h.to_stats();
    EXPECT_EQ(s.tokens, T);
    const double d = worst_diff(s);
    std::printf("[ hessian %s ] max |H_gpu - H_cpu| / sqrt(H_ii H_jj) = %.3e\n", cuda::hessian_precision_name(prec), d);
    EXPECT_LE(d, bound) << cuda::hessian_precision_name(prec);
    for (int64_t i = 0; i < C; ++i) {
      for (int64_t j = i + 1; j < C; ++j) ASSERT_EQ(s.H[i * C + j], s.H[j * C + i]) << "H symmetric at " << i << "," << j;
      ASSERT_NEAR(s.abs_sum[i], ref.abs_sum[i], 1e-12 * ref.abs_sum[i]);
      ASSERT_EQ(s.abs_max[i], ref.abs_max[i]);
    }
  }
}

TEST(Cuda, GptqPreparedHessianMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  for (const int64_t C : {int64_t{512}, int64_t{384}}) {
    auto x = correlated_inputs(2 * C, C, 2 + C);
    for (int64_t t = 0; t < 2 * C; ++t) x[t * C + 7] = 0.0f;  // a dead input
    const MatrixStats s = stats_of(x, 2 * C, C);
    for (bool act : {false, true}) {
      GptqOptions o;
      o.act_order = act;
      const quant::PreparedHessian cpu = quant::prepare_hessian(s, o);
      const quant::PreparedHessian gpu = cuda::prepare_hessian(s, o).to_host();
      EXPECT_EQ(gpu.perm, cpu.perm);
      EXPECT_EQ(gpu.dead, cpu.dead);
      EXPECT_EQ(gpu.dead_columns, 1);
      EXPECT_EQ(gpu.damp_used, cpu.damp_used);
      EXPECT_EQ(gpu.lambda, cpu.lambda);
      EXPECT_EQ(gpu.damp_retries, cpu.damp_retries);
      // Both factor in fp64 (different blocking); U is then rounded to f32.
      const double d = max_row_rel_diff(gpu.U, cpu.U, C);
      std::printf("[ prepare C=%lld act=%d ] max row-relative |U_gpu - U_cpu| = %.3e\n", static_cast<long long>(C), act, d);
      EXPECT_LE(d, 1e-4) << "C=" << C << " act=" << act;
    }
  }
  // An indefinite "Hessian" (eigenvalues 4 and -2): damping raised ×10 three
  // times, as on the CPU; with two retries allowed it fails with the CPU's message.
  MatrixStats bad(2);
  bad.H = {1, 3, 3, 1};
  bad.tokens = 2;
  const cuda::GpuPreparedHessian p = cuda::prepare_hessian(bad, {});
  EXPECT_EQ(p.damp_retries, 3);
  EXPECT_DOUBLE_EQ(p.damp_used, 10.0);
  GptqOptions two;
  two.max_damp_retries = 2;
  EXPECT_NE(test::error_of([&] { cuda::prepare_hessian(bad, two); }).find("not positive definite"), std::string::npos);
}

struct SweepCase {
  int64_t rows, cols;
  int group;
  bool mse, act_order, dead;
};

// Compares a GPU result with the CPU's: the bounds of the issue (codes equal on
// ≥ 99.9 % of entries, others one step apart, since the trailing GEMM's f32
// summation order can flip exact near-ties; cost and output error close).
void expect_close_to_cpu(const GptqResult& gpu, const GptqResult& cpu, const std::vector<float>& x, int64_t tokens,
                         const std::vector<float>& w, int64_t g, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(gpu.codes.size(), cpu.codes.size());
  ASSERT_EQ(gpu.params.size(), cpu.params.size());
  int64_t differ = 0, far = 0;
  for (size_t i = 0; i < cpu.codes.size(); ++i) {
    const int d = std::abs(int(gpu.codes[i]) - int(cpu.codes[i]));
    differ += d != 0;
    far += d > 1;
  }
  int64_t params_differ = 0;
  for (size_t i = 0; i < cpu.params.size(); ++i)
    params_differ += gpu.params[i].scale != cpu.params[i].scale || gpu.params[i].min != cpu.params[i].min;
  const double gpu_out = output_sq_error(x, tokens, w, gpu.dequant, gpu.rows, gpu.cols);
  const double cpu_out = output_sq_error(x, tokens, w, cpu.dequant, cpu.rows, cpu.cols);
  std::printf("[ %s ] codes differing %lld / %zu (%lld by more than 1), group params differing %lld / %zu, "
              "cost rel diff %.2e, output error rel diff %.2e\n",
              what.c_str(), static_cast<long long>(differ), cpu.codes.size(), static_cast<long long>(far),
              static_cast<long long>(params_differ), cpu.params.size(),
              std::abs(gpu.sweep_cost - cpu.sweep_cost) / cpu.sweep_cost, std::abs(std::sqrt(gpu_out / cpu_out) - 1));
  EXPECT_LE(static_cast<double>(differ), 1e-3 * static_cast<double>(cpu.codes.size()));
  EXPECT_EQ(far, 0);
  EXPECT_NEAR(gpu.sweep_cost, cpu.sweep_cost, 1e-3 * cpu.sweep_cost);
  EXPECT_NEAR(std::sqrt(gpu_out), std::sqrt(cpu_out), 5e-3 * std::sqrt(cpu_out));
  EXPECT_EQ(gpu.damp_used, cpu.damp_used);
  EXPECT_EQ(gpu.lambda, cpu.lambda);
  EXPECT_EQ(gpu.dead_columns, cpu.dead_columns);
  // Where code and parameters agree, the dequantized value is the CPU's bit for bit. (Group size g, not the
  // columns over the groups per row: 200 columns in 7 groups of 32 give 29, which checked values against another
  // group's parameters. That went unseen while every group's parameters agreed; int4_asym_f32's fp32 fits differ
  // by ulps in a few groups, where the trailing GEMMs' roundings differ, and a value of such a group failed.)
  const int64_t gpr = cpu.params.size() / cpu.rows;
  ASSERT_EQ(gpr, (cpu.cols + g - 1) / g);
  for (int64_t r = 0; r < cpu.rows; ++r)
    for (int64_t c = 0; c < cpu.cols; ++c) {
      const size_t i = r * cpu.cols + c, k = r * gpr + c / g;
      if (gpu.codes[i] == cpu.codes[i] && gpu.params[k].scale == cpu.params[k].scale &&
          gpu.params[k].min == cpu.params[k].min) {
        ASSERT_EQ(gpu.dequant[i], cpu.dequant[i]) << r << "," << c;
      }
    }
}

TEST(Cuda, GptqSweepMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const SweepCase cases[] = {
      {256, 512, 128, false, false, false}, {256, 512, 128, true, false, false}, {256, 512, 32, false, false, true},
      {300, 384, 32, true, false, false},   {300, 384, 64, false, true, true},   {300, 384, 128, true, true, false},
      {64, 200, 32, true, false, true},  // a ragged last block and group
  };
  for (const std::string family : {"int4_asym", "int4_sym", "int4_asym_f32"}) {
    for (const SweepCase& k : cases) {
      const int64_t T = 2 * k.cols;
      auto x = correlated_inputs(T, k.cols, 100 + k.cols);
      if (k.dead)
        for (int64_t t = 0; t < T; ++t) x[t * k.cols + 3] = 0.0f;
      const auto w = randn(k.rows * k.cols, 200 + k.rows, 0.02f);
      const MatrixStats s = stats_of(x, T, k.cols);
      GptqOptions o;
      o.act_order = k.act_order;
      const FormatChoice f = find_format(family, k.group);
      const GptqResult cpu = quant::gptq(w.data(), k.rows, k.cols, s, *quant::make_format_grid(f, k.mse), o);
      const std::string what = fmt::format("{} {}x{} g{}{}{}{}", family, k.rows, k.cols, k.group, k.mse ? " mse" : "",
                                           k.act_order ? " act-order" : "", k.dead ? " dead" : "");
      // The whole solve on the GPU, and the GPU sweep on the CPU's own U.
      const GptqResult gpu = cuda::gptq(w.data(), k.rows, k.cols, cuda::prepare_hessian(s, o), f, k.mse, o);
      expect_close_to_cpu(gpu, cpu, x, T, w, k.group, what + " (gpu U)");
      const GptqResult same_u =
          cuda::gptq(w.data(), k.rows, k.cols, cuda::upload(quant::prepare_hessian(s, o), T), f, k.mse, o);
      expect_close_to_cpu(same_u, cpu, x, T, w, k.group, what + " (cpu U)");
      // The dead input's weights were zeroed before the sweep: each one is the
      // group's nearest value to 0, whatever the codes around it became.
      if (k.dead)
        for (int64_t r = 0; r < k.rows; ++r) {
          const GroupParams& p = gpu.params[r * ((k.cols + k.group - 1) / k.group)];
          const FormatSpec& fs = *f.spec;
          ASSERT_EQ(gpu.dequant[r * k.cols + 3], fs.decode(fs.encode(0.0f, p), p)) << "row " << r;
        }
    }
  }
}

// With H = I the updates add exact zeros, so every code, parameter and value
// must equal the CPU's bit for bit: the group fit, the --mse search (order,
// ties), the bf16 rounding and the encode/decode arithmetic. The sweep runs on
// the CPU's own U: the signs of U's zero off-diagonal entries (which cuSOLVER
// and LAPACK may choose differently) reach a −0 weight through w − e·u. The
// signed zeros sit in the first block, which no GEMM has touched.
TEST(Cuda, GptqIdentityHessianBitExactWithCpu) {
  SKIP_WITHOUT_DEVICE();
  const int64_t R = 40, C = 200;  // ragged last group for every group size
  auto w = randn(R * C, 11, 0.02f);
  for (int64_t c = 0; c < 128; ++c) w[1 * C + c] = 0.0f;                 // zeros
  for (int64_t c = 0; c < 128; ++c) w[2 * C + c] = -0.0f;                // negative zeros
  for (int64_t c = 0; c < 64; ++c) w[3 * C + c] = c % 3 ? -0.0f : 0.0f;  // mixed signed zeros
  for (int64_t c = 0; c < C; ++c) w[4 * C + c] = 0.125f;                 // a constant row (scale 0)
  for (int64_t c = 0; c < C; c += 17) w[5 * C + c] = 0.4f;               // outliers
  for (int64_t c = 0; c < C; ++c) w[6 * C + c] *= 1e-4f;                 // int4_sym: f16 subnormal scales
  MatrixStats s(C);
  for (int64_t j = 0; j < C; ++j) s.H[j * C + j] = 1.0;
  s.tokens = 1;
  for (const std::string family : {"int4_asym", "int4_sym", "int4_asym_f32"}) {
    for (int g : {32, 64, 128})
      for (bool mse : {false, true})
        for (bool act : {false, true}) {
          SCOPED_TRACE(fmt::format("{} g={} mse={} act={}", family, g, mse, act));
          GptqOptions o;
          o.act_order = act;
          const FormatChoice f = find_format(family, g);
          const quant::PreparedHessian prep = quant::prepare_hessian(s, o);
          const GptqResult cpu = quant::gptq(w.data(), R, C, prep, *quant::make_format_grid(f, mse), o);
          const GptqResult gpu = cuda::gptq(w.data(), R, C, cuda::upload(prep, 1), f, mse, o);
          ASSERT_EQ(gpu.codes, cpu.codes);
          ASSERT_EQ(std::memcmp(gpu.dequant.data(), cpu.dequant.data(), cpu.dequant.size() * 4), 0);
          ASSERT_EQ(gpu.params.size(), cpu.params.size());
          for (size_t k = 0; k < cpu.params.size(); ++k) {
            ASSERT_EQ(std::memcmp(&gpu.params[k].scale, &cpu.params[k].scale, 4), 0) << k;
            ASSERT_EQ(std::memcmp(&gpu.params[k].min, &cpu.params[k].min, 4), 0) << k;
          }
          EXPECT_NEAR(gpu.sweep_cost, cpu.sweep_cost, 1e-12 * cpu.sweep_cost);
          // The GPU's own factorization of a diagonal matrix is exact too.
          const quant::PreparedHessian gprep = cuda::prepare_hessian(s, o).to_host();
          for (int64_t j = 0; j < C; ++j) ASSERT_EQ(gprep.U[j * C + j], prep.U[j * C + j]) << j;
        }
  }
}

// The whole GPU path: H accumulated on the GPU (default precision, fp64), prepared
// there without a host copy, then the sweep; the output error stays the CPU's.
TEST(Cuda, GptqFromGpuHessianMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const int64_t R = 256, C = 512, T = 1024;
  const auto x = correlated_inputs(T, C, 7);
  const auto w = randn(R * C, 8, 0.02f);
  const MatrixStats s = stats_of(x, T, C);
  cuda::GpuHessian h(C);
  h.add(x.data(), T);
  const FormatChoice f = find_format("int4_asym", 128);
  for (bool mse : {false, true}) {
    const GptqResult cpu = quant::gptq(w.data(), R, C, s, *quant::make_format_grid(f, mse), {});
    const GptqResult gpu = cuda::gptq(w.data(), R, C, cuda::prepare_hessian(h, {}), f, mse, {});
    const double cpu_out = output_sq_error(x, T, w, cpu.dequant, R, C);
    const double gpu_out = output_sq_error(x, T, w, gpu.dequant, R, C);
    EXPECT_NEAR(std::sqrt(gpu_out), std::sqrt(cpu_out), 5e-3 * std::sqrt(cpu_out)) << "mse=" << mse;
    EXPECT_NEAR(gpu.sweep_cost, cpu.sweep_cost, 1e-3 * cpu.sweep_cost) << "mse=" << mse;
  }
}

// The registered `gptq` method with device "cuda": the GPU solve behind the
// Quantizer interface, and a clear error for formats it does not implement.
TEST(Cuda, GptqQuantizerDeviceCuda) {
  SKIP_WITHOUT_DEVICE();
  const int64_t R = 96, C = 256, T = 512;
  const auto x = correlated_inputs(T, C, 9);
  const auto w = randn(R * C, 10, 0.02f);
  const MatrixStats s = stats_of(x, T, C);
  const FormatChoice f = find_format("int4_asym", 64);
  quant::QuantizerConfig c{f, true, false, 0.01, "cuda"};
  const auto q = quant::find_method("gptq").make(c);
  Tensor wt = Tensor::zeros(DType::F32, {R, C});
  std::memcpy(wt.data_mut<float>(), w.data(), w.size() * 4);
  quant::QuantizeInfo info;
  const QuantizedMatrix m = q->quantize(wt, &s, &info);
  const GptqResult direct = cuda::gptq(w.data(), R, C, cuda::prepare_hessian(s, {}), f, true, {});
  EXPECT_EQ(m.codes, direct.codes);
  EXPECT_EQ(info.damp_used, 0.01);
  EXPECT_EQ(m.format, f.spec);
  EXPECT_EQ(m.group_size, 64);
  // Again on the same statistics (the prepared Hessian is reused).
  EXPECT_EQ(q->quantize(wt, &s, nullptr).codes, m.codes);

  // int4_sym (the GPTQ community's layout) takes the same path.
  const FormatChoice fs = find_format("int4_sym", 128);
  quant::QuantizerConfig sym{fs, true, true, 0.01, "cuda"};
  const QuantizedMatrix ms = quant::find_method("gptq").make(sym)->quantize(wt, &s, nullptr);
  GptqOptions act;
  act.act_order = true;
  EXPECT_EQ(ms.codes, cuda::gptq(w.data(), R, C, cuda::prepare_hessian(s, act), fs, true, act).codes);
  EXPECT_EQ(ms.format, fs.spec);

  quant::QuantizerConfig other{find_format("int8_channel_sym", 0), false, false, 0.01, "cuda"};
  const std::string e = test::error_of([&] { quant::find_method("gptq").make(other); });
  EXPECT_NE(e.find("int4_asym, int4_sym and int4_asym_f32"), std::string::npos) << e;
  EXPECT_NE(e.find("--device cpu"), std::string::npos) << e;
  // --refine's formats on the GPU, and its message for the others.
  std::string why;
  EXPECT_TRUE(cuda::refine_supports(fs, &why));
  EXPECT_FALSE(cuda::refine_supports(find_format("nvfp4", 0), &why));
  // int4_asym_f32: the sweep, not --refine (whose fp32 refits keep taking ever smaller steps).
  EXPECT_TRUE(cuda::gptq_supports(find_format("int4_asym_f32", 32), &why));
  EXPECT_FALSE(cuda::refine_supports(find_format("int4_asym_f32", 32), &why));
  EXPECT_NE(why.find("--refine on the GPU supports int4_asym and int4_sym"), std::string::npos) << why;
}

}  // namespace
}  // namespace nibble

#endif  // NIBBLE_HAVE_CUDA
