// GPTQ's CPU solve (src/quant/gptq.cpp) on Llama-3-8B-shaped matrices, with
// round-to-nearest on the same matrix as the reference measured in the same run
// (DESIGN.md: performance claims are ratios against a reference in the same run).
//
//   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 build/bin/bench_gptq [--shapes full|small|OUTxIN,...]
//       [--tokens N] [--threads N] [--variants all|first|none]
//
// Per shape [out, in] (full: 4096×4096 q/o, 14336×4096 gate/up, 4096×14336 down;
// small: 1024×1024, 2816×1024, 1024×2816; or a list such as 4096x4096,4096x14336):
//   - H: seconds for MatrixStats::add over every calibration token (fp64 DSYRK,
//     ~tokens·in² flops) and for finalize() (mirroring the triangle), apart;
//   - seconds of gptq() on int4_asym g128 (damp 0.01, block 128): the damped
//     inverse Cholesky of H in fp64 (~in³ flops: it dominates for in = 14336),
//     then the column sweep (~out·in² flops of f32 GEMM);
//   - the same with --mse (33-step range search per group) and with act-order;
//   - rtn() (and rtn() with --mse) on the same grid, for comparison;
//   - refine() with 30 passes on plain GPTQ's result (--refine 30), its time
//     and output error;
//   - the output error on the calibration inputs, ‖X(Ŵ−W)ᵀ‖/‖XWᵀ‖ (fp64 sums):
//     GPTQ must beat RTN there, or it did no real work;
//   - once per input width: the damped H's factorization and inverse (fp64,
//     what dominates GPTQ's time at 14336 inputs) by nibble's blocked
//     cpu::potrf_upper + trtri_upper (the same bits on any thread count), with
//     LAPACK's threaded dpotrf + dtrtri on the same matrix as the reference.
// Inputs are synthetic but correlated, as a linear's inputs are: every token is
// a mix of 32 shared random factors plus 30% independent noise, and each input
// channel has its own scale, log-uniform over two orders of magnitude (0.1 .. 10).
// Weights are N(0, 0.02). Fixed seed: every run sees the same data.
//
// --threads N sets OpenMP's and OpenBLAS's thread counts (default: from the
// environment, OMP_NUM_THREADS / OPENBLAS_NUM_THREADS). --variants: run --mse and
// act-order on every shape (all), on the first shape only (first) or not at all;
// default first for the full shapes (each extra solve of the 14336-wide down shape
// costs minutes on 2 cores, almost all of it the Cholesky), all for small ones.
// Tables go to stdout; progress to stderr. Peak RSS (getrusage) is printed last:
// for the down shape it is dominated by H and the solve's fp64 copies of it.
#include <cblas.h>
#include <lapacke.h>
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "backend/cpu/kernels.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/gptq.h"
#include "nibble/util.h"
#include "gptq_inputs.h"

namespace {

using namespace nibble::bench;
using Clock = std::chrono::steady_clock;
constexpr int kRefinePasses = 30;  // --refine 30, the README's setting
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The damped H's factorization, once per input width.
struct FactorRow {
  int64_t in = 0;
  double t_lapack = 0, t_blocked = 0, max_diff = 0;  // max |difference| / max |U⁻¹|
};

FactorRow time_factorization(const nibble::quant::MatrixStats& stats) {
  const int64_t n = stats.dim;
  double mean = 0;
  for (int64_t j = 0; j < n; ++j) mean += stats.H[j * n + j];
  std::vector<double> a(stats.H);
  for (int64_t j = 0; j < n; ++j) a[j * n + j] += 0.01 * mean / static_cast<double>(n);  // --damp 0.01
  std::vector<double> b = a;
  FactorRow f{n};
  const int N = static_cast<int>(n);
  auto t0 = Clock::now();
  NIBBLE_CHECK(LAPACKE_dpotrf_work(LAPACK_COL_MAJOR, 'U', N, a.data(), N) == 0 &&
                   LAPACKE_dtrtri_work(LAPACK_COL_MAJOR, 'U', 'N', N, a.data(), N) == 0,
               "LAPACK's factorization failed");
  f.t_lapack = seconds_since(t0);
  t0 = Clock::now();
  NIBBLE_CHECK(nibble::cpu::potrf_upper(b.data(), n) && nibble::cpu::trtri_upper(b.data(), n),
               "the blocked factorization failed");
  f.t_blocked = seconds_since(t0);
  double top = 0;
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i <= j; ++i) {
      top = std::max(top, std::abs(a[i + j * n]));
      f.max_diff = std::max(f.max_diff, std::abs(a[i + j * n] - b[i + j * n]));
    }
  f.max_diff /= top;
  return f;
}

struct Row {
  Shape shape;
  double h_add = 0, h_fin = 0;
  // NAN: not run.
  double t_rtn = NAN, t_gptq = NAN, t_rtn_mse = NAN, t_gptq_mse = NAN, t_gptq_ao = NAN, t_refine = NAN;
  double e_rtn = NAN, e_gptq = NAN, e_rtn_mse = NAN, e_gptq_mse = NAN, e_gptq_ao = NAN, e_refine = NAN;
  int refine_passes = 0;
  int64_t refine_moves = 0, refine_refits = 0;
  double damp_used = 0;
  int damp_retries = 0;
  double identity_gap = NAN;  // |sweep_cost − (‖XΔWᵀ‖² + λ‖ΔW‖²)| / sweep_cost for plain GPTQ
};

std::string cell(double v, const char* fmt) {
  if (std::isnan(v)) return "-";
  char buf[32];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

[[noreturn]] void usage(const char* argv0, const char* why) {
  std::fprintf(stderr,
               "%s\nusage: %s [--shapes full|small|OUTxIN,...] [--tokens N] [--threads N] [--variants all|first|none]\n", why,
               argv0);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  nibble::select_blas_kernels(argv);  // OpenBLAS on AVX kernels where it would fall back to SSE3 (include/nibble/util.h)
  std::string shapes_opt = "full", variants = "first";
  int64_t tokens = 2048;
  int threads = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(argv[0], ("missing value for " + a).c_str());
      return argv[++i];
    };
    if (a == "--shapes") shapes_opt = value();
    else if (a == "--tokens") tokens = std::atoll(value().c_str());
    else if (a == "--threads") threads = std::atoi(value().c_str());
    else if (a == "--variants") variants = value();
    else if (a == "-h" || a == "--help") usage(argv[0], "GPTQ solve benchmark (see the comment atop bench/bench_gptq.cpp)");
    else usage(argv[0], ("unknown option " + a).c_str());
  }
  // --shapes full | small | OUTxIN[,OUTxIN...] (e.g. 4096x4096 to profile one shape).
  const std::vector<Shape> shapes = parse_shapes(shapes_opt);
  if (shapes.empty()) usage(argv[0], "--shapes must be full, small or OUTxIN[,OUTxIN...]");
  if (variants != "all" && variants != "first" && variants != "none") usage(argv[0], "--variants must be all|first|none");
  if (tokens <= 0) usage(argv[0], "--tokens must be positive");
  if (threads < 0) usage(argv[0], "--threads must be positive");
  if (threads > 0) {
    omp_set_num_threads(threads);
    openblas_set_num_threads(threads);
  }
  // Small shapes are quick: every variant on every shape unless told otherwise.
  if (shapes_opt == "small" && variants == "first") {
    bool explicit_variants = false;
    for (int i = 1; i < argc; ++i) explicit_variants |= std::strcmp(argv[i], "--variants") == 0;
    if (!explicit_variants) variants = "all";
  }

  std::printf("bench_gptq: GPTQ int4_asym g128 (damp 0.01, block 128) vs RTN, same run\n");
  std::printf("threads: OpenMP %d, OpenBLAS %d; calibration: %lld synthetic correlated tokens; shapes: %s; "
              "--mse/act-order on: %s\n",
              omp_get_max_threads(), openblas_get_num_threads(), static_cast<long long>(tokens), shapes_opt.c_str(),
              variants == "all" ? "every shape" : variants == "first" ? "the first shape" : "no shape");
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3)  // other jobs on the machine skew every time below
    std::printf("load average at start: %.2f %.2f %.2f (%ld cores online)\n", load[0], load[1], load[2],
                sysconf(_SC_NPROCESSORS_ONLN));
  std::fflush(stdout);

  const nibble::FormatChoice format = nibble::find_format("int4_asym", 128);
  const auto grid = nibble::quant::make_format_grid(format, false);
  const auto grid_mse = nibble::quant::make_format_grid(format, true);

  std::vector<Row> rows;
  std::vector<FactorRow> factors;
  try {
    for (size_t si = 0; si < shapes.size(); ++si) {
      const Shape& s = shapes[si];
      const bool run_variants = variants == "all" || (variants == "first" && si == 0);
      Row row{s};
      Rng rng = shape_rng(s.out, s.in);
      std::fprintf(stderr, "[%s] generating %lld×%lld inputs and %lld×%lld weights\n", s.name().c_str(),
                   static_cast<long long>(tokens), static_cast<long long>(s.in), static_cast<long long>(s.out),
                   static_cast<long long>(s.in));
      const std::vector<float> X = make_inputs(tokens, s.in, rng);  // [tokens, in]
      const std::vector<float> W = make_weights(s.out, s.in, rng);  // [out, in]
      const int64_t n = s.out * s.in;

      auto t0 = Clock::now();
      nibble::quant::MatrixStats stats(s.in);
      stats.add(X.data(), tokens);
      row.h_add = seconds_since(t0);
      t0 = Clock::now();
      stats.finalize();
      row.h_fin = seconds_since(t0);
      std::fprintf(stderr, "[%s] H: add %.2f s, finalize %.2f s\n", s.name().c_str(), row.h_add, row.h_fin);
      bool factored = false;
      for (const FactorRow& f : factors) factored |= f.in == s.in;
      if (!factored) {
        factors.push_back(time_factorization(stats));
        std::fprintf(stderr, "[%s] factorization: LAPACK %.2f s, blocked %.2f s\n", s.name().c_str(),
                     factors.back().t_lapack, factors.back().t_blocked);
      }

      const double ref_sq = output_sq(X, tokens, W.data(), nullptr, s.out, s.in);
      auto rel = [&](const nibble::quant::GptqResult& r) {
        return std::sqrt(output_sq(X, tokens, r.dequant.data(), W.data(), s.out, s.in) / ref_sq);
      };

      t0 = Clock::now();
      {
        const auto r = nibble::quant::rtn(W.data(), s.out, s.in, *grid);
        row.t_rtn = seconds_since(t0);
        row.e_rtn = rel(r);
      }
      std::fprintf(stderr, "[%s] rtn: %.2f s, out err %.5f\n", s.name().c_str(), row.t_rtn, row.e_rtn);

      nibble::quant::GptqOptions opt;
      t0 = Clock::now();
      {
        const nibble::quant::PreparedHessian prep = nibble::quant::prepare_hessian(stats, opt);
        auto r = nibble::quant::gptq(W.data(), s.out, s.in, prep, *grid, opt);
        row.t_gptq = seconds_since(t0);
        const double out_sq = output_sq(X, tokens, r.dequant.data(), W.data(), s.out, s.in);
        row.e_gptq = std::sqrt(out_sq / ref_sq);
        row.damp_used = r.damp_used;
        row.damp_retries = r.damp_retries;
        // The sweep's own account of its error (gptq.h): Σ (w − q)²/U_ii² =
        // ‖XΔWᵀ‖² + λ‖ΔW‖² (U in f32, so equal to ~1e-3, not exactly).
        const double expect = out_sq + r.lambda * weight_sq(r.dequant.data(), W.data(), n);
        row.identity_gap = std::abs(r.sweep_cost - expect) / r.sweep_cost;
        // --refine on plain GPTQ's result (the same Hessian, no second factorization).
        t0 = Clock::now();
        const auto rr = nibble::quant::refine(r, W.data(), stats, prep, *grid, kRefinePasses);
        row.refine_passes = rr.passes;
        row.refine_moves = rr.code_changes;
        row.refine_refits = rr.group_refits;
        row.t_refine = seconds_since(t0);
        row.e_refine = rel(r);
      }
      std::fprintf(stderr, "[%s] gptq: %.2f s, out err %.5f (damp %g, %d retries; cost identity gap %.2e)\n",
                   s.name().c_str(), row.t_gptq, row.e_gptq, row.damp_used, row.damp_retries, row.identity_gap);
      std::fprintf(stderr, "[%s] refine %d: %.2f s (%d passes run, %lld weights moved, %lld groups refit), out err %.5f\n",
                   s.name().c_str(), kRefinePasses, row.t_refine, row.refine_passes,
                   static_cast<long long>(row.refine_moves), static_cast<long long>(row.refine_refits), row.e_refine);

      if (run_variants) {
        t0 = Clock::now();
        {
          const auto r = nibble::quant::rtn(W.data(), s.out, s.in, *grid_mse);
          row.t_rtn_mse = seconds_since(t0);
          row.e_rtn_mse = rel(r);
        }
        std::fprintf(stderr, "[%s] rtn --mse: %.2f s, out err %.5f\n", s.name().c_str(), row.t_rtn_mse,
                     row.e_rtn_mse);
        t0 = Clock::now();
        {
          const auto r = nibble::quant::gptq(W.data(), s.out, s.in, stats, *grid_mse, opt);
          row.t_gptq_mse = seconds_since(t0);
          row.e_gptq_mse = rel(r);
        }
        std::fprintf(stderr, "[%s] gptq --mse: %.2f s, out err %.5f\n", s.name().c_str(), row.t_gptq_mse,
                     row.e_gptq_mse);
        nibble::quant::GptqOptions ao = opt;
        ao.act_order = true;
        t0 = Clock::now();
        {
          const auto r = nibble::quant::gptq(W.data(), s.out, s.in, stats, *grid, ao);
          row.t_gptq_ao = seconds_since(t0);
          row.e_gptq_ao = rel(r);
        }
        std::fprintf(stderr, "[%s] gptq act-order: %.2f s, out err %.5f\n", s.name().c_str(), row.t_gptq_ao,
                     row.e_gptq_ao);
      }
      rows.push_back(row);
    }
  } catch (const nibble::Error& e) {
    std::fprintf(stderr, "bench_gptq: %s\n", e.what());
    return 1;
  }

  std::printf("\n== seconds (wall); H = MatrixStats::add over %lld tokens, then finalize(); gptq/rtn = time ratio ==\n",
              static_cast<long long>(tokens));
  std::printf("%-11s %-13s %8s %8s %8s %8s %9s %8s %8s %9s %8s %8s %10s\n", "shape", "role", "H add", "H fin", "rtn",
              "gptq", "gptq/rtn", "rtn mse", "gptq mse", "gptq act", "refine", "ref/gptq", "H GiB");
  for (const Row& r : rows)
    std::printf("%-11s %-13s %8s %8s %8s %8s %9s %8s %8s %9s %8s %8s %10.2f\n", r.shape.name().c_str(), r.shape.role,
                cell(r.h_add, "%.2f").c_str(), cell(r.h_fin, "%.2f").c_str(), cell(r.t_rtn, "%.3f").c_str(),
                cell(r.t_gptq, "%.2f").c_str(), cell(r.t_gptq / r.t_rtn, "%.0f").c_str(),
                cell(r.t_rtn_mse, "%.2f").c_str(), cell(r.t_gptq_mse, "%.2f").c_str(), cell(r.t_gptq_ao, "%.2f").c_str(),
                cell(r.t_refine, "%.2f").c_str(), cell(r.t_refine / r.t_gptq, "%.2f").c_str(),
                static_cast<double>(r.shape.in * r.shape.in * 8) / (1u << 30));

  std::printf("\n== output error on the calibration inputs, ||X(W'-W)^T|| / ||XW^T||; gptq/rtn < 1: GPTQ did work ==\n");
  std::printf("%-11s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", "shape", "rtn", "gptq", "gptq/rtn", "rtn mse",
              "gptq mse", "gptq act", "gptq+ref", "damp", "cost gap");
  for (const Row& r : rows)
    std::printf("%-11s %9s %9s %9s %9s %9s %9s %9s %9s %9s\n", r.shape.name().c_str(), cell(r.e_rtn, "%.5f").c_str(),
                cell(r.e_gptq, "%.5f").c_str(), cell(r.e_gptq / r.e_rtn, "%.3f").c_str(),
                cell(r.e_rtn_mse, "%.5f").c_str(), cell(r.e_gptq_mse, "%.5f").c_str(),
                cell(r.e_gptq_ao, "%.5f").c_str(), cell(r.e_refine, "%.5f").c_str(), cell(r.damp_used, "%g").c_str(),
                cell(r.identity_gap, "%.1e").c_str());
  std::printf("(cost gap: |sweep_cost - (||X dW^T||^2 + lambda ||dW||^2)| / sweep_cost for plain gptq: the sweep's own\n"
              " error account (gptq.h) against the one measured here; near 0 says the sweep's bookkeeping holds)\n");

  std::printf("\n== the damped H's factorization and inverse (fp64 potrf + trtri): nibble's blocked steps (the same bits on any\n"
              "   thread count) against LAPACK's threaded ones on the same matrix, seconds (wall) ==\n");
  std::printf("%-7s %9s %9s %15s %22s\n", "inputs", "LAPACK", "blocked", "blocked/LAPACK", "max|diff|/max|U^-1|");
  for (const FactorRow& f : factors)
    std::printf("%-7lld %9.2f %9.2f %15.2f %22.1e\n", static_cast<long long>(f.in), f.t_lapack, f.t_blocked,
                f.t_blocked / f.t_lapack, f.max_diff);

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  std::printf("\npeak RSS: %.2f GiB (getrusage ru_maxrss)\n", static_cast<double>(ru.ru_maxrss) / (1 << 20));
  return 0;
}
