// Session 55 probe: single-token GEMVs that each hold half an SM and bulk-copy their weights into a shared-memory
// ring from their first instruction, before any dependency wait. Each GEMV is its own kernel, launched with
// programmatic dependent launch and triggering its dependents at once, so the next GEMV's block becomes resident
// beside the running one (each takes under half of the SM's shared memory, threads and registers) and streams its
// first ring of weights while the running one finishes; its consumers wait for the grid before (griddepcontrol.wait)
// only for the input. Session 29's half-SM GEMVs streamed with per-warp cp.async rings, which need every warp to
// stream; a bulk copy needs one thread.
//
// One block per SM: NC = 16 consumer warps and one producer warp. A stage is 16 groups of one 16-row tile (16 KB of
// codes, then the 16 groups' 64-byte scale/min entries: 17 KB in one bulk copy); warp w takes group w of each stage
// and runs the single-token GEMV's arithmetic (group_sums / group_combine of w4a16_gemv_math.cuh, as w4a16_gemv.cu runs them) against a prepared input
// read through L1. Block b takes tiles [b·T/G, (b+1)·T/G). Per-warp partial sums of a tile go to shared memory; every
// FB tiles the consumers meet once and sum them over the warps in a fixed order into y (f32).
// The stack: L layers of the Llama-3-8B shapes (q|k|v 6144×4096, o 4096×4096, gate|up 28672×4096, down 4096×14336)
// and the 128256×4096 head, as in bench_w4a16's M = 1 stack, each GEMV reading its own prepared input.
// Status: written in session 55, which was lent no device: compiled here for sm_90a (56 registers, no spills for the
// half-SM variants), never run. Its first run answers whether the idea is worth a production kernel.
// Build: nvcc -O3 -std=c++17 -arch=sm_90a -I src -I include -o halfsm docs/results/s55/probes/halfsm.cu
// Run: halfsm [LAYERS]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/w4a16_common.cuh"
#include "backend/cuda/w4a16_gemv_math.cuh"
using namespace nibble::cuda::w4a16;
using nibble::cuda::group_sums;
using nibble::cuda::group_combine;

#define CK(x)                                                                     \
  do {                                                                            \
    cudaError_t e_ = (x);                                                         \
    if (e_ != cudaSuccess) {                                                      \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      exit(1);                                                                    \
    }                                                                             \
  } while (0)

constexpr int kU = 16;                   // groups per stage
constexpr int kStage = kU * (1024 + 64);  // bytes per stage

__device__ inline void bar_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

struct Gemv {
  const unsigned char* data;  // [tiles][spt stages] of kStage bytes
  const uint4* frags;         // prepared input: [K/64 chunks][3 planes][4 tig] uint4
  const float2* ginfo;        // [K/128] (d, Σx)
  float* y;                   // [tiles · 16]
  int tiles, spt;             // spt = K / 128 / 16
  int* smid;                  // null, or [blocks]: the SM each block ran on (the placement check)
};
__device__ inline int sm_id() {
  int r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return r;
}

// PW = 1: the producer also waits for the grid before (no prefetch across the dependency).
template <int NC, int S, int FB, int PW, int MINB>
__global__ void __launch_bounds__((NC + 1) * 32, MINB) halfsm_gemv(const __grid_constant__ Gemv p) {
  static_assert(NC == kU, "one warp per group of a stage");
  extern __shared__ __align__(128) unsigned char smem[];
  grid_dependents_launch();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
  const int G = gridDim.x, b = blockIdx.x;
  if (p.smid && threadIdx.x == 0) p.smid[b] = sm_id();
  const int t0 = static_cast<int>(static_cast<long long>(b) * p.tiles / G);
  const int t1 = static_cast<int>(static_cast<long long>(b + 1) * p.tiles / G);
  const uint32_t ring = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const uint32_t full0 = ring + S * kStage, empty0 = full0 + 8 * S;
  float* red = reinterpret_cast<float*>(smem + S * kStage + 16 * S);  // [2·FB slots][NC warps][16 rows]
  if (threadIdx.x < S) {
    mbar_init(full0 + 8 * threadIdx.x, 1);
    mbar_init(empty0 + 8 * threadIdx.x, NC);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  if (warp == NC) {
    if (lane == 0) {
      if (PW) grid_dependency_wait();
      const unsigned char* src = p.data + static_cast<size_t>(t0) * p.spt * kStage;
      const int n = (t1 - t0) * p.spt;
      for (int seq = 0; seq < n; ++seq) {
        const int st = seq % S, use = seq / S;
        if (use > 0) mbar_wait(empty0 + 8 * st, (use - 1) & 1);
        mbar_expect_tx(full0 + 8 * st, kStage);
        bulk_copy(ring + st * kStage, src + static_cast<size_t>(seq) * kStage, kStage, full0 + 8 * st);
      }
    }
    return;
  }
  grid_dependency_wait();
  const float c_even = tig == 0 ? 65536.0f : tig == 1 ? 1.0f : 0.0f, c_odd = tig == 0 ? 256.0f : 0.0f;
  const float c_min = tig == 0 ? 1.0f : 0.0f;
  const bool b_lane = gid < 3;
  const uint4* xp = p.frags + gid * 4 + tig;
  const uint32_t woff = warp * 1024 + lane * 16, moff = NC * 1024 + warp * 64 + gid * 8;
  int st = 0;
  uint32_t ph = 0;
  for (int t = t0; t < t1; ++t) {
    float lo = 0.0f, hi = 0.0f;
    for (int k = 0; k < p.spt; ++k) {
      const uint32_t base = ring + st * kStage;
      const int g = k * NC + warp;
      uint4 xf[2];
      xf[0] = b_lane ? __ldg(xp + g * 24) : make_uint4(0, 0, 0, 0);
      xf[1] = b_lane ? __ldg(xp + g * 24 + 12) : make_uint4(0, 0, 0, 0);
      const float2 gi = __ldg(p.ginfo + g);
      mbar_wait(full0 + 8 * st, ph);
      uint4 q[2];
      q[0] = lds128(base + woff);
      q[1] = lds128(base + woff + 512);
      const uint2 sm = lds64(base + moff);
      __syncwarp();
      if (lane == 0) mbar_arrive(empty0 + 8 * st);
      int32_t acc[4];
      group_sums(q, xf, acc);
      group_combine(acc, sm, gi.x, gi.y, c_even, c_odd, c_min, lo, hi);
      if (++st == S) {
        st = 0;
        ph ^= 1;
      }
    }
    lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
    lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
    hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 1);
    hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 2);
    const int i = t - t0, slot = i % (2 * FB);
    if (tig == 0) {
      red[(slot * NC + warp) * 16 + gid] = lo;
      red[(slot * NC + warp) * 16 + gid + 8] = hi;
    }
    if (i % FB == FB - 1 || t == t1 - 1) {  // the last FB (or fewer) tiles: sum over the warps, in warp order
      bar_sync(1, NC * 32);
      const int first = i - i % FB, rows = (i - first + 1) * 16;
      for (int r = threadIdx.x; r < rows; r += NC * 32) {
        const int s = (first + r / 16) % (2 * FB);
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < NC; ++w) v += red[(s * NC + w) * 16 + r % 16];
        p.y[static_cast<size_t>(t0 + first) * 16 + r] = v;
      }
    }
  }
}

// The same sums one warp per tile, groups in order, straight from global memory: the check of the ring's addressing.
__global__ void ref_gemv(const __grid_constant__ Gemv p) {
  const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int t = blockIdx.x;
  const float c_even = tig == 0 ? 65536.0f : tig == 1 ? 1.0f : 0.0f, c_odd = tig == 0 ? 256.0f : 0.0f;
  const float c_min = tig == 0 ? 1.0f : 0.0f;
  float lo = 0.0f, hi = 0.0f;
  for (int g = 0; g < p.spt * kU; ++g) {
    const unsigned char* st = p.data + (static_cast<size_t>(t) * p.spt + g / kU) * kStage;
    const int w = g % kU;
    uint4 q[2], xf[2];
    q[0] = *reinterpret_cast<const uint4*>(st + w * 1024 + lane * 16);
    q[1] = *reinterpret_cast<const uint4*>(st + w * 1024 + 512 + lane * 16);
    const uint2 sm = *reinterpret_cast<const uint2*>(st + kU * 1024 + w * 64 + gid * 8);
    xf[0] = gid < 3 ? p.frags[g * 24 + gid * 4 + tig] : make_uint4(0, 0, 0, 0);
    xf[1] = gid < 3 ? p.frags[g * 24 + 12 + gid * 4 + tig] : make_uint4(0, 0, 0, 0);
    int32_t acc[4];
    group_sums(q, xf, acc);
    group_combine(acc, sm, p.ginfo[g].x, p.ginfo[g].y, c_even, c_odd, c_min, lo, hi);
  }
  lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 1);
  lo += __shfl_xor_sync(0xFFFFFFFFu, lo, 2);
  hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 1);
  hi += __shfl_xor_sync(0xFFFFFFFFu, hi, 2);
  if (tig == 0) {
    p.y[static_cast<size_t>(t) * 16 + gid] = lo;
    p.y[static_cast<size_t>(t) * 16 + gid + 8] = hi;
  }
}

// The read-only reference: the GEMV's bytes read by a plain kernel, launched the same way, waiting for the kernel
// before only after its reads.
__global__ void read_only(const __grid_constant__ Gemv p) {
  grid_dependents_launch();
  const uint4* d = reinterpret_cast<const uint4*>(p.data);
  const size_t n = static_cast<size_t>(p.tiles) * p.spt * kStage / 16;
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(d + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  grid_dependency_wait();
  if (acc == 0x9E3779B9u) p.y[0] = static_cast<float>(acc);
}
__global__ void read_all(const uint4* __restrict__ d, size_t n, unsigned* out) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(d + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) out[0] = acc;
}
__device__ inline uint32_t mix(uint32_t x) {
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  x *= 3266489917u;
  return x ^ (x >> 16);
}
// Codes random; scale/min entries bf16 scale in [2^-7, 2^-6), min in (-2^-3, 0].
__global__ void fill_weights(uint32_t* d, size_t stages, uint32_t seed) {
  const size_t words = stages * (kStage / 4);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < words;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t r = mix(static_cast<uint32_t>(i) * 2654435761u ^ seed ^ static_cast<uint32_t>(i >> 32));
    const size_t in_stage = i % (kStage / 4);
    if (in_stage < kU * 256)
      d[i] = r;
    else
      d[i] = (0x3C00u | (r & 0x7Fu)) | ((0xBD80u | ((r >> 8) & 0x7Fu)) << 16);  // scale ~2^-7, min ~ -2^-4
  }
}
__global__ void fill_input(uint32_t* frags, float2* ginfo, int K, uint32_t seed) {
  const int words = K / 64 * 12 * 4;
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < words; i += gridDim.x * blockDim.x)
    frags[i] = mix(static_cast<uint32_t>(i) ^ seed) & 0x7F7F7F7Fu;  // small positive int8 planes
  for (int g = blockIdx.x * blockDim.x + threadIdx.x; g < K / 128; g += gridDim.x * blockDim.x)
    ginfo[g] = make_float2(ldexpf(1.0f, -22), 0.25f * static_cast<float>(mix(g ^ seed) & 0xFF) / 255.0f);
}

template <class Kern>
static void launch(Kern k, int grid, int block, size_t smem, cudaStream_t s, bool pdl, const Gemv& g) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(grid);
  c.blockDim = dim3(block);
  c.dynamicSmemBytes = smem;
  c.stream = s;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = 1;
  c.attrs = a;
  c.numAttrs = pdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&c, k, g));
}

struct Stack {
  std::vector<Gemv> gemvs;
  double bytes = 0;
};

// Times `reps` graph replays of the stack launched by `one`; returns the median in ms.
template <class F>
static double time_graph(cudaStream_t s, const Stack& st, F one, int reps) {
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (const Gemv& v : st.gemvs) one(v);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int it = 0; it < reps + 3; ++it) {
    CK(cudaEventRecord(e0, s));
    CK(cudaGraphLaunch(ge, s));
    CK(cudaEventRecord(e1, s));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 3) ts.push_back(ms);
  }
  CK(cudaGetLastError());
  CK(cudaGraphExecDestroy(ge));
  CK(cudaGraphDestroy(g));
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

template <int NC, int S, int FB, int PW, int MINB>
static size_t variant_smem() {
  return static_cast<size_t>(S) * kStage + 16 * S + 2 * FB * NC * 16 * 4;
}

template <int NC, int S, int FB, int PW, int MINB>
static void run_variant(const char* name, cudaStream_t s, const Stack& st, int sms, bool pdl, double bw, int reps,
                        double ro_ms) {
  auto k = halfsm_gemv<NC, S, FB, PW, MINB>;
  const size_t smem = variant_smem<NC, S, FB, PW, MINB>();
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  cudaFuncAttributes fa;
  CK(cudaFuncGetAttributes(&fa, k));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, (NC + 1) * 32, smem));
  const double ms = time_graph(
      s, st, [&](const Gemv& g) { launch(k, sms, (NC + 1) * 32, smem, s, pdl, g); }, reps);
  printf("%-44s NC=%d S=%d smem=%6zu regs=%3d spill=%zu blocks/SM=%d pdl=%d: %.4f ms  %5.1f %% of read BW  %.3f x read-only\n",
         name, NC, S, smem, fa.numRegs, static_cast<size_t>(fa.localSizeBytes), per_sm, pdl ? 1 : 0, ms,
         100.0 * st.bytes / ms / 1e6 / bw, ms / ro_ms);
}

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::atoi(argv[1]) : 32;
  const int reps = 20;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  struct Shape {
    int n, k;
  } shapes[] = {{6144, 4096}, {4096, 4096}, {28672, 4096}, {4096, 14336}};
  std::vector<Shape> seq;
  for (int l = 0; l < layers; ++l)
    for (const Shape& sh : shapes) seq.push_back(sh);
  seq.push_back({128256, 4096});
  size_t total_stages = 0;
  for (const Shape& sh : seq) total_stages += static_cast<size_t>(sh.n / 16) * (sh.k / 128 / kU);
  unsigned char* data;
  CK(cudaMalloc(&data, total_stages * kStage));
  fill_weights<<<4 * sms, 512>>>(reinterpret_cast<uint32_t*>(data), total_stages, 12345u);
  // One prepared input and one output per GEMV.
  Stack st;
  size_t off = 0;
  for (size_t i = 0; i < seq.size(); ++i) {
    Gemv g = {};
    g.data = data + off * kStage;
    g.tiles = seq[i].n / 16;
    g.spt = seq[i].k / 128 / kU;
    off += static_cast<size_t>(g.tiles) * g.spt;
    uint4* f;
    float2* gi;
    float* y;
    CK(cudaMalloc(&f, seq[i].k / 64 * 12 * 16));
    CK(cudaMalloc(&gi, seq[i].k / 128 * sizeof(float2)));
    CK(cudaMalloc(&y, static_cast<size_t>(seq[i].n) * 4));
    fill_input<<<8, 256>>>(reinterpret_cast<uint32_t*>(f), gi, seq[i].k, 777u * static_cast<uint32_t>(i));
    g.frags = f;
    g.ginfo = gi;
    g.y = y;
    st.gemvs.push_back(g);
    st.bytes += static_cast<double>(g.tiles) * g.spt * kStage;
  }
  CK(cudaDeviceSynchronize());
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  // The read bandwidth: one plain kernel over the whole stack's bytes.
  double bw = 0;
  {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> ts;
    for (int it = 0; it < 8; ++it) {
      CK(cudaEventRecord(e0, s));
      read_all<<<sms * 8, 512, 0, s>>>(reinterpret_cast<const uint4*>(data), total_stages * kStage / 16, sink);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (it >= 2) ts.push_back(ms);
    }
    std::sort(ts.begin(), ts.end());
    bw = static_cast<double>(total_stages) * kStage / ts[ts.size() / 2] / 1e6;
  }
  printf("%s, %d SMs; %d layers + head, %zu GEMVs, %.3f GB; read bandwidth %.0f GB/s, floor %.4f ms\n", prop.name, sms,
         layers, st.gemvs.size(), st.bytes / 1e9, bw, st.bytes / bw / 1e6);
  const double ro = time_graph(
      s, st, [&](const Gemv& g) { launch(read_only, sms * 2, 512, 0, s, true, g); }, reps);
  printf("%-44s %.4f ms  %5.1f %% of read BW\n", "read-only, pdl (the reference)", ro, 100.0 * st.bytes / ro / 1e6 / bw);

  // Check: every variant's y against ref_gemv on the first layer's four GEMVs and the head.
  {
    auto k = halfsm_gemv<16, 5, 4, 0, 2>;
    const size_t smem = variant_smem<16, 5, 4, 0, 2>();
    CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    std::vector<int> which = {0, 1, 2, 3, static_cast<int>(st.gemvs.size()) - 1};
    for (int i : which) {
      Gemv g = st.gemvs[i];
      launch(k, sms, 17 * 32, smem, s, true, g);
      std::vector<float> a(static_cast<size_t>(g.tiles) * 16), r(a.size());
      CK(cudaMemcpyAsync(a.data(), g.y, a.size() * 4, cudaMemcpyDeviceToHost, s));
      ref_gemv<<<g.tiles, 32, 0, s>>>(g);
      CK(cudaMemcpyAsync(r.data(), g.y, r.size() * 4, cudaMemcpyDeviceToHost, s));
      CK(cudaStreamSynchronize(s));
      double worst = 0, scale = 0;
      for (size_t j = 0; j < a.size(); ++j) scale = std::max(scale, std::fabs(static_cast<double>(r[j])));
      for (size_t j = 0; j < a.size(); ++j)
        worst = std::max(worst, std::fabs(static_cast<double>(a[j]) - r[j]) / std::max(scale, 1e-30));
      printf("check GEMV %d (%d x %d): max |y - ref| / max|ref| = %.2e (max|ref| %.3g) %s\n", i, g.tiles * 16,
             g.spt * kU * 128, worst, scale, worst < 1e-5 ? "ok" : "MISMATCH");
    }
  }
  {  // Placement: one stack run recording each block's SM; how many GEMVs put two of their blocks on one SM.
    auto k = halfsm_gemv<16, 5, 4, 0, 2>;
    const size_t smem = variant_smem<16, 5, 4, 0, 2>();
    int* ids;
    CK(cudaMalloc(&ids, st.gemvs.size() * sms * sizeof(int)));
    for (size_t i = 0; i < st.gemvs.size(); ++i) {
      Gemv g = st.gemvs[i];
      g.smid = ids + i * sms;
      launch(k, sms, 17 * 32, smem, s, true, g);
    }
    std::vector<int> h(st.gemvs.size() * sms);
    CK(cudaMemcpyAsync(h.data(), ids, h.size() * sizeof(int), cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    int doubled = 0, worst = 0;
    for (size_t i = 0; i < st.gemvs.size(); ++i) {
      std::vector<int> per(1024, 0);
      int most = 0;
      for (int b = 0; b < sms; ++b) most = std::max(most, ++per[h[i * sms + b] & 1023]);
      doubled += most > 1;
      worst = std::max(worst, most);
    }
    printf("placement: %d of %zu GEMVs put more than one block on some SM (at most %d)\n", doubled, st.gemvs.size(),
           worst);
  }
  run_variant<16, 5, 4, 0, 2>("half SM, producer streams before the wait", s, st, sms, true, bw, reps, ro);
  run_variant<16, 5, 4, 1, 2>("half SM, producer waits", s, st, sms, true, bw, reps, ro);
  run_variant<16, 5, 4, 0, 2>("half SM, no pdl", s, st, sms, false, bw, reps, ro);
  run_variant<16, 4, 4, 0, 2>("half SM, 4 stages", s, st, sms, true, bw, reps, ro);
  run_variant<16, 6, 4, 0, 2>("half SM, 6 stages", s, st, sms, true, bw, reps, ro);
  run_variant<16, 12, 4, 0, 1>("whole SM (12 stages), streams before wait", s, st, sms, true, bw, reps, ro);
  run_variant<16, 5, 4, 0, 2>("half SM, producer streams before the wait", s, st, sms, true, bw, reps, ro);
  printf("read-only again: %.4f ms\n",
         time_graph(s, st, [&](const Gemv& g) { launch(read_only, sms * 2, 512, 0, s, true, g); }, reps));
  return 0;
}
