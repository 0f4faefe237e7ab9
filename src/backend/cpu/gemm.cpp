#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <functional>
#include <string_view>
#include <vector>

#include "backend/cpu/kernels.h"
#include "nibble/dtype.h"
#include "nibble/util.h"

namespace nibble {

// Measured on such a VM (2 vCPUs, AVX-512 and AMX; session 66): nibble eval of qwen3-26M-linux over 4 windows of 512
// 7.5-7.6 s with OpenBLAS's Prescott kernels against 5.4-5.5 s with its SkylakeX ones (three runs each, alternated;
// Haswell's 5.2 s in one run), GPTQ + MSE of it with 32 × 512 calibration tokens 50.4-51.8 against 30.2-30.9 s.
void select_blas_kernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  // OpenBLAS's x86-64 cores without AVX kernels: what it falls back to for a CPU it does not know.
  static constexpr std::array<std::string_view, 15> kPreAvx = {
      "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",       "Atom",   "Core2", "Penryn",
      "Dunnington", "Nehalem", "Athlon",   "Opteron",  "Opteron_SSE3", "Barcelona", "Nano"};
  const char* core = openblas_get_corename();
  if (core == nullptr || std::find(kPreAvx.begin(), kPreAvx.end(), std::string_view(core)) == kPreAvx.end()) return;
  const char* want = nullptr;
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    want = "SkylakeX";
  else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    want = "Haswell";
  if (want == nullptr || argv == nullptr || argv[0] == nullptr) return;
  setenv("OPENBLAS_CORETYPE", want, 1);
  execv("/proc/self/exe", argv);
  // The exec failed: go on with OpenBLAS's own choice (the variable stays set, so a child process does not try again).
}

}  // namespace nibble

namespace nibble::cpu {

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M <= 0 || N <= 0) return;
  // Tiles of C of a fixed size: each is one OpenBLAS call of its own shape, run
  // on one thread (OpenBLAS's OpenMP build runs a call made inside a parallel
  // region single-threaded, as it does with one OpenMP thread), so every
  // element's rounding depends on M, N and K only. 256 × 256 keeps OpenBLAS's
  // packing (each tile packs its slices of A and B) below 1 % of the products.
  constexpr int64_t kTile = kGemmTile;
  const int64_t tm = (M + kTile - 1) / kTile, tn = (N + kTile - 1) / kTile;
  // Always a parallel region, even for one tile: outside one, OpenBLAS would
  // thread the call over as many threads as OpenMP has.
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tm * tn; ++t) {
    const int64_t m0 = t / tn * kTile, n0 = t % tn * kTile;
    const int64_t m = std::min(kTile, M - m0), n = std::min(kTile, N - n0);
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(K), alpha, trans_a ? A + m0 : A + m0 * lda,
                static_cast<int>(lda), trans_b ? B + n0 * ldb : B + n0, static_cast<int>(ldb), beta,
                C + m0 * ldc + n0, static_cast<int>(ldc));
  }
}

void gemm_f32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y) {
  if (M == 1) {  // OpenBLAS's sgemv gives the same bits on any number of threads
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(N), static_cast<int>(K), 1.0f, w,
                static_cast<int>(K), x, 1, 0.0f, y, 1);
    return;
  }
  sgemm(false, true, M, N, K, 1.0f, x, K, w, K, 0.0f, y, N);
}

void gemm_decoded(const float* x, int64_t M, int64_t N, int64_t K,
                  const std::function<void(int64_t n, float* out)>& decode_row, float* y) {
  // Slices of whole kGemmTile-row tiles of W, about 64 MiB of f32 each: sgemm's tiles are then those of one call on
  // the whole decoded matrix. The calling thread's buffer is kept between calls (first-touch page faults cost more
  // than the decode); OpenMP's workers write into it through `w`.
  const int64_t slice = std::max<int64_t>(1, (int64_t{64} << 20) / (4 * K * kGemmTile)) * kGemmTile;
  thread_local std::vector<float> buf;
  if (buf.size() < static_cast<size_t>(std::min(N, slice) * K)) buf.resize(static_cast<size_t>(std::min(N, slice) * K));
  float* w = buf.data();
  for (int64_t n0 = 0; n0 < N; n0 += slice) {
    const int64_t rows = std::min(slice, N - n0);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) decode_row(n0 + r, w + r * K);
    sgemm(false, true, M, rows, K, 1.0f, x, K, w, K, 0.0f, y + n0, N);
  }
}

namespace {

float param_f32(uint16_t bf16) { return bf16_to_f32(bf16); }
float param_f32(float v) { return v; }

template <typename P>
void decode_row(const uint8_t* qweight, const P* scales, const P* mins, int64_t n, int64_t K, int group_size,
                float* out) {
  const int64_t groups = (K + group_size - 1) / group_size;
  const uint8_t* q = qweight + n * ((K + 1) / 2);
  for (int64_t g = 0; g < groups; ++g) {
    const float s = param_f32(scales[n * groups + g]), m = param_f32(mins[n * groups + g]);
    // Byte by byte (G is even: a byte never straddles two groups), with no branch in the loop, so that the
    // compiler vectorizes it; an odd K's last byte has one code.
    const int64_t c0 = g * group_size, c1 = std::min<int64_t>(K, c0 + group_size);
    const int64_t pairs = (c1 - c0) / 2;
    const uint8_t* b = q + c0 / 2;
    float* o = out + c0;
    for (int64_t j = 0; j < pairs; ++j) {
      o[2 * j] = static_cast<float>(b[j] & 0xF) * s + m;
      o[2 * j + 1] = static_cast<float>(b[j] >> 4) * s + m;
    }
    if (c0 + 2 * pairs < c1) o[2 * pairs] = static_cast<float>(b[pairs] & 0xF) * s + m;
  }
}

template <typename P>
void gemm_ref(const float* x, int64_t M, const uint8_t* qweight, const P* scales, const P* mins, int64_t N, int64_t K,
              int group_size, float* y) {
#pragma omp parallel if (M * N * K > (1 << 18))
  {
    std::vector<float> wrow(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      decode_row(qweight, scales, mins, n, K, group_size, wrow.data());
      for (int64_t i = 0; i < M; ++i) {
        const float* xi = x + i * K;
        float acc = 0.0f;
        for (int64_t c = 0; c < K; ++c) acc += xi[c] * wrow[c];
        y[i * N + n] = acc;
      }
    }
  }
}

}  // namespace

void decode_int4_asym_row(const uint8_t* qweight, const uint16_t* scales, const uint16_t* mins, int64_t n, int64_t K,
                          int group_size, float* out) {
  decode_row(qweight, scales, mins, n, K, group_size, out);
}
void decode_int4_asym_row(const uint8_t* qweight, const float* scales, const float* mins, int64_t n, int64_t K,
                          int group_size, float* out) {
  decode_row(qweight, scales, mins, n, K, group_size, out);
}
void gemm_int4_asym_ref(const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                        const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y) {
  gemm_ref(x, M, qweight, scales, mins, N, K, group_size, y);
}
void gemm_int4_asym_ref(const float* x, int64_t M, const uint8_t* qweight, const float* scales, const float* mins,
                        int64_t N, int64_t K, int group_size, float* y) {
  gemm_ref(x, M, qweight, scales, mins, N, K, group_size, y);
}

}  // namespace nibble::cpu
