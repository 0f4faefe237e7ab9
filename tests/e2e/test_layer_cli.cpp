// `nibble layer` end to end, through the CLI binary: the GPTQ literature's
// two-input worked example on the uniform grid, an int4 g128 matrix with
// correlated inputs (GPTQ vs RTN, and RTN checked against an independent
// dequantization written here from docs/FORMAT.md's formulas), bad inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include <nlohmann/json.hpp>

#include "nibble/dtype.h"
#include "nibble/npy.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream f(p);
  return nlohmann::json::parse(f);
}

void save(const fs::path& p, const std::vector<float>& v, Shape shape) {
  io::write_npy(p, Tensor::view(DType::F32, std::move(shape), v.data(), nullptr));
}

test::CommandResult layer(const TempDir& tmp, const std::string& args, const std::string& tag = "") {
  return test::run_command(test::nibble_bin() + " layer " + args + " --out '" + (tmp / ("Q" + tag + ".npy")).string() +
                           "' --report '" + (tmp / ("R" + tag + ".json")).string() + "'");
}

// --- The worked example --------------------------------------------------------
//
// Two input channels over four tokens, x1 = [1, 2, -1, 0.5] and
// x2 = [1, 1.8, -1.2, 0.6], one output with w = [0.62, 0.37], grid step 0.25.
// RTN rounds each weight alone: [0.5, 0.25], ΔW = [-0.12, -0.12], and the
// output error Σ_t (ΔW·x_t)² = 0.0144 · (4 + 14.44 + 4.84 + 1.21) = 0.352656.
// GPTQ rounds w1 to 0.5 and moves its error onto w2 along H = XᵀX:
// w2 += 0.12 · H12 / H22 = 0.12 · 6.1 / 6.04 (damping shifts it in the 4th
// digit) ≈ 0.4912, which rounds to 0.5: ΔW = [-0.12, 0.13] and the output
// error is 0.01² + 0.006² + 0.036² + 0.018² = 0.001756.
TEST(Layer, WorkedExampleUniformGrid) {
  TempDir tmp;
  const std::vector<float> x = {1, 1, 2, 1.8f, -1, -1.2f, 0.5f, 0.6f};  // [4 tokens, 2 inputs], row t = (x1[t], x2[t])
  save(tmp / "X.npy", x, {4, 2});
  save(tmp / "W.npy", {0.62f, 0.37f}, {1, 2});
  const std::string in = "--weight '" + (tmp / "W.npy").string() + "' --inputs '" + (tmp / "X.npy").string() +
                         "' --grid uniform:step=0.25 ";
  // ‖X Wᵀ‖² = 0.99² + 1.906² + 1.064² + 0.532² = 6.028056; ‖W‖² = 0.62² + 0.37².
  const double ref_sq = 6.028056, w_norm = std::sqrt(0.62 * 0.62 + 0.37 * 0.37);

  struct Want {
    const char* method;
    float q0, q1;
    double sq_err, tol;
  };
  for (const Want& want : {Want{"rtn", 0.5f, 0.25f, 0.3527, 5e-4}, Want{"gptq", 0.5f, 0.5f, 0.00176, 2e-5}}) {
    SCOPED_TRACE(want.method);
    const auto r = layer(tmp, in + "--method " + want.method, want.method);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const Tensor q = io::read_npy(tmp / fmt::format("Q{}.npy", want.method));
    ASSERT_EQ(q.dtype(), DType::F32);
    ASSERT_EQ(q.shape(), (Shape{1, 2}));
    EXPECT_EQ(q.data<float>()[0], want.q0);
    EXPECT_EQ(q.data<float>()[1], want.q1);

    const auto j = read_json(tmp / fmt::format("R{}.json", want.method));
    EXPECT_EQ(j["method"], want.method);
    EXPECT_NE(j["command_line"].get<std::string>().find("uniform:step=0.25"), std::string::npos);
    EXPECT_EQ(j["grid"], "uniform:step=0.25");
    EXPECT_EQ(j["rows"], 1);
    EXPECT_EQ(j["cols"], 2);
    EXPECT_EQ(j["tokens"], 4);
    EXPECT_FALSE(j.contains("output_rel_err_heldout"));
    const double sq = j["output_sq_err_calib"].get<double>();
    EXPECT_NEAR(sq, want.sq_err, want.tol);
    // The relative errors follow from the same numbers (fp32 inputs: 1e-6).
    EXPECT_NEAR(j["output_rel_err_calib"].get<double>(), std::sqrt(sq / ref_sq), 1e-6);
    const double dw = std::hypot(double{want.q0} - 0.62, double{want.q1} - 0.37);
    EXPECT_NEAR(j["weight_rel_err"].get<double>(), dw / w_norm, 1e-6);
    EXPECT_NE(r.out.find(fmt::format("{:.6f}", j["output_rel_err_calib"].get<double>())), std::string::npos) << r.out;

    if (std::string(want.method) == "gptq") {
      EXPECT_DOUBLE_EQ(j["damp"].get<double>(), 0.01);
      EXPECT_DOUBLE_EQ(j["damp_used"].get<double>(), 0.01);
      EXPECT_EQ(j["damp_retries"], 0);
      EXPECT_EQ(j["dead_columns"], 0);
      // gptq.h: the sweep's own account is ‖XΔWᵀ‖² + λ‖ΔW‖², λ = 0.01 · mean(diag H)
      // = 0.01 · (6.25 + 6.04) / 2 (fp32 inputs and U: 1e-5 relative).
      const double lambda = 0.01 * (6.25 + 6.04) / 2;
      EXPECT_NEAR(j["lambda"].get<double>(), lambda, 1e-7);
      EXPECT_NEAR(j["sweep_cost"].get<double>(), sq + lambda * dw * dw, 1e-5 * (sq + lambda * dw * dw));
    } else {
      EXPECT_TRUE(j["damp"].is_null());
      EXPECT_TRUE(j["sweep_cost"].is_null());
    }
  }
}

// An input that is zero on every calibration token: GPTQ counts it dead and
// zeroes its weights (gptq.h); RTN reports the same count and rounds them as usual.
TEST(Layer, DeadInputColumn) {
  TempDir tmp;
  std::vector<float> x(8 * 3);
  for (int t = 0; t < 8; ++t) {
    x[t * 3] = static_cast<float>(t % 3) - 1.0f;
    x[t * 3 + 2] = 0.5f * static_cast<float>(t) - 2;
  }
  save(tmp / "X.npy", x, {8, 3});  // column 1 all zero
  save(tmp / "W.npy", {0.3f, 0.7f, -0.2f, 0.1f, -0.9f, 0.4f}, {2, 3});
  const std::string in = "--weight '" + (tmp / "W.npy").string() + "' --inputs '" + (tmp / "X.npy").string() +
                         "' --grid uniform:step=0.25 ";
  for (const char* m : {"rtn", "gptq"}) {
    SCOPED_TRACE(m);
    const auto r = layer(tmp, in + "--method " + m, m);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(read_json(tmp / fmt::format("R{}.json", m))["dead_columns"], 1);
    const Tensor q = io::read_npy(tmp / fmt::format("Q{}.npy", m));
    const bool zeroed = std::string(m) == "gptq";
    EXPECT_EQ(q.data<float>()[1], zeroed ? 0.0f : 0.75f);  // 0.7 / 0.25 = 2.8 -> 3
    EXPECT_EQ(q.data<float>()[4], zeroed ? 0.0f : -1.0f);  // -0.9 / 0.25 = -3.6 -> -4
  }
}

// --- int4 g128 on a correlated layer ---------------------------------------------

// Inputs with a few shared factors plus small noise (as real activations are
// strongly correlated), and uneven channel scales: the case GPTQ is for.
std::vector<float> correlated_inputs(int64_t tokens, int64_t in, const std::vector<float>& mix,
                                     const std::vector<float>& channel_scale, uint32_t seed) {
  const int64_t k = static_cast<int64_t>(mix.size()) / in;
  std::mt19937 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(tokens * in));
  std::vector<float> f(static_cast<size_t>(k));
  for (int64_t t = 0; t < tokens; ++t) {
    for (auto& v : f) v = n01(rng);
    for (int64_t c = 0; c < in; ++c) {
      float s = 0.05f * n01(rng);
      for (int64_t i = 0; i < k; ++i) s += f[i] * mix[i * in + c];
      x[t * in + c] = s * channel_scale[c];
    }
  }
  return x;
}

// int4_asym dequantization written from docs/FORMAT.md alone (fp32 throughout).
std::vector<float> reference_rtn_int4(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t group) {
  std::vector<float> out(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += group) {
      const float* g = &w[r * cols + c0];
      const int64_t n = std::min(group, cols - c0);
      const float lo = *std::min_element(g, g + n), hi = *std::max_element(g, g + n);
      const float scale = round_to_bf16((hi - lo) / 15.0f), mn = round_to_bf16(lo);
      for (int64_t i = 0; i < n; ++i) {
        const float code = scale == 0.0f ? 0.0f : std::clamp(std::nearbyint((g[i] - mn) / scale), 0.0f, 15.0f);
        out[r * cols + c0 + i] = code * scale + mn;
      }
    }
  return out;
}

TEST(Layer, Int4GptqBeatsRtnOnOutputError) {
  TempDir tmp;
  constexpr int64_t kRows = 48, kCols = 256, kFactors = 6, kTokens = 512;
  std::mt19937 rng(1234);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> w(kRows * kCols), mix(kFactors * kCols), scale(kCols);
  for (auto& v : w) v = 0.05f * n01(rng);
  for (auto& v : mix) v = n01(rng);
  for (auto& v : scale) v = std::exp(0.5f * n01(rng));  // channel scales spread over ~e^±1
  save(tmp / "W.npy", w, {kRows, kCols});
  save(tmp / "X.npy", correlated_inputs(kTokens, kCols, mix, scale, 1), {kTokens, kCols});
  save(tmp / "X2.npy", correlated_inputs(kTokens, kCols, mix, scale, 2), {kTokens, kCols});
  const std::string in = "--weight '" + (tmp / "W.npy").string() + "' --inputs '" + (tmp / "X.npy").string() +
                         "' --heldout '" + (tmp / "X2.npy").string() + "' ";

  std::map<std::string, nlohmann::json> rep;
  for (const auto& [tag, args] : std::vector<std::pair<std::string, std::string>>{
           {"rtn", "--method rtn"},
           {"gptq", "--method gptq"},
           {"gptq_ao_mse", "--method gptq --act-order --mse --grid int4_g64_asym"},
           {"gptq_refine", "--method gptq --refine 20"}}) {
    SCOPED_TRACE(tag);
    const auto r = layer(tmp, in + args, tag);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    rep[tag] = read_json(tmp / ("R" + tag + ".json"));
    EXPECT_TRUE(rep[tag].contains("output_rel_err_heldout"));
    EXPECT_EQ(rep[tag]["heldout_tokens"], kTokens);
    EXPECT_EQ(rep[tag]["tokens"], kTokens);
    // Every group of the result lies on one 16-level grid.
    const Tensor q = io::read_npy(tmp / ("Q" + tag + ".npy"));
    ASSERT_EQ(q.shape(), (Shape{kRows, kCols}));
    const int64_t g = rep[tag]["group_size"].get<int64_t>();
    for (int64_t i = 0; i < kRows * kCols; i += g) {
      const std::set<float> levels(q.data<float>() + i, q.data<float>() + i + g);
      EXPECT_LE(levels.size(), 16u) << "group at " << i;
    }
  }
  const auto& rtn = rep["rtn"];
  const auto& gptq = rep["gptq"];
  EXPECT_EQ(rtn["grid_format"], "int4_g128_asym");
  EXPECT_EQ(rep["gptq_ao_mse"]["grid_format"], "int4_g64_asym");
  // GPTQ trades weight error for output error: worse on W, better on X Wᵀ,
  // on the calibration inputs and on held-out inputs of the same distribution.
  EXPECT_GT(gptq["weight_rel_err"].get<double>(), rtn["weight_rel_err"].get<double>());
  EXPECT_LT(gptq["output_rel_err_calib"].get<double>(), rtn["output_rel_err_calib"].get<double>());
  EXPECT_LT(gptq["output_rel_err_heldout"].get<double>(), rtn["output_rel_err_heldout"].get<double>());
  EXPECT_LT(rep["gptq_ao_mse"]["output_rel_err_calib"].get<double>(), rtn["output_rel_err_calib"].get<double>());
  // --refine lowers GPTQ's own objective (the damped calibration output error),
  // and with it the calibration output error; held out too, on these inputs.
  const auto& refined = rep["gptq_refine"];
  ASSERT_TRUE(refined["refine"].is_object());
  EXPECT_TRUE(gptq["refine"].is_null());
  EXPECT_LT(refined["refine"]["objective_after"].get<double>(), refined["refine"]["objective_before"].get<double>());
  EXPECT_GT(refined["refine"]["codes_changed"].get<int64_t>(), 0);
  EXPECT_LT(refined["output_rel_err_calib"].get<double>(), gptq["output_rel_err_calib"].get<double>());
  EXPECT_LT(refined["output_rel_err_heldout"].get<double>(), gptq["output_rel_err_heldout"].get<double>());
  // RTN's output equals the independent dequantization, bit for bit.
  const Tensor q = io::read_npy(tmp / "Qrtn.npy");
  const std::vector<float> want = reference_rtn_int4(w, kRows, kCols, 128);
  for (int64_t i = 0; i < kRows * kCols; ++i)
    ASSERT_EQ(q.data<float>()[i], want[i]) << "[" << i / kCols << ", " << i % kCols << "] w = " << w[i];
  std::printf("[ measured ] rtn  weight %.5f  calib %.5f  heldout %.5f\n", rtn["weight_rel_err"].get<double>(),
              rtn["output_rel_err_calib"].get<double>(), rtn["output_rel_err_heldout"].get<double>());
  for (const char* tag : {"gptq", "gptq_ao_mse", "gptq_refine"})
    std::printf("[ measured ] %s  weight %.5f  calib %.5f  heldout %.5f\n", tag,
                rep[tag]["weight_rel_err"].get<double>(), rep[tag]["output_rel_err_calib"].get<double>(),
                rep[tag]["output_rel_err_heldout"].get<double>());
}

// AWQ's scales and the Hadamard rotation on one matrix: inputs with a few
// large channels, weights with a few large columns (where rounding a whole
// group to the largest weight's step hurts). --out holds the effective weight
// for the original inputs, so the reported error must be recomputable from it.
TEST(Layer, TransformsMapBackAndNeverLoseToRtnOnTheirObjective) {
  TempDir tmp;
  constexpr int64_t kRows = 32, kCols = 256, kTokens = 384;
  std::mt19937 rng(99);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> w(kRows * kCols), x(kTokens * kCols);
  for (int64_t i = 0; i < kRows * kCols; ++i) w[i] = 0.05f * n01(rng) * (i % kCols % 37 == 0 ? 10.0f : 1.0f);
  for (int64_t i = 0; i < kTokens * kCols; ++i) x[i] = n01(rng) * (i % kCols % 29 == 0 ? 8.0f : 1.0f);
  save(tmp / "W.npy", w, {kRows, kCols});
  save(tmp / "X.npy", x, {kTokens, kCols});
  const std::string in = "--weight '" + (tmp / "W.npy").string() + "' --inputs '" + (tmp / "X.npy").string() + "' ";
  std::map<std::string, nlohmann::json> rep;
  for (const char* m : {"rtn", "awq", "awq+gptq", "rotate", "rotate+gptq", "gptq"}) {
    SCOPED_TRACE(m);
    const auto r = layer(tmp, in + "--method " + m, m);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    rep[m] = read_json(tmp / (std::string("R") + m + ".json"));
    // ‖X(Q − W)ᵀ‖ / ‖X Wᵀ‖ from the written weights, in double.
    const Tensor q = io::read_npy(tmp / (std::string("Q") + m + ".npy"));
    double num = 0, den = 0;
    for (int64_t t = 0; t < kTokens; ++t)
      for (int64_t o = 0; o < kRows; ++o) {
        double y = 0, d = 0;
        for (int64_t j = 0; j < kCols; ++j) {
          y += static_cast<double>(x[t * kCols + j]) * w[o * kCols + j];
          d += static_cast<double>(x[t * kCols + j]) * (q.data<float>()[o * kCols + j] - w[o * kCols + j]);
        }
        num += d * d;
        den += y * y;
      }
    EXPECT_NEAR(std::sqrt(num / den), rep[m]["output_rel_err_calib"].get<double>(), 1e-6);
  }
  EXPECT_EQ(rep["awq"]["method"], "awq+rtn");
  EXPECT_GT(rep["awq"]["transform"]["alpha"].get<double>(), 0.0);
  // α = 0 is plain rounding, and AWQ's objective is this very output error.
  EXPECT_LE(rep["awq"]["output_rel_err_calib"].get<double>(), rep["rtn"]["output_rel_err_calib"].get<double>());
  // The rotation spreads the large columns over every group.
  EXPECT_LT(rep["rotate"]["output_rel_err_calib"].get<double>(), rep["rtn"]["output_rel_err_calib"].get<double>());
  EXPECT_LT(rep["rotate+gptq"]["output_rel_err_calib"].get<double>(),
            rep["rotate"]["output_rel_err_calib"].get<double>());
  for (const char* m : {"rtn", "awq", "awq+gptq", "rotate", "rotate+gptq", "gptq"})
    std::printf("[ measured ] %-12s output rel. error %.5f\n", m, rep[m]["output_rel_err_calib"].get<double>());
  // SmoothQuant needs quantized activations to mean anything: refused.
  const auto r = layer(tmp, in + "--method smoothquant", "sq");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("nibble eval"), std::string::npos) << r.err;
}

// --- Bad input -------------------------------------------------------------------

void expect_clean_failure(const TempDir& tmp, const test::CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_NE(r.exit_code, 0);
  for (const auto& n : needles) EXPECT_NE(r.err.find(n), std::string::npos) << "missing '" << n << "' in: " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << "not one line: " << r.err;
  EXPECT_FALSE(fs::exists(tmp / "Q.npy"));
  EXPECT_FALSE(fs::exists(tmp / "R.json"));
}

TEST(LayerBadInput, ShapesFilesAndOptions) {
  TempDir tmp;
  const std::string W = (tmp / "W.npy").string(), X = (tmp / "X.npy").string();
  save(tmp / "W.npy", std::vector<float>(4 * 8, 0.25f), {4, 8});
  save(tmp / "X.npy", std::vector<float>(16 * 6, 1.0f), {16, 6});
  save(tmp / "Xok.npy", std::vector<float>(16 * 8, 1.0f), {16, 8});
  save(tmp / "v.npy", std::vector<float>(8, 1.0f), {8});
  std::vector<float> nan_x(16 * 8, 1.0f);
  nan_x[3 * 8 + 5] = NAN;
  save(tmp / "Xnan.npy", nan_x, {16, 8});
  std::ofstream(tmp / "text.npy") << "this is not numpy\n";
  const std::string Xok = (tmp / "Xok.npy").string();

  // W [4, 8] with X [16, 6]: both shapes and both files named.
  expect_clean_failure(tmp, layer(tmp, "--method gptq --weight " + W + " --inputs " + X),
                       {"[16, 6]", "[4, 8]", X, W});
  expect_clean_failure(tmp, layer(tmp, "--method rtn --weight " + W + " --inputs " + Xok + " --heldout " + X),
                       {"--heldout", "[16, 6]", "[4, 8]"});
  expect_clean_failure(tmp, layer(tmp, "--method rtn --weight " + (tmp / "nope.npy").string() + " --inputs " + Xok),
                       {(tmp / "nope.npy").string()});
  expect_clean_failure(tmp, layer(tmp, "--method rtn --weight " + W + " --inputs " + (tmp / "text.npy").string()),
                       {(tmp / "text.npy").string(), "not a .npy file"});
  expect_clean_failure(tmp, layer(tmp, "--method rtn --weight " + (tmp / "v.npy").string() + " --inputs " + Xok),
                       {"--weight", "2-D", "[8]"});
  expect_clean_failure(tmp, layer(tmp, "--method gptq --weight " + W + " --inputs " + (tmp / "Xnan.npy").string()),
                       {"--inputs", "non-finite", "[3, 5]"});
  expect_clean_failure(tmp, layer(tmp, "--method rtn --act-order --weight " + W + " --inputs " + Xok),
                       {"--act-order", "gptq"});
  expect_clean_failure(tmp, layer(tmp, "--method rtn --damp 0.1 --weight " + W + " --inputs " + Xok),
                       {"--damp", "gptq"});
  expect_clean_failure(tmp, layer(tmp, "--method gptq --grid int3_wat --weight " + W + " --inputs " + Xok),
                       {"int3_wat"});
  expect_clean_failure(tmp, layer(tmp, "--method gptq --grid uniform:step=abc --weight " + W + " --inputs " + Xok),
                       {"uniform:step=abc"});
  const auto no_dir = test::run_command(test::nibble_bin() + " layer --method rtn --weight " + W + " --inputs " + Xok +
                                        " --out " + (tmp / "Q.npy").string() + " --report " +
                                        (tmp / "no" / "R.json").string());
  expect_clean_failure(tmp, no_dir, {"--report", (tmp / "no").string(), "does not exist"});
  // The same files with a valid setup work (the checks above are not over-eager).
  const auto ok = layer(tmp, "--method gptq --grid uniform:step=0.125 --weight " + W + " --inputs " + Xok + " -q");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_EQ(ok.err, "");
}

}  // namespace
}  // namespace nibble
