// int4_asym GEMV / small-M GEMM (and the 8-bit formats', since session 84; nvfp4 and mxfp4, session 85;
// int8_g16_asym_f32, session 86) against
// OpenBLAS f32 on the same shapes, in the same run: per shape and M, the time, the GB/s of weight bytes each reads, and
// the ratio int4 time / f32 time (DESIGN.md: performance claims are ratios against
// a reference measured in the same run).
//
//   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 build/bin/bench_int4_gemv
//
// Weight bytes: f32 = 4·N·K; int4 = N·ceil(K/2) (codes) + 2·2·N·ceil(K/G) (bf16
// scale and min); int8 = N·K + 4·N (int8 g32: N·K + 2·N·K/32, Q8_0's f16 scales; int8 g16 asym: N·K + 8·N·K/16,
// an fp32 scale and min per 16); nvfp4 = N·ceil(K/2) + N·K/16 (an E4M3 byte per 16), mxfp4 = N·ceil(K/2) +
// N·K/32 (an E8M0 byte per 32), each with a 1 KB table of scales. Two residencies:
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
//
// Then tokens/s of both real fixtures ($NIBBLE_SHARED/models, default ../shared
// beside the repo: stories260K and qwen3-26M-linux), each as stored (f32 dense)
// and as an RTN int4 copy quantized in the same run: prefill and decode tok/s
// and the int4/f32 ratios (print_fixtures below). A fixture that is not found is
// noted and skipped. --fixtures=off skips this part, --fixtures=only runs just it.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <emmintrin.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/kernels.h"
#include "nibble/convert.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/model.h"
#include "nibble/source.h"
#include "nibble/util.h"

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

// int8_channel_sym: codes [N, K], an fp32 scale per row; and a scale per 32 inputs (int8_g32_sym, GGUF Q8_0);
// and, the same bytes as unsigned codes, an fp32 scale and min per 16 (int8_g16_asym_f32, GGUF Q6_K).
struct Int8Matrix {
  std::vector<int8_t> q;
  std::vector<float> s;
  std::vector<float> s32;
  std::vector<float> s16, m16;
};

struct Shape {
  int64_t N, K;
  std::string name() const { return std::to_string(N) + "x" + std::to_string(K); }
  int64_t groups() const { return (K + kGroup - 1) / kGroup; }
  int64_t int4_bytes() const { return N * ((K + 1) / 2) + 4 * N * groups(); }
  int64_t f32_bytes() const { return 4 * N * K; }
  int64_t int8_bytes() const { return N * K + 4 * N; }
  int64_t int8_g32_bytes() const { return N * K + 2 * N * ((K + 31) / 32); }  // f16 scales as stored (Q8_0)
  int64_t int8_g16_asym_bytes() const { return N * K + 8 * N * ((K + 15) / 16); }  // fp32 scale and min
  int64_t fp4_bytes(int g) const { return N * ((K + 1) / 2) + N * ((K + g - 1) / g); }
};

// The weights of one shape: a ring of copies for the cold runs (copy 0 is the hot one).
struct Weights {
  std::vector<Int4Matrix> int4;
  std::vector<std::vector<uint8_t>> fp4_scales;  // per int4 copy, a scale byte per 16 inputs (mxfp4: the first half)
  std::vector<float> fp4_table;                  // the 256 scale values those bytes select
  std::vector<Int8Matrix> int8;
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
    std::vector<uint8_t> sb(static_cast<size_t>(s.N * ((s.K + 15) / 16)));
    for (auto& b : sb) b = static_cast<uint8_t>(rng.next() >> 56);
    w.fp4_scales.push_back(std::move(sb));
  }
  for (int b = 0; b < 256; ++b) w.fp4_table.push_back(rng.uniform(0.002f, 0.02f));
  for (int c = 0; c < copies_for(s.int8_bytes()); ++c) {
    Int8Matrix m;
    m.q.resize(static_cast<size_t>(s.N * s.K));
    // Codes -126 .. 126 but -1: as E4M3 bytes none is NaN (0x7F, 0xFF), so the fp8 row times the finite decode.
    for (auto& b : m.q) {
      const int v = static_cast<int>(rng.next() >> 56) % 253 - 126;
      b = static_cast<int8_t>(v == -1 ? 0 : v);
    }
    m.s.resize(static_cast<size_t>(s.N));
    for (auto& v : m.s) v = rng.uniform(0.0005f, 0.002f);
    m.s32.resize(static_cast<size_t>(s.N * ((s.K + 31) / 32)));
    for (auto& v : m.s32) v = rng.uniform(0.0005f, 0.002f);
    m.s16.resize(static_cast<size_t>(s.N * ((s.K + 15) / 16)));
    m.m16.resize(m.s16.size());
    for (size_t i = 0; i < m.s16.size(); ++i) {
      m.s16[i] = rng.uniform(0.0005f, 0.002f);
      m.m16[i] = -32.0f * m.s16[i];  // Q6_K's (q − 32)·S
    }
    w.int8.push_back(std::move(m));
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

// Other jobs on the machine skew every number here (on a loaded machine, spinning
// OpenMP/OpenBLAS threads wait for the scheduler: see the decode note in
// print_fixtures), so the header says how loaded it was.
void print_load() {
  double load[3] = {0, 0, 0};
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  if (getloadavg(load, 3) == 3)
    std::printf("load average at start: %.2f %.2f %.2f (%ld cores online); OMP_WAIT_POLICY=%s\n", load[0], load[1],
                load[2], sysconf(_SC_NPROCESSORS_ONLN), wait ? wait : "(unset)");
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

// Σ of every float in [p, p + n) (n a multiple of 32 floats here, or not: a scalar
// tail), eight independent SSE2 accumulators so the adds are not the limit, and
// the kernels' software prefetch: the machine's read bandwidth for the same bytes
// an int4 GEMV reads.
float read_all(const void* data, int64_t bytes) {
  const float* p = static_cast<const float*>(data);
  const int64_t n = bytes / 4;
  __m128 a[8];
  for (auto& v : a) v = _mm_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    // Software prefetch as the kernels do (hardware prefetchers stop at 4 KiB pages).
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + 2048, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + 2048 + 64, _MM_HINT_T0);
    for (int k = 0; k < 8; ++k) a[k] = _mm_add_ps(a[k], _mm_loadu_ps(p + i + 4 * k));
  }
  float out[4];
  _mm_storeu_ps(out, _mm_add_ps(_mm_add_ps(_mm_add_ps(a[0], a[1]), _mm_add_ps(a[2], a[3])),
                                _mm_add_ps(_mm_add_ps(a[4], a[5]), _mm_add_ps(a[6], a[7]))));
  float r = out[0] + out[1] + out[2] + out[3];
  for (; i < n; ++i) r += p[i];
  return r;
}

// Reads one int4 matrix's three parts on every thread's share of it (the
// threads split each part into contiguous slices, as the GEMV splits rows).
float read_matrix(const Int4Matrix& m) {
  float total = 0.0f;
#pragma omp parallel reduction(+ : total)
  {
    const int t = omp_get_thread_num(), nt = omp_get_num_threads();
    auto slice = [&](const void* base, int64_t bytes) {
      const int64_t b0 = bytes * t / nt / 64 * 64, b1 = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
      return read_all(static_cast<const char*>(base) + b0, b1 - b0);
    };
    total += slice(m.qweight.data(), static_cast<int64_t>(m.qweight.size()));
    total += slice(m.scales.data(), static_cast<int64_t>(m.scales.size() * 2));
    total += slice(m.mins.data(), static_cast<int64_t>(m.mins.size() * 2));
  }
  return total;
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
      if (M == 1)
        register_case("read" + tail, {s.name(), "read (no compute)", res, M, s.int4_bytes(), index},
                      [&s, &w, cold](benchmark::State& st) {
                        size_t i = 0;
                        for (auto _ : st) {
                          const float r = read_matrix(w.int4[cold ? i++ % w.int4.size() : 0]);
                          benchmark::DoNotOptimize(r);
                        }
                        set_counters(st, s.int4_bytes());
                      });
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
      // int8_channel_sym, and the same bytes as fp8_e4m3_channel's codes (the decode differs, the bytes do not),
      // with no NaN code: the decode the forward takes for nibble's own E4M3 checkpoints (packed_kernels.cpp).
      for (const auto kind : {nibble::cpu::Code8::Int8, nibble::cpu::Code8::E4M3Finite}) {
        const bool fp8 = kind == nibble::cpu::Code8::E4M3Finite;
        register_case((fp8 ? "fp8_e4m3_channel" : "int8_channel") + tail,
                      {s.name(), fp8 ? "fp8 e4m3 channel" : "int8 channel", res, M, s.int8_bytes(), index},
                      [&s, &w, x, M, cold, kind](benchmark::State& st) {
                        std::vector<float> y(static_cast<size_t>(M * s.N));
                        size_t i = 0;
                        for (auto _ : st) {
                          const auto& m = w.int8[cold ? i++ % w.int8.size() : 0];
                          nibble::cpu::gemm_code8(kind, x, M, reinterpret_cast<const uint8_t*>(m.q.data()),
                                                  m.s.data(), 1, s.N, s.K, y.data());
                          benchmark::DoNotOptimize(y.data());
                        }
                        set_counters(st, s.int8_bytes());
                      });
      }
      // int8_g32_sym (GGUF Q8_0): the int8 copies' codes with a scale per 32 inputs (fp32 as loaded; the bytes
      // counted are the stored f16 ones).
      register_case("int8_g32" + tail, {s.name(), "int8 g32 (Q8_0)", res, M, s.int8_g32_bytes(), index},
                    [&s, &w, x, M, cold](benchmark::State& st) {
                      std::vector<float> y(static_cast<size_t>(M * s.N));
                      size_t i = 0;
                      for (auto _ : st) {
                        const auto& m = w.int8[cold ? i++ % w.int8.size() : 0];
                        nibble::cpu::gemm_code8(nibble::cpu::Code8::Int8, x, M,
                                                reinterpret_cast<const uint8_t*>(m.q.data()), m.s32.data(), 1, s.N,
                                                s.K, y.data(), 32);
                        benchmark::DoNotOptimize(y.data());
                      }
                      set_counters(st, s.int8_g32_bytes());
                    });
      // int8_g16_asym_f32 (GGUF Q6_K, Q5_K / Q5_1 at 32): the int8 copies' bytes as unsigned codes, an fp32 scale and
      // min per 16 inputs.
      register_case("int8_g16_asym" + tail, {s.name(), "int8 g16 asym (Q6_K)", res, M, s.int8_g16_asym_bytes(), index},
                    [&s, &w, x, M, cold](benchmark::State& st) {
                      std::vector<float> y(static_cast<size_t>(M * s.N));
                      size_t i = 0;
                      for (auto _ : st) {
                        const auto& m = w.int8[cold ? i++ % w.int8.size() : 0];
                        nibble::cpu::gemm_code8(nibble::cpu::Code8::UInt8, x, M,
                                                reinterpret_cast<const uint8_t*>(m.q.data()), m.s16.data(), 1, s.N,
                                                s.K, y.data(), 16, m.m16.data());
                        benchmark::DoNotOptimize(y.data());
                      }
                      set_counters(st, s.int8_g16_asym_bytes());
                    });
      // nvfp4 (groups of 16) and mxfp4 (32): the int4 copies' bytes as E2M1 codes, and scale bytes through a
      // table, as packed_kernels.cpp loads them.
      for (const int g : {16, 32}) {
        const bool nv = g == 16;
        const char* name = nv ? "nvfp4" : "mxfp4";
        register_case(name + tail, {s.name(), name, res, M, s.fp4_bytes(g), index},
                      [&s, &w, x, M, cold, g](benchmark::State& st) {
                        std::vector<float> y(static_cast<size_t>(M * s.N));
                        size_t i = 0;
                        for (auto _ : st) {
                          const size_t c = cold ? i++ % w.int4.size() : 0;
                          nibble::cpu::Fp4Scales sc;
                          sc.codes = w.fp4_scales[c].data();
                          sc.table = w.fp4_table.data();
                          nibble::cpu::gemm_fp4(x, M, w.int4[c].qweight.data(), sc, s.N, s.K, g, y.data());
                          benchmark::DoNotOptimize(y.data());
                        }
                        set_counters(st, s.fp4_bytes(g));
                      });
      }
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
  std::printf("\n== int4 g128, int8 and fp8 e4m3 channel, nvfp4 and mxfp4 vs OpenBLAS f32, same run: median and best of the repetitions; GB/s\n"
              "   and the ratio to f32 (time) from the medians; 'read' streams the int4 matrix's bytes and\n"
              "   computes nothing (the memory roofline), 'of read' = int4 GB/s / read GB/s (medians) ==\n");
  std::printf("%-11s %-4s %-5s %-17s %11s %11s %8s %8s %9s %9s %8s\n", "shape NxK", "M", "res", "kernel",
              "median us", "best us", "GB/s med", "GB/s bst", "vs f32", "(best)", "of read");
  // Group by (shape, M, residency); the f32 row of the group is the reference for its ratios.
  std::map<std::tuple<size_t, int64_t, std::string>, std::vector<std::string>> groups;
  for (const auto& [name, c] : g_cases) {
    if (!rep.seconds.count(name)) continue;
    groups[{c.shape_index, c.M, c.residency == "hot" ? "a" : "b"}].push_back(name);
  }
  for (auto& [key, names] : groups) {
    auto is_f32 = [](const std::string& n) { return n.rfind("f32", 0) == 0; };
    auto is_read = [](const std::string& n) { return n.rfind("read", 0) == 0; };
    auto rank = [&](const std::string& n) { return is_read(n) ? 0 : is_f32(n) ? 1 : 2; };
    std::sort(names.begin(), names.end(), [&](const std::string& a, const std::string& b) {
      return std::make_pair(rank(a), a) < std::make_pair(rank(b), b);
    });
    double f32_med = 0, f32_best = 0, read_gbs = 0;
    for (const auto& name : names) {
      const Case& c = g_cases.at(name);
      const auto& t = rep.seconds.at(name);
      const double med = median(t), best = *std::min_element(t.begin(), t.end());
      const double gb = static_cast<double>(c.bytes) * 1e-9;
      if (is_f32(name)) f32_med = med, f32_best = best;
      if (is_read(name)) read_gbs = gb / med;
      char r_med[32] = "", r_best[32] = "", r_read[32] = "";
      if (!is_f32(name) && !is_read(name) && f32_med > 0) {
        std::snprintf(r_med, sizeof r_med, "%.3f", med / f32_med);
        std::snprintf(r_best, sizeof r_best, "%.3f", best / f32_best);
      }
      if (!is_f32(name) && !is_read(name) && read_gbs > 0)
        std::snprintf(r_read, sizeof r_read, "%.0f%%", 100.0 * gb / med / read_gbs);
      std::printf("%-11s %-4" PRId64 " %-5s %-17s %11.1f %11.1f %8.1f %8.1f %9s %9s %8s\n", c.shape.c_str(), c.M,
                  c.residency.c_str(), c.kernel.c_str(), med * 1e6, best * 1e6, gb / med, gb / best, r_med, r_best,
                  r_read);
    }
  }
}

// ---- fixture tokens/s ---------------------------------------------------------
// Both real fixtures, each as stored (f32 / bf16 weights, loaded as f32 dense
// through OpenBLAS) and as RTN int4 packed copies quantized in this run into a
// temp dir (int4 kernels reading the packed bytes: int4_asym's bf16 pairs, and
// int4_sym and int4_asym_f32, which the kernels read as fp32 pairs, the layout
// GGUF Q4_0 / Q4_1 / Q4_K and GPTQ / AWQ linears load in): prefill tok/s of one
// kPrompt-token prompt of fixed ids, and decode tok/s of kDecode greedy steps
// (argmax of the last logits), one token per Model::forward, as `nibble run` does.
// Median and best of kFixtureReps runs, each on a fresh cache.

constexpr int kPrompt = 128, kDecode = 128, kFixtureReps = 5;

struct Fixture {
  const char* name;
  int group;  // stories260K: hidden 64 and intermediate 172, so g64's last group of down_proj is ragged (44)
};
constexpr Fixture kFixtures[] = {{"stories260K", 64}, {"qwen3-26M-linux", 128}};

// $NIBBLE_SHARED, or ../shared beside the repo (as the tests find it).
std::filesystem::path shared_dir() {
  if (const char* s = std::getenv("NIBBLE_SHARED"); s && *s) return s;
  return NIBBLE_DEFAULT_SHARED;
}

struct Speed {
  double prefill_med = 0, prefill_best = 0, decode_med = 0, decode_best = 0;  // tokens/s
};

Speed measure_model(const nibble::Model& m) {
  using Clock = std::chrono::steady_clock;
  const nibble::ModelConfig& c = m.config();
  NIBBLE_CHECK(kPrompt + kDecode <= c.max_position_embeddings, "fixture context {} < {} + {} tokens",
               c.max_position_embeddings, kPrompt, kDecode);
  // Fixed ids spread over the vocabulary (BOS first when the model has one).
  std::vector<int32_t> prompt(kPrompt);
  for (int i = 0; i < kPrompt; ++i) prompt[i] = static_cast<int32_t>((7919 * i + 13) % c.vocab_size);
  if (c.bos_token_id) prompt[0] = static_cast<int32_t>(*c.bos_token_id);
  std::vector<double> prefill, decode;
  for (int rep = 0; rep < kFixtureReps; ++rep) {
    nibble::KVCache cache(c, kPrompt + kDecode);
    auto t0 = Clock::now();
    nibble::Tensor logits = m.forward(prompt, cache, /*all_logits=*/false);  // [1, vocab]
    prefill.push_back(kPrompt / std::chrono::duration<double>(Clock::now() - t0).count());
    t0 = Clock::now();
    for (int i = 0; i < kDecode; ++i) {
      const float* l = logits.data<float>();
      const int32_t next = static_cast<int32_t>(std::max_element(l, l + c.vocab_size) - l);
      logits = m.forward({next}, cache, /*all_logits=*/false);
    }
    decode.push_back(kDecode / std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return {median(prefill), *std::max_element(prefill.begin(), prefill.end()), median(decode),
          *std::max_element(decode.begin(), decode.end())};
}

Speed measure_dir(const std::filesystem::path& dir) {
  const auto src = nibble::CheckpointDir::open(dir);  // outlives the model: packed parts are views into its files
  const auto model = nibble::Model::load(*src);
  return measure_model(*model);
}

void print_fixtures() {
  const std::filesystem::path models = shared_dir() / "models";
  std::printf("\n== fixture tokens/s (%s): %d-token prompt of fixed ids, then %d greedy decode steps one token at a\n"
              "   time; median (best) of %d runs; f32 dense = the stored f32/bf16 weights as f32 (OpenBLAS);\n"
              "   int4 = RTN packed copies quantized in this run (int4 kernels on the packed bytes; int4_sym and\n"
              "   int4_asym_f32 run with fp32 scale/min pairs);\n"
              "   int4/f32 = tokens/s ratio (> 1: int4 faster) ==\n",
              models.c_str(), kPrompt, kDecode, kFixtureReps);
  std::printf("%-16s %-22s %20s %20s %12s %12s\n", "fixture", "weights", "prefill tok/s", "decode tok/s",
              "int4/f32 pre", "int4/f32 dec");
  for (const Fixture& f : kFixtures) {
    const std::filesystem::path dir = models / f.name;
    if (!std::filesystem::exists(dir / "config.json")) {
      std::printf("%-16s not found at %s (set NIBBLE_SHARED): skipped\n", f.name, dir.c_str());
      continue;
    }
    std::fprintf(stderr, "fixtures: %s: measuring the stored weights\n", f.name);
    const Speed ref = measure_dir(dir);
    // A temp dir of our own for the packed copy, removed afterwards.
    std::string tmpl = (std::filesystem::temp_directory_path() / "nibble-bench-XXXXXX").string();
    NIBBLE_CHECK(mkdtemp(tmpl.data()) != nullptr, "cannot create a temp dir from {}", tmpl);
    const std::filesystem::path tmp = tmpl;
    auto speed = [](double med, double best) {
      char b[48];
      std::snprintf(b, sizeof b, "%.1f (%.1f)", med, best);
      return std::string(b);
    };
    std::printf("%-16s %-22s %20s %20s %12s %12s\n", f.name, "f32 dense",
                speed(ref.prefill_med, ref.prefill_best).c_str(), speed(ref.decode_med, ref.decode_best).c_str(), "",
                "");
    for (const char* family :
         {"int4_asym", "int4_sym", "int4_asym_f32", "int8_channel_sym", "int8_g32_sym", "int8_asym_f32",
          "fp8_e4m3_channel", "nvfp4", "mxfp4"}) {
      const bool grouped = std::string(family).rfind("int4", 0) == 0;  // the others: their own group or a row
      Speed q;
      try {
        nibble::QuantizeOptions opt;
        opt.method = "rtn";
        opt.format = family;
        opt.group_size = grouped ? f.group : 0;
        opt.progress = false;
        std::fprintf(stderr, "fixtures: %s: quantizing (rtn %s) into %s\n", f.name, family, tmp.c_str());
        nibble::quantize_model(dir, tmp / family, opt);
        std::fprintf(stderr, "fixtures: %s: measuring the %s copy\n", f.name, family);
        q = measure_dir(tmp / family);
      } catch (...) {
        std::filesystem::remove_all(tmp);
        throw;
      }
      const std::string g = std::string(family) + (grouped ? " g" + std::to_string(f.group) : std::string()) + " rtn";
      std::printf("%-16s %-22s %20s %20s %12.3f %12.3f\n", f.name, g.c_str(),
                  speed(q.prefill_med, q.prefill_best).c_str(), speed(q.decode_med, q.decode_best).c_str(),
                  q.prefill_med / ref.prefill_med, q.decode_med / ref.decode_med);
      std::fflush(stdout);
    }
    std::filesystem::remove_all(tmp);
  }
}

}  // namespace

int main(int argc, char** argv) {
  nibble::select_blas_kernels(argv);  // OpenBLAS on AVX kernels where it would fall back to SSE3 (include/nibble/util.h)
  // Defaults: 5 repetitions of ≥ 0.2 s each (on a shared machine, the median and
  // the best of several). Flags on the command line come later and win.
  std::vector<char*> args = {argv[0]};
  std::string reps = "--benchmark_repetitions=5", min_time = "--benchmark_min_time=0.2";
  args.push_back(reps.data());
  args.push_back(min_time.data());
  std::string fixtures = "on";  // --fixtures=on|off|only (ours, not Google Benchmark's)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--fixtures=", 0) == 0) {
      fixtures = a.substr(11);
      if (fixtures != "on" && fixtures != "off" && fixtures != "only") {
        std::fprintf(stderr, "--fixtures must be on, off or only, found '%s'\n", fixtures.c_str());
        return 1;
      }
    } else {
      args.push_back(argv[i]);
    }
  }
  int n_args = static_cast<int>(args.size());
  benchmark::Initialize(&n_args, args.data());
  if (benchmark::ReportUnrecognizedArguments(n_args, args.data())) return 1;
  std::printf("threads: OpenMP %d, OpenBLAS %d; int4 ISA: %s\n", omp_get_max_threads(), openblas_get_num_threads(),
              nibble::cpu::isa_name(nibble::cpu::best_isa()));
  print_load();

  if (fixtures != "only") {
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
  }  // the GEMV weights (≥ 1 GB of rings) are freed before the fixtures run
  benchmark::Shutdown();
  if (fixtures != "off") {
    try {
      print_fixtures();
    } catch (const std::exception& e) {
      std::printf("fixture tokens/s failed: %s\n", e.what());
      return 1;
    }
  }
  return 0;
}
