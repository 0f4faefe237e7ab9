// Session 16 micro-benchmark (docs/results/s16/): the latency of the
// synchronisation a persistent decode kernel would use instead of kernel
// boundaries, on an otherwise idle GPU and under a concurrent HBM read stream.
//  * ping-pong: block 0 and block B (another SM) hand a token back and forth
//    through two flags in global memory (st.release.gpu / ld.acquire.gpu spin),
//    N round trips; one-way latency = time / (2N).
//  * grid barrier: all G blocks (one per SM) add 1 to a counter (red.release)
//    and spin (ld.acquire) until it reaches G·k, k = 1..N; time / N.
//  * kernel boundary, for comparison: N empty dependent kernels in a graph,
//    with programmatic dependent launch (each waits with griddepcontrol.wait).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

__device__ __forceinline__ unsigned ld_acq(const unsigned* p) {
  unsigned v; asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); return v;
}
__device__ __forceinline__ void st_rel(unsigned* p, unsigned v) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned long long gns() {
  unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t;
}

// Blocks 0 and `other` ping-pong; every other block streams `bytes` of `buf` (load) if buf != null.
__global__ void pingpong(unsigned* flags, int n, int other, const uint4* buf, long long n16, unsigned* sink,
                         unsigned long long* out) {
  if (blockIdx.x == 0 || blockIdx.x == other) {
    if (threadIdx.x != 0) return;
    const bool first = blockIdx.x == 0;
    unsigned* mine = flags + (first ? 0 : 32);
    unsigned* theirs = flags + (first ? 32 : 0);
    const unsigned long long t0 = gns();
    for (int i = 1; i <= n; ++i) {
      if (first) { st_rel(theirs, i); while (ld_acq(mine) < (unsigned)i) {} }
      else { while (ld_acq(mine) < (unsigned)i) {} st_rel(theirs, i); }
    }
    if (first) out[0] = gns() - t0;
    return;
  }
  if (buf == nullptr) return;
  unsigned acc = 0;
  for (int pass = 0; pass < 4; ++pass)
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += (long long)gridDim.x * blockDim.x) {
      const uint4 v = __ldcs(buf + i); acc ^= v.x ^ v.w;
    }
  if (acc == 0x1234567u) sink[0] = acc;
}

__global__ void grid_barrier(unsigned* counter, int n, unsigned long long* out) {
  __shared__ unsigned long long t0;
  if (threadIdx.x == 0) t0 = gns();
  for (int k = 1; k <= n; ++k) {
    __syncthreads();
    if (threadIdx.x == 0) {
      asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
      while (ld_acq(counter) < (unsigned)(gridDim.x * k)) {}
    }
    __syncthreads();
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) out[0] = gns() - t0;
}

__global__ void empty_dep() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  asm volatile("griddepcontrol.wait;" ::: "memory");
}

int main() {
  int sms = 0; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  unsigned* flags; unsigned long long* out; unsigned* sink; uint4* buf;
  const long long bytes = 1ll << 32;
  CK(cudaMalloc(&flags, 4096)); CK(cudaMalloc(&out, 64)); CK(cudaMalloc(&sink, 64)); CK(cudaMalloc(&buf, bytes));
  CK(cudaMemset(buf, 1, bytes));
  const int n = 1000;
  for (int loaded = 0; loaded < 2; ++loaded)
    for (int other : {1, sms / 2, sms - 1}) {
      CK(cudaMemset(flags, 0, 4096));
      pingpong<<<sms, 512>>>(flags, n, other, loaded ? buf : nullptr, bytes / 16, sink, out);
      CK(cudaDeviceSynchronize());
      unsigned long long t; CK(cudaMemcpy(&t, out, 8, cudaMemcpyDeviceToHost));
      printf("ping-pong block 0 <-> block %3d, %s: one way %.0f ns\n", other, loaded ? "under a 4 GiB read stream" : "idle",
             double(t) / (2.0 * n));
    }
  for (int rep = 0; rep < 2; ++rep) {
    CK(cudaMemset(flags, 0, 4096));
    grid_barrier<<<sms, 256>>>(flags, n, out);
    CK(cudaDeviceSynchronize());
    unsigned long long t; CK(cudaMemcpy(&t, out, 8, cudaMemcpyDeviceToHost));
    printf("grid barrier over %d blocks: %.0f ns each\n", sms, double(t) / n);
  }
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  for (int blocks : {1, sms, 2 * sms}) {
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < 200; ++i) {
      cudaLaunchConfig_t cfg = {}; cfg.gridDim = dim3(blocks); cfg.blockDim = dim3(256); cfg.stream = s;
      cfg.attrs = attr; cfg.numAttrs = 1;
      CK(cudaLaunchKernelEx(&cfg, empty_dep));
    }
    CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
    CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    cudaEventRecord(a, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b);
    printf("empty dependent kernels of %d blocks in a graph (PDL): %.0f ns each\n", blocks, ms * 1e6 / 200);
  }
  return 0;
}
