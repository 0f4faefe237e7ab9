#include <cstdio>
#include <cuda_runtime.h>
__global__ void k(unsigned long long* out, int i) {
  unsigned long long id;
  asm volatile("mov.u64 %0, %%gridid;" : "=l"(id));
  if (threadIdx.x == 0 && blockIdx.x == 0) out[i] = id;
}
int main() {
  unsigned long long* d; cudaMalloc(&d, 64 * 8); cudaMemset(d, 0, 64 * 8);
  cudaStream_t s; cudaStreamCreate(&s);
  k<<<2, 32, 0, s>>>(d, 0); k<<<2, 32, 0, s>>>(d, 1);
  cudaGraph_t g; cudaGraphExec_t ge;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  k<<<2, 32, 0, s>>>(d, 2); k<<<2, 32, 0, s>>>(d, 3);
  cudaStreamEndCapture(s, &g); cudaGraphInstantiate(&ge, g, 0);
  unsigned long long h[8];
  for (int r = 0; r < 3; ++r) {
    cudaGraphLaunch(ge, s); cudaStreamSynchronize(s);
    cudaMemcpy(h, d, 32, cudaMemcpyDeviceToHost);
    printf("replay %d: direct %llu %llu graph %llu %llu\n", r, h[0], h[1], h[2], h[3]);
  }
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
