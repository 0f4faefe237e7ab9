// Session 33 probe: a one-wave GEMV-shaped read (static: a block per tile, K split over the tile's warps)
// against dynamic units (warps take (tile, K part) units from an atomic counter, one unit ahead).
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <string>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)
__device__ __forceinline__ uint64_t gtime() { uint64_t t; asm volatile("mov.u64 %0, %globaltimer;" : "=l"(t)); return t; }

__global__ void stat(const uint4* __restrict__ w, int tiles, int chunks, int wpt, unsigned* out, unsigned long long* st) {
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
  if (acc == 0x12345678u) out[0] = acc;
  __syncthreads();
  if (threadIdx.x == 0 && st) { st[2 * blockIdx.x] = t0; st[2 * blockIdx.x + 1] = gtime(); }
}

// units: tile-major, kp K parts of gpu groups each; unit u -> tile u / kp, groups (u % kp) * gpu ...
__global__ void dyn(const uint4* __restrict__ w, int tiles, int chunks, int gpu, unsigned* ctr, unsigned* out,
                    unsigned long long* st) {
  const uint64_t t0 = gtime();
  const int lane = threadIdx.x & 31;
  const int groups = chunks / 2, kp = groups / gpu;
  const unsigned units = (unsigned)tiles * kp;
  unsigned acc = 0;
  unsigned u = 0, un = 0;
  if (lane == 0) u = atomicAdd(ctr, 1u);
  u = __shfl_sync(~0u, u, 0);
  while (u < units) {
    if (lane == 0) un = atomicAdd(ctr, 1u);  // the next unit, in flight while this one streams
    const int64_t tile = u / kp;
    const int g0 = (u % kp) * gpu;
    const uint4* p = w + ((tile * chunks + 2 * g0) * 32 + lane);
    uint4 a0 = __ldcg(p), a1 = __ldcg(p + 32), b0, b1;
    for (int g = 0; g < gpu; ++g) {
      if (g + 1 < gpu) { b0 = __ldcg(p + 64 * (g + 1)); b1 = __ldcg(p + 64 * (g + 1) + 32); }
      acc ^= a0.x ^ a0.y ^ a0.z ^ a0.w ^ a1.x ^ a1.y ^ a1.z ^ a1.w;
      a0 = b0; a1 = b1;
    }
    u = __shfl_sync(~0u, un, 0);
  }
  if (acc == 0x12345678u) out[0] = acc;
  __syncthreads();
  if (threadIdx.x == 0 && st) { st[2 * blockIdx.x] = t0; st[2 * blockIdx.x + 1] = gtime(); }
}

int main() {
  struct Shape { const char* name; int tiles, chunks, wpt, tpb; };
  const Shape shapes[] = {{"gate|up", 1792, 64, 2, 2}, {"down", 256, 224, 16, 1}, {"qkv", 384, 64, 8, 1}, {"o", 256, 64, 16, 1}};
  const int copies = 6, reps = 60;
  unsigned* out; CK(cudaMalloc(&out, 4));
  unsigned* ctr; CK(cudaMalloc(&ctr, 4 * 4096));
  unsigned long long* st; CK(cudaMalloc(&st, 16 * 20000));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  for (const Shape& s : shapes) {
    const size_t n16 = (size_t)s.tiles * s.chunks * 32;
    std::vector<uint4*> bufs(copies);
    for (auto& b : bufs) { CK(cudaMalloc(&b, n16 * 16)); CK(cudaMemset(b, 1, n16 * 16)); }
    const double mb = n16 * 16 / 1e6;
    auto span = [&](unsigned blocks) {
      std::vector<unsigned long long> h(2 * blocks);
      cudaMemcpy(h.data(), st, h.size() * 8, cudaMemcpyDeviceToHost);
      uint64_t a = ~0ull, b = 0; std::vector<double> ends;
      for (unsigned i = 0; i < blocks; ++i) { a = std::min<uint64_t>(a, h[2 * i]); b = std::max<uint64_t>(b, h[2 * i + 1]); }
      for (unsigned i = 0; i < blocks; ++i) ends.push_back((h[2 * i + 1] - a) / 1e3);
      std::sort(ends.begin(), ends.end());
      char buf[200]; snprintf(buf, sizeof buf, "span %.2f us (ends p10 %.2f med %.2f p90 %.2f)", (b - a) / 1e3,
                              ends[ends.size() / 10], ends[ends.size() / 2], ends[ends.size() * 9 / 10]);
      return std::string(buf);
    };
    for (int rep = 0; rep < 2; ++rep) {
      {  // static
        const unsigned blocks = s.tiles / s.tpb, threads = s.tpb * s.wpt * 32;
        for (int i = 0; i < copies; ++i) stat<<<blocks, threads>>>(bufs[i], s.tiles, s.chunks, s.wpt, out, nullptr);
        CK(cudaDeviceSynchronize());
        cudaEventRecord(e0);
        for (int i = 0; i < reps; ++i) stat<<<blocks, threads>>>(bufs[i % copies], s.tiles, s.chunks, s.wpt, out, nullptr);
        cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
        float ms; cudaEventElapsedTime(&ms, e0, e1);
        stat<<<blocks, threads>>>(bufs[0], s.tiles, s.chunks, s.wpt, out, st);
        CK(cudaDeviceSynchronize());
        printf("%-8s static   %4u x %4u: %7.2f us/launch (%6.1f GB/s)  %s\n", s.name, blocks, threads, ms * 1e3 / reps,
               mb / (ms / reps), span(blocks).c_str());
      }
      for (int gpu : {1, 2, 4, 8}) {
        if ((s.chunks / 2) % gpu) continue;
        for (int wpb : {4, 16}) {
          const unsigned threads = wpb * 32;
          int per = 0; CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, dyn, threads, 0));
          const int warps_target = 32;  // about the GEMV's warps per SM
          const unsigned blocks = sms * std::min(per, warps_target / wpb);
          CK(cudaMemset(ctr, 0, 4 * 4096));
          for (int i = 0; i < copies; ++i) dyn<<<blocks, threads>>>(bufs[i], s.tiles, s.chunks, gpu, ctr + i, out, nullptr);
          CK(cudaDeviceSynchronize());
          CK(cudaMemset(ctr, 0, 4 * 4096));
          cudaEventRecord(e0);
          for (int i = 0; i < reps; ++i) dyn<<<blocks, threads>>>(bufs[i % copies], s.tiles, s.chunks, gpu, ctr + i, out, nullptr);
          cudaEventRecord(e1); CK(cudaEventSynchronize(e1));
          float ms; cudaEventElapsedTime(&ms, e0, e1);
          CK(cudaMemset(ctr, 0, 4));
          dyn<<<blocks, threads>>>(bufs[0], s.tiles, s.chunks, gpu, ctr, out, st);
          CK(cudaDeviceSynchronize());
          printf("%-8s dynamic  %4u x %4u, units of %d groups: %7.2f us/launch (%6.1f GB/s)  %s\n", s.name, blocks, threads, gpu,
                 ms * 1e3 / reps, mb / (ms / reps), span(blocks).c_str());
        }
      }
    }
    for (auto& b : bufs) cudaFree(b);
  }
  return 0;
}
