// The contract between the int4_asym GEMM driver (int4_gemm.cpp) and its
// per-ISA kernels (int4_avx2.cpp, int4_avx512.cpp, each compiled with its own
// -m flags). Only plain structs and function declarations live here: an inline
// function or template included by an ISA file would be compiled with that
// file's flags, and the linker may keep that copy for every caller, so an
// AVX-512 instruction could run on a CPU without AVX-512.
#pragma once

#include <cstdint>

namespace nibble::cpu::int4 {

// Kernels walk a qweight row in chunks of 32 inputs = 16 bytes. G ∈ {32, 64,
// 128} is a multiple of 32 and groups start at multiples of G, so a chunk never
// straddles two groups. Chunk c of a row covers inputs [32c, 32c + 32); the last
// chunk of a row is short when K is not a multiple of 32 (the kernels copy it
// into a zeroed 16-byte buffer instead of reading past the row).
constexpr int64_t kChunk = 32;
constexpr int64_t kChunkBytes = kChunk / 2;

// One packed int4 matrix: int4_asym as docs/FORMAT.md §3 stores it (bf16 scale
// and min per group), or the same with fp32 parameters (int4_asym_f32, §7.8, and
// int4_sym once its f16 scale s becomes the pair (s, −8·s), exactly).
struct Problem {
  const uint8_t* qweight;  // [N, row_bytes]
  const void* scales;      // [N, groups]: uint16_t bf16 bits, or float when f32_params
  const void* mins;        // [N, groups], the same type
  bool f32_params;
  int64_t N, K;
  int group_size;
  int64_t row_bytes;  // ceil(K / 2)
  int64_t groups;     // ceil(K / G)
  int64_t chunks;     // ceil(K / 32)
  // FP4 E2M1 codes (fp4_e2m1, mxfp4; FORMAT.md §7.5-7.6) with fp32 scales s and no mins, for the AVX2 integer GEMV
  // only (fp4_gemm.cpp): it reads each code as c = 2·e2m1(code) + 12 ∈ [0, 24] (vpshufb) and each group's pair as
  // (s/2, −6·s), so c·s/2 − 6·s = e2m1(code)·s. A lane's vpmaddubsw pair is then at most 2·24·128 = 6144 in
  // magnitude, and a group of 128 adds 4 of them in int16 (24576 < 2^15). G = 16 (nvfp4) is allowed here: the
  // activations then come in groups of 32 (d_g per chunk) with QActivations::xsum per group of 16, and a chunk's
  // int32 lanes 0-1 and 2-3 (inputs 0-15 and 16-31 after vpmaddwd) take their own group's s/2.
  bool e2m1 = false;
  // E2M1 only: when set, scales are bytes (uint8_t) and a group's scale is scale_table[byte] (nvfp4's E4M3 times
  // its global scale, fp4_gemm.cpp).
  const float* scale_table = nullptr;
};

// Activations as the kernels want them. Splitting the 16 bytes of a chunk into
// low and high nibbles gives the codes of inputs 0, 2, ..., 30 and 1, 3, ..., 31;
// so that the kernels need no shuffle, x is stored permuted the same way, once
// per call:
//   xp[m, 32c + i]      = x[m, 32c + 2i]       (i < 16: the low nibbles)
//   xp[m, 32c + 16 + i] = x[m, 32c + 2i + 1]   (the high nibbles)
// with zeros for inputs ≥ K (so padding codes contribute 0).
struct Activations {
  const float* xp;    // [M, xp_stride], 64-byte aligned rows of chunks * 32 floats
  int64_t M;
  int64_t xp_stride;  // floats between rows of xp (chunks * 32 + kRowPad)
};

// The most chunks one call covers (the driver's K block for M = 1: 4096 inputs).
constexpr int64_t kMaxBlockChunks = 128;

// Floats (64 bytes) added to the row stride of xp: with strides that are
// multiples of 4 KiB (K = 4096 gives 16 KiB) the rows of x a kernel streams through
// together all map to the same L1 sets and evict each other.
constexpr int64_t kRowPad = 16;

// How far ahead of the current chunk the kernels prefetch qweight. The rows of a
// task are contiguous, so this runs on into the next rows. Hardware prefetchers
// stop at 4 KiB pages and a row of K = 4096 is only 2 KiB, so this keeps a DRAM
// stream going across pages. (On the shared 2-core test VM its effect on
// 14336×4096 was within the run-to-run noise of ±30%; it costs one instruction
// per 64 bytes.)
constexpr int64_t kPrefetchBytes = 2048;

// The integer GEMVs walk a row in pairs of chunks (AVX2, int4_avx2_i24.cpp: 64
// inputs = 32 qweight bytes, one load) or quads (AVX-512, int4_avx512_i24.cpp).
constexpr int64_t kPairBytes = 2 * kChunkBytes;
constexpr int64_t kChunkQBytes = 96;                  // activation bytes per chunk (see QActivations)
constexpr int64_t kPairQBytes = 2 * kChunkQBytes;     // per pair of chunks (AVX2)
constexpr int64_t kQuadBytes = 4 * kChunkBytes;       // 128 inputs = 64 qweight bytes, one AVX-512 load
constexpr int64_t kQuadQBytes = 4 * kChunkQBytes;     // per quad of chunks (AVX-512)

// Activations for the integer kernels: each row of x in 24-bit fixed point per
// group, split into three signed bytes. For group g, d_g = 2^e is the smallest
// power of two with max_i |x_i| / d_g ≤ kQMax = 8355711, and
//   x24_i = round_to_nearest_even(x_i / d_g) ∈ [-kQMax, kQMax],
//   c_i = x24_i − 256·t_i with t_i = (x24_i + 128) >> 8   (c_i ∈ [-128, 127]),
//   b_i = t_i − 256·a_i  with a_i = (t_i + 128) >> 8     (b_i ∈ [-128, 127], a_i ∈ [-127, 127]),
// so x24_i = 65536·a_i + 256·b_i + c_i exactly and |x_i − d_g·x24_i| ≤ d_g/2 ≤
// max|x| · 2^-23 (d_g ≤ max|x| / 2^22): the rounding of one fp32 operation on the
// group's largest value. A power of two keeps x_i / d_g exact: activations that are
// already on a coarser grid (the tests' integer cases) are not rounded at all.
// The bytes follow the kernel's weight loads: a unit of U chunks (U = 2 for the
// AVX2 kernel's 32-byte loads, 4 for AVX-512's 64 bytes) holds 96·U bytes,
//   [0, 16U)      a of the low nibbles: chunk 0 of the unit inputs 0,2,..,30, then chunk 1's, ...
//   [16U, 32U)    a of the high nibbles: inputs 1,3,..,31 of each chunk
//   [32U, 64U)    b, [64U, 96U) c, in the same two blocks
// (zeros past K, so padding codes contribute 0). So byte 16k + i of a weight load
// (chunk k of the unit, its byte i: inputs 2i and 2i + 1) lines up with byte
// 16k + i of each activation block.
constexpr int32_t kQMax = 8355711;  // 127·65536 + 127·256 + 127
// One activation row (the integer kernel is the M = 1 GEMV).
struct QActivations {
  const int8_t* q;    // units * 96·U bytes, 64-byte aligned
  const float* d;     // d_g per group, then a zero (groups + 1 floats)
  const float* xsum;  // Σ of x over each group, fp32
};

// For M > 1 the kernels take activation rows in tiles of up to this many.
constexpr int64_t kMaxTileRows = 4;

// Computes rows [n0, n1) of y[M, N] over the inputs of chunks [c0, c1), where c0
// is a multiple of G/32 and c1 is too or equals p.chunks:
//   y[m, n] = (accumulate ? y[m, n] : 0) + Σ_{i in the chunks} x[m, i] · ŵ[n, i]
void rows_avx2(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
               bool accumulate, float* y);
// Fills QActivations from one row x[K] (the buffers are the caller's; d_g is left
// non-finite for a group whose activations are not finite).
void prepare_avx2_i24(const float* x, const Problem& p, const QActivations& a, int unit);
// The M = 1 GEMV over QActivations (c0 even, as the driver's K blocks are).
void rows_avx2_i24(const Problem& p, const QActivations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                   bool accumulate, float* y);
// The M = 1 GEMV with AVX-512 VNNI (vpdpbusd) over QActivations in quads (U = 4;
// c0 a multiple of 4 chunks, as the driver's K blocks are).
void rows_avx512_i24(const Problem& p, const QActivations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                     bool accumulate, float* y);
void rows_avx512(const Problem& p, const Activations& a, int64_t c0, int64_t c1, int64_t n0, int64_t n1,
                 bool accumulate, float* y);

}  // namespace nibble::cpu::int4
