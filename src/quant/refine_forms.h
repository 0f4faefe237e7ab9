// GPTQ --refine's quadratic forms of a matrix's codes (src/quant/refine.cpp).
//
// For the objective's matrix A [cols, cols] (symmetric, row-major) and groups
// G of g inputs (the last one ragged), per row and group: u = A_GG c (u_j for
// j in G), cᵀA_GG c and cᵀA_GG 1, with c the values of the row's codes at
// scale 1 and min 0. The refit of a group solves a 2×2 system built from them.
// Rebuilding them costs g² products per group, so the coordinate descent keeps
// them up to date instead, one moved code at a time: c_j += dc changes
// cᵀA_GG c by 2 dc u_j + dc² A_jj, cᵀA_GG 1 by dc (A_GG 1)_j, and u by
// dc A_G,j.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace nibble::quant {

class GroupForms {
 public:
  GroupForms(const float* A, int64_t rows, int64_t cols, int64_t g)
      : A_(A),
        cols_(cols),
        g_(g),
        gpr_((cols + g - 1) / g),
        row_sum_(static_cast<size_t>(cols), 0.0),
        ones_(static_cast<size_t>(gpr_), 0.0),
        u_(static_cast<size_t>(rows * cols)),
        cAc_(static_cast<size_t>(rows * gpr_)),
        cA1_(static_cast<size_t>(rows * gpr_)) {
    for (int64_t k = 0; k < gpr_; ++k)
      for (int64_t j = k * g; j < end(k); ++j) {
        for (int64_t l = k * g; l < end(k); ++l) row_sum_[j] += A[j * cols + l];
        ones_[k] += row_sum_[j];
      }
  }

  // Row r's forms from scratch: code[j] is input j's code, value[c] the value
  // of code c.
  void build(int64_t r, const uint8_t* code, const float* value) {
    for (int64_t k = 0; k < gpr_; ++k) {
      double cAc = 0, cA1 = 0;
      for (int64_t j = k * g_; j < end(k); ++j) {
        double uj = 0;
        for (int64_t l = k * g_; l < end(k); ++l) uj += static_cast<double>(A_[j * cols_ + l]) * value[code[l]];
        u_[r * cols_ + j] = static_cast<float>(uj);
        cAc += value[code[j]] * uj;
        cA1 += value[code[j]] * row_sum_[j];
      }
      cAc_[r * gpr_ + k] = cAc;
      cA1_[r * gpr_ + k] = cA1;
    }
  }

  // The value of input j's code in row r changed by dc.
  void move(int64_t r, int64_t j, double dc) {
    const int64_t k = j / g_;
    cAc_[r * gpr_ + k] += 2 * dc * u_[r * cols_ + j] + dc * dc * A_[j * cols_ + j];
    cA1_[r * gpr_ + k] += dc * row_sum_[j];
    for (int64_t l = k * g_; l < end(k); ++l) u_[r * cols_ + l] += static_cast<float>(dc * A_[j * cols_ + l]);
  }

  double cAc(int64_t r, int64_t k) const { return cAc_[r * gpr_ + k]; }
  double cA1(int64_t r, int64_t k) const { return cA1_[r * gpr_ + k]; }
  // 1ᵀA_GG 1 of group k: the same for every row.
  double ones(int64_t k) const { return ones_[k]; }

 private:
  int64_t end(int64_t k) const { return std::min(cols_, (k + 1) * g_); }

  const float* A_;
  int64_t cols_, g_, gpr_;
  std::vector<double> row_sum_;  // (A_GG 1)_j
  std::vector<double> ones_;     // 1ᵀA_GG 1 per group
  std::vector<float> u_;
  std::vector<double> cAc_, cA1_;
};

}  // namespace nibble::quant
