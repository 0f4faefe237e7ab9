// GPTQ's --refine: coordinate descent over the codes and a least-squares refit
// of each group's scale (and min), both against the objective of the sweep,
// f(Q) = Σ_rows (q − w)ᵀ A (q − w) with A = H + λI on the live inputs.
//
// Per row, e = A (q − w) is kept up to date: moving q_j by δ changes f by
// 2δ e_j + δ² A_jj and e by δ A[:, j]. The 1-D minimizer of coordinate j is
// t = q_j − e_j / A_jj, so the representable value nearest to t is the best
// one for that weight. For a group G with codes c and decode c · s + m, a
// change (Δs, Δm) moves q_G by c Δs + Δm, and f by
//   2 (Δs cᵀe_G + Δm 1ᵀe_G) + [Δs Δm] [[cᵀA_GG c, cᵀA_GG 1], [1ᵀA_GG c, 1ᵀA_GG 1]] [Δs Δm]ᵀ,
// minimized by one 2×2 solve (c the codes' values, FormatSpec::affine; without
// a min, Δm = 0 and Δs = −cᵀe_G / cᵀA_GG c); the parameters, rounded as the
// format stores them, are kept when they lower f.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "quant/refine_forms.h"
#include "quant/refine_step.h"

namespace nibble::quant {

RefineReport refine(GptqResult& res, const float* w, const MatrixStats& stats, const PreparedHessian& prep,
                    const Grid& grid, int passes) {
  const int64_t rows = res.rows, cols = res.cols;
  NIBBLE_CHECK(passes >= 0, "--refine: the number of passes must be >= 0, found {}", passes);
  NIBBLE_CHECK(stats.dim == cols && prep.cols == cols, "refine: the statistics are for {} inputs, the matrix has {}",
               stats.dim, cols);
  NIBBLE_CHECK(res.dequant.size() == static_cast<size_t>(rows * cols), "refine: the result has no values");
  RefineReport rep;
  if (passes == 0 || rows == 0 || cols == 0) return rep;
  const int64_t g = grid.group_len(cols);
  const int64_t gpr = g > 0 ? (cols + g - 1) / g : 0;
  const bool has_codes = !res.codes.empty();
  const FormatSpec* f = grid.format();
  // Group parameters are refitted for grouped formats with an affine decode
  // (not for per-channel ones, whose one group is the whole row).
  const AffineParams* affine = f ? f->affine : nullptr;
  const bool refit = g > 0 && has_codes && affine && grid.group_size() > 0;
  const bool with_min = refit && affine->has_min;
  const std::vector<uint8_t>& dead = prep.dead;

  // A = H + λI on the live inputs (a dead input's row and column of H are 0).
  std::vector<float> A(static_cast<size_t>(cols * cols));
#pragma omp parallel for schedule(static) if (cols >= 512)
  for (int64_t i = 0; i < cols; ++i)
    for (int64_t j = 0; j < cols; ++j)
      A[i * cols + j] = dead[i] || dead[j] ? 0.0f
                                           : static_cast<float>(stats.H[i * cols + j] + (i == j ? prep.lambda : 0.0));
  // D = Q − W on the live inputs, E = D A (A is symmetric).
  std::vector<float> D(static_cast<size_t>(rows * cols)), E(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j)
      D[r * cols + j] = dead[j] ? 0.0f : res.dequant[r * cols + j] - w[r * cols + j];
  cpu::sgemm(false, false, rows, cols, cols, 1.0f, D.data(), cols, A.data(), cols, 0.0f, E.data(), cols);
  // The value of each code at scale 1, min 0 (decode is code_value · scale + min).
  float code_value[256] = {};
  if (refit) {
    GroupParams unit;
    unit.scale = unit.global = 1.0f;
    for (int c = 0; c < (1 << f->code_bits); ++c) code_value[c] = f->decode(static_cast<uint8_t>(c), unit);
  }

  // The smallest distance between two distinct values a group can hold (0 when
  // the grid's values cannot be listed: no screen).
  auto smallest_gap = [&](const GroupParams& p) {
    if (!has_codes || !f || f->code_bits > 8) return 0.0f;
    std::vector<float> v;
    for (int c = 0; c < (1 << f->code_bits); ++c) v.push_back(f->decode(static_cast<uint8_t>(c), p));
    std::sort(v.begin(), v.end());
    float best = INFINITY;
    for (size_t i = 1; i < v.size(); ++i)
      if (v[i] > v[i - 1]) best = std::min(best, v[i] - v[i - 1]);
    return std::isfinite(best) ? best : 0.0f;
  };
  // Per row and group, kept up to date as codes move: the refit's forms
  // (refine_forms.h; empty without a refit) and the smallest gap.
  GroupForms forms(A.data(), refit ? rows : 0, refit ? cols : 0, refit ? g : 1);
  const int64_t gaps = std::max<int64_t>(gpr, 1);
  std::vector<float> gap(static_cast<size_t>(rows * gaps));
  std::vector<uint8_t> active(static_cast<size_t>(rows), 1);  // changed something in the pass before
  std::vector<int> passes_run(static_cast<size_t>(rows), 0);
  const int threads = rows * cols >= (1 << 16) ? omp_get_max_threads() : 1;
  // The objective per row, then the rows added in order: the same total on any
  // number of threads.
  std::vector<double> row_cost(static_cast<size_t>(rows), 0.0);
  auto total = [&] {
    double s = 0;
    for (double v : row_cost) s += v;
    return s;
  };
  int64_t code_changes = 0, group_refits = 0;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* code = has_codes ? &res.codes[r * cols] : nullptr;
    for (int64_t j = 0; j < cols; ++j) row_cost[r] += static_cast<double>(E[r * cols + j]) * D[r * cols + j];
    for (int64_t k = 0; k < gaps; ++k) gap[r * gaps + k] = smallest_gap(g > 0 ? res.params[r * gpr + k] : GroupParams{});
    if (refit) forms.build(r, code, code_value);
  }
  D = {};
  const double before = total();
  // The refits of one group in every row, applied to E at once: dQ [rows that
  // refit, g] times A's rows of the group.
  std::vector<float> dQ(static_cast<size_t>(refit ? rows * g : 0)), T;
  std::vector<int64_t> refit_rows;

  for (int pass = 1; pass <= passes; ++pass) {
    std::vector<uint8_t> changed(static_cast<size_t>(rows), 0);
    // Coordinate descent, each active row on its own.
#pragma omp parallel for schedule(dynamic, 8) num_threads(threads) reduction(+ : code_changes)
    for (int64_t r = 0; r < rows; ++r) {
      if (!active[r]) continue;
      float* e = &E[r * cols];
      float* q = &res.dequant[r * cols];
      uint8_t* code = has_codes ? &res.codes[r * cols] : nullptr;
      int64_t moved = 0;
      for (int64_t j = 0; j < cols; ++j) {
        if (dead[j]) continue;
        const float ajj = A[j * cols + j];
        // Every other value is at least gap away from q_j, so it can be nearer
        // to t = q_j − e_j / A_jj only when |t − q_j| ≥ gap / 2.
        if (std::abs(e[j]) < 0.49f * ajj * gap[r * gaps + (g > 0 ? j / g : 0)]) continue;
        const GroupParams p = g > 0 ? res.params[r * gpr + j / g] : GroupParams{};
        uint8_t c = 0;
        const float v = grid.quantize(q[j] - e[j] / ajj, p, &c);
        const float delta = v - q[j];
        if (delta == 0.0f || !(2.0f * delta * e[j] + delta * delta * ajj < 0.0f)) continue;
        q[j] = v;
        if (refit) forms.move(r, j, static_cast<double>(code_value[c]) - code_value[code[j]]);
        if (code) code[j] = c;
        cblas_saxpy(static_cast<int>(cols), delta, &A[j * cols], 1, e, 1);  // e += δ A[:, j]
        ++moved;
      }
      code_changes += moved;
      changed[r] = moved > 0;
    }
    // The refit, group by group; in each row in the order of its groups, each
    // one seeing the gradient after the one before.
    for (int64_t k = 0; refit && k < gpr; ++k) {
      const int64_t c0 = k * g, c1 = std::min(cols, c0 + g), n = c1 - c0;
      std::vector<uint8_t> took(static_cast<size_t>(rows), 0);
#pragma omp parallel for schedule(dynamic, 16) num_threads(threads) reduction(+ : group_refits)
      for (int64_t r = 0; r < rows; ++r) {
        if (!active[r]) continue;
        const float* e = &E[r * cols];
        float* q = &res.dequant[r * cols];
        const uint8_t* code = &res.codes[r * cols];
        float* dq = &dQ[r * g];
        double ce = 0, oe = 0;
        for (int64_t j = c0; j < c1; ++j) {
          if (dead[j]) continue;
          ce += code_value[code[j]] * e[j];
          oe += e[j];
        }
        const RefitSums sums{ce, oe, forms.cAc(r, k), forms.cA1(r, k), forms.ones(k)};
        GroupParams& p = res.params[r * gpr + k];
        double ds = 0, dm = 0;
        if (!refit_step(sums, with_min, ds, dm)) continue;
        const double s0 = affine->scale(p), m0 = with_min ? p.min : 0.0;
        const GroupParams np = affine->store(p, s0 + ds, m0 + dm);
        const double s1 = affine->scale(np), m1 = with_min ? np.min : 0.0;
        if (!(s1 > 0) || !std::isfinite(s1) || !std::isfinite(m1) || (s1 == s0 && m1 == m0)) continue;
        // The change of f for the stored parameters, from the quadratic form
        // (exact up to the rounding of decode): a cheap screen...
        const double s_ = s1 - s0, m_ = m1 - m0;
        if (!(refit_model_change(sums, s_, m_) < 0)) continue;
        // ...then exactly, on the values decode gives.
        double df = 0;
        for (int64_t j = c0; j < c1; ++j) {
          dq[j - c0] = dead[j] ? 0.0f : f->decode(code[j], np) - q[j];
          df += 2.0 * dq[j - c0] * e[j];
        }
        for (int64_t j = c0; j < c1; ++j) {
          if (dq[j - c0] == 0.0f) continue;
          double sum = 0;
          for (int64_t l = c0; l < c1; ++l) sum += static_cast<double>(A[j * cols + l]) * dq[l - c0];
          df += dq[j - c0] * sum;
        }
        if (!(df < 0)) continue;
        p = np;
        gap[r * gaps + k] = smallest_gap(np);
        ++group_refits;
        took[r] = 1;
        // Every value of the group (dead ones too: not in f, but stored, so
        // they keep the value the file will decode to).
        for (int64_t j = c0; j < c1; ++j) q[j] = f->decode(code[j], np);
      }
      // e += A[:, G] dq for every row that took its refit: one GEMM.
      refit_rows.clear();
      for (int64_t r = 0; r < rows; ++r)
        if (took[r]) {
          changed[r] = 1;
          std::copy_n(&dQ[r * g], n, &dQ[refit_rows.size() * n]);
          refit_rows.push_back(r);
        }
      const int64_t m = static_cast<int64_t>(refit_rows.size());
      if (m == 0) continue;
      T.resize(static_cast<size_t>(m * cols));
      cpu::sgemm(false, false, m, cols, n, 1.0f, dQ.data(), n, &A[c0 * cols], cols, 0.0f, T.data(), cols);
#pragma omp parallel for schedule(static) num_threads(threads)
      for (int64_t i = 0; i < m; ++i) {
        float* e = &E[refit_rows[i] * cols];
        const float* t = &T[i * cols];
        for (int64_t j = 0; j < cols; ++j) e[j] += t[j];
      }
    }
    bool any = false;
    for (int64_t r = 0; r < rows; ++r) {
      if (active[r]) passes_run[r] = pass;
      active[r] = changed[r];
      any |= changed[r] != 0;
    }
    if (!any) break;
  }
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int64_t r = 0; r < rows; ++r) {
    row_cost[r] = 0;
    for (int64_t j = 0; j < cols; ++j)
      if (!dead[j]) row_cost[r] += static_cast<double>(E[r * cols + j]) * (res.dequant[r * cols + j] - w[r * cols + j]);
  }
  const double after = total();
  const int max_passes = rows > 0 ? *std::max_element(passes_run.begin(), passes_run.end()) : 0;
  rep.code_changes = code_changes;
  rep.group_refits = group_refits;
  rep.passes = max_passes;
  rep.cost_before = before;
  rep.cost_after = after;
  return rep;
}

}  // namespace nibble::quant
