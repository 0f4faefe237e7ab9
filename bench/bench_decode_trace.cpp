// Where a GPU decode step's time goes: every kernel of a few greedy decode
// steps (CUDA graph or eager, as `nibble run --device cuda` runs them) traced with
// CUPTI's concurrent-kernel activity records (start and end of each kernel on
// the GPU's clock), then, per kernel, how much it *extends* the step: its end
// minus the latest end of the kernels before it (0 when it finishes under
// another kernel; programmatic dependent launch lets a kernel start before its
// predecessor ends). The extensions of a step sum to its span, so the table
// below says which kernels the step's time is spent waiting for.
//
//   bench_decode_trace --model DIR [--steps 8] [--warmup 64] [--no-graph] [--no-fuse] [--chain] [--kv-shared-from N]
//                      [--kv-bf16] [--layer 1] [--temp T [--top-k K] [--top-p P] [--seed S]]
// (--temp above 0: sampled steps, as `nibble run --temp` runs them on the device.)
// (--warmup sets the position the traced steps run at: 4 prompt tokens plus
// the warm-up steps.)
//
// Prints: the step span and the gap between steps; per kernel name, calls per
// step, mean duration, mean extension and the share of the step; and the
// kernels of one layer in launch order (start offset, duration, extension,
// grid, block, shared memory, registers).
#include <cuda_runtime.h>
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "nibble/cuda_model.h"
#include "nibble/sampler.h"
#include "nibble/source.h"

namespace {

#define CUPTI_CK(call)                                                                             \
  do {                                                                                             \
    CUptiResult r_ = (call);                                                                       \
    if (r_ != CUPTI_SUCCESS) {                                                                     \
      const char* s_ = nullptr;                                                                    \
      cuptiGetResultString(r_, &s_);                                                               \
      std::fprintf(stderr, "CUPTI error %s at %s:%d: %s\n", s_ ? s_ : "?", __FILE__, __LINE__, #call); \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

struct Kernel {
  std::string name;
  uint64_t start = 0, end = 0;
  int grid = 0, block = 0, smem = 0, regs = 0;
};

std::vector<Kernel>& records() {
  static std::vector<Kernel> r;
  return r;
}

// The kernel's name without its namespace, parameters and template arguments'
// namespaces: "w4a16_gemv_kernel<float, 2, 2>".
std::string short_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  std::string s = status == 0 && d ? d.get() : mangled;
  for (const char* ns : {"(anonymous namespace)::", "nibble::cuda::", "nibble::", "void "}) {
    for (size_t p; (p = s.find(ns)) != std::string::npos;) s.erase(p, std::strlen(ns));
  }
  const auto paren = s.find('(');
  if (paren != std::string::npos) s.resize(paren);
  return s;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  constexpr size_t kBytes = 8 << 20;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBytes));
  *size = kBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* rec = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
    if (rec->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL && rec->kind != CUPTI_ACTIVITY_KIND_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(rec);
    records().push_back({short_name(k->name), k->start, k->end, k->gridX * k->gridY * k->gridZ,
                         k->blockX * k->blockY * k->blockZ,
                         static_cast<int>(k->dynamicSharedMemory + k->staticSharedMemory), k->registersPerThread});
  }
  std::free(buffer);
}

const char* arg_value(int& i, int argc, char** argv) {
  if (i + 1 >= argc) {
    std::fprintf(stderr, "%s needs a value\n", argv[i]);
    std::exit(2);
  }
  return argv[++i];
}

}  // namespace

int main(int argc, char** argv) {
  std::string model;
  int steps = 8, warmup = 64, layer = 1;
  bool graph = true, fuse = true, chain = false, kv_bf16 = false;
  int64_t kv_shared_from = nibble::cuda::GpuOptions{}.kv_shared_from;
  nibble::SamplerConfig sample;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--model") model = arg_value(i, argc, argv);
    else if (a == "--steps") steps = std::atoi(arg_value(i, argc, argv));
    else if (a == "--warmup") warmup = std::atoi(arg_value(i, argc, argv));
    else if (a == "--layer") layer = std::atoi(arg_value(i, argc, argv));
    else if (a == "--no-graph") graph = false;
    else if (a == "--no-fuse") fuse = false;  // GpuOptions::fuse_decode off: the separate norm and SiLU kernels
    else if (a == "--chain") chain = true;  // GpuOptions::chain_decode: the GEMVs between attentions in one launch
    else if (a == "--kv-shared-from")  // GpuOptions::kv_shared_from: -1 never, 0 always, -2 the default crossover
      kv_shared_from = std::atoll(arg_value(i, argc, argv));
    else if (a == "--kv-bf16") kv_bf16 = true;  // GpuOptions::kv_dtype bf16 (run --device cuda --kv bf16)
    else if (a == "--temp") sample.temperature = static_cast<float>(std::atof(arg_value(i, argc, argv)));
    else if (a == "--top-k") sample.top_k = std::atoi(arg_value(i, argc, argv));
    else if (a == "--top-p") sample.top_p = static_cast<float>(std::atof(arg_value(i, argc, argv)));
    else if (a == "--seed") sample.seed = std::strtoull(arg_value(i, argc, argv), nullptr, 10);
    else {
      std::fprintf(stderr,
                   "usage: bench_decode_trace --model DIR [--steps 8] [--warmup 64] [--no-graph] [--no-fuse] "
                   "[--chain] [--kv-shared-from N] [--kv-bf16] [--layer 1] [--temp T [--top-k K] [--top-p P] "
                   "[--seed S]]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (model.empty() || steps < 1 || warmup < 0) {
    std::fprintf(stderr, "bench_decode_trace: --model DIR is required; --steps >= 1, --warmup >= 0\n");
    return 2;
  }
  try {
    auto dir = nibble::CheckpointDir::open(model);
    nibble::cuda::GpuOptions opts;
    opts.decode_graph = graph;
    opts.fuse_decode = fuse;
    opts.chain_decode = chain;
    opts.kv_shared_from = kv_shared_from;
    if (kv_bf16) opts.kv_dtype = nibble::DType::BF16;
    const int64_t prompt = 4;
    auto gpu = nibble::cuda::GpuModel::load(*dir, prompt + warmup + steps + 1, opts);
    const int64_t vocab = gpu->config().vocab_size;
    (void)gpu->forward({1, 2, 3, 4}, false);
    int32_t tok = 5;
    // The steps as nibble run's greedy decode runs them (decode_greedy_run: fed on the device).
    auto keep = [&tok](int32_t id) {
      tok = id;
      return true;
    };
    // Or sampled (decode_sample_run), each run continuing the draw numbers.
    uint64_t draws = 0;
    auto run = [&](int64_t n) {
      if (sample.temperature > 0) {
        gpu->decode_sample_run(tok, vocab, n, sample, draws, keep);
        draws += static_cast<uint64_t>(n);
      } else {
        gpu->decode_greedy_run(tok, vocab, n, keep);
      }
    };
    run(warmup);
    cudaDeviceSynchronize();

    CUPTI_CK(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    run(steps);
    cudaDeviceSynchronize();
    CUPTI_CK(cuptiActivityFlushAll(1));
    CUPTI_CK(cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));

    auto ks = records();
    std::sort(ks.begin(), ks.end(), [](const Kernel& a, const Kernel& b) { return a.start < b.start; });
    if (ks.empty()) {
      std::fprintf(stderr, "bench_decode_trace: CUPTI recorded no kernels\n");
      return 1;
    }
    // Every step launches the same kernels (one captured graph, or the same
    // launches): cut the trace into `steps` equal runs, and check that each
    // run starts with the same kernel (the step's first, the embedding).
    std::vector<size_t> begin;
    const size_t per = ks.size() / static_cast<size_t>(steps);
    bool same = per > 0 && ks.size() % static_cast<size_t>(steps) == 0;
    for (int s = 0; same && s < steps; ++s) {
      begin.push_back(static_cast<size_t>(s) * per);
      same = ks[begin.back()].name == ks[0].name;
    }
    if (!same) {
      std::fprintf(stderr, "bench_decode_trace: %zu kernels do not split into %d equal steps; the first ones:\n",
                   ks.size(), steps);
      for (size_t i = 0; i < std::min<size_t>(ks.size(), 80); ++i) std::fprintf(stderr, "  %s\n", ks[i].name.c_str());
      return 1;
    }
    begin.push_back(ks.size());
    struct Agg {
      int calls = 0;
      double dur = 0, ext = 0;
      size_t first = 0;
    };
    std::map<std::string, Agg> agg;
    std::vector<double> ext(ks.size(), 0.0);
    double span_sum = 0, gap_sum = 0;
    for (int s = 0; s < steps; ++s) {
      uint64_t latest = ks[begin[s]].start;
      for (size_t i = begin[s]; i < begin[s + 1]; ++i) {
        ext[i] = ks[i].end > latest ? static_cast<double>(ks[i].end - latest) : 0.0;
        latest = std::max(latest, ks[i].end);
        auto& a = agg[ks[i].name];
        if (a.calls == 0) a.first = i - begin[s];
        ++a.calls;
        a.dur += static_cast<double>(ks[i].end - ks[i].start);
        a.ext += ext[i];
      }
      span_sum += static_cast<double>(latest - ks[begin[s]].start);
      if (s + 1 < steps) gap_sum += static_cast<double>(ks[begin[s + 1]].start) - static_cast<double>(latest);
    }
    const double span = span_sum / steps;
    char how[96] = "greedy";
    if (sample.temperature > 0)
      std::snprintf(how, sizeof how, "sampled at T %g, top-k %d, top-p %g", sample.temperature, sample.top_k,
                    sample.top_p);
    std::printf("decode trace: %s, %s, %s, %s KV cache, position %lld, %s, %zu kernels per step, step span %.1f us "
                "(sum of extensions), gap between steps %.1f us\n",
                model.c_str(), how, graph ? "CUDA graph" : "no graph", kv_bf16 ? "bf16" : "f32",
                static_cast<long long>(gpu->size() - steps),
                gpu->decode_chained() ? "GemvFusion in GEMV chains"
                : gpu->decode_fused() ? "GemvFusion"
                                      : "separate norm/SiLU kernels", (ks.size()) / steps, span / 1e3,
                steps > 1 ? gap_sum / (steps - 1) / 1e3 : 0.0);
    std::vector<std::pair<std::string, Agg>> rows(agg.begin(), agg.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ext > b.second.ext; });
    std::printf("\n%-60s %6s %10s %10s %10s %7s\n", "kernel", "calls", "mean us", "ext us", "ext/step", "share");
    for (const auto& [name, a] : rows)
      std::printf("%-60.60s %6.1f %10.2f %10.2f %10.1f %6.1f%%\n", name.c_str(), double(a.calls) / steps,
                  a.dur / a.calls / 1e3, a.ext / a.calls / 1e3, a.ext / steps / 1e3, 100.0 * a.ext / steps / span);

    // One layer of the middle step, in launch order: from the two kernels
    // before the layer's attention kernel (norm, q|k|v) to the same point of
    // the next layer.
    const int mid = steps / 2;
    std::vector<size_t> starts;
    for (size_t i = begin[mid] + 2; i < begin[mid + 1]; ++i)
      if (ks[i].name.find("attention") != std::string::npos) starts.push_back(i - 2);
    if (layer >= 0 && static_cast<size_t>(layer) < starts.size()) {
      const size_t lo = starts[layer];
      const size_t hi = static_cast<size_t>(layer) + 1 < starts.size() ? starts[layer + 1] : begin[mid + 1];
      const uint64_t t0 = ks[lo].start;
      std::printf("\nlayer %d of step %d (times in us from its first kernel's start)\n", layer, mid);
      std::printf("%-60s %8s %8s %8s %8s %7s %5s %8s %5s\n", "kernel", "start", "end", "dur", "ext", "grid", "block",
                  "smem", "regs");
      for (size_t i = lo; i < hi; ++i)
        std::printf("%-60.60s %8.2f %8.2f %8.2f %8.2f %7d %5d %8d %5d\n", ks[i].name.c_str(),
                    (static_cast<double>(ks[i].start) - t0) / 1e3, (static_cast<double>(ks[i].end) - t0) / 1e3,
                    static_cast<double>(ks[i].end - ks[i].start) / 1e3, ext[i] / 1e3, ks[i].grid, ks[i].block,
                    ks[i].smem, ks[i].regs);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_decode_trace: %s\n", e.what());
    return 1;
  }
  return 0;
}
