// GPTQ's solve on the GPU (include/nibble/cuda_gptq.h) on Llama-3-8B-shaped
// matrices, next to the CPU solve (src/quant/gptq.cpp) measured in the same run
// (DESIGN.md: performance claims are ratios against a reference in the same run).
//
//   build-cuda/bin/bench_gptq_cuda [--shapes full|small|OUTxIN,...] [--tokens N]
//       [--cpu-ref small|all|none] [--threads N] [--refine N]
//
// Same synthetic problem as bench_gptq (bench/gptq_inputs.h: 32 shared factors
// + 30 % noise, per-channel scales 0.1 .. 10, weights N(0, 0.02), fixed seeds),
// int4_asym g128, damp 0.01, block 128. Per shape [out, in]:
//   - H from N tokens on the GPU in each HessianPrecision (X already in device
//     memory; the upload is timed apart), and each one's distance from the fp64 H;
//   - prepare (damping, Dpotrf + Xtrtri in fp64, U in f32) from the fp64 H;
//   - the sweep, plain and --mse, and act-order (its own prepare + sweep);
//     every sweep time includes W's upload and the results' download;
//   - the host transfers a sweep makes, timed alone (W up; codes and dequantized
//     values down into fresh vectors), to show how much of a sweep they are;
//   - with --cpu-ref: MatrixStats::add and gptq() on the CPU (plain and --mse),
//     the speedup, and how the two results agree (codes, output error, cost).
//     The agreement is measured as the quantizer runs, on the CPU's fp64 H
//     (uploaded, prepared and swept on the GPU), so that only U's factorization,
//     the trailing GEMM's summation order and pow() differ.
//     small (default): shapes whose input width is at most 4096 (the CPU's
//     14336-wide Cholesky and sweep take minutes); all; none.
//   - with --refine N: GPTQ's --refine (N passes at most) on the plain sweep's
//     result on the GPU (A = H + λI built on the device, uploads included), and
//     with --cpu-ref on the CPU's result on the CPU (quant::refine alone), with
//     the output error after each.
// Output error: ‖X(Ŵ−W)ᵀ‖/‖XWᵀ‖ on the calibration inputs (f32 GEMM, fp64 sums).
#include <cuda_runtime.h>
#include <omp.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gptq_inputs.h"
#include "nibble/cuda_gptq.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/gptq.h"
#include "nibble/util.h"

namespace {

using namespace nibble::bench;
using nibble::cuda::HessianPrecision;
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void device_sync() {
  if (cudaDeviceSynchronize() != cudaSuccess) {
    std::fprintf(stderr, "bench_gptq_cuda: cudaDeviceSynchronize failed\n");
    std::exit(1);
  }
}

struct Row {
  Shape shape;
  double upload = NAN, h[3] = {NAN, NAN, NAN}, h_diff[3] = {NAN, NAN, NAN};  // by HessianPrecision
  double prepare = NAN, sweep = NAN, sweep_mse = NAN, act = NAN, transfers = NAN;
  double refine_gpu = NAN, refine_cpu = NAN, e_gpu_refine = NAN, e_cpu_refine = NAN;
  int passes_gpu = -1, passes_cpu = -1;
  double e_gpu = NAN, e_gpu_mse = NAN, e_gpu_act = NAN;
  // CPU reference (NAN: not run).
  double cpu_h = NAN, cpu_gptq = NAN, cpu_gptq_mse = NAN, e_cpu = NAN, e_cpu_mse = NAN;
  double codes_equal = NAN, codes_equal_mse = NAN, cost_diff = NAN;
  int max_code_diff = -1;
};

std::string cell(double v, const char* fmt) {
  if (std::isnan(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

[[noreturn]] void usage(const char* argv0, const char* why) {
  std::fprintf(stderr,
               "%s\nusage: %s [--shapes full|small|OUTxIN,...] [--tokens N] [--cpu-ref small|all|none] [--threads N] "
               "[--refine N]\n",
               why, argv0);
  std::exit(2);
}

// max |A − B| / √(B_ii B_jj) over H [n, n].
double h_distance(const std::vector<double>& a, const std::vector<double>& b, int64_t n) {
  double worst = 0;
#pragma omp parallel for reduction(max : worst)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) {
      const double s = std::sqrt(b[i * n + i] * b[j * n + j]);
      if (s > 0) worst = std::max(worst, std::abs(a[i * n + j] - b[i * n + j]) / s);
    }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  nibble::select_blas_kernels(argv);  // OpenBLAS on AVX kernels where it would fall back to SSE3 (include/nibble/util.h)
  std::string shapes_opt = "full", cpu_ref = "small";
  int64_t tokens = 2048;
  int threads = 0, refine = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], ("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--shapes") shapes_opt = value();
    else if (a == "--tokens") tokens = std::atoll(value().c_str());
    else if (a == "--cpu-ref") cpu_ref = value();
    else if (a == "--threads") threads = std::atoi(value().c_str());
    else if (a == "--refine") refine = std::atoi(value().c_str());
    else if (a == "-h" || a == "--help") usage(argv[0], "GPU GPTQ benchmark (see the comment atop bench/bench_gptq_cuda.cpp)");
    else usage(argv[0], ("unknown option " + a).c_str());
  }
  const std::vector<Shape> shapes = parse_shapes(shapes_opt);
  if (shapes.empty()) usage(argv[0], "--shapes must be full, small or OUTxIN[,OUTxIN...]");
  if (cpu_ref != "small" && cpu_ref != "all" && cpu_ref != "none") usage(argv[0], "--cpu-ref must be small|all|none");
  if (tokens <= 0) usage(argv[0], "--tokens must be positive");
  if (refine < 0 || refine > 1000) usage(argv[0], "--refine must be 0 to 1000");
  if (threads > 0) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  if (!nibble::cuda::device_available()) {
    std::fprintf(stderr, "bench_gptq_cuda: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("bench_gptq_cuda: GPTQ int4_asym g128 (damp 0.01, block 128) on %s vs the CPU, same run\n", prop.name);
  std::printf("calibration: %lld synthetic correlated tokens; shapes: %s; CPU reference: %s (OpenMP %d, OpenBLAS %d "
              "threads)\n",
              static_cast<long long>(tokens), shapes_opt.c_str(), cpu_ref.c_str(), omp_get_max_threads(),
              openblas_get_num_threads());
  std::fflush(stdout);

  namespace q = nibble::quant;
  namespace cu = nibble::cuda;
  const nibble::FormatChoice format = nibble::find_format("int4_asym", 128);
  const auto grid = q::make_format_grid(format, false), grid_mse = q::make_format_grid(format, true);
  const q::GptqOptions plain;
  q::GptqOptions act;
  act.act_order = true;

  std::vector<Row> rows;
  try {
    {  // warm-up: handles, module loading, first allocations
      Rng rng = shape_rng(256, 256);
      const auto X = make_inputs(512, 256, rng);
      const auto W = make_weights(256, 256, rng);
      cu::GpuHessian h(256);
      h.add(X.data(), 512);
      for (bool mse : {false, true}) cu::gptq(W.data(), 256, 256, cu::prepare_hessian(h, plain), format, mse, plain);
      device_sync();
    }
    for (const Shape& s : shapes) {
      Row row{s};
      Rng rng = shape_rng(s.out, s.in);
      std::fprintf(stderr, "[%s] generating %lld×%lld inputs and %lld×%lld weights\n", s.name().c_str(),
                   static_cast<long long>(tokens), static_cast<long long>(s.in), static_cast<long long>(s.out),
                   static_cast<long long>(s.in));
      const std::vector<float> X = make_inputs(tokens, s.in, rng);  // [tokens, in]
      const std::vector<float> W = make_weights(s.out, s.in, rng);  // [out, in]
      const double ref_sq = output_sq(X, tokens, W.data(), nullptr, s.out, s.in);
      auto rel = [&](const q::GptqResult& r) {
        return std::sqrt(output_sq(X, tokens, r.dequant.data(), W.data(), s.out, s.in) / ref_sq);
      };

      auto t0 = Clock::now();
      const cu::DeviceBuffer dX = cu::upload(X.data(), X.size() * sizeof(float));
      device_sync();
      row.upload = seconds_since(t0);
      // H in each precision from the device-resident X; the fp64 one (the default) is kept.
      std::vector<double> h64;
      std::unique_ptr<cu::GpuHessian> hkeep;
      for (HessianPrecision p : {HessianPrecision::F64, HessianPrecision::F32, HessianPrecision::BF16}) {
        const int k = static_cast<int>(p);
        auto h = std::make_unique<cu::GpuHessian>(s.in, p);
        device_sync();
        t0 = Clock::now();
        h->add_device(static_cast<const float*>(dX.get()), tokens);
        h->device_h();
        device_sync();
        row.h[k] = seconds_since(t0);
        std::vector<double> hv(static_cast<size_t>(s.in * s.in));
        cudaMemcpy(hv.data(), h->device_h(), hv.size() * sizeof(double), cudaMemcpyDeviceToHost);
        if (p == HessianPrecision::F64) {
          h64 = std::move(hv);
          row.h_diff[k] = 0;
        } else {
          row.h_diff[k] = h_distance(hv, h64, s.in);
        }
        if (p == HessianPrecision::F64) hkeep = std::move(h);
        std::fprintf(stderr, "[%s] H %s: %.4f s (%.1e from fp64)\n", s.name().c_str(), cu::hessian_precision_name(p),
                     row.h[k], row.h_diff[k]);
      }

      t0 = Clock::now();
      const cu::GpuPreparedHessian prep = cu::prepare_hessian(*hkeep, plain);
      device_sync();
      row.prepare = seconds_since(t0);
      t0 = Clock::now();
      const q::GptqResult g = cu::gptq(W.data(), s.out, s.in, prep, format, false, plain);
      row.sweep = seconds_since(t0);
      t0 = Clock::now();
      const q::GptqResult gm = cu::gptq(W.data(), s.out, s.in, prep, format, true, plain);
      row.sweep_mse = seconds_since(t0);
      t0 = Clock::now();
      {
        const q::GptqResult ga = cu::gptq(W.data(), s.out, s.in, cu::prepare_hessian(*hkeep, act), format, false, act);
        row.act = seconds_since(t0);
        row.e_gpu_act = rel(ga);
      }
      row.e_gpu = rel(g);
      if (refine > 0) {  // --refine on the plain sweep's result
        t0 = Clock::now();
        const cu::DeviceBuffer A = cu::refine_objective(hkeep->device_h(), prep);
        const cu::DeviceBuffer dW = cu::upload(W.data(), W.size() * sizeof(float));
        cu::DeviceBuffer dq = cu::upload(g.dequant.data(), g.dequant.size() * sizeof(float));
        q::GptqResult gr = g;
        row.passes_gpu = cu::refine_device(gr, static_cast<const float*>(dW.get()), static_cast<float*>(dq.get()),
                                           static_cast<const float*>(A.get()), prep, format, refine)
                             .passes;
        device_sync();
        row.refine_gpu = seconds_since(t0);
        row.e_gpu_refine = rel(gr);
        std::fprintf(stderr, "[%s] gpu --refine %d: %.3f s, %d passes, out err %.5f -> %.5f\n", s.name().c_str(),
                     refine, row.refine_gpu, row.passes_gpu, row.e_gpu, row.e_gpu_refine);
      }
      row.e_gpu_mse = rel(gm);
      {  // the sweep's host transfers alone: W up, dequantized values (f32) and codes (u8) down
        t0 = Clock::now();
        const cu::DeviceBuffer dW = cu::upload(W.data(), W.size() * sizeof(float));
        std::vector<float> back(W.size());
        std::vector<uint8_t> codes(W.size());
        cudaMemcpy(back.data(), dW.get(), back.size() * sizeof(float), cudaMemcpyDeviceToHost);
        cudaMemcpy(codes.data(), dW.get(), codes.size(), cudaMemcpyDeviceToHost);
        row.transfers = seconds_since(t0);
      }
      std::fprintf(stderr, "[%s] gpu: prepare %.3f s, sweep %.3f s, --mse %.3f s, act-order %.3f s; out err %.5f\n",
                   s.name().c_str(), row.prepare, row.sweep, row.sweep_mse, row.act, row.e_gpu);

      if (cpu_ref == "all" || (cpu_ref == "small" && s.in <= 4096)) {
        t0 = Clock::now();
        q::MatrixStats stats(s.in);
        stats.add(X.data(), tokens);
        stats.finalize();
        row.cpu_h = seconds_since(t0);
        t0 = Clock::now();
        const q::GptqResult c = q::gptq(W.data(), s.out, s.in, stats, *grid, plain);
        row.cpu_gptq = seconds_since(t0);
        t0 = Clock::now();
        const q::GptqResult cm = q::gptq(W.data(), s.out, s.in, stats, *grid_mse, plain);
        row.cpu_gptq_mse = seconds_since(t0);
        row.e_cpu = rel(c);
        row.e_cpu_mse = rel(cm);
        if (refine > 0) {
          const q::PreparedHessian cp = q::prepare_hessian(stats, plain);
          q::GptqResult cr = c;
          t0 = Clock::now();
          row.passes_cpu = q::refine(cr, W.data(), stats, cp, *grid, refine).passes;
          row.refine_cpu = seconds_since(t0);
          row.e_cpu_refine = rel(cr);
          std::fprintf(stderr, "[%s] cpu --refine %d: %.2f s, %d passes, out err %.5f -> %.5f\n", s.name().c_str(),
                       refine, row.refine_cpu, row.passes_cpu, row.e_cpu, row.e_cpu_refine);
        }
        // The GPU solve on the CPU's H, as `nibble quantize --device cuda` runs it.
        const cu::GpuPreparedHessian sp = cu::prepare_hessian(stats, plain);
        const q::GptqResult sg = cu::gptq(W.data(), s.out, s.in, sp, format, false, plain);
        const q::GptqResult sgm = cu::gptq(W.data(), s.out, s.in, sp, format, true, plain);
        auto agree = [&](const q::GptqResult& a, const q::GptqResult& b) {
          int64_t same = 0;
          for (size_t i = 0; i < a.codes.size(); ++i) {
            same += a.codes[i] == b.codes[i];
            row.max_code_diff = std::max(row.max_code_diff, std::abs(int(a.codes[i]) - int(b.codes[i])));
          }
          return 100.0 * static_cast<double>(same) / static_cast<double>(a.codes.size());
        };
        row.codes_equal = agree(sg, c);
        row.codes_equal_mse = agree(sgm, cm);
        row.cost_diff = std::abs(sg.sweep_cost - c.sweep_cost) / c.sweep_cost;
        std::fprintf(stderr, "[%s] cpu: H %.2f s, gptq %.2f s, --mse %.2f s; codes equal %.3f %%\n", s.name().c_str(),
                     row.cpu_h, row.cpu_gptq, row.cpu_gptq_mse, row.codes_equal);
      }
      rows.push_back(row);
    }
  } catch (const nibble::Error& e) {
    std::fprintf(stderr, "bench_gptq_cuda: %s\n", e.what());
    return 1;
  }

  std::printf("\n== GPU seconds; H from %lld tokens already on the device (X upload apart), prepare from the fp64 H; "
              "sweeps include W's upload and the results' download (their transfers alone: 'xfers') ==\n",
              static_cast<long long>(tokens));
  std::printf("%-11s %-13s %8s %8s %8s %8s %8s %8s %9s %9s %8s %10s\n", "shape", "role", "X up", "H f64", "H f32",
              "H bf16", "prepare", "sweep", "sweep mse", "act-order", "xfers", "H+prep+sw");
  for (const Row& r : rows)
    std::printf("%-11s %-13s %8s %8s %8s %8s %8s %8s %9s %9s %8s %10s\n", r.shape.name().c_str(), r.shape.role,
                cell(r.upload, "%.4f").c_str(), cell(r.h[0], "%.4f").c_str(), cell(r.h[1], "%.4f").c_str(),
                cell(r.h[2], "%.4f").c_str(), cell(r.prepare, "%.3f").c_str(), cell(r.sweep, "%.3f").c_str(),
                cell(r.sweep_mse, "%.3f").c_str(), cell(r.act, "%.3f").c_str(), cell(r.transfers, "%.3f").c_str(),
                cell(r.h[0] + r.prepare + r.sweep, "%.3f").c_str());
  std::printf("\n== H precision: max |H - H_f64| / sqrt(H_ii H_jj) (f64 agrees with the CPU's MatrixStats) ==\n");
  std::printf("%-11s %10s %10s\n", "shape", "f32", "bf16");
  for (const Row& r : rows)
    std::printf("%-11s %10s %10s\n", r.shape.name().c_str(), cell(r.h_diff[1], "%.1e").c_str(),
                cell(r.h_diff[2], "%.1e").c_str());
  std::printf("\n== CPU reference (same run) and speedup: cpu (H + gptq) / gpu (H f64 + prepare + sweep) ==\n");
  std::printf("%-11s %8s %9s %9s %9s %9s\n", "shape", "H cpu", "gptq cpu", "mse cpu", "speedup", "spd mse");
  for (const Row& r : rows)
    std::printf("%-11s %8s %9s %9s %9s %9s\n", r.shape.name().c_str(), cell(r.cpu_h, "%.2f").c_str(),
                cell(r.cpu_gptq, "%.2f").c_str(), cell(r.cpu_gptq_mse, "%.2f").c_str(),
                cell((r.cpu_h + r.cpu_gptq) / (r.h[0] + r.prepare + r.sweep), "%.1f").c_str(),
                cell((r.cpu_h + r.cpu_gptq_mse) / (r.h[0] + r.prepare + r.sweep_mse), "%.1f").c_str());
  std::printf("\n== output error ||X(W'-W)^T|| / ||XW^T||; agreement of the GPU solve on the CPU's H with the CPU "
              "(codes equal, largest code difference, sweep cost gap) ==\n");
  std::printf("%-11s %9s %9s %9s %9s %9s %9s %9s %8s %9s\n", "shape", "gpu", "cpu", "gpu mse", "cpu mse", "gpu act",
              "codes= %", "mse= %", "max|dc|", "cost gap");
  for (const Row& r : rows)
    std::printf("%-11s %9s %9s %9s %9s %9s %9s %9s %8s %9s\n", r.shape.name().c_str(), cell(r.e_gpu, "%.5f").c_str(),
                cell(r.e_cpu, "%.5f").c_str(), cell(r.e_gpu_mse, "%.5f").c_str(), cell(r.e_cpu_mse, "%.5f").c_str(),
                cell(r.e_gpu_act, "%.5f").c_str(), cell(r.codes_equal, "%.3f").c_str(),
                cell(r.codes_equal_mse, "%.3f").c_str(),
                r.max_code_diff >= 0 ? std::to_string(r.max_code_diff).c_str() : "-", cell(r.cost_diff, "%.1e").c_str());
  if (refine > 0) {
    std::printf("\n== --refine %d on the plain sweep's result: seconds (GPU: A, uploads and passes; CPU: the passes), "
                "passes run, output error before -> after ==\n",
                refine);
    std::printf("%-11s %9s %7s %19s %9s %7s %19s %8s\n", "shape", "gpu s", "passes", "gpu err", "cpu s", "passes",
                "cpu err", "speedup");
    for (const Row& r : rows)
      std::printf("%-11s %9s %7d %9s->%-9s %9s %7d %9s->%-9s %8s\n", r.shape.name().c_str(),
                  cell(r.refine_gpu, "%.3f").c_str(), r.passes_gpu, cell(r.e_gpu, "%.5f").c_str(),
                  cell(r.e_gpu_refine, "%.5f").c_str(), cell(r.refine_cpu, "%.2f").c_str(), r.passes_cpu,
                  cell(r.e_cpu, "%.5f").c_str(), cell(r.e_cpu_refine, "%.5f").c_str(),
                  cell(r.refine_cpu / r.refine_gpu, "%.1f").c_str());
  }
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("\npeak RSS: %.2f GiB (getrusage ru_maxrss)\n", static_cast<double>(ru.ru_maxrss) / (1 << 20));
  return 0;
}
