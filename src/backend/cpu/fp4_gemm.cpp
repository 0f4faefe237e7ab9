// FP4 E2M1 codes on the CPU: fp4_e2m1_g{G} (FORMAT.md §7.5), mxfp4 (§7.6) and
// nvfp4 (§7.7), all three as codes packed two a byte times one scale per group:
// fp4_e2m1's bf16 scales made fp32 when a model loads, mxfp4's and nvfp4's
// scale bytes kept as stored and looked up in a 256-entry table made then
// (E8M0's power of two; NVFP4's fl(e4m3·global)), exactly the scale each
// format's decode multiplies by (packed_kernels.cpp). y[M, N] = x[M, K] · Ŵ[N,
// K]ᵀ read straight from those parts, so such a checkpoint loads at a little
// over half a byte a weight instead of four.
//
//  * One token with fp32 scales and groups of 32..128 (fp4_e2m1, mxfp4) on an
//    AVX2 CPU: the int4 integer GEMV (int4_avx2_i24.cpp) with each code looked
//    up as 2·e2m1(code) + 12 ∈ [0, 24] by one vpshufb per 32 codes and each
//    group's pair (s/2, −6·s): x in 24-bit fixed point per group, so the
//    numerics of int4_asym's GEMV (int4_gemm.cpp). nvfp4's groups of 16 take
//    x's fixed point per 32 inputs. 4096² on the 2-vCPU VM: 2.6-3× faster
//    than the fp32 decode below (README, "Benchmarks").
//  * Otherwise every weight is decoded as the format says, fl(e2m1(code)·s),
//    and dotted with x in fp32: the kernels differ from the reference below
//    only in the order of the fp32 additions.
//  * Below 64 rows of x: the AVX2 rows (fp4_avx2.cpp; also on AVX-512 CPUs),
//    OpenMP over tasks of 32 weight rows; each chunk of 8 weights is decoded
//    once for a tile of up to 8 rows (8 rather than 4: nvfp4 at 16 tokens
//    13.5 → 10.0 ms on 4096²).
//  * From 64 rows on: cpu::gemm_decoded (slices of whole sgemm tiles decoded
//    to f32 by the AVX2 decode, then sgemm), the bits of gemm_f32 on the
//    dequantized matrix.
#include <omp.h>

#include <algorithm>

#include "backend/cpu/fp4_rows.h"
#include "backend/cpu/kernels.h"
#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble::cpu {
namespace {

constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kDequantRows = 64;

// log2 of the group size: the formats' 16, 32, 64 or 128.
int check_shape(int64_t M, int64_t N, int64_t K, int group_size) {
  NIBBLE_CHECK(M >= 0 && N >= 0 && K >= 1, "FP4 GEMM: bad shape M={} N={} K={}", M, N, K);
  NIBBLE_CHECK(group_size == 16 || group_size == 32 || group_size == 64 || group_size == 128,
               "FP4 GEMM: group size {} (16, 32, 64 or 128)", group_size);
  int shift = 0;
  while ((1 << shift) < group_size) ++shift;
  return shift;
}

void rows_scalar(const fp4k::Problem& p, int64_t n0, int64_t n1, float* y) {
  const int64_t bytes = (p.K + 1) / 2, groups = ((p.K - 1) >> p.shift) + 1;
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const uint8_t* q = p.q + n * bytes;
      const float* x = p.x + m * p.K;
      float t = 0.0f;
      for (int64_t k = 0; k < p.K; ++k) t += fp4k::weight(q, p.s, n * groups, k, p.shift) * x[k];
      y[m * p.N + n] = t;
    }
}

}  // namespace

void decode_fp4_row(const uint8_t* codes, Fp4Scales scales, int64_t n, int64_t K, int group_size, float* out) {
  const int shift = check_shape(1, n + 1, K, group_size);
  const uint8_t* q = codes + n * ((K + 1) / 2);
  const int64_t s0 = n * (((K - 1) >> shift) + 1);
  for (int64_t k = 0; k < K; ++k) out[k] = fp4k::weight(q, scales, s0, k, shift);
}

void gemm_fp4_ref(const float* x, int64_t M, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K,
                  int group_size, float* y) {
  const int shift = check_shape(M, N, K, group_size);
  rows_scalar({x, M, codes, scales, N, K, shift}, 0, N, y);
}

void gemm_fp4_isa(Isa isa, const float* x, int64_t M, const uint8_t* codes, Fp4Scales scales, int64_t N,
                  int64_t K, int group_size, float* y) {
  const int shift = check_shape(M, N, K, group_size);
  NIBBLE_CHECK(isa_supported(isa), "FP4 GEMM: this CPU cannot run the {} kernel", isa_name(isa));
  if (M == 0 || N == 0) return;
  if (isa != Isa::Scalar && M == 1) {
    fp4k::gemv_integer(x, codes, scales, N, K, group_size, y);
    return;
  }
  const fp4k::Problem p{x, M, codes, scales, N, K, shift};
  auto rows = isa == Isa::Scalar ? rows_scalar : fp4k::rows_avx2;  // AVX-512 CPUs run the AVX2 rows
  const int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  const int threads = M * N * K >= (int64_t{1} << 17) ? omp_get_max_threads() : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t t = 0; t < tasks; ++t) rows(p, t * kRowsPerTask, std::min(N, (t + 1) * kRowsPerTask), y);
}

void gemm_fp4(const float* x, int64_t M, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K,
              int group_size, float* y) {
  const int shift = check_shape(M, N, K, group_size);
  if (M < kDequantRows) {
    gemm_fp4_isa(best_isa(), x, M, codes, scales, N, K, group_size, y);
    return;
  }
  if (!isa_supported(Isa::Avx2)) {
    gemm_decoded(x, M, N, K, [&](int64_t n, float* out) { decode_fp4_row(codes, scales, n, K, group_size, out); }, y);
    return;
  }
  const fp4k::Problem p{x, M, codes, scales, N, K, shift};
  gemm_decoded(x, M, N, K, [&](int64_t n, float* out) { fp4k::decode_row_avx2(p, n, out); }, y);
}

}  // namespace nibble::cpu
