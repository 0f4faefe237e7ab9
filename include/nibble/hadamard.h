// Hadamard matrices and the randomized Hadamard rotation of QuaRot (Ashkboos
// et al. 2024) / QuIP# (Tseng et al. 2024): a fixed orthogonal Q that spreads
// each row's outliers over all its entries before quantization.
//
// Conventions (the rotation pipeline relies on them):
//  - Sylvester order: H_{2^k}[i, j] = (-1)^popcount(i & j); fwht() multiplies
//    by exactly this (symmetric) matrix.
//  - An order n = m·p, p = 2^k, is built as H_n = H_m ⊗ H_p: index i = a·p + b
//    (a < m, b < p), H_n[a·p + b, c·p + d] = H_m[a, c] · H_p[b, d]. H_m is 1
//    (m = 1) or a Paley matrix, and m is the smallest constructible m with
//    n = m·2^k (and m ≤ kMaxHadamardFactor), so that applying H_n costs
//    O(n log n + n·m) per row.
//  - Paley I (prime q ≡ 3 mod 4) gives order q + 1 and is not symmetric;
//    Paley II (prime q ≡ 1 mod 4) gives order 2(q + 1). Both use the quadratic
//    character χ mod q; see hadamard.cpp for the exact layout.
#pragma once

#include <cstdint>
#include <vector>

namespace nibble::quant {

// The largest non-power-of-two factor m that is built: the dense m×m step
// costs n·m per row, and beyond ~1000 it dominates the transform (11008 would
// need m = 5504, Paley I with q = 5503; it is refused instead).
inline constexpr int64_t kMaxHadamardFactor = 1024;

// Fast Walsh–Hadamard transform in place: x ← H_n x (unnormalized, Sylvester
// order, so applying it twice gives n·x). n must be a power of two (n ≥ 1).
void fwht(float* x, int64_t n);
void fwht(double* x, int64_t n);

// True when hadamard_matrix(n) has a construction: n = 2^k·m with m = 1 or a
// Paley I/II order ≤ kMaxHadamardFactor.
bool hadamard_supported(int64_t n);

// A Hadamard matrix of order n (entries ±1, H·Hᵀ = n·I), row-major [n, n], in
// the Kronecker layout above. Throws an Error naming n and the supported
// shapes when there is no construction.
std::vector<int8_t> hadamard_matrix(int64_t n);

// The randomized orthogonal rotation Q = diag(s) · H_n / sqrt(n), Q·Qᵀ = I.
// Signs: std::mt19937_64 seeded with `seed`; s_i for i = 0, 1, ..., n−1 takes
// the i-th 64-bit output u and is −1 when the top bit (u >> 63) is set, +1
// otherwise (no distribution object, so the draw is the same on every
// standard library).
class HadamardRotation {
 public:
  HadamardRotation(int64_t n, uint64_t seed);  // throws like hadamard_matrix for unsupported n
  int64_t size() const { return n_; }
  uint64_t seed() const { return seed_; }
  const std::vector<int8_t>& signs() const { return signs_; }  // s, [n]
  // The decomposition n = factor() · 2^k (factor() = m, 1 for powers of two).
  int64_t factor() const { return m_; }

  // Each of the `rows` rows r of x (row stride ld, 0 = n) becomes r · Q, in
  // place. f32 in and out, fp64 inside; rows in parallel when there are many.
  void apply(float* x, int64_t rows, int64_t ld = 0) const;
  // r ← r · Qᵀ = r · Hᵀ · diag(s) / sqrt(n), the inverse of apply.
  void apply_transpose(float* x, int64_t rows, int64_t ld = 0) const;

 private:
  void run(float* x, int64_t rows, int64_t ld, bool transpose) const;

  int64_t n_ = 0, m_ = 1, p_ = 1;
  uint64_t seed_ = 0;
  std::vector<int8_t> signs_;  // [n]
  std::vector<double> hm_;     // H_m [m, m] as fp64 for the dense step
};

}  // namespace nibble::quant
