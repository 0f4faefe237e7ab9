// Prefill attention on the GPU: the flash kernel against the row-wise kernel
// (one block per query and head, what decode uses) on Llama-3-8B's attention
// shape (32 heads, 8 kv heads, head_dim 128), fp32 KV cache as GpuModel keeps
// it, measured in the same run (issue 6, item 3); and the tensor-core path
// GpuModel's prefill takes by default (flash_attention_tc: q and the f32
// cache's rows rounded to bf16, then flash_attention_bf16; both in the timing).
//
//   bench_attention [--reps 10] [--ns 512,2048,8192] [--skip-rowwise]
//
// FLOPs counted: 4·head_dim per (query, head, key it attends to) — q·k and
// p·v, multiply and add — summed over the causal triangle (and the cached
// prefix for chunked rows), so masked work a kernel does anyway is not
// credited. Inputs are random; the two kernels' outputs are compared too.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nibble/cuda.h"
#include "nibble/cuda_attention.h"
#include "nibble/dtype.h"
#include "cuda_check.h"

namespace {

using nibble::cuda::AttentionArgs;
using nibble::cuda::DeviceBuffer;

// Roughly N(0, 1)-sized values from a hash (uniform, variance 1).
__global__ void fill_f32(float* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = (static_cast<float>(h & 0xFFFF) / 65535.0f - 0.5f) * 3.4641f;
  }
}

struct Case {
  int64_t n, p0;
};

// Milliseconds per call: one warm-up call, then the median of `reps` timed calls.
template <typename F>
double time_ms(F&& f, int reps) {
  f();
  CK(cudaDeviceSynchronize());
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float t = 0;
    CK(cudaEventElapsedTime(&t, a, b));
    ms.push_back(t);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

std::vector<float> download_bf16(const DeviceBuffer& b) {
  std::vector<uint16_t> raw(b.bytes() / 2);
  CK(cudaMemcpy(raw.data(), b.get(), b.bytes(), cudaMemcpyDeviceToHost));
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = nibble::bf16_to_f32(raw[i]);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 10;
  bool rowwise = true;
  std::vector<Case> cases = {{512, 0}, {2048, 0}, {8192, 0}, {512, 7680}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else if (a == "--ns" && i + 1 < argc) {
      cases.clear();
      for (std::string s = argv[++i]; !s.empty();) {
        const size_t c = s.find(',');
        cases.push_back({std::atoll(s.substr(0, c).c_str()), 0});
        s = c == std::string::npos ? "" : s.substr(c + 1);
      }
    } else if (a == "--skip-rowwise") {
      rowwise = false;
    } else {
      std::fprintf(stderr, "usage: bench_attention [--reps N] [--ns 512,2048,8192] [--skip-rowwise]\n");
      return 2;
    }
  }
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  const int64_t H = 32, KV = 8, hd = 128;
  std::printf("shape: %lld heads, %lld kv heads, head_dim %lld, fp32 q/K/V, bf16 out\n\n", (long long)H,
              (long long)KV, (long long)hd);
  std::printf("%6s %6s %12s %10s %10s %12s %10s %9s %14s %10s %10s %14s\n", "n", "p0", "GFLOP", "flash ms", "TFLOP/s",
              "rowwise ms", "TFLOP/s", "speedup", "max|Δ| (bf16)", "tc ms", "TFLOP/s", "max|Δ| vs fp32");
  for (const Case& c : cases) {
    const int64_t T = c.p0 + c.n;
    DeviceBuffer q(static_cast<size_t>(c.n * H * hd) * 4), k(static_cast<size_t>(T * KV * hd) * 4),
        v(static_cast<size_t>(T * KV * hd) * 4), out_flash(static_cast<size_t>(c.n * H * hd) * 2),
        out_row(static_cast<size_t>(c.n * H * hd) * 2);
    fill_f32<<<1024, 256>>>(static_cast<float*>(q.get()), c.n * H * hd, 1);
    fill_f32<<<1024, 256>>>(static_cast<float*>(k.get()), T * KV * hd, 2);
    fill_f32<<<1024, 256>>>(static_cast<float*>(v.get()), T * KV * hd, 3);
    CK(cudaGetLastError());
    AttentionArgs a;
    a.q = static_cast<const float*>(q.get());
    a.k = static_cast<const float*>(k.get());
    a.v = static_cast<const float*>(v.get());
    a.ldo = H * hd;
    a.n = c.n;
    a.p0 = c.p0;
    a.heads = H;
    a.kv_heads = KV;
    a.head_dim = hd;
    a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const double keys = static_cast<double>(c.n) * (c.n + 1) / 2 + static_cast<double>(c.n) * c.p0;
    const double flop = 4.0 * hd * H * keys;
    a.out = out_flash.get();
    const double ms_flash = time_ms([&] { nibble::cuda::flash_attention(a, nullptr); }, reps);
    const bool can_rowwise =
        rowwise && nibble::cuda::rowwise_attention_smem(hd, T) <= nibble::cuda::rowwise_attention_smem_limit();
    double ms_row = NAN, diff = NAN;
    if (can_rowwise) {
      a.out = out_row.get();
      // The row-wise kernel is slow at 8192: fewer repetitions there.
      ms_row = time_ms([&] { nibble::cuda::rowwise_attention(a, nullptr, T, nullptr); }, T > 4096 ? 3 : reps);
      const auto x = download_bf16(out_flash), y = download_bf16(out_row);
      diff = 0;
      for (size_t i = 0; i < x.size(); ++i) diff = std::max(diff, static_cast<double>(std::fabs(x[i] - y[i])));
    }
    // The tensor-core path (GpuOptions::tensor_core_prefill), its roundings included.
    DeviceBuffer scratch(nibble::cuda::flash_attention_tc_scratch(a)), out_tc(out_flash.bytes());
    a.out = out_tc.get();
    const double ms_bf16 = time_ms([&] { nibble::cuda::flash_attention_tc(a, scratch.get(), nullptr); }, reps);
    double diff_bf16 = 0;
    {
      const auto x = download_bf16(out_flash), y = download_bf16(out_tc);
      for (size_t i = 0; i < x.size(); ++i)
        diff_bf16 = std::max(diff_bf16, static_cast<double>(std::fabs(x[i] - y[i])));
    }
    std::printf("%6lld %6lld %12.2f %10.3f %10.2f %12.3f %10.2f %8.1fx %14.4g %10.3f %10.2f %14.4g\n", (long long)c.n,
                (long long)c.p0, flop * 1e-9, ms_flash, flop / ms_flash * 1e-9, ms_row, flop / ms_row * 1e-9,
                ms_row / ms_flash, diff, ms_bf16, flop / ms_bf16 * 1e-9, diff_bf16);
  }
  int khz = 0;
  CK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  std::printf("\nfp32 CUDA-core peak (128 FMA lanes per SM, FMA = 2 FLOPs): %.1f TFLOP/s at %d MHz\n",
              2.0 * 128 * prop.multiProcessorCount * khz * 1e-9, khz / 1000);
  return 0;
}
