// Session 33 probe: does a one-wave GEMV's tail come from uneven blocks per SM?
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <map>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ uint64_t gtime() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ unsigned smid() { unsigned s; asm volatile("mov.u32 %0, %smid;" : "=r"(s)); return s; }

// [tile][chunk][32 lanes] x 16 B; a warp takes groups wi, wi + wpt, ... of its tile (2 chunks per group).
__global__ void gemv_like(const uint4* __restrict__ w, int tiles, int chunks, int wpt, unsigned* out,
                          unsigned long long* stamps) {
  extern __shared__ char pad[];
  const uint64_t t0 = gtime();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = warp / wpt, wi = warp % wpt;
  const int64_t tile = blockIdx.x + (int64_t)sub * gridDim.x;
  const int groups = chunks / 2;
  unsigned acc = 0;
  if (tile < tiles) {
    auto idx = [&](int c) -> int64_t { return (tile * chunks + c) * 32 + lane; };
    int g = wi;
    uint4 a0, a1, b0, b1;
    if (g < groups) { a0 = __ldcg(w + idx(2 * g)); a1 = __ldcg(w + idx(2 * g + 1)); }
    for (; g < groups; g += wpt) {
      const int gn = g + wpt;
      if (gn < groups) { b0 = __ldcg(w + idx(2 * gn)); b1 = __ldcg(w + idx(2 * gn + 1)); }
      acc ^= a0.x ^ a0.y ^ a0.z ^ a0.w ^ a1.x ^ a1.y ^ a1.z ^ a1.w;
      a0 = b0; a1 = b1;
    }
  }
  if (acc == 0x12345678u) out[0] = acc + pad[0];
  __syncthreads();
  if (threadIdx.x == 0 && stamps) {
    stamps[blockIdx.x * 3 + 0] = t0;
    stamps[blockIdx.x * 3 + 1] = gtime();
    stamps[blockIdx.x * 3 + 2] = smid();
  }
}

int main() {
  struct Shape { const char* name; int tiles, chunks, wpt, tpb; };
  const Shape shapes[] = {{"gate|up", 1792, 64, 2, 2}, {"down", 256, 224, 16, 1}, {"qkv", 384, 64, 8, 1},
                          {"head", 8016, 64, 1, 1}};
  const int copies = 6;
  unsigned* out; CK(cudaMalloc(&out, 4));
  unsigned long long* st; CK(cudaMalloc(&st, 3 * 8 * 20000));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  CK(cudaFuncSetAttribute(gemv_like, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
  for (const Shape& s : shapes) {
    const size_t n16 = (size_t)s.tiles * s.chunks * 32;
    std::vector<uint4*> bufs(copies);
    for (auto& b : bufs) { CK(cudaMalloc(&b, n16 * 16)); CK(cudaMemset(b, 1, n16 * 16)); }
    const double mb = n16 * 16 / 1e6;
    const unsigned blocks = s.tiles / s.tpb, threads = s.tpb * s.wpt * 32;
    int natural = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&natural, gemv_like, threads, 0));
    const int need = (blocks + sms - 1) / sms;
    std::vector<int> caps = {0};
    if (need < natural) caps.push_back(need);
    if (need + 1 < natural) caps.push_back(need + 1);
    for (int rep = 0; rep < 2; ++rep)
      for (int cap : caps) {
        // smem so that at most `cap` blocks fit on an SM (228 KB per SM, 1 KB reserved per block)
        size_t smem = 0;
        if (cap) smem = (228 * 1024) / cap - 1024 - 64;
        int got = 0;
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, gemv_like, threads, smem));
        const int reps = 60;
        auto launch = [&](int i, unsigned long long* stp) {
          gemv_like<<<blocks, threads, smem>>>(bufs[i % copies], s.tiles, s.chunks, s.wpt, out, stp);
        };
        for (int i = 0; i < copies; ++i) launch(i, nullptr);
        CK(cudaDeviceSynchronize());
        cudaEventRecord(e0);
        for (int i = 0; i < reps; ++i) launch(i, nullptr);
        cudaEventRecord(e1);
        CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        const double us = ms * 1000 / reps;
        // one stamped launch after a warm one
        launch(0, nullptr); launch(1, st);
        CK(cudaDeviceSynchronize());
        std::vector<unsigned long long> h(blocks * 3);
        CK(cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost));
        uint64_t tmin = ~0ull, tmax = 0;
        std::map<int, int> per_sm;
        for (unsigned b = 0; b < blocks; ++b) { tmin = std::min<uint64_t>(tmin, h[3 * b]); tmax = std::max<uint64_t>(tmax, h[3 * b + 1]); per_sm[(int)h[3 * b + 2]]++; }
        std::map<int, std::vector<double>> dur_by_count, end_by_count;
        for (unsigned b = 0; b < blocks; ++b) {
          const int c = per_sm[(int)h[3 * b + 2]];
          dur_by_count[c].push_back((h[3 * b + 1] - h[3 * b]) / 1e3);
          end_by_count[c].push_back((h[3 * b + 1] - tmin) / 1e3);
        }
        printf("%-8s cap %d (fits %d, natural %d, smem %zu) blocks %u x %u: %8.2f us/launch (%7.1f GB/s), stamped span %.2f us, SMs used %zu\n",
               s.name, cap, got, natural, smem, blocks, threads, us, mb * 1e3 / us, (tmax - tmin) / 1e3, per_sm.size());
        for (auto& [c, v] : dur_by_count) {
          std::sort(v.begin(), v.end());
          auto& e = end_by_count[c];
          std::sort(e.begin(), e.end());
          printf("    SMs with %2d blocks: %4zu blocks; duration p10 %.2f med %.2f p90 %.2f max %.2f; end med %.2f max %.2f\n", c,
                 v.size(), v[v.size() / 10], v[v.size() / 2], v[v.size() * 9 / 10], v.back(), e[e.size() / 2], e.back());
        }
      }
    for (auto& b : bufs) cudaFree(b);
  }
  return 0;
}
