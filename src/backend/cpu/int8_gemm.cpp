// int8_channel_sym on the CPU (FORMAT.md §7.2: int8 codes [N, K], one fp32
// scale per row): y[M, N] = x[M, K] · Ŵ[N, K]ᵀ read straight from the packed
// parts, so a W8A8 checkpoint loads at one byte a weight instead of four.
//
//  * Every weight is decoded as the format says, fl(code·s), and dotted with x
//    in fp32: the kernels differ from the reference below only in the order
//    of the fp32 additions.
//  * Below 64 rows of x: the AVX2 rows (int8_avx2.cpp; also on AVX-512 CPUs),
//    OpenMP over tasks of 32 weight rows. One token streams each weight once
//    (memory bound: a quarter of f32's bytes); a few tokens decode each chunk
//    of 8 weights once for a tile of 4 rows of x.
//  * From 64 rows on (prefill) the product is compute bound: slices of whole
//    256-row GEMM tiles of W are decoded to f32 and multiplied by cpu::sgemm,
//    which gives the bits of gemm_f32 on the dequantized matrix.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/int8_rows.h"
#include "backend/cpu/kernels.h"
#include "nibble/error.h"

namespace nibble::cpu {
namespace {

constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kDequantRows = 64;

void check_shape(int64_t M, int64_t N, int64_t K) {
  NIBBLE_CHECK(M >= 0 && N >= 0 && K >= 1, "int8_channel_sym GEMM: bad shape M={} N={} K={}", M, N, K);
}

void rows_scalar(const int8k::Problem& p, int64_t n0, int64_t n1, float* y) {
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const int8_t* q = p.q + n * p.K;
      const float* x = p.x + m * p.K;
      float t = 0.0f;
      for (int64_t k = 0; k < p.K; ++k) t += static_cast<float>(q[k]) * p.s[n] * x[k];
      y[m * p.N + n] = t;
    }
}

}  // namespace

void decode_int8_channel_row(const int8_t* qweight, const float* scales, int64_t n, int64_t K, float* out) {
  const int8_t* q = qweight + n * K;
  const float s = scales[n];
  for (int64_t k = 0; k < K; ++k) out[k] = static_cast<float>(q[k]) * s;
}

void gemm_int8_channel_ref(const float* x, int64_t M, const int8_t* qweight, const float* scales, int64_t N, int64_t K,
                           float* y) {
  check_shape(M, N, K);
  rows_scalar({x, M, qweight, scales, N, K}, 0, N, y);
}

void gemm_int8_channel_isa(Isa isa, const float* x, int64_t M, const int8_t* qweight, const float* scales, int64_t N,
                           int64_t K, float* y) {
  check_shape(M, N, K);
  NIBBLE_CHECK(isa_supported(isa), "int8_channel_sym GEMM: this CPU cannot run the {} kernel", isa_name(isa));
  if (M == 0 || N == 0) return;
  const int8k::Problem p{x, M, qweight, scales, N, K};
  auto rows = isa == Isa::Scalar ? rows_scalar : int8k::rows_avx2;  // AVX-512 CPUs run the AVX2 rows
  const int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  const int threads = M * N * K >= (int64_t{1} << 17) ? omp_get_max_threads() : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t t = 0; t < tasks; ++t) rows(p, t * kRowsPerTask, std::min(N, (t + 1) * kRowsPerTask), y);
}

void gemm_int8_channel(const float* x, int64_t M, const int8_t* qweight, const float* scales, int64_t N, int64_t K,
                       float* y) {
  check_shape(M, N, K);
  if (M < kDequantRows) {
    gemm_int8_channel_isa(best_isa(), x, M, qweight, scales, N, K, y);
    return;
  }
  // Slices of about 64 MiB of f32, whole kGemmTile-row tiles each: sgemm's tiles are then those of one call on the
  // whole decoded matrix. The buffer is kept between calls (first-touch page faults cost more than the decode).
  const int64_t slice = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * K * kGemmTile)) * kGemmTile;
  // (The calling thread's buffer: OpenMP's workers below write into it through `w`.)
  thread_local std::vector<float> buf;
  buf.resize(static_cast<size_t>(std::min(N, slice) * K));
  float* w = buf.data();
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t rows = std::min(slice, N - n0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) decode_int8_channel_row(qweight, scales, n0 + r, K, w + r * K);
    sgemm(false, true, M, rows, K, 1.0f, x, K, w, K, 0.0f, y + n0, N);
  }
}

}  // namespace nibble::cpu
