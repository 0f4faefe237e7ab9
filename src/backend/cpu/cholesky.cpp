// GPTQ's two fp64 factorizations (potrf, trtri) as blocked algorithms whose
// every step is one single-threaded OpenBLAS/LAPACK call on a block of fixed
// size, the blocks spread over OpenMP's threads: the same bits on any number of
// threads (LAPACK's own threaded potrf/trtri moved about 1 in 10^4 of the
// factor's entries at 4096 inputs between one thread and two). The algorithms
// are LAPACK's right-looking dpotrf and blocked dtrtri ("Upper", column-major).
#include <cblas.h>
#include <lapacke.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/kernels.h"

namespace nibble::cpu {

namespace {

constexpr int64_t kBlock = 256;

int I(int64_t v) { return static_cast<int>(v); }

}  // namespace

bool potrf_upper(double* a, int64_t n) {
  bool ok = true;
  for (int64_t k0 = 0; k0 < n && ok; k0 += kBlock) {
    const int64_t kb = std::min(kBlock, n - k0), r0 = k0 + kb, rest = n - r0;
    double* a11 = a + k0 + k0 * n;
    // The diagonal block on one thread (inside a parallel region OpenBLAS's
    // OpenMP build runs single-threaded; with one OpenMP thread it has one).
#pragma omp parallel
#pragma omp single
    ok = LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'U', I(kb), a11, I(n)) == 0;
    if (!ok || rest == 0) break;
    // A12 ← U11⁻ᵀ A12, by column blocks.
    double* a12 = a + k0 + r0 * n;
    const int64_t tb = (rest + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static)
    for (int64_t b = 0; b < tb; ++b)
      cblas_dtrsm(CblasColMajor, CblasLeft, CblasUpper, CblasTrans, CblasNonUnit, I(kb),
                  I(std::min(kBlock, rest - b * kBlock)), 1.0, a11, I(n), a12 + b * kBlock * n, I(n));
    // A22 ← A22 − A12ᵀ A12 on the upper triangle, block by block.
    syrk_upper(false, rest, kb, -1.0, a12, n, a + r0 + r0 * n, n);
  }
  return ok;
}

void syrk_upper(bool row_major, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, double* c,
                int64_t ldc) {
  const CBLAS_ORDER order = row_major ? CblasRowMajor : CblasColMajor;
  // Element (r, s) of a matrix with leading dimension ld.
  auto at = [row_major](int64_t r, int64_t s, int64_t ld) { return row_major ? r * ld + s : r + s * ld; };
  const int64_t nb = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t t = 0; t < nb * nb; ++t) {
    const int64_t bi = t % nb, bj = t / nb;  // tile (bi, bj) of C, bi <= bj
    if (bi > bj) continue;
    const int64_t i0 = bi * kBlock, j0 = bj * kBlock;
    const int64_t mi = std::min(kBlock, n - i0), nj = std::min(kBlock, n - j0);
    double* ct = c + at(i0, j0, ldc);
    if (bi == bj)
      cblas_dsyrk(order, CblasUpper, CblasTrans, I(mi), I(k), alpha, a + at(0, i0, lda), I(lda), 1.0, ct, I(ldc));
    else
      cblas_dgemm(order, CblasTrans, CblasNoTrans, I(mi), I(nj), I(k), alpha, a + at(0, i0, lda), I(lda),
                  a + at(0, j0, lda), I(lda), 1.0, ct, I(ldc));
  }
}

bool trtri_upper(double* a, int64_t n) {
  for (int64_t j = 0; j < n; ++j)
    if (!(a[j + j * n] != 0.0)) return false;  // singular (LAPACK's info > 0)
  std::vector<double> t;
  for (int64_t j0 = 0; j0 < n; j0 += kBlock) {
    const int64_t jb = std::min(kBlock, n - j0);
    double* u11 = a + j0 + j0 * n;
    if (j0 > 0) {
      // Rows 0..j0 of this block column: X01 ← −(U00⁻¹ X01) U11⁻¹, with U00⁻¹
      // already in place above and to the left. By row blocks, each reading
      // the block column as it was (t).
      double* x01 = a + j0 * n;
      t.resize(static_cast<size_t>(j0 * jb));
      for (int64_t c = 0; c < jb; ++c) std::copy_n(x01 + c * n, j0, &t[c * j0]);
      const int64_t rb = (j0 + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(dynamic, 1)
      for (int64_t b = 0; b < rb; ++b) {
        const int64_t i0 = b * kBlock, mi = std::min(kBlock, j0 - i0), i1 = i0 + mi;
        const double* inv = a;  // U00⁻¹
        cblas_dtrmm(CblasColMajor, CblasLeft, CblasUpper, CblasNoTrans, CblasNonUnit, I(mi), I(jb), 1.0,
                    inv + i0 + i0 * n, I(n), x01 + i0, I(n));
        if (i1 < j0)
          cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, I(mi), I(jb), I(j0 - i1), 1.0, inv + i0 + i1 * n,
                      I(n), &t[i1], I(j0), 1.0, x01 + i0, I(n));
        cblas_dtrsm(CblasColMajor, CblasRight, CblasUpper, CblasNoTrans, CblasNonUnit, I(mi), I(jb), -1.0, u11, I(n),
                    x01 + i0, I(n));
      }
    }
    bool ok = true;
#pragma omp parallel
#pragma omp single
    ok = LAPACKE_dtrtri_work(LAPACK_COL_MAJOR, 'U', 'N', I(jb), u11, I(n)) == 0;
    if (!ok) return false;
  }
  return true;
}

}  // namespace nibble::cpu
