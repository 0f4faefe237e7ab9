// Fast int4 GEMV / small-M GEMM on the CPU (int4_asym's layout, bf16 or fp32 parameters): the driver and ISA
// dispatch.
//
// y[M, N] = x[M, K] · Ŵ[N, K]ᵀ, Ŵ read straight from its packed parts (FORMAT.md §3).
//
// Design
//  * Dispatch: best_isa() asks the CPU once (__builtin_cpu_supports) and picks
//    AVX-512 (int4_avx512.cpp), else AVX2 (int4_avx2.cpp), else the scalar
//    reference (gemm.cpp). The ISA files are compiled with their own -m flags;
//    this file and everything else stays baseline x86-64.
//  * Parameters: bf16 scale/min pairs (int4_asym) or fp32 ones (int4_asym_f32,
//    and int4_sym as (s, −8·s)); every kernel reads either (Problem::f32_params),
//    and decodes fl(fl(code·s) + m) with both.
//  * Activations are prepared once per call (int4_isa.h).
//  * M = 1 (decode, memory bound): one pass over the weights.
//      AVX2:    integer dot products (int4_avx2_i24.cpp). x is held per group in
//               24-bit fixed point, x_i = d_g·(65536·a_i + 256·b_i + c_i) with d_g a
//               power of two and a, b, c signed bytes, and per group
//               Σ_i x_i (code_i·s + m) = s·d_g·Σ_i code_i·(65536·a_i + 256·b_i + c_i) + m·Σ_i x_i,
//               where vpmaddubsw does 32 code·byte products per instruction. The
//               only error it adds is x's rounding, |Δx_i| ≤ max|x over the group|·2^-23:
//               the size of one fp32 rounding of the group's largest term, so the
//               packed forward still equals the dequantized one within 1e-4 on the
//               fixtures (tests/golden). A 16-bit split (two bytes, 2/3 of the work)
//               was tried: 1.0e-2 off on stories260K's logits, whose activations
//               have outliers that set d_g for their whole group.
//      AVX-512: vpermps is a 16-entry table lookup, i.e. one group's decode table
//               fl(c·s + m), so weights are decoded exactly and dotted with x: a lookup
//               and an FMA per 16 weights.
//  * M ≥ 2: activation rows in tiles of 4. Each chunk of a weight row is decoded
//    once per tile, exactly as FORMAT.md says (AVX2: convert + one FMA, fl(c·s + m);
//    AVX-512: the table lookup), and used for the tile's 4 rows: 4·MT FMAs per
//    decode. A task's weights stay in L1 across the tiles, a tile's x in L1 across
//    the task's rows, so any M (prefill, evaluation chunks) is one pass over the
//    weights.
//  * K is blocked (M = 1: 4096 inputs, otherwise 1024) so the slice of x that all
//    rows reuse stays in L1 (x for K = 14336 is 56 KiB, more than L1); blocks after
//    the first add into y.
//  * Large M (from kDequantRows = 64 rows of x): the product is compute bound,
//    and gemm_decoded (gemm.cpp) decodes slices of W to f32 and runs sgemm on
//    them, the bits of gemm_f32 on the dequantized matrix, and a prefill's speed
//    that of f32 (session 82, with a vectorized row decode: int4/f32 prefill
//    0.97-1.13 on the fixtures; README, "Benchmarks"). A first try, without a
//    kept buffer or whole-tile slices, had been slower than the kernels
//    (4096², M = 64: 94 ms against 35).
//  * FP4 (fp4_e2m1, mxfp4, nvfp4: fp4_gemm.cpp) borrows the AVX2 integer GEMV
//    for one token: Problem::e2m1 makes it look each code up as 2·e2m1(code) +
//    12 (one vpshufb per 32 codes) and use the pair (s/2, −6·s) per group;
//    nvfp4's groups of 16 take x's fixed point per 32 inputs and Σx per 16.
//  * Threads: OpenMP over tasks of 32 rows of W (dynamic schedule), each task
//    streaming its rows' weights; small problems run on one thread.
//  * Numerics: fp32 accumulation. Results differ from the reference by the order
//    of fp32 additions, and in the AVX2 M = 1 path by x's fixed-point rounding
//    (above) and by rounding s·Σcode·x and m·Σx separately;
//    tests/unit/test_int4_kernels.cpp derives the bounds.
//  * Speed (bench/bench_int4_gemv.cpp): the fp32 tile kernels are compute bound:
//    AVX2 needs ~3.5 vector ops per 8 weights (zero-extend, mask or shift, convert,
//    FMA) shared by the tile's rows. The integer GEMV needs per 64 weights one
//    load, three nibble ops and six vpmaddubsw (two per cycle on Zen 3), i.e. ~3
//    cycles where the fp32 GEMV needed ~8; measured 1.4–1.5× faster on the 2-core
//    VM. (Integer tiles for M ≥ 2 were slower than the fp32 tiles, which decode
//    once for 4 rows: the integer path's cost is per row.)
#include <cpuid.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <type_traits>

#include "backend/cpu/fp4_rows.h"
#include "backend/cpu/int4_isa.h"
#include "backend/cpu/kernels.h"
#include "nibble/error.h"

namespace nibble::cpu {
namespace {

using int4::kChunk;

constexpr int64_t kRowsPerTask = 32;
// From this many rows of x on, gemm_int4_asym decodes the weights and runs OpenBLAS's sgemm.
constexpr int64_t kDequantRows = 64;

// Per-thread 64-byte aligned scratch for prepared activations, kept between calls
// and grown when needed: a decode step makes hundreds of small GEMV calls, and a
// fresh allocation (and its first-touch page faults) per call cost more than the
// GEMV itself on small models. Slot k is one buffer; a call uses slots 0..2.
float* scratch(int slot, int64_t floats) {
  struct Buf {
    float* p = nullptr;
    int64_t n = 0;
    ~Buf() { std::free(p); }
  };
  thread_local Buf bufs[4];
  Buf& b = bufs[slot];
  if (b.n < floats) {
    std::free(b.p);
    const int64_t n = std::max<int64_t>(floats, 2 * b.n);
    b.p = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((n * 4 + 63) / 64 * 64)));
    b.n = b.p ? n : 0;
    NIBBLE_CHECK(b.p != nullptr, "out of memory allocating {} floats for the int4 kernel", n);
  }
  return b.p;
}

// F16C from CPUID leaf 1 (ECX bit 29): clang before 16 does not know "f16c"
// in __builtin_cpu_supports, and `make fuzz` builds with clang.
bool cpu_has_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::Scalar:
      return true;
    case Isa::Avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
    case Isa::Avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("fma");
  }
  return false;
}

// What every int4_asym GEMM here accepts.
void check_arguments(int64_t M, int64_t N, int64_t K, int group_size) {
  NIBBLE_CHECK(group_size == 32 || group_size == 64 || group_size == 128,
               "int4_asym GEMM: group size must be 32, 64 or 128, got {}", group_size);
  NIBBLE_CHECK(M >= 0 && N >= 0 && K >= 1, "int4_asym GEMM: bad shape M={} N={} K={}", M, N, K);
}

// Permutes rows of x into the kernels' layout (int4_isa.h).
void prepare_activations(const float* x, int64_t M, const int4::Problem& p, float* xp) {
  const int64_t stride = p.chunks * kChunk + int4::kRowPad;
#pragma omp parallel for schedule(static) if (M * p.K > (1 << 18))
  for (int64_t m = 0; m < M; ++m) {
    const float* xm = x + m * p.K;
    float* o = xp + m * stride;
    for (int64_t c = 0; c < p.chunks; ++c)
      for (int64_t i = 0; i < kChunk / 2; ++i) {
        const int64_t e = c * kChunk + 2 * i;
        o[c * kChunk + i] = e < p.K ? xm[e] : 0.0f;
        o[c * kChunk + kChunk / 2 + i] = e + 1 < p.K ? xm[e + 1] : 0.0f;
      }
  }
}

// The int4 kernels over all rows of W: one pass over the weights for any M.
template <typename Rows, typename Acts>
void gemm_kernels(Rows rows, const int4::Problem& p, const Acts& a, int64_t M, float* y) {
  // K block in chunks; a multiple of 4 chunks = 128 inputs, so group (and pair) aligned for every G.
  const int64_t kb = M == 1 ? int4::kMaxBlockChunks : 1024 / kChunk;
  const int64_t work = M * p.N * p.K;
  const int threads = work >= (int64_t{1} << 17) ? omp_get_max_threads() : 1;
  const int64_t blocks = (p.N + kRowsPerTask - 1) / kRowsPerTask;
  // Dynamic, not static: the cores of a shared VM do not run at the same speed (a
  // busy neighbour on one core's sibling slows it by a third here), and 32-row
  // tasks (64 KiB of weights each at K = 4096) keep the hand-out cheap.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t n0 = b * kRowsPerTask, n1 = std::min(p.N, n0 + kRowsPerTask);
    for (int64_t c0 = 0; c0 < p.chunks; c0 += kb) rows(p, a, c0, std::min(c0 + kb, p.chunks), n0, n1, c0 > 0, y);
  }
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

bool isa_supported(Isa isa) {
  static const bool avx2 = cpu_has(Isa::Avx2), avx512 = cpu_has(Isa::Avx512);
  switch (isa) {
    case Isa::Scalar: return true;
    case Isa::Avx2: return avx2;
    case Isa::Avx512: return avx512;
  }
  return false;
}

bool gemv_is_integer(Isa isa) {
  static const bool vnni = __builtin_cpu_supports("avx512vnni");
  return isa == Isa::Avx2 || (isa == Isa::Avx512 && vnni);
}

Isa best_isa() {
  if (isa_supported(Isa::Avx512)) return Isa::Avx512;
  if (isa_supported(Isa::Avx2)) return Isa::Avx2;
  return Isa::Scalar;
}

namespace {

// The integer GEMV (int4_avx2_i24.cpp, int4_avx512_i24.cpp) on x in 24-bit fixed
// point per group, in pairs (AVX2) or quads (AVX-512) of chunks.
// FP4 in groups of 16 (nvfp4): x's fixed point per 32 inputs (a chunk) and Σx per 16 (int4_isa.h).
void integer_gemv(Isa isa, const float* x, const int4::Problem& p, float* y) {
  const int unit = isa == Isa::Avx512 ? 4 : 2;
  int4::Problem pa = p;  // the activations' grouping
  if (p.group_size == 16) {
    pa.group_size = 32;
    pa.groups = (p.K + 31) / 32;
  }
  float* q = scratch(0, ((p.chunks + unit - 1) / unit * unit * int4::kChunkQBytes + 3) / 4);
  float* d = scratch(1, pa.groups + 1);
  float* xsum = scratch(2, pa.groups);
  int4::QActivations a{reinterpret_cast<const int8_t*>(q), d, xsum};
  int4::prepare_avx2_i24(x, pa, a, unit);
  for (int64_t g = 0; g < pa.groups; ++g)
    NIBBLE_CHECK(std::isfinite(d[g]), "{} GEMM: the activations are not finite in inputs {}..{}",
                 p.e2m1 ? "FP4" : "int4_asym", g * pa.group_size, std::min<int64_t>(p.K, (g + 1) * pa.group_size) - 1);
  if (p.group_size == 16) {
    float* xs16 = scratch(3, p.groups);
    for (int64_t g = 0; g < p.groups; ++g) {
      float t = 0.0f;
      for (int64_t i = g * 16; i < std::min<int64_t>(p.K, g * 16 + 16); ++i) t += x[i];
      xs16[g] = t;
    }
    a.xsum = xs16;
  }
  gemm_kernels(isa == Isa::Avx512 ? int4::rows_avx512_i24 : int4::rows_avx2_i24, p, a, 1, y);
}

}  // namespace

// FP4 E2M1 codes through the AVX2 integer GEMV (fp4_rows.h).
void fp4k::gemv_integer(const float* x, const uint8_t* codes, Fp4Scales scales, int64_t N, int64_t K, int group_size,
                        float* y) {
  check_arguments(1, N, K, group_size == 16 ? 32 : group_size);
  if (N == 0) return;
  int4::Problem p{codes,         scales.codes ? static_cast<const void*>(scales.codes) : scales.f32,
                  nullptr,       true,
                  N,             K,
                  group_size,    (K + 1) / 2,
                  (K + group_size - 1) / group_size, (K + kChunk - 1) / kChunk};
  p.e2m1 = true;
  p.scale_table = scales.codes ? scales.table : nullptr;
  integer_gemv(Isa::Avx2, x, p, y);
}

namespace {

// gemm_int4_asym_isa for either parameter type P (uint16_t bf16 bits or float).
template <typename P>
void gemm_isa(Isa isa, const float* x, int64_t M, const uint8_t* qweight, const P* scales, const P* mins, int64_t N,
              int64_t K, int group_size, float* y) {
  check_arguments(M, N, K, group_size);
  NIBBLE_CHECK(isa_supported(isa), "int4_asym GEMM: this CPU cannot run the {} kernel", isa_name(isa));
  if (M == 0 || N == 0) return;
  if (isa == Isa::Scalar) {
    gemm_int4_asym_ref(x, M, qweight, scales, mins, N, K, group_size, y);
    return;
  }
  const int4::Problem p{qweight, scales, mins, std::is_same_v<P, float>, N, K, group_size, (K + 1) / 2,
                        (K + group_size - 1) / group_size, (K + kChunk - 1) / kChunk};
  if (M == 1 && gemv_is_integer(isa)) {
    integer_gemv(isa, x, p, y);
    return;
  }
  const int64_t stride = p.chunks * kChunk + int4::kRowPad;
  float* xp = scratch(0, M * stride);
  prepare_activations(x, M, p, xp);
  const int4::Activations a{xp, M, stride};
  gemm_kernels(isa == Isa::Avx512 ? int4::rows_avx512 : int4::rows_avx2, p, a, M, y);
}

template <typename P>
void gemm_any(const float* x, int64_t M, const uint8_t* qweight, const P* scales, const P* mins, int64_t N, int64_t K,
              int group_size, float* y) {
  if (M < kDequantRows) {
    gemm_isa(best_isa(), x, M, qweight, scales, mins, N, K, group_size, y);
    return;
  }
  check_arguments(M, N, K, group_size);
  // Many rows: the product is compute bound, and OpenBLAS's sgemm on the decoded weights (as FORMAT.md says,
  // fl(fl(code·s) + m)) beats the int4 kernels, which decode every weight again for each block of rows.
  gemm_decoded(
      x, M, N, K,
      [&](int64_t n, float* out) { decode_int4_asym_row(qweight, scales, mins, n, K, group_size, out); }, y);
}

}  // namespace

void gemm_int4_asym_isa(Isa isa, const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                        const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y) {
  gemm_isa(isa, x, M, qweight, scales, mins, N, K, group_size, y);
}
void gemm_int4_asym_isa(Isa isa, const float* x, int64_t M, const uint8_t* qweight, const float* scales,
                        const float* mins, int64_t N, int64_t K, int group_size, float* y) {
  gemm_isa(isa, x, M, qweight, scales, mins, N, K, group_size, y);
}
void gemm_int4_asym(const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales, const uint16_t* mins,
                    int64_t N, int64_t K, int group_size, float* y) {
  gemm_any(x, M, qweight, scales, mins, N, K, group_size, y);
}
void gemm_int4_asym(const float* x, int64_t M, const uint8_t* qweight, const float* scales, const float* mins,
                    int64_t N, int64_t K, int group_size, float* y) {
  gemm_any(x, M, qweight, scales, mins, N, K, group_size, y);
}

}  // namespace nibble::cpu
