// CUDA kernels against their CPU references. Compiled whenever the build has
// CUDA (CI compiles them); run where a GPU is present, skipped elsewhere.
#include <gtest/gtest.h>

#ifdef NIBBLE_HAVE_CUDA
#include <cstring>
#include <random>

#include "nibble/cuda.h"
#include "nibble/format.h"
#include "nibble/quantizer.h"

namespace nibble {
namespace {

TEST(Cuda, DequantInt4AsymBitExactWithCpuReference) {
  if (!cuda::device_available()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int g : {32, 64, 128}) {
    for (int64_t cols : {int64_t{172}, int64_t{4096}, int64_t{4099}, int64_t{1}}) {
      const int64_t rows = 24;
      std::vector<float> w(rows * cols);
      for (auto& v : w) v = normal(rng);
      const FormatChoice f = find_format("int4_asym", g);
      const auto parts = f.spec->pack(quant::quantize_rtn(f, w.data(), rows, cols));
      const Tensor cpu = dequantize_parts(f, parts, rows, cols);
      const Tensor gpu = cuda::dequantize_int4_asym(parts, rows, cols, g);
      ASSERT_EQ(gpu.shape(), cpu.shape());
      EXPECT_EQ(std::memcmp(gpu.raw(), cpu.raw(), cpu.nbytes()), 0) << "g=" << g << " cols=" << cols;
    }
  }
}

}  // namespace
}  // namespace nibble
#endif
