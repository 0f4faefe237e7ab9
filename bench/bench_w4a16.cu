// W4A16 on the GPU: a Llama-3-8B-shaped stack of linears plus the head, timed
// as CUDA graphs at M = 1, 4, 16, 64, next to cuBLAS bf16 on the same shapes and
// against the read bandwidth measured in the same run (issue 6, item 2).
//
//   bench_w4a16 [--layers 32] [--reps 20] [--ms 1,4,16,64] [--group 128] [--skip-cublas] [--profile]
//               [--shapes NxK,...] [--no-pdl] [--interleave] [--same-weights] [--act bf16|fp16]
//               [--torch SCRIPT | --no-torch]
//
// After the stacks (groups of 128 only), the same run starts SCRIPT
// (default bench/torch_int4_stack.py, relative to the working directory) with
// python3 for torch's int4 kernel (tinygemm) on the unfused stack at the same
// M, and prints it beside nibble's stacks (issue 6: "one run prints all of
// it"). Without python3 or torch it says so and ends normally.
// --act: the activations' type for nibble's kernels (bf16 by default; cuBLAS
// stays bf16 and reads the same buffer, for its time only).
// --shapes: only these shapes, each as `--layers` copies in one graph per M
// (as the per-shape rows below), then exit; for sweeps of one kernel's grid.
// --no-pdl: with --shapes, launch without programmatic dependent launch (the
// stacks' rows always print both).
// --same-weights: with --shapes, every copy reads the first one's bytes (from
// the L2 where they fit: what the kernels stream when the bytes are near), and
// at M = 1 the prepared GEMV and the read-only kernel as well.
// --interleave: with --shapes, also the given shapes in turn, --layers rounds
// in one graph per M (their transitions, against the per-shape rows' sum; the
// same uploaded weights as those rows).
// --profile: no timing; a few plain launches per distinct shape and M (and at
// M = 1 each shape as a GEMV chain of one call, twice), for Nsight Compute.
//
// Stacks: "unfused" = q, k, v, o, gate, up, down per layer (7 launches, as the
// torch reference in bench/torch_int4_stack.py times it); "fused" = qkv and
// gate|up concatenated (4 launches per layer, what the GPU forward does).
// Before each stack's row at each M, per distinct shape: all its copies in the
// stack, one graph (the fused stack: q|k|v and gate|up, the shapes the unfused
// stack lacks).
// With M = 1, the fused stack again with each input already prepared (the
// decode path: LinearKernel::gemv_prepared, one launch per linear), as GEMV
// chains, and per shape; and, as their reference, the same weights read by
// plain kernels launched the same way (read-only: no arithmetic at all),
// timed right after the fused M = 1 row and printed after the table; and the
// read-only kernels again, each waiting for the one before as a GEMV waits for
// its input ("wait first": before any read; "32K/SM, wait": after its first
// 32 KB per SM, about what a GEMV's ring issues before its wait; 96K, 192K).
// The per-shape rows "ro wait 1st" and "ro 32K, wait" are the same two.
// "x M=1": each stack's time over its own M = 1 time in this run (issue 6's
// "M = 16 within 1.3× of M = 1"; needs 1 first in --ms).
// Weights are random (codes, scales, mins), never zeros.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/w4a16_gemv.h"
#include "nibble/cuda.h"
#include "nibble/dtype.h"
#include "nibble/format.h"
#include "cuda_check.h"

namespace {

using nibble::cuda::Act;
using nibble::cuda::DeviceBuffer;
using nibble::cuda::DeviceLinear;

__global__ void read_kernel(const uint4* __restrict__ p, int64_t n, unsigned* out) {
  unsigned acc = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(p + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) out[0] = acc;  // keeps the loads; practically never taken
}

// The same bytes a GEMV reads, and nothing else (the "read-only" rows): a
// weight's two buffers, read by a grid of `blocks_per_sm` × SMs blocks of 512
// threads, four 16-byte loads in flight per thread, launched like a decode
// GEMV (programmatic dependent launch: the next kernel may start at once, and
// this one waits for the one before only after its reads). What one kernel
// per weight could stream if its arithmetic cost nothing.
// `pre_rounds` >= 0: the kernel waits for the one before after its threads
// have read that many rounds of the codes (a round: one 16-byte word per
// thread, in memory order; 32 KB per SM at 4 blocks of 512 threads), and reads
// the rest after: what one kernel per weight could stream if its arithmetic
// cost nothing but it had to wait for its input as a GEMV does (0: nothing
// read before the wait; a GEMV's two-stage ring issues about one round, 32 KB
// per SM, before it). -1: every read before the wait.
__global__ void __launch_bounds__(512) read_weight_kernel(const uint4* __restrict__ a, int64_t na,
                                                          const uint4* __restrict__ b, int64_t nb, unsigned* out,
                                                          int pre_rounds) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  unsigned acc = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x, t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  int64_t start = t;  // the codes' first word read by the main loops
  if (pre_rounds >= 0) {
    for (int r = 0; r < pre_rounds; r += 4) {  // four rounds at a time (the last ones predicated off)
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t w = t + (r + u) * stride;
        v[u] = r + u < pre_rounds && w < na ? __ldcs(a + w) : make_uint4(0, 0, 0, 0);
      }
      acc ^= v[0].x ^ v[1].y ^ v[2].z ^ v[3].w;
    }
    start = t + pre_rounds * stride;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  }
  for (int pass = 0; pass < 2; ++pass) {
    const uint4* p = pass == 0 ? a : b;
    const int64_t n = pass == 0 ? na : nb;
    int64_t i = pass == 0 ? start : t;
    for (; i + 3 * stride < n; i += 4 * stride) {
      const uint4 v0 = __ldcs(p + i), v1 = __ldcs(p + i + stride), v2 = __ldcs(p + i + 2 * stride),
                  v3 = __ldcs(p + i + 3 * stride);
      acc ^= v0.x ^ v1.y ^ v2.z ^ v3.w;
    }
    for (; i < n; i += stride) acc ^= __ldcs(p + i).x;
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (pre_rounds < 0) asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  if (acc == 0x12345678u) out[0] = acc;
}
// pre_rounds: as read_weight_kernel's (-1: every read before the wait).
void read_weight(const DeviceLinear& l, int blocks_per_sm, int sms, unsigned* sink, cudaStream_t s,
                 int pre_rounds = -1) {
  cudaLaunchAttribute attr[1] = {};
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(blocks_per_sm * sms));
  cfg.blockDim = dim3(512);
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, read_weight_kernel, static_cast<const uint4*>(l.a.get()),
                        static_cast<int64_t>(l.a.bytes() / 16), static_cast<const uint4*>(l.b.get()),
                        static_cast<int64_t>(l.b.bytes() / 16), sink, pre_rounds));
}

template <typename T>
__global__ void fill_kernel(T* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    p[i] = static_cast<T>((static_cast<float>(h & 0xFFFF) / 65535.0f - 0.5f) * 0.1f);
  }
}
void fill_bf16(void* p, int64_t n, uint32_t seed, int blocks = 1024) {
  fill_kernel<<<blocks, 256>>>(static_cast<__nv_bfloat16*>(p), n, seed);
}

Act g_act = Act::BF16;  // --act: the activations' type for nibble's kernels

// n activations of type g_act (the same values in bf16 or fp16).
void fill_act(void* p, int64_t n, uint32_t seed) {
  if (g_act == Act::F16)
    fill_kernel<<<1024, 256>>>(static_cast<__half*>(p), n, seed);
  else
    fill_bf16(p, n, seed);
}

struct Shape {
  int64_t n, k;
  bool operator==(const Shape& o) const { return n == o.n && k == o.k; }
};

// "a,b,c" -> {"a", "b", "c"} ("" and a trailing comma add no piece).
std::vector<std::string> split_commas(std::string v) {
  std::vector<std::string> out;
  while (!v.empty()) {
    const size_t c = v.find(',');
    out.push_back(v.substr(0, c));
    v = c == std::string::npos ? "" : v.substr(c + 1);
  }
  return out;
}

// One per-shape row: `copies` copies of the shape in one graph took t_ms.
void print_shape_row(const Shape& sh, int M, size_t copies, float t_ms, double bytes, double read_gbs) {
  std::printf("  shape %6lld x %5lld  M=%2d  x%-3zu %8.2f us each  %6.0f GB/s  %5.1f%% of read BW\n",
              static_cast<long long>(sh.n), static_cast<long long>(sh.k), M, copies, 1e3 * t_ms / copies,
              bytes / (t_ms * 1e-3) / 1e9, 100.0 * bytes / (t_ms * 1e-3) / (read_gbs * 1e9));
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median time of one replay of `graph` (ms), after warm-up.
float time_graph(cudaGraphExec_t exec, cudaStream_t s, int reps) {
  for (int i = 0; i < 3; ++i) CK(cudaGraphLaunch(exec, s));
  CK(cudaStreamSynchronize(s));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    CK(cudaEventRecord(a, s));
    CK(cudaGraphLaunch(exec, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return median(t);
}

template <typename F>
float time_captured(cudaStream_t s, int reps, F&& body) {
  body();  // once outside the graph: module loads, library handles, workspaces
  CK(cudaStreamSynchronize(s));
  CK(cudaGetLastError());
  cudaGraph_t g;
  cudaGraphExec_t exec;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  body();
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&exec, g, 0));
  const float ms = time_graph(exec, s, reps);
  CK(cudaGraphExecDestroy(exec));
  CK(cudaGraphDestroy(g));
  return ms;
}

int g_group = 128;  // --group: the int4 g128 stack of the issue, or groups of 64 / 32

std::vector<nibble::Tensor> random_parts(int64_t rows, int64_t cols, uint32_t seed) {
  const auto f = nibble::find_format("int4_asym", g_group);
  const auto specs = f.spec->parts(rows, cols, g_group);
  std::vector<nibble::Tensor> parts;
  std::mt19937 rng(seed);
  for (const auto& sp : specs) {
    nibble::Tensor t = nibble::Tensor::zeros(sp.dtype, sp.shape);
    if (sp.dtype == nibble::DType::U8) {
      auto* p = static_cast<uint32_t*>(t.raw_mut());
      for (size_t i = 0; i < t.nbytes() / 4; ++i) p[i] = rng();
    } else {
      auto* p = static_cast<uint16_t*>(t.raw_mut());
      std::uniform_real_distribution<float> d(sp.suffix == "scales" ? 0.002f : -0.1f, sp.suffix == "scales" ? 0.02f : 0.0f);
      for (size_t i = 0; i < t.nbytes() / 2; ++i) p[i] = nibble::f32_to_bf16(d(rng));
    }
    parts.push_back(std::move(t));
  }
  return parts;
}

std::vector<Shape> stack_shapes(int layers, bool fused) {
  const int64_t h = 4096, kv = 1024, ff = 14336, vocab = 128256;
  std::vector<Shape> s;
  for (int l = 0; l < layers; ++l) {
    if (fused) {
      s.insert(s.end(), {{h + 2 * kv, h}, {h, h}, {2 * ff, h}, {h, ff}});
    } else {
      s.insert(s.end(), {{h, h}, {kv, h}, {kv, h}, {h, h}, {ff, h}, {ff, h}, {h, ff}});
    }
  }
  s.push_back({vocab, h});
  return s;
}

}  // namespace

// torch's int4 kernel on the same unfused stack, by bench/torch_int4_stack.py
// in a child process (this one's GPU buffers are freed by then), beside
// nibble's unfused and fused stacks of this run.
void torch_rows(const std::string& script, int layers, const std::vector<int>& ms, const std::map<int, float>& unfused,
                const std::map<int, float>& fused) {
  std::string list;
  for (int M : ms) list += (list.empty() ? "" : ",") + std::to_string(M);
  const std::string cmd =
      "python3 '" + script + "' --tinygemm-only --layers " + std::to_string(layers) + " --ms " + list + " 2>&1";
  std::fflush(stdout);
  FILE* p = popen(cmd.c_str(), "r");
  std::map<int, float> tiny;
  std::string last, head;
  if (p != nullptr) {
    char line[512];
    while (std::fgets(line, sizeof line, p) != nullptr) {
      last = line;
      int M = 0;
      float t = 0, gb = 0;
      if (std::sscanf(line, "%d %f %f", &M, &t, &gb) == 3)
        tiny[M] = t;
      else if (head.empty() && std::string(line).rfind("torch ", 0) == 0)
        head = line;
    }
  }
  const int rc = p != nullptr ? pclose(p) : -1;
  for (std::string* l : {&last, &head})
    while (!l->empty() && (l->back() == '\n' || l->back() == '\r')) l->pop_back();
  if (rc != 0 || tiny.empty()) {
    std::printf("\ntorch tinygemm: not measured (%s: %s)\n", cmd.c_str(), last.empty() ? "no output" : last.c_str());
    return;
  }
  std::printf("\ntorch's int4 kernel (aten._weight_int4pack_mm, tinygemm, groups of 128) on the unfused stack, run by "
              "%s from this run (%s):\n",
              script.c_str(), head.empty() ? "torch" : head.c_str());
  std::printf("%3s %12s %14s %12s %18s\n", "M", "tinygemm ms", "nibble unfused", "nibble fused",
              "tinygemm / fused");
  for (int M : ms) {
    if (!tiny.count(M) || !unfused.count(M) || !fused.count(M)) continue;
    const float t = tiny.at(M), f = fused.at(M);
    std::printf("%3d %12.3f %14.3f %12.3f %17.2fx\n", M, t, unfused.at(M), f, t / f);
  }
}

int main(int argc, char** argv) {
  int layers = 32, reps = 20;
  bool skip_cublas = false, profile = false, no_pdl = false, interleave = false, same_weights = false;
  std::string torch_script = "bench/torch_int4_stack.py";  // --torch; empty: --no-torch
  std::vector<int> ms = {1, 4, 16, 64};
  std::vector<Shape> only;  // --shapes
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--layers" && i + 1 < argc) layers = std::atoi(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--group" && i + 1 < argc) g_group = std::atoi(argv[++i]);
    else if (a == "--skip-cublas") skip_cublas = true;
    else if (a == "--profile") profile = true;
    else if (a == "--no-pdl") no_pdl = true;
    else if (a == "--interleave") interleave = true;
    else if (a == "--same-weights") same_weights = true;
    else if (a == "--no-torch") torch_script.clear();
    else if (a == "--torch" && i + 1 < argc) torch_script = argv[++i];
    else if (a == "--act" && i + 1 < argc) {
      const std::string v = argv[++i];
      if (v != "bf16" && v != "fp16") {
        std::fprintf(stderr, "bench_w4a16: --act must be bf16 or fp16 (found '%s')\n", v.c_str());
        return 2;
      }
      g_act = v == "fp16" ? Act::F16 : Act::BF16;
    }
    else if (a == "--ms" && i + 1 < argc) {
      ms.clear();
      for (const std::string& v : split_commas(argv[++i])) ms.push_back(std::atoi(v.c_str()));
    } else if (a == "--shapes" && i + 1 < argc) {
      for (const std::string& v : split_commas(argv[++i])) {
        const size_t x = v.find('x');
        const long long n = std::atoll(v.substr(0, x).c_str()),
                        k = x == std::string::npos ? 0 : std::atoll(v.substr(x + 1).c_str());
        if (n <= 0 || k <= 0) {
          std::fprintf(stderr, "bench_w4a16: --shapes wants NxK,... (found '%s')\n", v.c_str());
          return 2;
        }
        only.push_back({n, k});
      }
    } else {
      std::fprintf(stderr,
                   "usage: bench_w4a16 [--layers N] [--reps N] [--ms 1,4,16,64] [--group 128|64|32] [--skip-cublas] "
                   "[--profile] [--shapes NxK,...] [--no-pdl] [--interleave] [--same-weights] [--act bf16|fp16] "
                   "[--torch SCRIPT | --no-torch]\n");
      return 2;
    }
  }
  if (g_group != 32 && g_group != 64 && g_group != 128) {
    std::fprintf(stderr, "bench_w4a16: --group must be 32, 64 or 128 (found %d)\n", g_group);
    return 2;
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB; int4 groups of %d; %s activations\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, g_group, g_act == Act::F16 ? "fp16" : "bf16");
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));

  if (profile) {  // a few plain launches per distinct shape and M, for Nsight Compute
    const auto* k = nibble::cuda::find_linear_kernel("int4_asym", g_group);
    const int64_t mx = std::max<int64_t>(64, *std::max_element(ms.begin(), ms.end()));
    DeviceBuffer x(mx * 14336 * 2), y(mx * 128256 * 2);
    fill_act(x.get(), mx * 14336, 7);
    for (const Shape sh : {Shape{4096, 4096}, Shape{28672, 4096}, Shape{4096, 14336}, Shape{128256, 4096}}) {
      const DeviceLinear w = k->upload(random_parts(sh.n, sh.k, 1), sh.n, sh.k, g_group);
      for (int M : ms)
        for (int i = 0; i < 2; ++i) k->gemm(w, x.get(), M, sh.k, y.get(), sh.n, g_act, false, s, false);
      if (k->gemv_chain != nullptr && k->prepare != nullptr && nibble::cuda::w4a16_gemv_chain_applies(g_group) &&
          std::find(ms.begin(), ms.end(), 1) != ms.end()) {  // M = 1: the weight as a chain of one call
        k->prepare(w, x.get(), g_act, w.scratch.get(), w.scratch.bytes(), s, false);
        DeviceBuffer sync(nibble::cuda::kGemvChainSync * sizeof(unsigned));
        CK(cudaMemset(sync.get(), 0, sync.bytes()));
        nibble::cuda::GemvCall c;
        c.w = &w;
        c.prepared = w.scratch.get();
        c.prepared_bytes = w.scratch.bytes();
        c.y = static_cast<float*>(y.get());
        for (int i = 0; i < 2; ++i) k->gemv_chain(&c, 1, static_cast<unsigned*>(sync.get()), s, false);
        CK(cudaStreamSynchronize(s));
      }
    }
    CK(cudaStreamSynchronize(s));
    return 0;
  }

  // Read bandwidth: 4 GiB read once per pass, median of passes.
  double read_gbs = 0;
  {
    const int64_t bytes = int64_t{4} << 30;
    DeviceBuffer buf(bytes), sink(64);
    CK(cudaMemset(buf.get(), 0x5A, bytes));
    const float ms_read = time_captured(s, reps, [&] {
      read_kernel<<<prop.multiProcessorCount * 8, 512, 0, s>>>(static_cast<const uint4*>(buf.get()), bytes / 16,
                                                              static_cast<unsigned*>(sink.get()));
    });
    read_gbs = bytes / (ms_read * 1e-3) / 1e9;
    std::printf("read bandwidth: %.0f GB/s (4 GiB read, %.3f ms)\n", read_gbs, ms_read);
  }

  const int64_t max_m = *std::max_element(ms.begin(), ms.end());
  const int64_t width = 2 * 14336 + 128256;  // any K or N of the stack fits
  DeviceBuffer x(static_cast<size_t>(max_m * width * 2)), y(static_cast<size_t>(max_m * width * 2));
  fill_act(x.get(), max_m * width, 7);
  CK(cudaGetLastError());

  if (!only.empty()) {  // --shapes: each shape's copies in one graph per M
    const auto* k = nibble::cuda::find_linear_kernel("int4_asym", g_group);
    std::vector<std::vector<DeviceLinear>> kept;  // --interleave times the same uploads again,
    std::vector<std::vector<const DeviceLinear*>> kept_copies;  // through the same copies
    for (const Shape& sh : only) {
      const std::vector<nibble::Tensor> parts = random_parts(sh.n, sh.k, 1);
      std::vector<DeviceLinear> w;
      // --same-weights: one upload, read by every copy (its bytes stay in the L2 when they fit)
      for (int i = 0; i < (same_weights ? 1 : layers); ++i) w.push_back(k->upload(parts, sh.n, sh.k, g_group));
      DeviceBuffer xs(static_cast<size_t>(max_m * sh.k * 2)),
          ys(static_cast<size_t>(std::max<int64_t>(max_m * 2, 4) * sh.n));  // bf16 [M, N], or f32 [N]
      fill_act(xs.get(), max_m * sh.k, 7);
      std::vector<const DeviceLinear*> wp;
      for (int i = 0; i < layers; ++i) wp.push_back(&w[same_weights ? 0 : i]);
      const double bytes = static_cast<double>(w[0].weight_bytes()) * layers;
      for (int M : ms) {
        const float t = time_captured(s, reps, [&] {
          for (const DeviceLinear* wi : wp) k->gemm(*wi, xs.get(), M, sh.k, ys.get(), sh.n, g_act, false, s, !no_pdl);
        });
        print_shape_row(sh, M, wp.size(), t, bytes, read_gbs);
        if (!same_weights || M != 1 || k->prepare == nullptr || k->gemv_prepared == nullptr ||
            !k->single_token_f32(w[0]))
          continue;
        // With --same-weights at M = 1, also the prepared GEMV (f32 y) and
        // the read-only kernel: what each streams out of the L2.
        k->prepare(w[0], xs.get(), g_act, w[0].scratch.get(), w[0].scratch.bytes(), s, false);
        const float tp = time_captured(s, reps, [&] {
          for (const DeviceLinear* wi : wp)
            k->gemv_prepared(*wi, wi->scratch.get(), wi->scratch.bytes(), ys.get(), s, !no_pdl, false, nullptr);
        });
        std::printf("    prepared:      ");
        print_shape_row(sh, M, wp.size(), tp, bytes, read_gbs);
        DeviceBuffer sink(64);
        const float tr = time_captured(s, reps, [&] {
          for (const DeviceLinear* wi : wp)
            read_weight(*wi, 4, prop.multiProcessorCount, static_cast<unsigned*>(sink.get()), s);
        });
        std::printf("    read-only 4/SM:");
        print_shape_row(sh, M, wp.size(), tr, bytes, read_gbs);
      }
      if (interleave) {  // (moving the vector keeps its elements where the copies point)
        kept.push_back(std::move(w));
        kept_copies.push_back(std::move(wp));
      }
    }
    if (interleave) {  // --interleave: the given shapes in turn, `layers` rounds in one graph per M
      const std::vector<std::vector<const DeviceLinear*>>& w = kept_copies;
      double bytes = 0;
      for (const std::vector<const DeviceLinear*>& wj : w) bytes += static_cast<double>(wj[0]->weight_bytes()) * layers;
      for (int M : ms) {
        const float t = time_captured(s, reps, [&] {
          for (int i = 0; i < layers; ++i)
            for (size_t j = 0; j < only.size(); ++j)
              k->gemm(*w[j][i], x.get(), M, only[j].k, y.get(), only[j].n, g_act, false, s, !no_pdl);
        });
        std::printf("  interleaved %zu shapes  M=%2d  x%-3d %8.2f us a round  %6.0f GB/s  %5.1f%% of read BW\n",
                    only.size(), M, layers, 1e3 * t / layers, bytes / (t * 1e-3) / 1e9,
                    100.0 * bytes / (t * 1e-3) / (read_gbs * 1e9));
      }
    }
    return 0;
  }

  std::printf("\n%-8s %3s %12s %10s %10s %10s %12s %10s %8s\n", "stack", "M", "int4 GB", "nibble ms", "no-PDL ms",
              "cuBLAS ms", "bf16 GB", "of read BW", "x M=1");
  const std::vector<Shape> unfused_shapes = stack_shapes(layers, false);
  std::map<int, float> stack_ms[2];  // [fused][M]: nibble's stack times, for the torch rows
  for (bool fused : {false, true}) {
    const std::vector<Shape> shapes = stack_shapes(layers, fused);
    // One host random matrix per distinct shape; each linear gets its own device copy.
    std::vector<DeviceLinear> w;
    double int4_bytes = 0, bf16_bytes = 0;
    {
      std::vector<std::pair<Shape, std::vector<nibble::Tensor>>> cache;
      const auto* k = nibble::cuda::find_linear_kernel("int4_asym", g_group);
      for (const Shape& sh : shapes) {
        auto it = std::find_if(cache.begin(), cache.end(), [&](const auto& c) { return c.first == sh; });
        if (it == cache.end()) {
          cache.emplace_back(sh, random_parts(sh.n, sh.k, static_cast<uint32_t>(cache.size() + 1)));
          it = cache.end() - 1;
        }
        w.push_back(k->upload(it->second, sh.n, sh.k, g_group));
        int4_bytes += static_cast<double>(w.back().weight_bytes());
        bf16_bytes += 2.0 * sh.n * sh.k;
      }
    }
    std::vector<DeviceBuffer> wb;
    if (!skip_cublas) {
      for (size_t i = 0; i < shapes.size(); ++i) {
        wb.emplace_back(static_cast<size_t>(shapes[i].n * shapes[i].k * 2));
        fill_bf16(wb.back().get(), shapes[i].n * shapes[i].k, static_cast<uint32_t>(i), 4096);
      }
      CK(cudaDeviceSynchronize());
    }
    for (int M : ms) {  // per distinct shape: all its copies in the stack, one graph
      // (the fused stack: only the shapes the unfused one lacks, q|k|v and gate|up)
      std::vector<Shape> seen;
      for (const Shape& sh : shapes) {
        if (std::find(seen.begin(), seen.end(), sh) != seen.end()) continue;
        seen.push_back(sh);
        if (fused && std::find(unfused_shapes.begin(), unfused_shapes.end(), sh) != unfused_shapes.end()) continue;
        std::vector<size_t> idx;
        double bytes = 0;
        for (size_t i = 0; i < shapes.size(); ++i)
          if (shapes[i] == sh) {
            idx.push_back(i);
            bytes += static_cast<double>(w[i].weight_bytes());
          }
        const float t = time_captured(s, reps, [&] {
          for (size_t i : idx) w[i].kernel->gemm(w[i], x.get(), M, sh.k, y.get(), sh.n, g_act, false, s, true);
        });
        print_shape_row(sh, M, idx.size(), t, bytes, read_gbs);
      }
    }
    std::string m1_rows;  // printed after the table, measured right after the M = 1 row
    auto out = [&](const char* fmt, auto... a) {
      char line[256];
      std::snprintf(line, sizeof line, fmt, a...);
      m1_rows += line;
    };
    auto m1_extras = [&] {
      if (!fused || w[0].kernel->prepare == nullptr || w[0].kernel->gemv_prepared == nullptr ||
          !w[0].kernel->single_token_f32(w[0]))  // the integer GEMV's groups only
        return;
      // M = 1 with the input already prepared (what decode does: the kernel
      // before writes it): one gemv_prepared launch per linear, and the same
      // linears as persistent chains (gemv_chain) of kGemvChainMax calls.
      const auto* k = w[0].kernel;
      // Each linear's prepared input in its own workspace (DeviceLinear::scratch).
      for (const DeviceLinear& l : w) k->prepare(l, x.get(), g_act, l.scratch.get(), l.scratch.bytes(), s, false);
      DeviceBuffer sync(nibble::cuda::kGemvChainSync * sizeof(unsigned));
      CK(cudaMemset(sync.get(), 0, sync.bytes()));
      CK(cudaStreamSynchronize(s));
      auto report = [&](const char* what, float t) {
        out("%-24s %10.3f ms %9.1f%% of read BW\n", what, t,
                    100.0 * int4_bytes / (t * 1e-3) / (read_gbs * 1e9));
      };
      report("M=1 prepared", time_captured(s, reps, [&] {
               for (const DeviceLinear& l : w)
                 k->gemv_prepared(l, l.scratch.get(), l.scratch.bytes(), y.get(), s, true, false, nullptr);
             }));
      auto chains = [&](const std::vector<const DeviceLinear*>& ls) {
        for (size_t i = 0; i < ls.size(); i += nibble::cuda::kGemvChainMax) {
          std::vector<nibble::cuda::GemvCall> calls;
          for (size_t j = i; j < std::min(ls.size(), i + nibble::cuda::kGemvChainMax); ++j) {
            nibble::cuda::GemvCall c;
            c.w = ls[j];
            c.prepared = ls[j]->scratch.get();
            c.prepared_bytes = ls[j]->scratch.bytes();
            c.y = static_cast<float*>(y.get());
            calls.push_back(c);
          }
          k->gemv_chain(calls.data(), static_cast<int>(calls.size()), static_cast<unsigned*>(sync.get()), s, true);
        }
      };
      std::vector<const DeviceLinear*> all;
      for (const DeviceLinear& l : w) all.push_back(&l);
      const bool chains_apply = k->gemv_chain != nullptr && nibble::cuda::w4a16_gemv_chain_applies(g_group);
      if (chains_apply) report("M=1 chains of 8", time_captured(s, reps, [&] { chains(all); }));
      // The reference for the rows above: the same weights read by one
      // plain kernel each, at 4 (whole SMs) and 2 (room for the next) blocks of
      // 16 warps per SM.
      DeviceBuffer sink(64);
      auto* sk = static_cast<unsigned*>(sink.get());
      const int sms = prop.multiProcessorCount;
      for (int bps : {4, 2}) {
        const std::string what = "M=1 read-only, " + std::to_string(bps) + "/SM";
        report(what.c_str(), time_captured(s, reps, [&] {
                 for (const DeviceLinear& l : w) read_weight(l, bps, sms, sk, s);
               }));
      }
      // The same, each kernel waiting for the one before as a GEMV waits for
      // its input: after reading nothing, or its first 1 (about what a GEMV
      // issues before its wait), 3 or 6 rounds of 32 KB per SM.
      for (int rounds : {0, 1, 3, 6}) {
        const std::string what = rounds == 0 ? "M=1 read-only, wait first"
                                             : "M=1 read-only, " + std::to_string(32 * rounds) + "K/SM, wait";
        report(what.c_str(), time_captured(s, reps, [&] {
                 for (const DeviceLinear& l : w) read_weight(l, 4, sms, sk, s, rounds);
               }));
      }
      // Per distinct shape: all its copies in the stack.
      std::vector<std::pair<int64_t, int64_t>> seen;
      for (const DeviceLinear& l0 : w) {
        if (std::find(seen.begin(), seen.end(), std::make_pair(l0.rows, l0.cols)) != seen.end()) continue;
        seen.emplace_back(l0.rows, l0.cols);
        std::vector<const DeviceLinear*> same;
        double bytes = 0;
        for (const DeviceLinear& l : w)
          if (l.rows == l0.rows && l.cols == l0.cols) {
            same.push_back(&l);
            bytes += static_cast<double>(l.weight_bytes());
          }
        auto pr = [&](const char* what, float t) {
          out("  shape %6lld x %5lld x%-3zu %-12s %8.2f us each %5.1f%% of read BW\n",
                      static_cast<long long>(l0.rows), static_cast<long long>(l0.cols), same.size(), what,
                      1e3 * t / same.size(), 100.0 * bytes / (t * 1e-3) / (read_gbs * 1e9));
        };
        pr("prepared", time_captured(s, reps, [&] {
             for (const DeviceLinear* l : same)
               k->gemv_prepared(*l, l->scratch.get(), l->scratch.bytes(), y.get(), s, true, false, nullptr);
           }));
        if (chains_apply) pr("chains of 8", time_captured(s, reps, [&] { chains(same); }));
        for (int bps : {4, 2}) {
          const std::string what = "read-only " + std::to_string(bps);
          pr(what.c_str(), time_captured(s, reps, [&] {
               for (const DeviceLinear* l : same) read_weight(*l, bps, sms, sk, s);
             }));
        }
        for (int rounds : {0, 1})
          pr(rounds == 0 ? "ro wait 1st" : "ro 32K, wait", time_captured(s, reps, [&] {
               for (const DeviceLinear* l : same) read_weight(*l, 4, sms, sk, s, rounds);
             }));
      }
    };
    float t_m1 = 0;  // this stack's time at M = 1, when --ms has it first (the issue's "M = 16 within 1.3× of M = 1")
    for (int M : ms) {
      auto run_stack = [&](bool pdl) {
        for (size_t i = 0; i < shapes.size(); ++i)
          w[i].kernel->gemm(w[i], x.get(), M, shapes[i].k, y.get(), shapes[i].n, g_act, false, s, pdl);
      };
      const float t_pdl = time_captured(s, reps, [&] { run_stack(true); });
      const float t_plain = time_captured(s, reps, [&] { run_stack(false); });
      float t_cublas = 0;
      if (!skip_cublas)
        t_cublas = time_captured(s, reps, [&] {
          for (size_t i = 0; i < shapes.size(); ++i)
            nibble::cuda::gemm_bf16_cublas(wb[i].get(), shapes[i].n, shapes[i].k, x.get(), M, shapes[i].k, y.get(),
                                           shapes[i].n, s);
        });
      if (M == 1) t_m1 = t_pdl;
      stack_ms[fused][M] = t_pdl;
      std::printf("%-8s %3d %12.3f %10.3f %10.3f %10.3f %12.3f %9.1f%%", fused ? "fused" : "unfused", M,
                  int4_bytes / 1e9, t_pdl, t_plain, t_cublas, bf16_bytes / 1e9,
                  100.0 * int4_bytes / (t_pdl * 1e-3) / (read_gbs * 1e9));
      if (t_m1 > 0)
        std::printf(" %8.2f\n", t_pdl / t_m1);
      else
        std::printf(" %8s\n", "-");
      // The M = 1 variants right after the M = 1 stack: timed after the
      // large-M stacks they read 15-25 % slower (session 25).
      if (M == 1) m1_extras();
    }
    std::printf("%s", m1_rows.c_str());
    CK(cudaDeviceSynchronize());
  }
  std::printf("\nfloor at the measured read bandwidth: int4 bytes / %.0f GB/s\n", read_gbs);
  if (!torch_script.empty() && g_group == 128) torch_rows(torch_script, layers, ms, stack_ms[0], stack_ms[1]);
  return 0;
}
