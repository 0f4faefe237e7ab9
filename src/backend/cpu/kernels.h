// CPU kernels behind one dispatch point (DESIGN.md: kernels by format, backend, op).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "nibble/format.h"

namespace nibble::cpu {

// C[M, N] = α·op(A)·op(B) + β·C, row-major (op(A) = Aᵀ when trans_a: A is then
// [K, M]), like cblas_sgemm, but with bits that do not depend on the number of
// threads: OpenBLAS's own threading splits a product in ways that change its
// rounding, so GPTQ, AWQ and --refine (whose inputs come through the forward's
// products) wrote other checkpoints on other core counts. Fixed tiles of C,
// each one single-threaded call, spread over OpenMP's threads instead. Needs
// OpenBLAS's OpenMP build (scripts/install-deps.sh installs it; CMakeLists.txt
// links it): the pthreads build would still thread each tile.
constexpr int64_t kGemmTile = 256;  // sgemm's tiles of C: kGemmTile × kGemmTile
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// GPTQ's fp64 factorizations, column-major with leading dimension n, with bits
// that do not depend on the number of threads either (src/backend/cpu/cholesky.cpp):
// potrf_upper leaves U with A = UᵀU in the upper triangle (LAPACK's dpotrf 'U'),
// false when A is not positive definite; trtri_upper replaces an upper
// triangular U by U⁻¹ (dtrtri 'U' 'N'), false when U is singular. The strictly
// lower triangle is neither read nor written.
bool potrf_upper(double* a, int64_t n);
bool trtri_upper(double* a, int64_t n);
// C ← α·AᵀA + C on C's upper triangle (n × n), A [k, n], both row-major or both column-major: cblas_dsyrk's
// 'U', 'T' with β = 1, by fixed tiles of C (each one single-threaded dsyrk or dgemm), so with the same bits on any
// number of threads. potrf_upper's trailing update and GPTQ's Hessians (MatrixStats::add).
void syrk_upper(bool row_major, int64_t n, int64_t k, double alpha, const double* a, int64_t lda, double* c,
                int64_t ldc);

// One query head's softmax attention over key/value rows in up to a few runs of consecutive rows (a quantized
// cache's dequantized rows, then the exact ones), each row `stride` floats after the one before:
// scores[k] = scale·q·key_k over the runs' rows in order, softmax in fp32, out[hd] = Σ_k p_k·value_k (in order of k).
// `scores` holds the rows' count. The dot products go by 16 partial sums, reduced pairwise, with no FMA: the same
// bits on every x86-64 (the AVX2 and AVX-512 clones run the same arithmetic wider), for every query whichever
// prefill, decode step or quantized cache it comes in (src/backend/cpu/attention.cpp).
struct AttentionRun {
  const float* keys;
  const float* values;
  int64_t rows;
};
void attention_row(const float* q, int64_t hd, float scale, const AttentionRun* runs, int nruns, int64_t stride,
                   float* scores, float* out);

// y[M, N] = x[M, K] · W[N, K]ᵀ with W dense f32 (sgemm above; OpenBLAS's sgemv for M = 1).
void gemm_f32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y);
// The same product for a packed W whose row n decode_row(n, out[K]) writes in f32 (decoded as its format says):
// slices of whole kGemmTile-row tiles decoded in parallel, then sgemm, so y has the bits of gemm_f32 on the whole
// decoded matrix. The packed GEMMs' path from 64 rows of x on, where the product is compute bound.
void gemm_decoded(const float* x, int64_t M, int64_t N, int64_t K,
                  const std::function<void(int64_t n, float* out)>& decode_row, float* y);

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ with Ŵ an int4_asym matrix read straight from its
// packed parts (qweight [N, ceil(K/2)], scales/mins bf16 [N, ceil(K/G)]). Each
// group is decoded exactly as FORMAT.md says (fl(fl(code·s) + m)) into a small
// buffer and dotted with x in fp32; the full-precision matrix never exists.
// Each int4 GEMM below also takes fp32 scales and mins (int4_asym_f32, FORMAT.md §7.8; int4_sym as the pairs
// (s, −8·s)): the same codes, layout and decode fl(fl(code·s) + m).
void gemm_int4_asym_ref(const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                        const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y);
void gemm_int4_asym_ref(const float* x, int64_t M, const uint8_t* qweight, const float* scales, const float* mins,
                        int64_t N, int64_t K, int group_size, float* y);
// Row n of such a matrix decoded into out[K], each weight fl(fl(code·s) + m): what gemm_int4_asym_ref above and
// gemm_int4_asym below (from 64 rows on) multiply.
void decode_int4_asym_row(const uint8_t* qweight, const uint16_t* scales, const uint16_t* mins, int64_t n, int64_t K,
                          int group_size, float* out);
void decode_int4_asym_row(const uint8_t* qweight, const float* scales, const float* mins, int64_t n, int64_t K,
                          int group_size, float* out);

// Which instruction set a CPU kernel uses. Scalar is the reference above;
// Avx2 needs AVX2+FMA+F16C, Avx512 needs AVX-512 F/BW/VL/DQ (checked at run time).
// The M = 1 GEMV of Avx2, and of Avx512 on CPUs with AVX-512 VNNI, uses integer
// dot products on x in 24-bit fixed point per group (|Δx_i| ≤ max|x over i's
// group|·2^-23, int4_isa.h); everything else uses the exact decoded weights and
// fp32 products.
enum class Isa { Scalar, Avx2, Avx512 };
const char* isa_name(Isa isa);
bool isa_supported(Isa isa);  // this CPU can run it (and this build has it)
Isa best_isa();               // the fastest supported one; what gemm_int4_asym uses
bool gemv_is_integer(Isa isa);  // its M = 1 path is the integer GEMV on this CPU

// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ for an int4_asym matrix, same arguments and
// meaning as gemm_int4_asym_ref: the fast path (src/backend/cpu/int4_gemm.cpp
// documents the design). Results equal the reference up to fp32 summation order.
// From 64 rows of x on it decodes W in slices of whole 256-row tiles and runs
// sgemm: the bits of gemm_f32 on the dequantized matrix (compute bound there,
// where the int4 kernels would decode each weight again per block of rows).
void gemm_int4_asym(const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                    const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y);
void gemm_int4_asym(const float* x, int64_t M, const uint8_t* qweight, const float* scales, const float* mins,
                    int64_t N, int64_t K, int group_size, float* y);
// The same with a chosen ISA (tests, benchmarks); throws nibble::Error when the
// CPU cannot run it. With fp32 parameters the AVX2 tiles (M ≥ 2) decode with a
// multiply and an add where bf16's exact products let one FMA do; the integer
// GEMVs (M = 1) never decode a weight, so their arithmetic is the same for both.
void gemm_int4_asym_isa(Isa isa, const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                        const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y);
void gemm_int4_asym_isa(Isa isa, const float* x, int64_t M, const uint8_t* qweight, const float* scales,
                        const float* mins, int64_t N, int64_t K, int group_size, float* y);

// 8-bit codes times one fp32 scale per row or per tensor (src/backend/cpu/int8_gemm.cpp): int8_channel_sym
// (FORMAT.md §7.2) and fp8_e4m3 / fp8_e5m2 _tensor / _channel (§7.4); or per group of inputs: int8_g{G}_sym (§7.9)
// and int8_g{G}_asym_f32 (§7.10). code8_value: a code's value (int8 two's complement, the unsigned byte, or the OCP
// FP8 value: E4M3's S.1111.111 is NaN, E5M2's infinities and NaNs as IEEE's).
// E4M3Finite: E4M3 codes known to hold no NaN (the caller checked them once, as packed_kernels.cpp's prepare does),
// which the AVX2 rows decode without the NaN blend, about 1.5× faster; the values are E4M3's.
// UInt8: unsigned codes with a min per group (int8_asym_f32), decoded fl(fl(code·s) + m); only with group_size > 0
// and `mins`, laid out as the scales.
enum class Code8 { Int8, E4M3, E4M3Finite, E5M2, UInt8 };
float code8_value(Code8 kind, uint8_t code);
// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ read straight from the packed codes [N, K] and scales (s[n·scale_stride]: stride
// 1 per row, 0 per tensor; or, with group_size G > 0 (a multiple of 8), s[n·ceil(K/G) + k/G] per group of G inputs),
// each weight decoded as the format says, fl(value·s) (UInt8: fl(fl(value·s) + mins[i]) at the scale's index i),
// and dotted with x in fp32.
// _ref: the scalar reference, additions in k order; _isa: Scalar or Avx2 rows (Avx512 runs the Avx2 rows), the
// same sums in another order; gemm_code8: the fast path (those rows below 64 rows of x, the bits of gemm_f32 on
// the decoded matrix from 64 on). decode_code8_row: row n, each weight as the format decodes it.
void gemm_code8_ref(Code8 kind, const float* x, int64_t M, const uint8_t* codes, const float* scales,
                    int64_t scale_stride, int64_t N, int64_t K, float* y, int64_t group_size = 0,
                    const float* mins = nullptr);
void gemm_code8_isa(Isa isa, Code8 kind, const float* x, int64_t M, const uint8_t* codes, const float* scales,
                    int64_t scale_stride, int64_t N, int64_t K, float* y, int64_t group_size = 0,
                    const float* mins = nullptr);
void gemm_code8(Code8 kind, const float* x, int64_t M, const uint8_t* codes, const float* scales,
                int64_t scale_stride, int64_t N, int64_t K, float* y, int64_t group_size = 0,
                const float* mins = nullptr);
void decode_code8_row(Code8 kind, const uint8_t* codes, const float* scales, int64_t scale_stride, int64_t n,
                      int64_t K, float* out, int64_t group_size = 0, const float* mins = nullptr);

// FP4 E2M1 codes times one scale per group of G inputs (src/backend/cpu/fp4_gemm.cpp): fp4_e2m1_g{G}, mxfp4 and
// nvfp4 (FORMAT.md §7.5-7.7). codes [N, ceil(K/2)] packed as int4_asym's (element 2j in byte j's low nibble);
// G = 16, 32, 64 or 128. The scale of group g of row n (index i = n·ceil(K/G) + g) is f32[i], or table[codes[i]]
// for the formats whose scales are bytes (mxfp4's E8M0, nvfp4's E4M3 times the global scale: packed_kernels.cpp
// makes the 256-entry table when a model loads, so the stored bytes stay as they are).
struct Fp4Scales {
  const float* f32 = nullptr;
  const uint8_t* codes = nullptr;
  const float* table = nullptr;
};
// Each weight decoded as the formats say, fl(e2m1(code)·s), and dotted with x in fp32. _ref: the scalar reference,
// additions in k order; _isa: Scalar or Avx2 rows (Avx512 runs the Avx2 rows), the same sums in another order,
// except that Avx2 / Avx512 take one token (M = 1) through the int4 integer GEMV on x in 24-bit fixed point
// (fp4_gemm.cpp); gemm_fp4: the fast path (those below 64 rows of x, the bits of gemm_f32 on the decoded matrix
// from 64 on). decode_fp4_row: row n, fl(e2m1(code)·s).
void gemm_fp4_ref(const float* x, int64_t M, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K,
                  int group_size, float* y);
void gemm_fp4_isa(Isa isa, const float* x, int64_t M, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K,
                  int group_size, float* y);
void gemm_fp4(const float* x, int64_t M, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K,
              int group_size, float* y);
void decode_fp4_row(const uint8_t* codes, Fp4Scales scales, int64_t n, int64_t K, int group_size, float* out);

// A format's CPU kernel (src/backend/cpu/packed_kernels.cpp): `prepare` turns the stored parts (in the order the
// format's registry row lists them) into what `gemm` reads, once when a model loads (nullptr: the stored parts
// as they are); gemm computes y[M, N] = x[M, K] · Ŵ[N, K]ᵀ from them, the same values as the format's
// dequantized matrix times x up to fp32 rounding.
struct PackedKernel {
  std::vector<Tensor> (*prepare)(const std::vector<Tensor>& parts, int64_t N, int64_t K, int group_size);
  void (*gemm)(const float* x, int64_t M, const std::vector<Tensor>& parts, int64_t N, int64_t K, int group_size,
               float* y);
};
// The CPU kernel registered for a format, or nullptr when there is none: callers then dequantize the matrix once
// and use gemm_f32 (DESIGN.md: a missing entry falls back to dequantize + reference GEMM).
const PackedKernel* find_packed_kernel(const FormatSpec& format);

}  // namespace nibble::cpu
