// Layout micro-benchmark (session 16, not part of the repo): does the order
// of the int4 tiles in memory change the GEMV's achievable read bandwidth?
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint4 ldcg(const uint4* p) { return __ldcg(p); }

// layout 0: [tile][chunk][32] ; layout 1: [chunk][tile][32]; layout 2: [group][tile][cpg][32]
template <int L>
__global__ void gemv_like(const uint4* __restrict__ w, int tiles, int chunks, int wpt, unsigned* out) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp / wpt, wi = warp % wpt;
  const int tpb = blockDim.x / 32 / wpt;
  const int64_t tile = blockIdx.x + (int64_t)sub * gridDim.x;
  if (tile >= tiles) return;
  const int groups = chunks / 2;
  unsigned acc = 0;
  auto idx = [&](int c) -> int64_t {
    if (L == 0) return (tile * chunks + c) * 32 + lane;
    if (L == 1) return ((int64_t)c * tiles + tile) * 32 + lane;
    return (((int64_t)(c >> 1) * tiles + tile) * 2 + (c & 1)) * 32 + lane;
  };
  int g = wi;
  uint4 a0, a1, b0, b1;
  if (g < groups) { a0 = ldcg(w + idx(2 * g)); a1 = ldcg(w + idx(2 * g + 1)); }
  for (; g < groups; g += wpt) {
    const int gn = g + wpt;
    if (gn < groups) { b0 = ldcg(w + idx(2 * gn)); b1 = ldcg(w + idx(2 * gn + 1)); }
    acc ^= a0.x ^ a0.y ^ a0.z ^ a0.w ^ a1.x ^ a1.y ^ a1.z ^ a1.w;
    a0 = b0; a1 = b1;
  }
  (void)tpb;
  if (acc == 0x12345678u) out[0] = acc;
}

__global__ void contiguous(const uint4* __restrict__ w, int64_t n, unsigned* out) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const uint4 v = ldcg(w + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;
}

int main() {
  struct Shape { const char* name; int tiles, chunks, wpt, tpb; };
  const Shape shapes[] = {{"gate|up 28672x4096", 1792, 64, 2, 2}, {"down 4096x14336", 256, 224, 16, 1},
                          {"qkv 6144x4096", 384, 64, 8, 1}, {"o 4096x4096", 256, 64, 16, 1},
                          {"head-like 65536x4096", 4096, 64, 4, 1}};
  const int copies = 6;
  unsigned* out; CK(cudaMalloc(&out, 4));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (const Shape& s : shapes) {
    const size_t n16 = (size_t)s.tiles * s.chunks * 32;  // uint4s
    std::vector<uint4*> bufs(copies);
    for (auto& b : bufs) { CK(cudaMalloc(&b, n16 * 16)); CK(cudaMemset(b, 1, n16 * 16)); }
    const double mb = n16 * 16 / 1e6;
    for (int rep = 0; rep < 2; ++rep) {
      for (int L = 0; L < 4; ++L) {
        const int reps = 60;
        auto launch = [&](int i) {
          const uint4* w = bufs[i % copies];
          const unsigned blocks = s.tiles / s.tpb, threads = s.tpb * s.wpt * 32;
          if (L == 0) gemv_like<0><<<blocks, threads>>>(w, s.tiles, s.chunks, s.wpt, out);
          else if (L == 1) gemv_like<1><<<blocks, threads>>>(w, s.tiles, s.chunks, s.wpt, out);
          else if (L == 2) gemv_like<2><<<blocks, threads>>>(w, s.tiles, s.chunks, s.wpt, out);
          else contiguous<<<132 * 4, 512>>>(w, (int64_t)n16, out);
        };
        for (int i = 0; i < copies; ++i) launch(i);
        CK(cudaDeviceSynchronize());
        cudaEventRecord(e0);
        for (int i = 0; i < reps; ++i) launch(i);
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1000 / reps;
        const char* ln[] = {"[tile][chunk] (now)", "[chunk][tile]", "[group][tile][cpg]", "contiguous sweep"};
        printf("%-22s %-22s %8.2f us  %7.1f GB/s\n", s.name, ln[L], us, mb * 1e3 / us);
      }
    }
    for (auto& b : bufs) cudaFree(b);
  }
  return 0;
}
