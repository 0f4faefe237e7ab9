// GPTQ's --refine (quant::refine) against a scalar fp64 reference: the
// objective it reports is f(Q) = Σ_rows (q − w)ᵀ (H + λI) (q − w) recomputed
// from scratch, it never rises, and when the passes converge no single weight
// can move to another code, and no group's least-squares (scale, min) stored
// in bf16, to lower f.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/quantizer.h"
#include "quant/refine_forms.h"
#include "test_util.h"

namespace nibble::quant {
namespace {

using test::randn;

// Inputs with shared factors (so H is far from diagonal), one dead input.
struct Problem {
  int64_t rows, cols, tokens;
  std::vector<float> w, x;
  MatrixStats stats;
};
Problem make_problem(int64_t rows, int64_t cols, int64_t tokens, uint64_t seed, float noise_sd = 0.3f) {
  Problem p{rows, cols, tokens, randn(rows * cols, seed, 0.02f), {}, MatrixStats(cols)};
  const auto f = randn(tokens * 6, seed + 1), mix = randn(6 * cols, seed + 2), noise = randn(tokens * cols, seed + 3, noise_sd);
  p.x.resize(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < cols; ++j) {
      float s = noise[t * cols + j];
      for (int k = 0; k < 6; ++k) s += f[t * 6 + k] * mix[k * cols + j];
      p.x[t * cols + j] = j == 7 ? 0.0f : s * (1.0f + static_cast<float>(j % 5));
    }
  p.stats.add(p.x.data(), tokens);
  p.stats.finalize();
  return p;
}

// The scalar reference: f per row in fp64, A = H + λI on the live inputs.
struct Objective {
  const Problem& p;
  const PreparedHessian& prep;
  double a(int64_t i, int64_t j) const {
    if (prep.dead[i] || prep.dead[j]) return 0.0;
    return p.stats.H[i * p.cols + j] + (i == j ? prep.lambda : 0.0);
  }
  // (A d)_j and dᵀ A d for d = q − w of one row.
  std::vector<double> grad(const float* q, int64_t r) const {
    std::vector<double> g(static_cast<size_t>(p.cols), 0.0);
    for (int64_t j = 0; j < p.cols; ++j)
      for (int64_t l = 0; l < p.cols; ++l) g[j] += a(j, l) * (static_cast<double>(q[l]) - p.w[r * p.cols + l]);
    return g;
  }
  double row(const float* q, int64_t r) const {
    const auto g = grad(q, r);
    double s = 0;
    for (int64_t j = 0; j < p.cols; ++j)
      if (!prep.dead[j]) s += g[j] * (static_cast<double>(q[j]) - p.w[r * p.cols + j]);
    return s;
  }
  double total(const std::vector<float>& q) const {
    double s = 0;
    for (int64_t r = 0; r < p.rows; ++r) s += row(&q[r * p.cols], r);
    return s;
  }
};

// What the test knows of each format, written out here: the value of each code
// at scale 1, whether a group has a min, the codes' multiplier, and the stored
// parameters nearest to a real-valued scale and min.
struct AffineCase {
  const char* format;
  std::vector<float> value;  // per code
  bool has_min;
  double (*scale)(const GroupParams&);
  GroupParams (*store)(const GroupParams&, double, double);
};
const std::vector<float> kE2M1 = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
std::vector<float> ramp(int from) {
  std::vector<float> v;
  for (int c = 0; c < 16; ++c) v.push_back(static_cast<float>(c + from));
  return v;
}
double plain_scale(const GroupParams& p) { return p.scale; }
const AffineCase kCases[] = {
    {"int4_g128_asym", ramp(0), true, plain_scale,
     [](const GroupParams&, double s, double m) {
       GroupParams p;
       p.scale = round_to_bf16(static_cast<float>(s));
       p.min = round_to_bf16(static_cast<float>(m));
       return p;
     }},
    {"int4_g128_sym", ramp(-8), false, plain_scale,
     [](const GroupParams&, double s, double) {
       GroupParams p;
       p.scale = f16_to_f32(f32_to_f16(static_cast<float>(s)));
       return p;
     }},
    {"fp4_e2m1_g32", kE2M1, false, plain_scale,
     [](const GroupParams&, double s, double) {
       GroupParams p;
       p.scale = round_to_bf16(static_cast<float>(s));
       return p;
     }},
    {"nvfp4", kE2M1, false, [](const GroupParams& p) { return static_cast<double>(p.scale * p.global); },
     [](const GroupParams& old, double s, double) {
       GroupParams p = old;
       p.scale = f8_e4m3_to_f32(f32_to_f8_e4m3(static_cast<float>(s / old.global)));
       return p;
     }},
};

// The result's values are its codes and parameters as the packed matrix
// decodes them (dead inputs too).
void expect_values_are_stored(const GptqResult& r, const FormatChoice& fc) {
  std::vector<float> back(r.dequant.size());
  dequantize(r.to_quantized(*fc.spec, fc.group_size), back.data());
  EXPECT_EQ(back, r.dequant);
}

TEST(Refine, ReachesACoordinateMinimumOfGptqsObjective) {
  const Problem p = make_problem(10, 256, 700, 5, 2.0f);
  GptqOptions o;
  const PreparedHessian prep = prepare_hessian(p.stats, o);
  ASSERT_EQ(prep.dead_columns, 1);
  const Objective obj{p, prep};
  for (const AffineCase& fcase : kCases) {
    SCOPED_TRACE(fcase.format);
    const FormatChoice fc = find_format(fcase.format);
    const FormatSpec& f = *fc.spec;
    ASSERT_NE(f.affine, nullptr);
    EXPECT_EQ(f.affine->has_min, fcase.has_min);
    const auto grid = make_format_grid(fc, false);
    const int64_t g = grid->group_len(p.cols), gpr = p.cols / g;
    const GptqResult before = gptq(p.w.data(), p.rows, p.cols, prep, *grid, o);
    GptqResult after = before;
    const RefineReport rep = refine(after, p.w.data(), p.stats, prep, *grid, 100);

    // The report's objective is the reference's, and it fell.
    const double f0 = obj.total(before.dequant), f1 = obj.total(after.dequant);
    EXPECT_NEAR(rep.cost_before, f0, 1e-4 * f0);
    EXPECT_NEAR(rep.cost_after, f1, 1e-4 * f0);
    EXPECT_LT(f1, 0.97 * f0);
    EXPECT_GT(rep.code_changes, 0);
    EXPECT_GT(rep.group_refits, 0);
    ASSERT_LT(rep.passes, 100) << "did not converge";

    // Pass by pass, f never rises (k passes are the first k of any longer run).
    double last = f0;
    for (int k = 1; k <= rep.passes; ++k) {
      GptqResult partial = before;
      const double fk = refine(partial, p.w.data(), p.stats, prep, *grid, k).cost_after;
      EXPECT_LE(fk, last) << "after pass " << k;
      EXPECT_NEAR(fk, obj.total(partial.dequant), 1e-4 * f0);
      last = fk;
    }
    EXPECT_EQ(last, rep.cost_after);

    // The values are the stored codes and parameters, decoded, and the decode
    // is the affine one the test knows.
    expect_values_are_stored(after, fc);
    for (int64_t r = 0; r < p.rows; ++r)
      for (int64_t j = 0; j < p.cols; ++j) {
        const uint8_t c = after.codes[r * p.cols + j];
        const GroupParams& gp = after.params[r * gpr + j / g];
        ASSERT_NEAR(f.decode(c, gp), fcase.value[c] * fcase.scale(gp) + (fcase.has_min ? gp.min : 0.0f),
                    1e-6 * std::abs(fcase.scale(gp)));
      }

    for (int64_t r = 0; r < p.rows; ++r) {
      std::vector<float> q(after.dequant.begin() + r * p.cols, after.dequant.begin() + (r + 1) * p.cols);
      const double fr = obj.row(q.data(), r);
      const double tol = 1e-5 * fr;
      const auto grad = obj.grad(q.data(), r);
      // No single weight lowers f by moving to another code of its group.
      for (int64_t j = 0; j < p.cols; ++j) {
        if (prep.dead[j]) continue;
        const GroupParams& gp = after.params[r * gpr + j / g];
        for (int c = 0; c < 16; ++c) {
          const double d = static_cast<double>(f.decode(static_cast<uint8_t>(c), gp)) - q[j];
          ASSERT_GE(2 * d * grad[j] + d * d * obj.a(j, j), -tol) << "row " << r << " input " << j << " code " << c;
        }
      }
      // No group's least-squares scale (and min) for its codes, stored as the
      // format stores them, lowers f.
      for (int64_t k = 0; k < gpr; ++k) {
        const int64_t c0 = k * g;
        // Normal equations of min over (s, m) of f with q_G = v s + m, the rest fixed.
        double M[2][2] = {}, b[2] = {};
        for (int64_t j = c0; j < c0 + g; ++j) {
          if (prep.dead[j]) continue;
          const double vj = fcase.value[after.codes[r * p.cols + j]];
          double rest = 0;  // (A (q − w))_j over the inputs outside G, minus A_jG w_G
          for (int64_t l = 0; l < p.cols; ++l) {
            const bool in = l >= c0 && l < c0 + g;
            rest += obj.a(j, l) * ((in ? 0.0 : static_cast<double>(q[l])) - p.w[r * p.cols + l]);
          }
          b[0] -= vj * rest;
          b[1] -= rest;
          for (int64_t l = c0; l < c0 + g; ++l) {
            const double vl = fcase.value[after.codes[r * p.cols + l]];
            M[0][0] += vj * obj.a(j, l) * vl;
            M[0][1] += vj * obj.a(j, l);
            M[1][1] += obj.a(j, l);
          }
        }
        double s = 0, m = 0;
        if (fcase.has_min) {
          const double det = M[0][0] * M[1][1] - M[0][1] * M[0][1];
          ASSERT_GT(det, 0);
          s = (b[0] * M[1][1] - b[1] * M[0][1]) / det;
          m = (b[1] * M[0][0] - b[0] * M[0][1]) / det;
        } else {
          if (!(M[0][0] > 0)) continue;
          s = b[0] / M[0][0];
        }
        const GroupParams ls = fcase.store(after.params[r * gpr + k], s, m);
        std::vector<float> alt = q;
        for (int64_t j = c0; j < c0 + g; ++j) alt[j] = f.decode(after.codes[r * p.cols + j], ls);
        EXPECT_LE(fr, obj.row(alt.data(), r) + 1e-3 * tol) << "row " << r << " group " << k;
      }
    }
    // Fewer output errors, as the objective says: ‖X (Q − W)ᵀ‖² fell too.
    auto out_err = [&](const std::vector<float>& q) {
      double e = 0;
      for (int64_t r = 0; r < p.rows; ++r)
        for (int64_t t = 0; t < p.tokens; ++t) {
          double sum = 0;
          for (int64_t j = 0; j < p.cols; ++j)
            sum += static_cast<double>(p.x[t * p.cols + j]) * (q[r * p.cols + j] - p.w[r * p.cols + j]);
          e += sum * sum;
        }
      return e;
    };
    EXPECT_LT(out_err(after.dequant), out_err(before.dequant));
  }
}

// A ragged last group (200 inputs: groups of 128 and 72; NVFP4's blocks of 16
// end with 8) and a dead input: the stored values stay the decoded codes, the
// report matches the reference, and the objective falls.
TEST(Refine, RaggedLastGroup) {
  const Problem p = make_problem(7, 200, 500, 31, 2.0f);
  GptqOptions o;
  const PreparedHessian prep = prepare_hessian(p.stats, o);
  const Objective obj{p, prep};
  for (const char* name : {"int4_g128_asym", "nvfp4"}) {
    SCOPED_TRACE(name);
    const FormatChoice fc = find_format(name);
    const auto grid = make_format_grid(fc, false);
    const GptqResult before = gptq(p.w.data(), p.rows, p.cols, prep, *grid, o);
    GptqResult after = before;
    const RefineReport rep = refine(after, p.w.data(), p.stats, prep, *grid, 50);
    EXPECT_GT(rep.group_refits, 0);
    EXPECT_NEAR(rep.cost_before, obj.total(before.dequant), 1e-4 * rep.cost_before);
    EXPECT_NEAR(rep.cost_after, obj.total(after.dequant), 1e-4 * rep.cost_before);
    EXPECT_LT(rep.cost_after, rep.cost_before);
    expect_values_are_stored(after, fc);
  }
}

TEST(Refine, FormatsWithoutARefitMoveOnlyCodes) {
  const Problem p = make_problem(6, 128, 400, 9);
  GptqOptions o;
  const PreparedHessian prep = prepare_hessian(p.stats, o);
  const Objective obj{p, prep};
  // mxfp4's power-of-two scales are not refitted; per-channel formats' one
  // group is the whole row.
  for (const char* name : {"mxfp4", "int8_channel_sym"}) {
    SCOPED_TRACE(name);
    const FormatChoice fc = find_format(name);
    const auto grid = make_format_grid(fc, false);
    const GptqResult before = gptq(p.w.data(), p.rows, p.cols, prep, *grid, o);
    GptqResult after = before;
    const RefineReport rep = refine(after, p.w.data(), p.stats, prep, *grid, 50);
    EXPECT_EQ(rep.group_refits, 0);
    ASSERT_EQ(after.params.size(), before.params.size());
    for (size_t k = 0; k < after.params.size(); ++k) {
      EXPECT_EQ(after.params[k].scale, before.params[k].scale);
      EXPECT_EQ(after.params[k].min, before.params[k].min);
    }
    EXPECT_LE(obj.total(after.dequant), obj.total(before.dequant));
    EXPECT_NEAR(rep.cost_after, obj.total(after.dequant), 1e-4 * rep.cost_before);
    expect_values_are_stored(after, fc);
  }
  // Zero passes change nothing.
  const auto grid = make_format_grid(find_format("int4_asym", 128), false);
  const GptqResult before = gptq(p.w.data(), p.rows, p.cols, prep, *grid, o);
  GptqResult same = before;
  const RefineReport none = refine(same, p.w.data(), p.stats, prep, *grid, 0);
  EXPECT_EQ(none.passes, 0);
  EXPECT_EQ(same.codes, before.codes);
  EXPECT_EQ(same.dequant, before.dequant);
}

// The refit's forms, kept up to date over many moves of single codes (several
// in each group, the ragged last one included), equal the fp64 sums of their
// definition over the codes as they end up.
TEST(Refine, GroupFormsFollowTheMovedCodes) {
  const int64_t rows = 3, cols = 200, g = 64, gpr = 4;  // groups of 64, 64, 64 and 8
  // A = BᵀB/n + I: symmetric, positive definite, far from diagonal.
  const auto B = randn(50 * cols, 41);
  std::vector<float> A(static_cast<size_t>(cols * cols));
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      double s = i == j ? 1.0 : 0.0;
      for (int64_t t = 0; t < 50; ++t) s += static_cast<double>(B[t * cols + i]) * B[t * cols + j] / 50;
      A[i * cols + j] = static_cast<float>(s);
    }
  float value[256] = {};
  for (int c = 0; c < 16; ++c) value[c] = static_cast<float>(c) - 7.5f;
  std::mt19937 rng(7);
  std::vector<uint8_t> code(static_cast<size_t>(rows * cols));
  for (auto& c : code) c = static_cast<uint8_t>(rng() % 16);
  GroupForms forms(A.data(), rows, cols, g);
  for (int64_t r = 0; r < rows; ++r) forms.build(r, &code[r * cols], value);
  for (int i = 0; i < 600; ++i) {
    const int64_t r = static_cast<int64_t>(rng() % rows), j = static_cast<int64_t>(rng() % cols);
    const auto c = static_cast<uint8_t>(rng() % 16);
    if (c == code[r * cols + j]) continue;
    forms.move(r, j, static_cast<double>(value[c]) - value[code[r * cols + j]]);
    code[r * cols + j] = c;
  }
  for (int64_t k = 0; k < gpr; ++k) {
    const int64_t c0 = k * g, c1 = std::min(cols, c0 + g);
    double ones = 0, ones_scale = 0;
    for (int64_t j = c0; j < c1; ++j)
      for (int64_t l = c0; l < c1; ++l) {
        ones += A[j * cols + l];
        ones_scale += std::abs(A[j * cols + l]);
      }
    EXPECT_NEAR(forms.ones(k), ones, 1e-9 * ones_scale) << "group " << k;
    for (int64_t r = 0; r < rows; ++r) {
      double cAc = 0, cA1 = 0, scale = 0;
      for (int64_t j = c0; j < c1; ++j)
        for (int64_t l = c0; l < c1; ++l) {
          const double vj = value[code[r * cols + j]], vl = value[code[r * cols + l]], a = A[j * cols + l];
          cAc += vj * a * vl;
          cA1 += vj * a;
          scale += std::abs(vj * a * vl) + std::abs(vj * a);
        }
      EXPECT_NEAR(forms.cAc(r, k), cAc, 1e-6 * scale) << "row " << r << " group " << k;
      EXPECT_NEAR(forms.cA1(r, k), cA1, 1e-6 * scale) << "row " << r << " group " << k;
    }
  }
}

TEST(Refine, IsAGptqOption) {
  const FormatChoice f = find_format("int4_asym", 128);
  // --device cuda takes it too (Cuda.Refine* test the GPU's): without a
  // device, or in a CPU-only build, the refusal is about the device.
  QuantizerConfig c{f, false, false, 0.01, "cuda", 3};
  const std::string e = test::error_of([&] { find_method("gptq").make(c); });
  EXPECT_EQ(e.find("--refine"), std::string::npos) << e;
  if (e != "(no error)") {
    EXPECT_NE(e.find("--device cuda"), std::string::npos) << e;
  }
  c.device = "cpu";
  c.refine = -1;
  EXPECT_NE(test::error_of([&] { find_method("gptq").make(c); }).find(">= 0"), std::string::npos);
  // Through the quantizer: the refined codes differ from the plain sweep's,
  // and the stored matrix decodes to a lower objective.
  const Problem p = make_problem(8, 256, 500, 21);
  Tensor w = Tensor::empty(DType::F32, {p.rows, p.cols});
  std::copy(p.w.begin(), p.w.end(), w.data_mut<float>());
  QuantizeInfo plain_info, refined_info;
  c.refine = 0;
  const QuantizedMatrix plain = find_method("gptq").make(c)->quantize(w, &p.stats, &plain_info);
  c.refine = 20;
  const QuantizedMatrix refined = find_method("gptq").make(c)->quantize(w, &p.stats, &refined_info);
  EXPECT_NE(plain.codes, refined.codes);
  EXPECT_EQ(plain_info.refine.cost_before, 0.0);
  EXPECT_GT(refined_info.refine.code_changes, 0);
  std::vector<float> a(static_cast<size_t>(p.rows * p.cols)), b(a.size());
  dequantize(plain, a.data());
  dequantize(refined, b.data());
  const PreparedHessian prep = prepare_hessian(p.stats, GptqOptions{});
  const Objective obj{p, prep};
  EXPECT_NEAR(obj.total(a), refined_info.refine.cost_before, 1e-4 * refined_info.refine.cost_before);
  EXPECT_NEAR(obj.total(b), refined_info.refine.cost_after, 1e-4 * refined_info.refine.cost_before);
  EXPECT_LT(obj.total(b), obj.total(a));
}

}  // namespace
}  // namespace nibble::quant
