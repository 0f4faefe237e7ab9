// Hadamard matrices (Sylvester ⊗ Paley) and the randomized Hadamard rotation.
//
// Paley constructions over GF(q), q prime, with the quadratic character
// χ(a) = 0 for a ≡ 0, +1 for a nonzero square mod q, −1 otherwise, and the
// Jacobsthal matrix J[i, j] = χ(j − i) (i, j = 0..q−1; antisymmetric for
// q ≡ 3 mod 4, symmetric for q ≡ 1 mod 4). Index 0 of the bordered matrices
// below is the extra "point at infinity", index 1 + i is the field element i.
//  - Paley I, q ≡ 3 mod 4, order q + 1: H = I + S with
//    S = [[0, 1ᵀ], [−1, J]] (antisymmetric, S·Sᵀ = q·I).
//  - Paley II, q ≡ 1 mod 4, order 2(q + 1): C = [[0, 1ᵀ], [1, J]] (symmetric
//    conference matrix), and every entry of C becomes a 2×2 block:
//    0 → [[1, −1], [−1, −1]], ±1 → ±[[1, 1], [1, −1]].
#include "nibble/hadamard.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "nibble/error.h"

namespace nibble::quant {

namespace {

bool is_power_of_two(int64_t n) { return n >= 1 && (n & (n - 1)) == 0; }

bool is_prime(int64_t q) {
  if (q < 2) return false;
  for (int64_t d = 2; d * d <= q; ++d)
    if (q % d == 0) return false;
  return true;
}

// 1 for Paley I, 2 for Paley II, 0 when m is neither (m itself, not m·2^k).
int paley_kind(int64_t m) {
  if (m >= 4 && is_prime(m - 1) && (m - 1) % 4 == 3) return 1;
  if (m >= 6 && m % 2 == 0 && is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1) return 2;
  return 0;
}

// The smallest m with n = m·2^k that is 1 or a Paley order ≤ kMaxHadamardFactor; 0 when none.
int64_t dense_factor(int64_t n) {
  if (n < 1) return 0;
  int64_t m = n;
  while (m % 2 == 0) m /= 2;  // the odd part: candidates are m, 2m, 4m, ... up to n
  for (; m <= n && m <= kMaxHadamardFactor; m *= 2)
    if (m == 1 || paley_kind(m) != 0) return m;
  return 0;
}

[[noreturn]] void fail_unsupported(int64_t n) {
  std::string shape;  // n's own decomposition, to show which m was looked for
  if (n >= 1) {
    int64_t odd = n, k = 0;
    for (; odd % 2 == 0; odd /= 2) ++k;
    shape = fmt::format(" = {}·2^{}", odd, k);
  }
  std::string orders;  // the Paley orders up to 200, as a sample of the m that work
  for (int64_t m = 4; m <= 200; ++m)
    if (paley_kind(m) != 0 && !is_power_of_two(m)) orders += fmt::format("{}, ", m);
  NIBBLE_FAIL("no Hadamard matrix of order {}{}: supported orders are n = m·2^k with m = 1 or a Paley order "
              "≤ {} (q+1 for a prime q ≡ 3 mod 4, 2(q+1) for a prime q ≡ 1 mod 4: {}...)",
              n, shape, kMaxHadamardFactor, orders);
}

// χ(a) for a = 0..q−1.
std::vector<int> quadratic_character(int64_t q) {
  std::vector<int> chi(static_cast<size_t>(q), -1);
  chi[0] = 0;
  for (int64_t a = 1; a < q; ++a) chi[static_cast<size_t>(a * a % q)] = 1;
  return chi;
}

// H_m [m, m] for m = 1 or a Paley order.
std::vector<int8_t> paley_matrix(int64_t m) {
  std::vector<int8_t> h(static_cast<size_t>(m * m));
  if (m == 1) {
    h[0] = 1;
    return h;
  }
  const int kind = paley_kind(m);
  const int64_t q = kind == 1 ? m - 1 : m / 2 - 1;
  const auto chi = quadratic_character(q);
  // The bordered (q+1)×(q+1) matrix: S for Paley I, C for Paley II.
  auto bordered = [&](int64_t i, int64_t j) -> int {
    if (i == 0) return j == 0 ? 0 : 1;
    if (j == 0) return kind == 1 ? -1 : 1;
    return chi[static_cast<size_t>(((j - i) % q + q) % q)];
  };
  if (kind == 1) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < m; ++j) h[i * m + j] = static_cast<int8_t>(bordered(i, j) + (i == j ? 1 : 0));
  } else {
    for (int64_t i = 0; i <= q; ++i)
      for (int64_t j = 0; j <= q; ++j) {
        const int c = bordered(i, j);
        for (int di = 0; di < 2; ++di)
          for (int dj = 0; dj < 2; ++dj) {
            const int v = c == 0 ? (di == 0 && dj == 0 ? 1 : -1) : c * (di == 1 && dj == 1 ? -1 : 1);
            h[(2 * i + di) * m + 2 * j + dj] = static_cast<int8_t>(v);
          }
      }
  }
  return h;
}

template <typename T>
void fwht_impl(T* x, int64_t n) {
  NIBBLE_CHECK(is_power_of_two(n), "fwht: length {} is not a power of two", n);
  for (int64_t h = 1; h < n; h *= 2)
    for (int64_t i = 0; i < n; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const T a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

}  // namespace

void fwht(float* x, int64_t n) { fwht_impl(x, n); }
void fwht(double* x, int64_t n) { fwht_impl(x, n); }

bool hadamard_supported(int64_t n) { return dense_factor(n) != 0; }

std::vector<int8_t> hadamard_matrix(int64_t n) {
  const int64_t m = dense_factor(n);
  if (m == 0) fail_unsupported(n);
  const int64_t p = n / m;
  const auto hm = paley_matrix(m);
  std::vector<int8_t> h(static_cast<size_t>(n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const int sylvester = std::popcount(static_cast<uint64_t>((i % p) & (j % p))) % 2 ? -1 : 1;
      h[i * n + j] = static_cast<int8_t>(hm[(i / p) * m + j / p] * sylvester);
    }
  return h;
}

HadamardRotation::HadamardRotation(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  m_ = dense_factor(n);
  if (m_ == 0) fail_unsupported(n);
  p_ = n / m_;
  std::mt19937_64 rng(seed);
  signs_.resize(static_cast<size_t>(n));
  for (auto& s : signs_) s = (rng() >> 63) ? -1 : 1;
  const auto hm = paley_matrix(m_);
  hm_.assign(hm.begin(), hm.end());
}

void HadamardRotation::apply(float* x, int64_t rows, int64_t ld) const { run(x, rows, ld, false); }
void HadamardRotation::apply_transpose(float* x, int64_t rows, int64_t ld) const { run(x, rows, ld, true); }

// A row r viewed as R [m, p] (R[a, b] = r[a·p + b]) times H_m ⊗ H_p is
// H_mᵀ · R · H_p: an FWHT of each length-p segment, then segment c becomes
// Σ_a H_m[a, c] · segment a. The transpose uses H_m[c, a] (H_p is symmetric).
// Signs go before H for Q = diag(s)·H/√n and after it for Qᵀ = Hᵀ·diag(s)/√n.
void HadamardRotation::run(float* x, int64_t rows, int64_t ld, bool transpose) const {
  if (ld == 0) ld = n_;
  NIBBLE_CHECK(ld >= n_, "HadamardRotation: row stride {} < size {}", ld, n_);
  const double scale = 1.0 / std::sqrt(static_cast<double>(n_));
  const int64_t n = n_, m = m_, p = p_;
#pragma omp parallel if (rows > 1 && rows * n >= (1 << 16))
  {
    std::vector<double> buf(static_cast<size_t>(n)), out(m > 1 ? static_cast<size_t>(n) : 0);
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x + r * ld;
      for (int64_t i = 0; i < n; ++i) buf[i] = transpose ? row[i] : row[i] * static_cast<double>(signs_[i]);
      for (int64_t a = 0; a < m; ++a) fwht_impl(buf.data() + a * p, p);
      const double* z = buf.data();
      if (m > 1) {
        std::fill(out.begin(), out.end(), 0.0);
        for (int64_t c = 0; c < m; ++c) {
          double* dst = out.data() + c * p;
          for (int64_t a = 0; a < m; ++a) {
            const double h = transpose ? hm_[c * m + a] : hm_[a * m + c];
            const double* src = buf.data() + a * p;
            for (int64_t b = 0; b < p; ++b) dst[b] += h * src[b];
          }
        }
        z = out.data();
      }
      for (int64_t i = 0; i < n; ++i)
        row[i] = static_cast<float>(z[i] * scale * (transpose ? static_cast<double>(signs_[i]) : 1.0));
    }
  }
}

}  // namespace nibble::quant
