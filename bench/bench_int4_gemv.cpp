// int4_asym GEMV / small-M GEMM against OpenBLAS f32 on the same shapes, in the
// same run: per shape and M, the time, the GB/s of weight bytes each reads, and
// the ratio int4 time / f32 time (DESIGN.md: performance claims are ratios against
// a reference measured in the same run).
//
//   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 build/bin/bench_int4_gemv
//
// Weight bytes: f32 = 4·N·K; int4 = N·ceil(K/2) (codes) + 2·2·N·ceil(K/G) (bf16
// scale and min). Two residencies:
//   hot  — one matrix, multiplied again and again: it stays in the last-level
//          cache when it fits (4096×4096 int4 g128 is 8.9 MB; L3 is often 32 MB),
//          as in llama.cpp's test-backend-ops perf mode;
//   cold — a ring of copies adding up to ≥ 256 MB, one copy per iteration, so every
//          iteration streams its weights from DRAM, as a real forward does
//          (every layer's weights are read once per token).
// Shapes 4096×4096 and 14336×4096 (Llama-3-8B's attention and MLP up/gate), G = 128,
// M = 1, 16 and 64. On a shared machine other jobs steal cycles: the summary gives
// the median and the best repetition of each, and the ratios of both.
// Extra Google Benchmark flags pass through (e.g. --benchmark_filter=4096x4096,
// --benchmark_repetitions=10).
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels.h"
#include "nibble/dtype.h"

namespace {

using nibble::cpu::Isa;

constexpr int kGroup = 128;
constexpr int64_t kColdBytes = int64_t{256} << 20;

// A small fast generator (the data only has to look random to the CPU).
struct XorShift {
  uint64_t s;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * static_cast<float>(next() >> 40) * 0x1p-24f; }
};

struct Int4Matrix {
  std::vector<uint8_t> qweight;  // [N, ceil(K/2)]
  std::vector<uint16_t> scales;  // [N, NG]
  std::vector<uint16_t> mins;    // [N, NG]
};

struct Shape {
  int64_t N, K;
  std::string name() const { return std::to_string(N) + "x" + std::to_string(K); }
  int64_t groups() const { return (K + kGroup - 1) / kGroup; }
  int64_t int4_bytes() const { return N * ((K + 1) / 2) + 4 * N * groups(); }
  int64_t f32_bytes() const { return 4 * N * K; }
};

// The weights of one shape: a ring of copies for the cold runs (copy 0 is the hot one).
struct Weights {
  std::vector<Int4Matrix> int4;
  std::vector<std::vector<float>> f32;
};

int copies_for(int64_t bytes) { return static_cast<int>(std::max<int64_t>(1, (kColdBytes + bytes - 1) / bytes)); }

Weights make_weights(const Shape& s, XorShift& rng) {
  Weights w;
  for (int c = 0; c < copies_for(s.int4_bytes()); ++c) {
    Int4Matrix m;
    m.qweight.resize(static_cast<size_t>(s.N * ((s.K + 1) / 2)));
    for (auto& b : m.qweight) b = static_cast<uint8_t>(rng.next() >> 56);
    m.scales.resize(static_cast<size_t>(s.N * s.groups()));
    m.mins.resize(m.scales.size());
    for (size_t i = 0; i < m.scales.size(); ++i) {
      const float scale = rng.uniform(0.002f, 0.02f);
      m.scales[i] = nibble::f32_to_bf16(scale);
      m.mins[i] = nibble::f32_to_bf16(-8.0f * scale + rng.uniform(-0.01f, 0.01f));
    }
    w.int4.push_back(std::move(m));
  }
  for (int c = 0; c < copies_for(s.f32_bytes()); ++c) {
    std::vector<float> m(static_cast<size_t>(s.N * s.K));
    for (auto& v : m) v = rng.uniform(-0.1f, 0.1f);
    w.f32.push_back(std::move(m));
  }
  return w;
}

std::vector<float> make_x(int64_t M, int64_t K, XorShift& rng) {
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = rng.uniform(-1.0f, 1.0f);
  return x;
}

// What the summary needs about one benchmark: its key and weight bytes; times come from the reporter.
struct Case {
  std::string shape, kernel, residency;
  int64_t M, bytes;
  size_t shape_index;  // for the summary's order
};
std::map<std::string, Case> g_cases;  // by benchmark name

void register_case(const std::string& name, Case c, std::function<void(benchmark::State&)> fn) {
  g_cases[name] = std::move(c);
  benchmark::RegisterBenchmark(name.c_str(), fn)
      ->UseRealTime()
      ->Unit(benchmark::kMicrosecond);
}

void set_counters(benchmark::State& st, int64_t bytes) {
  st.counters["GB/s"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9 * static_cast<double>(st.iterations()),
                                           benchmark::Counter::kIsRate);
}

// x: kMaxM rows of activations. M = 1 (decode), 16 (small batch) and 64 (a prefill-sized tile).
constexpr int64_t kMaxM = 64;
void register_shape(size_t index, const Shape& s, const Weights& w, const std::vector<float>& xs) {
  std::vector<Isa> isas;
  for (Isa i : {Isa::Avx512, Isa::Avx2})
    if (nibble::cpu::isa_supported(i)) isas.push_back(i);
  for (int64_t M : {int64_t{1}, int64_t{16}, kMaxM}) {
    const float* x = xs.data();
    // The cold ring matters for M = 1 (memory bound); M ≥ 16 is compute bound.
    for (const std::string& res : M == 1 ? std::vector<std::string>{"hot", "cold"} : std::vector<std::string>{"hot"}) {
      const bool cold = res == "cold";
      // (built with += : GCC 12 warns falsely (-Wrestrict) about "literal" + std::string&&)
      std::string tail = "/";
      tail += s.name();
      tail += "/M";
      tail += std::to_string(M);
      tail += "/";
      tail += res;
      register_case("f32_openblas" + tail, {s.name(), "f32 OpenBLAS", res, M, s.f32_bytes(), index},
                    [&s, &w, x, M, cold](benchmark::State& st) {
                      std::vector<float> y(static_cast<size_t>(M * s.N));
                      size_t i = 0;
                      for (auto _ : st) {
                        const auto& m = w.f32[cold ? i++ % w.f32.size() : 0];
                        nibble::cpu::gemm_f32(x, M, m.data(), s.N, s.K, y.data());
                        benchmark::DoNotOptimize(y.data());
                      }
                      set_counters(st, s.f32_bytes());
                    });
      for (Isa isa : isas) {
        register_case(std::string("int4_") + nibble::cpu::isa_name(isa) + tail,
                      {s.name(), std::string("int4 g128 ") + nibble::cpu::isa_name(isa), res, M, s.int4_bytes(), index},
                      [&s, &w, x, M, cold, isa](benchmark::State& st) {
                        std::vector<float> y(static_cast<size_t>(M * s.N));
                        size_t i = 0;
                        for (auto _ : st) {
                          const auto& m = w.int4[cold ? i++ % w.int4.size() : 0];
                          nibble::cpu::gemm_int4_asym_isa(isa, x, M, m.qweight.data(), m.scales.data(),
                                                          m.mins.data(), s.N, s.K, kGroup, y.data());
                          benchmark::DoNotOptimize(y.data());
                        }
                        set_counters(st, s.int4_bytes());
                      });
      }
    }
  }
}

// Prints the usual table and keeps every repetition's time per iteration (seconds).
class CollectingReporter : public benchmark::ConsoleReporter {
 public:
  std::map<std::string, std::vector<double>> seconds;
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs)
      if (r.run_type == Run::RT_Iteration && !r.error_occurred && r.iterations > 0)
        seconds[r.run_name.function_name].push_back(r.real_accumulated_time / static_cast<double>(r.iterations));
    ConsoleReporter::ReportRuns(runs);
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void print_summary(const CollectingReporter& rep) {
  std::printf("\n== int4 g128 vs OpenBLAS f32, same run: median and best of the repetitions; GB/s and the\n"
              "   ratio int4/f32 (time) from the medians ==\n");
  std::printf("%-11s %-4s %-5s %-17s %11s %11s %8s %8s %9s %9s\n", "shape NxK", "M", "res", "kernel", "median us",
              "best us", "GB/s med", "GB/s bst", "int4/f32", "(best)");
  // Group by (shape, M, residency); the f32 row of the group is the reference for its ratios.
  std::map<std::tuple<size_t, int64_t, std::string>, std::vector<std::string>> groups;
  for (const auto& [name, c] : g_cases) {
    if (!rep.seconds.count(name)) continue;
    groups[{c.shape_index, c.M, c.residency == "hot" ? "a" : "b"}].push_back(name);
  }
  for (auto& [key, names] : groups) {
    auto is_f32 = [](const std::string& n) { return n.rfind("f32", 0) == 0; };
    std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
      return std::make_pair(!is_f32(a), a) < std::make_pair(!is_f32(b), b);
    });
    double f32_med = 0, f32_best = 0;
    for (const auto& name : names) {
      const Case& c = g_cases.at(name);
      const auto& t = rep.seconds.at(name);
      const double med = median(t), best = *std::min_element(t.begin(), t.end());
      if (is_f32(name)) f32_med = med, f32_best = best;
      char r_med[32] = "", r_best[32] = "";
      if (!is_f32(name) && f32_med > 0) {
        std::snprintf(r_med, sizeof r_med, "%.3f", med / f32_med);
        std::snprintf(r_best, sizeof r_best, "%.3f", best / f32_best);
      }
      const double gb = static_cast<double>(c.bytes) * 1e-9;
      std::printf("%-11s %-4" PRId64 " %-5s %-17s %11.1f %11.1f %8.1f %8.1f %9s %9s\n", c.shape.c_str(), c.M,
                  c.residency.c_str(), c.kernel.c_str(), med * 1e6, best * 1e6, gb / med, gb / best, r_med, r_best);
    }
  }
  // TODO(tokens/s): decode tokens/s of the fixtures (packed int4 checkpoint vs its
  // dequantized f32 twin, both models in ../shared/models) go here, measured in this
  // same run and printed as one more table with the ratio int4/f32.
  std::printf("\n== fixture tokens/s: not measured yet (TODO in bench/bench_int4_gemv.cpp) ==\n");
}

}  // namespace

int main(int argc, char** argv) {
  // Defaults: 5 repetitions of ≥ 0.2 s each (on a shared machine, the median and
  // the best of several). Flags on the command line come later and win.
  std::vector<char*> args = {argv[0]};
  std::string reps = "--benchmark_repetitions=5", min_time = "--benchmark_min_time=0.2";
  args.push_back(reps.data());
  args.push_back(min_time.data());
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  int n_args = static_cast<int>(args.size());
  benchmark::Initialize(&n_args, args.data());
  if (benchmark::ReportUnrecognizedArguments(n_args, args.data())) return 1;
  std::printf("threads: OpenMP %d, OpenBLAS %d; int4 ISA: %s\n", omp_get_max_threads(), openblas_get_num_threads(),
              nibble::cpu::isa_name(nibble::cpu::best_isa()));

  XorShift rng{0x9E3779B97F4A7C15ull};
  const std::vector<Shape> shapes = {{4096, 4096}, {14336, 4096}};
  std::vector<Weights> weights;
  weights.reserve(shapes.size());
  for (const Shape& s : shapes) weights.push_back(make_weights(s, rng));
  const std::vector<float> xs = make_x(kMaxM, 4096, rng);
  for (size_t i = 0; i < shapes.size(); ++i) register_shape(i, shapes[i], weights[i], xs);

  CollectingReporter rep;
  benchmark::RunSpecifiedBenchmarks(&rep);
  print_summary(rep);
  benchmark::Shutdown();
  return 0;
}
