// The activation quantizers on the device (src/backend/cuda/act_quant.h)
// against the host's (src/quant/act_quant.cpp), the reference: the same
// matrix through both must give the same bits. Compiled whenever CUDA is on;
// skipped without a device.
#include "nibble/cuda.h"

#ifdef NIBBLE_HAVE_CUDA

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cuda/act_quant.h"
#include "nibble/act_quant.h"
#include "test_util.h"

namespace nibble {
namespace {

struct Shape {
  int64_t rows, dim, ld;
};

// rows × dim values of spread sd, with (kind 1) llm_int8 outliers at and above its threshold of 6, an all-zero
// row, ±inf, NaN and subnormals, or (kind 2) values on or next to int8 ties of their row's scale.
std::vector<float> matrix(const Shape& s, int kind, uint64_t seed) {
  std::vector<float> x = test::randn(s.rows * s.dim, seed, 1.5f);
  if (kind == 1) {
    for (int64_t r = 0; r < s.rows; ++r) {
      x[r * s.dim + 3 % s.dim] = r % 2 ? 6.0f : -7.5f;  // an outlier column
      x[r * s.dim + (5 % s.dim)] = 5.9990234f;           // just below 6, and 6 once rounded to fp16
      x[r * s.dim + (11 % s.dim)] = 1e-40f;              // subnormal
    }
    if (s.rows > 2) std::fill_n(x.begin() + s.dim, s.dim, 0.0f);  // row 1: zeros only
    if (s.rows > 4) {
      x[4 * s.dim + 1] = std::numeric_limits<float>::quiet_NaN();
      x[4 * s.dim + 2] = -std::numeric_limits<float>::infinity();
    }
  } else if (kind == 2) {
    for (int64_t r = 0; r < s.rows; ++r) {
      float amax = 0.0f;
      for (int64_t j = 0; j < s.dim; ++j) amax = std::max(amax, std::abs(x[r * s.dim + j]));
      const float step = amax / 127.0f;
      for (int64_t j = 0; j < s.dim; j += 3) x[r * s.dim + j] = (static_cast<float>(j % 50) - 25.0f + 0.5f) * step;
    }
  }
  return x;
}

bool same_bits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, sizeof a) == 0;
}

TEST(Cuda, ActQuantOnTheDeviceMatchesTheHost) {
  SKIP_WITHOUT_DEVICE();
  const Shape shapes[] = {{1, 4096, 4096}, {7, 300, 320}, {64, 1024, 1100}};
  for (const ActQuantSpec& spec : act_quants()) {
    SCOPED_TRACE(std::string(spec.name));
    const cuda::ActQuantDevice dev = cuda::find_act_quant_device(spec);
    ASSERT_NE(dev, nullptr) << "an activation quantizer with no device row";
    for (const Shape& s : shapes)
      for (int kind = 0; kind < 3; ++kind) {
        SCOPED_TRACE(testing::Message() << s.rows << " x " << s.dim << " (row stride " << s.ld << "), kind " << kind);
        const std::vector<float> x = matrix(s, kind, 100 + 7 * kind + s.dim);
        std::vector<float> want = x;
        spec.apply(want.data(), s.rows, s.dim);
        // On the device with the row stride; the padding between rows must stay as it was.
        std::vector<float> strided(static_cast<size_t>(s.rows * s.ld), -3.25f);
        for (int64_t r = 0; r < s.rows; ++r) std::copy_n(&x[r * s.dim], s.dim, &strided[r * s.ld]);
        float* d = nullptr;
        ASSERT_EQ(cudaMalloc(&d, strided.size() * sizeof(float)), cudaSuccess);
        ASSERT_EQ(cudaMemcpy(d, strided.data(), strided.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
        dev(d, s.rows, s.dim, s.ld, nullptr);
        std::vector<float> got(strided.size());
        ASSERT_EQ(cudaMemcpy(got.data(), d, got.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
        cudaFree(d);
        int64_t differ = 0, changed = 0;
        for (int64_t r = 0; r < s.rows; ++r)
          for (int64_t j = 0; j < s.ld; ++j) {
            const float g = got[r * s.ld + j];
            if (j >= s.dim) {
              ASSERT_EQ(g, -3.25f) << "row " << r << ": the padding at " << j << " was written";
              continue;
            }
            const float w = want[r * s.dim + j];
            if (!same_bits(g, w) && differ++ < 5)
              ADD_FAILURE() << "row " << r << " input " << j << ": x " << x[r * s.dim + j] << ", host " << w
                            << ", device " << g;
            changed += !same_bits(w, x[r * s.dim + j]);
          }
        EXPECT_EQ(differ, 0);
        EXPECT_GT(changed, s.rows * s.dim / 4) << "the quantizer left most of the matrix as it was";
      }
  }
}

}  // namespace
}  // namespace nibble

#endif  // NIBBLE_HAVE_CUDA
