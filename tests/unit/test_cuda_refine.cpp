// GPTQ's --refine on the GPU (cuda::refine_device) against an fp64 scalar
// reference of its objective f(Q) = Σ_rows (q − w)ᵀ (H + λI) (q − w) and
// against the CPU's quant::refine from the same GPTQ result. Compiled whenever
// CUDA is on; skipped without a device.
#include "nibble/cuda.h"

#ifdef NIBBLE_HAVE_CUDA

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

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
using test::randn;
using test::TempDir;

// Inputs with a few shared factors (H far from diagonal), each channel with
// its own scale, input 5 never active (a dead input).
MatrixStats correlated_stats(int64_t tokens, int64_t cols, uint64_t seed) {
  const auto f = randn(tokens * 6, seed), mix = randn(6 * cols, seed + 1), noise = randn(tokens * cols, seed + 2, 0.5f);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      float s = noise[t * cols + j];
      for (int k = 0; k < 6; ++k) s += f[t * 6 + k] * mix[k * cols + j];
      x[t * cols + j] = j == 5 ? 0.0f : s * (1.0f + static_cast<float>(j % 7));
    }
  MatrixStats st(cols);
  st.add(x.data(), tokens);
  st.finalize();
  return st;
}

// The scalar reference, fp64: A = H + λI on the live inputs.
struct Objective {
  const MatrixStats& st;
  const quant::PreparedHessian& prep;
  const std::vector<float>& w;
  int64_t cols;
  double a(int64_t i, int64_t j) const {
    if (prep.dead[i] || prep.dead[j]) return 0.0;
    return st.H[i * cols + j] + (i == j ? prep.lambda : 0.0);
  }
  std::vector<double> grad(const float* q, int64_t r) const {
    std::vector<double> g(static_cast<size_t>(cols), 0.0);
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t l = 0; l < cols; ++l) g[j] += a(j, l) * (static_cast<double>(q[l]) - w[r * cols + l]);
    return g;
  }
  double row(const float* q, int64_t r) const {
    const auto g = grad(q, r);
    double s = 0;
    for (int64_t j = 0; j < cols; ++j)
      if (!prep.dead[j]) s += g[j] * (static_cast<double>(q[j]) - w[r * cols + j]);
    return s;
  }
  double total(const std::vector<float>& q, int64_t rows) const {
    double s = 0;
    for (int64_t r = 0; r < rows; ++r) s += row(&q[r * cols], r);
    return s;
  }
};

std::vector<float> decoded(const GptqResult& r, const FormatChoice& f) {
  std::vector<float> v(static_cast<size_t>(r.rows * r.cols));
  dequantize(r.to_quantized(*f.spec, f.group_size), v.data());
  return v;
}

// Both devices refine the same CPU GPTQ result (on the CPU's own prepared
// Hessian): the GPU's report is the reference objective, it reaches a
// coordinate minimum (no single weight lowers f by moving to another code of
// its group), and it lands where the CPU does up to near ties.
TEST(Cuda, RefineMatchesTheCpuAndReachesACoordinateMinimum) {
  SKIP_WITHOUT_DEVICE();
  struct Case {
    int64_t rows, cols;
    int group;
    bool mse;
  };
  for (const std::string family : {"int4_asym", "int4_sym"}) {
    for (const Case& k : {Case{48, 384, 128, false}, Case{40, 300, 32, true}, Case{33, 200, 64, false}}) {
      const std::string what = fmt::format("{} {}x{} g{}{}", family, k.rows, k.cols, k.group, k.mse ? " mse" : "");
      SCOPED_TRACE(what);
      const MatrixStats st = correlated_stats(3 * k.cols, k.cols, 40 + k.cols);
      const auto w = randn(k.rows * k.cols, 50 + k.rows, 0.02f);
      const FormatChoice f = find_format(family, k.group);
      const auto grid = quant::make_format_grid(f, k.mse);
      const GptqOptions o;
      const quant::PreparedHessian prep = quant::prepare_hessian(st, o);
      ASSERT_EQ(prep.dead_columns, 1);
      const GptqResult start = quant::gptq(w.data(), k.rows, k.cols, prep, *grid, o);
      const Objective obj{st, prep, w, k.cols};
      const double f0 = obj.total(start.dequant, k.rows);

      GptqResult cpu = start;
      const quant::RefineReport rc = quant::refine(cpu, w.data(), st, prep, *grid, 100);
      ASSERT_LT(rc.passes, 100);

      GptqResult gpu = start;
      const cuda::GpuPreparedHessian gp = cuda::upload(prep, 3 * k.cols);
      const cuda::DeviceBuffer A = cuda::refine_objective(st, gp);
      const cuda::DeviceBuffer w_dev = cuda::upload(w.data(), w.size() * sizeof(float));
      cuda::DeviceBuffer dq = cuda::upload(start.dequant.data(), start.dequant.size() * sizeof(float));
      const quant::RefineReport rg =
          cuda::refine_device(gpu, static_cast<const float*>(w_dev.get()), static_cast<float*>(dq.get()),
                              static_cast<const float*>(A.get()), gp, f, 100);
      ASSERT_LT(rg.passes, 100) << "did not converge";

      // The report against the reference, and the values are the stored codes decoded
      // (gpu.dequant was updated from the device buffer).
      const std::vector<float> back = decoded(gpu, f);
      EXPECT_EQ(back, gpu.dequant);
      const double f1 = obj.total(back, k.rows);
      EXPECT_NEAR(rg.cost_before, f0, 1e-4 * f0);
      EXPECT_NEAR(rg.cost_after, f1, 1e-4 * f0);
      EXPECT_LT(f1, 0.97 * f0);
      EXPECT_GT(rg.code_changes, 0);
      EXPECT_GT(rg.group_refits, 0);

      // A coordinate minimum of the reference objective.
      const int64_t gpr = (k.cols + k.group - 1) / k.group;
      for (int64_t r = 0; r < k.rows; ++r) {
        const float* q = &back[r * k.cols];
        const double tol = 1e-5 * obj.row(q, r);
        const auto g = obj.grad(q, r);
        for (int64_t j = 0; j < k.cols; ++j) {
          if (prep.dead[j]) continue;
          const GroupParams& p = gpu.params[r * gpr + j / k.group];
          for (int c = 0; c < 16; ++c) {
            const double d = static_cast<double>(f.spec->decode(static_cast<uint8_t>(c), p)) - q[j];
            ASSERT_GE(2 * d * g[j] + d * d * obj.a(j, j), -tol) << "row " << r << " input " << j << " code " << c;
          }
        }
      }

      // Where the CPU lands: the same objective to within a small fraction of
      // what the refinement gained, and nearly every code the same.
      EXPECT_NEAR(rg.cost_after, rc.cost_after, 0.02 * (f0 - rc.cost_after));
      int64_t same = 0;
      for (size_t i = 0; i < gpu.codes.size(); ++i) same += gpu.codes[i] == cpu.codes[i];
      const double frac = static_cast<double>(same) / static_cast<double>(gpu.codes.size());
      EXPECT_GT(frac, 0.98) << "codes equal to the CPU's: " << frac;
      std::printf("[ refine ] %s: f %.6g -> cpu %.6g (%d passes) gpu %.6g (%d passes), codes equal %.4f%%\n",
                  what.c_str(), f0, rc.cost_after, rc.passes, rg.cost_after, rg.passes, 100 * frac);
    }
  }
}

// --refine through the gptq method with --device cuda: the quantizer reports
// the refinement and stores a matrix with a lower objective than the plain sweep's.
TEST(Cuda, RefineIsAGptqOptionOnTheGpu) {
  SKIP_WITHOUT_DEVICE();
  const int64_t R = 64, C = 256;
  const MatrixStats st = correlated_stats(600, C, 3);
  const auto w = randn(R * C, 4, 0.02f);
  Tensor wt = Tensor::zeros(DType::F32, {R, C});
  std::memcpy(wt.data_mut<float>(), w.data(), w.size() * 4);
  for (const std::string family : {"int4_asym", "int4_sym"}) {
    SCOPED_TRACE(family);
    const FormatChoice f = find_format(family, 128);
    quant::QuantizerConfig c{f, true, true, 0.01, "cuda", 0};
    quant::QuantizeInfo plain_info, refined_info;
    const QuantizedMatrix plain = quant::find_method("gptq").make(c)->quantize(wt, &st, &plain_info);
    c.refine = 20;
    const QuantizedMatrix refined = quant::find_method("gptq").make(c)->quantize(wt, &st, &refined_info);
    EXPECT_EQ(plain_info.refine.passes, 0);
    EXPECT_GT(refined_info.refine.code_changes, 0);
    std::vector<float> a(static_cast<size_t>(R * C)), b(a.size());
    dequantize(plain, a.data());
    dequantize(refined, b.data());
    GptqOptions o;
    o.act_order = true;
    const quant::PreparedHessian prep = quant::prepare_hessian(st, o);
    const Objective obj{st, prep, w, C};
    EXPECT_NEAR(obj.total(a, R), refined_info.refine.cost_before, 1e-4 * refined_info.refine.cost_before);
    EXPECT_NEAR(obj.total(b, R), refined_info.refine.cost_after, 1e-4 * refined_info.refine.cost_before);
    EXPECT_LT(obj.total(b, R), obj.total(a, R));
  }
}

// nibble quantize --device cuda --refine: the GPU calibration flow refines
// every matrix and records it in nibble.json.
TEST(Cuda, RefineOnTheGpuEndToEnd) {
  SKIP_WITHOUT_DEVICE();
  TempDir tmp;
  const std::string model = test::model_dir("stories260K").string();
  const std::filesystem::path calib = test::shared_dir() / "data/corpora/tinystories-valid-sample.txt";
  const auto r = test::run_command(test::nibble_bin() + " quantize -q --method gptq --mse --device cuda --refine 10" +
                                   " --group 64 --model " + model + " --calib " + calib.string() +
                                   " --calib-samples 8 --calib-len 128 --out " + (tmp / "q").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(tmp / "q/nibble.json");
  const auto j = nlohmann::json::parse(in);
  EXPECT_EQ(j["options"]["refine"], 10);
  EXPECT_EQ(j["options"]["device"], "cuda");
  int refined = 0;
  for (const auto& [name, t] : j["tensors"].items()) {
    if (!t.contains("refine")) continue;
    ++refined;
    EXPECT_LT(t["refine"]["objective_after"].get<double>(), t["refine"]["objective_before"].get<double>()) << name;
  }
  EXPECT_GE(refined, 7 * 5) << "every decoder linear of the 5 layers";
}

}  // namespace
}  // namespace nibble

#endif  // NIBBLE_HAVE_CUDA
