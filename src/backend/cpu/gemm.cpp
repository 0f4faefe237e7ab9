#include <cblas.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/kernels.h"
#include "nibble/dtype.h"

namespace nibble::cpu {

void gemm_f32(const float* x, int64_t M, const float* w, int64_t N, int64_t K, float* y) {
  if (M == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(N), static_cast<int>(K), 1.0f, w,
                static_cast<int>(K), x, 1, 0.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(M), static_cast<int>(N), static_cast<int>(K),
              1.0f, x, static_cast<int>(K), w, static_cast<int>(K), 0.0f, y, static_cast<int>(N));
}

void gemm_int4_asym_ref(const float* x, int64_t M, const uint8_t* qweight, const uint16_t* scales,
                        const uint16_t* mins, int64_t N, int64_t K, int group_size, float* y) {
  const int64_t bytes_per_row = (K + 1) / 2, groups = (K + group_size - 1) / group_size;
#pragma omp parallel if (M * N * K > (1 << 18))
  {
    std::vector<float> wrow(static_cast<size_t>(K));
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      const uint8_t* q = qweight + n * bytes_per_row;
      for (int64_t g = 0; g < groups; ++g) {
        const float s = bf16_to_f32(scales[n * groups + g]), m = bf16_to_f32(mins[n * groups + g]);
        const int64_t c1 = std::min<int64_t>(K, (g + 1) * group_size);
        for (int64_t c = g * group_size; c < c1; ++c) {
          const uint8_t code = (c & 1) ? (q[c >> 1] >> 4) : (q[c >> 1] & 0xF);
          wrow[c] = static_cast<float>(code) * s + m;
        }
      }
      for (int64_t i = 0; i < M; ++i) {
        const float* xi = x + i * K;
        float acc = 0.0f;
        for (int64_t c = 0; c < K; ++c) acc += xi[c] * wrow[c];
        y[i * N + n] = acc;
      }
    }
  }
}

}  // namespace nibble::cpu
