// 8-bit codes on the CPU: int8_channel_sym (FORMAT.md §7.2: int8 codes [N, K],
// one fp32 scale per row), int8_g{G}_sym (§7.9, llama.cpp's Q8_0 at G = 32: a
// scale per group of G inputs, its f16 made fp32 at load), int8_g{G}_asym_f32
// (§7.10: unsigned codes, an fp32 scale and min per group) and the FP8 formats
// (§7.4: E4M3 or E5M2 codes, one fp32 scale per row or per tensor). y[M, N] = x[M, K] · Ŵ[N, K]ᵀ read
// straight from the packed parts, so such a checkpoint loads at one byte a
// weight instead of four.
//
//  * Every weight is decoded as the format says, fl(value·s) (int8_asym_f32:
//    fl(fl(code·s) + m)), and dotted with x in fp32: the kernels differ from
//    the reference below only in the order of the fp32 additions. One
//    exception: int8_g{G}_asym_f32 at one token factors each group's sum
//    into s·Σq·x + m·Σx (int8_avx2.cpp's row_one_affine), as llama.cpp's
//    and the int4 kernels' dot products do.
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
#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble::cpu {
namespace {

constexpr int64_t kRowsPerTask = 32;
constexpr int64_t kDequantRows = 64;

void check_shape(Code8 kind, int64_t M, int64_t N, int64_t K, int64_t scale_stride, int64_t group,
                 const float* mins) {
  NIBBLE_CHECK(M >= 0 && N >= 0 && K >= 1, "8-bit-code GEMM: bad shape M={} N={} K={}", M, N, K);
  NIBBLE_CHECK(scale_stride == 0 || scale_stride == 1, "8-bit-code GEMM: scale stride {} (0 or 1)", scale_stride);
  NIBBLE_CHECK(group >= 0 && group % 8 == 0, "8-bit-code GEMM: group size {} (0, or a multiple of 8)", group);
  NIBBLE_CHECK((kind == Code8::UInt8) == (mins != nullptr) && (mins == nullptr || group > 0),
               "8-bit-code GEMM: unsigned codes take a min per group, and only they");
}

void rows_scalar(const int8k::Problem& p, int64_t n0, int64_t n1, float* y) {
  for (int64_t m = 0; m < p.M; ++m)
    for (int64_t n = n0; n < n1; ++n) {
      const float* x = p.x + m * p.K;
      float t = 0.0f;
      for (int64_t k = 0; k < p.K; ++k) t += weight(p, n, k) * x[k];
      y[m * p.N + n] = t;
    }
}

}  // namespace

float code8_value(Code8 kind, uint8_t code) {
  switch (kind) {
    case Code8::Int8: return static_cast<float>(static_cast<int8_t>(code));
    case Code8::E4M3:
    case Code8::E4M3Finite: return f8_e4m3_to_f32(code);
    case Code8::E5M2: return f8_e5m2_to_f32(code);
    case Code8::UInt8: return static_cast<float>(code);
  }
  return 0.0f;
}

namespace {
// Every code's value, one table per kind: decode_code8_row's lookups.
struct ValueTables {
  float v[5][256];
  ValueTables() {
    for (Code8 c : {Code8::Int8, Code8::E4M3, Code8::E4M3Finite, Code8::E5M2, Code8::UInt8})
      for (int b = 0; b < 256; ++b) v[static_cast<int>(c)][b] = code8_value(c, static_cast<uint8_t>(b));
  }
};
}  // namespace

void decode_code8_row(Code8 kind, const uint8_t* codes, const float* scales, int64_t scale_stride, int64_t n,
                      int64_t K, float* out, int64_t group_size, const float* mins) {
  static const ValueTables tables;
  const float* value = tables.v[static_cast<int>(kind)];
  const int8k::Problem p{kind, nullptr, 0, codes, scales, scale_stride, n + 1, K, group_size, mins};
  const uint8_t* q = codes + n * K;
  const float* sr = row_scales(p, n);
  for (int64_t k0 = 0, j = 0; k0 < K; k0 += seg_len(p), j += seg_step(p)) {
    const float s = sr[j];
    const int64_t end = std::min(K, k0 + seg_len(p));
    if (mins) {
      const float m = row_mins(p, n)[j];
      for (int64_t k = k0; k < end; ++k) out[k] = value[q[k]] * s + m;
    } else {
      for (int64_t k = k0; k < end; ++k) out[k] = value[q[k]] * s;
    }
  }
}

void gemm_code8_ref(Code8 kind, const float* x, int64_t M, const uint8_t* codes, const float* scales,
                    int64_t scale_stride, int64_t N, int64_t K, float* y, int64_t group_size, const float* mins) {
  check_shape(kind, M, N, K, scale_stride, group_size, mins);
  rows_scalar({kind, x, M, codes, scales, scale_stride, N, K, group_size, mins}, 0, N, y);
}

void gemm_code8_isa(Isa isa, Code8 kind, const float* x, int64_t M, const uint8_t* codes, const float* scales,
                    int64_t scale_stride, int64_t N, int64_t K, float* y, int64_t group_size, const float* mins) {
  check_shape(kind, M, N, K, scale_stride, group_size, mins);
  NIBBLE_CHECK(isa_supported(isa), "8-bit-code GEMM: this CPU cannot run the {} kernel", isa_name(isa));
  if (M == 0 || N == 0) return;
  int8k::Problem p{kind, x, M, codes, scales, scale_stride, N, K, group_size, mins};
  // UInt8's one-token row takes each group's Σx (inputs below K / 8 · 8, in k order), the same for every row.
  std::vector<float> xs;
  if (isa != Isa::Scalar && kind == Code8::UInt8 && M == 1) {
    const int64_t k8 = K / 8 * 8;
    xs.assign(static_cast<size_t>((k8 + group_size - 1) / group_size), 0.0f);
    for (int64_t k = 0; k < k8; ++k) xs[static_cast<size_t>(k / group_size)] += x[k];
    p.xs = xs.data();
  }
  auto rows = isa == Isa::Scalar ? rows_scalar : int8k::rows_avx2;  // AVX-512 CPUs run the AVX2 rows
  const int64_t tasks = (N + kRowsPerTask - 1) / kRowsPerTask;
  const int threads = M * N * K >= (int64_t{1} << 17) ? omp_get_max_threads() : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t t = 0; t < tasks; ++t) rows(p, t * kRowsPerTask, std::min(N, (t + 1) * kRowsPerTask), y);
}

void gemm_code8(Code8 kind, const float* x, int64_t M, const uint8_t* codes, const float* scales,
                int64_t scale_stride, int64_t N, int64_t K, float* y, int64_t group_size, const float* mins) {
  check_shape(kind, M, N, K, scale_stride, group_size, mins);
  if (M < kDequantRows) {
    gemm_code8_isa(best_isa(), kind, x, M, codes, scales, scale_stride, N, K, y, group_size, mins);
    return;
  }
  gemm_decoded(
      x, M, N, K,
      [&](int64_t n, float* out) {
        decode_code8_row(kind, codes, scales, scale_stride, n, K, out, group_size, mins);
      },
      y);
}

}  // namespace nibble::cpu
