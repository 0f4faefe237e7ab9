// nibble layer: quantize one matrix (a .npy file) against its calibration
// inputs with RTN or GPTQ on any grid, and measure what was lost: the weight
// error and the output error ‖X(Ŵ−W)ᵀ‖ on the calibration and held-out inputs.
// A research tool for checking methods on one matrix, e.g. the GPTQ papers'
// worked examples, before they run on a whole checkpoint.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/hadamard.h"
#include "nibble/npy.h"
#include "nibble/transform.h"
#include "nibble/util.h"

namespace nibble::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct LayerOptions {
  std::string weight, inputs, heldout, method, grid = "int4_asym", out, report;
  bool mse = false, act_order = false;
  int refine = 0;
  double damp = 0.01;
  int group = 128;
  uint64_t rotate_seed = 0;
};

// A 2-D float32 matrix from a .npy file (any numeric dtype, converted), every
// value finite. `flag` names the option in messages.
Tensor load_matrix(const std::string& path, const char* flag) {
  Tensor t = io::read_npy(path);
  NIBBLE_CHECK(t.dim() == 2, "{} {}: expected a 2-D array, found shape {}", flag, path, shape_str(t.shape()));
  if (t.dtype() != DType::F32) t = t.to_f32();
  const float* v = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i)
    NIBBLE_CHECK(std::isfinite(v[i]), "{} {}: non-finite value {} at [{}, {}]", flag, path, v[i], i / t.size(1),
                 i % t.size(1));
  return t;
}

// sqrt(num / den), or NaN when the reference is zero (reported as null / n/a).
double rel_error(double sq_num, double sq_den) { return sq_den > 0 ? std::sqrt(sq_num / sq_den) : NAN; }
// Signal-to-quantization-noise ratio in dB, 10·log10(‖signal‖² / ‖error‖²):
// +inf for an exact result, NaN for a zero signal (both reported as null).
double sqnr_db(double sq_err, double sq_ref) {
  return sq_ref > 0 ? (sq_err > 0 ? 10.0 * std::log10(sq_ref / sq_err) : INFINITY) : NAN;
}

struct OutputError {
  double sq_err = 0;  // ‖X(Ŵ−W)ᵀ‖²
  double sq_ref = 0;  // ‖X Wᵀ‖²
  double rel() const { return rel_error(sq_err, sq_ref); }
  double sqnr() const { return sqnr_db(sq_err, sq_ref); }
};

// ‖X Dᵀ‖²_F and ‖X Wᵀ‖²_F for X [tokens, in], W and D = Ŵ − W [out, in],
// all in fp64: D is formed exactly (the difference of two floats is exact in
// double), and the products go through dgemm in blocks of output rows and
// tokens so the fp64 copies stay small whatever the matrix size.
OutputError output_error(const Tensor& x, const float* w, const float* q, int64_t out, int64_t in) {
  const int64_t tokens = x.size(0);
  const int64_t rb = std::clamp<int64_t>((int64_t{4} << 20) / std::max<int64_t>(in, 1), 1, out);  // ≤ 64 MiB of fp64
  constexpr int64_t kTokenBlock = 256;
  std::vector<double> wd(static_cast<size_t>(2 * rb * in));  // [2 rb, in]: W rows, then D rows
  std::vector<double> xb(static_cast<size_t>(std::min(tokens, kTokenBlock) * in));
  std::vector<double> y(static_cast<size_t>(std::min(tokens, kTokenBlock) * 2 * rb));
  OutputError e;
  const float* xv = x.data<float>();
  for (int64_t r0 = 0; r0 < out; r0 += rb) {
    const int64_t nr = std::min(rb, out - r0);
    for (int64_t r = 0; r < nr; ++r)
      for (int64_t c = 0; c < in; ++c) {
        const size_t i = static_cast<size_t>((r0 + r) * in + c);
        wd[r * in + c] = w[i];
        wd[(nr + r) * in + c] = static_cast<double>(q[i]) - static_cast<double>(w[i]);
      }
    for (int64_t t0 = 0; t0 < tokens; t0 += kTokenBlock) {
      const int64_t nt = std::min(kTokenBlock, tokens - t0);
      for (int64_t i = 0; i < nt * in; ++i) xb[i] = xv[t0 * in + i];
      // y [nt, 2 nr] = xb [nt, in] · wdᵀ
      cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nt), static_cast<int>(2 * nr),
                  static_cast<int>(in), 1.0, xb.data(), static_cast<int>(in), wd.data(), static_cast<int>(in), 0.0,
                  y.data(), static_cast<int>(2 * nr));
      for (int64_t t = 0; t < nt; ++t) {
        for (int64_t r = 0; r < nr; ++r) e.sq_ref += y[t * 2 * nr + r] * y[t * 2 * nr + r];
        for (int64_t r = nr; r < 2 * nr; ++r) e.sq_err += y[t * 2 * nr + r] * y[t * 2 * nr + r];
      }
    }
  }
  return e;
}

nlohmann::ordered_json or_null(double v) {
  return std::isfinite(v) ? nlohmann::ordered_json(v) : nlohmann::ordered_json(nullptr);
}

std::string fmt_rel(double v) {
  return std::isfinite(v) ? fmt::format("{:.6f}", v) : std::string("n/a (zero reference)");
}

std::string fmt_db(double v) {
  if (std::isnan(v)) return "n/a (zero reference)";
  return std::isinf(v) ? std::string("inf (exact)") : fmt::format("{:.2f} dB", v);
}

void run_layer(const LayerOptions& o, const GlobalOptions& global) {
  const auto t_start = Clock::now();
  const quant::MethodChoice method = quant::parse_method(o.method);
  NIBBLE_CHECK(!method.transform || method.transform->name != std::string_view("smoothquant"),
               "--method {}: SmoothQuant moves error into the activations, which one matrix with exact inputs does not "
               "measure; use nibble quantize --method smoothquant and nibble eval",
               o.method);
  const bool is_gptq = method.quantizer->name == std::string_view("gptq");
  NIBBLE_CHECK(is_gptq || !o.act_order, "--act-order applies to GPTQ (--method gptq or TRANSFORM+gptq) only");
  NIBBLE_CHECK(is_gptq || o.refine == 0, "--refine applies to GPTQ (--method gptq or TRANSFORM+gptq) only");
  // Fail before the work, not after it, when an output cannot be placed.
  require_output_dir("--out", o.out);
  require_output_dir("--report", o.report);

  const Tensor w = load_matrix(o.weight, "--weight");  // [out, in]
  const int64_t rows = w.size(0), cols = w.size(1);
  NIBBLE_CHECK(rows > 0 && cols > 0, "--weight {}: empty matrix {}", o.weight, shape_str(w.shape()));
  auto load_inputs = [&](const std::string& path, const char* flag) {
    Tensor x = load_matrix(path, flag);  // [tokens, in]
    NIBBLE_CHECK(x.size(1) == cols,
                 "{} {} is {} but --weight {} is {}: the inputs' width ({}) must equal the weight's input "
                 "dimension (its {} columns)",
                 flag, path, shape_str(x.shape()), o.weight, shape_str(w.shape()), x.size(1), cols);
    NIBBLE_CHECK(x.size(0) > 0, "{} {}: no tokens (shape {})", flag, path, shape_str(x.shape()));
    return x;
  };
  const Tensor x = load_inputs(o.inputs, "--inputs");
  std::optional<Tensor> xh;
  if (!o.heldout.empty()) xh = load_inputs(o.heldout, "--heldout");
  const std::unique_ptr<quant::Grid> grid = quant::parse_grid(o.grid, o.group, o.mse);
  const double t_read = seconds_since(t_start);

  auto t = Clock::now();
  // A transform first (AWQ's scales, a Hadamard rotation): the quantizer sees
  // the transformed matrix and inputs; the result is mapped back, so --out and
  // the errors are about the effective weight of the original inputs.
  Tensor wq = w.to_f32(), xq = x.to_f32();  // [out, in], [tokens, in]
  std::vector<double> awq_scales;
  std::optional<quant::HadamardRotation> rotation;
  nlohmann::ordered_json transform_report;
  if (method.transform && method.transform->name == std::string_view("awq")) {
    quant::MatrixStats st(cols);
    st.add(x.data<float>(), x.size(0));
    st.finalize();
    const quant::AwqSearch a = quant::awq_search({&wq}, st, *grid);
    awq_scales = a.scales;
    transform_report = {{"name", "awq"}, {"alpha", a.alpha}, {"error", a.error}, {"error_unscaled", a.error_unscaled}};
    quant::scale_columns(wq, awq_scales);
    std::vector<double> inv(awq_scales.size());
    for (size_t j = 0; j < inv.size(); ++j) inv[j] = 1.0 / awq_scales[j];
    quant::scale_columns(xq, inv);
  } else if (method.transform && method.transform->name == std::string_view("rotate")) {
    rotation.emplace(cols, o.rotate_seed);  // an unsupported width is an error naming it
    rotation->apply(wq.data_mut<float>(), rows);
    rotation->apply(xq.data_mut<float>(), xq.size(0));
    transform_report = {{"name", "rotate"}, {"seed", o.rotate_seed}, {"hadamard_factor", rotation->factor()}};
  }
  quant::GptqResult r;
  std::optional<quant::RefineReport> refined;
  double t_stats = 0;
  if (is_gptq) {
    quant::MatrixStats stats(cols);  // H = XᵀX [in, in], fp64
    stats.add(xq.data<float>(), xq.size(0));
    stats.finalize();
    t_stats = seconds_since(t);
    t = Clock::now();
    quant::GptqOptions go;
    go.damp = o.damp;
    go.act_order = o.act_order;
    const quant::PreparedHessian prep = quant::prepare_hessian(stats, go);
    r = quant::gptq(wq.data<float>(), rows, cols, prep, *grid, go);
    if (o.refine > 0) refined = quant::refine(r, wq.data<float>(), stats, prep, *grid, o.refine);
  } else {
    // RTN needs no Hessian. Its dead-column count is GPTQ's (inputs with
    // H_ii = Σ x² = 0, i.e. never nonzero in calibration), for comparison;
    // RTN leaves those weights as they are.
    r = quant::rtn(wq.data<float>(), rows, cols, *grid);
    std::vector<bool> live(static_cast<size_t>(cols), false);
    const float* xv = xq.data<float>();
    for (int64_t i = 0; i < xq.numel(); ++i) live[i % cols] = live[i % cols] || xv[i] != 0.0f;
    r.dead_columns = std::count(live.begin(), live.end(), false);
  }
  if (!awq_scales.empty())
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        r.dequant[i * cols + j] = static_cast<float>(r.dequant[i * cols + j] / awq_scales[j]);
  if (rotation) rotation->apply_transpose(r.dequant.data(), rows);
  NIBBLE_CHECK(r.dequant.size() == static_cast<size_t>(rows * cols), "{}: result has {} values for a {} matrix",
               o.method, r.dequant.size(), shape_str(w.shape()));
  const double t_quant = seconds_since(t);

  t = Clock::now();
  const float* wv = w.data<float>();
  const float* qv = r.dequant.data();
  double w_sq = 0, dw_sq = 0;
  for (int64_t i = 0; i < rows * cols; ++i) {
    const double d = static_cast<double>(qv[i]) - wv[i];
    w_sq += static_cast<double>(wv[i]) * wv[i];
    dw_sq += d * d;
  }
  const double weight_rel = rel_error(dw_sq, w_sq);
  const OutputError calib = output_error(x, wv, qv, rows, cols);
  std::optional<OutputError> held;
  if (xh) held = output_error(*xh, wv, qv, rows, cols);
  const double t_err = seconds_since(t);

  io::write_npy(o.out, Tensor::view(DType::F32, {rows, cols}, qv, nullptr));

  using ojson = nlohmann::ordered_json;
  ojson j;
  j["nibble_version"] = NIBBLE_VERSION;
  j["command_line"] = global.command_line;
  j["method"] = method.name;
  if (!transform_report.is_null()) j["transform"] = transform_report;
  j["grid"] = o.grid;
  j["grid_format"] = grid->format() ? ojson(grid->format()->canonical_name(grid->group_size())) : ojson(nullptr);
  j["group_size"] = grid->group_size();
  j["mse"] = o.mse;
  j["act_order"] = o.act_order;
  j["damp"] = is_gptq ? ojson(o.damp) : ojson(nullptr);
  j["weight"] = o.weight;
  j["inputs"] = o.inputs;
  j["heldout"] = xh ? ojson(o.heldout) : ojson(nullptr);
  j["rows"] = rows;
  j["cols"] = cols;
  j["tokens"] = x.size(0);
  if (xh) j["heldout_tokens"] = xh->size(0);
  j["weight_rel_err"] = or_null(weight_rel);
  j["weight_sqnr_db"] = or_null(sqnr_db(dw_sq, w_sq));
  j["output_rel_err_calib"] = or_null(calib.rel());
  j["output_sq_err_calib"] = calib.sq_err;
  j["output_sqnr_db_calib"] = or_null(calib.sqnr());
  if (held) {
    j["output_rel_err_heldout"] = or_null(held->rel());
    j["output_sq_err_heldout"] = held->sq_err;
    j["output_sqnr_db_heldout"] = or_null(held->sqnr());
  }
  j["damp_used"] = is_gptq ? ojson(r.damp_used) : ojson(nullptr);
  j["lambda"] = is_gptq ? ojson(r.lambda) : ojson(nullptr);
  j["damp_retries"] = is_gptq ? ojson(r.damp_retries) : ojson(nullptr);
  j["dead_columns"] = r.dead_columns;
  j["sweep_cost"] = is_gptq ? ojson(r.sweep_cost) : ojson(nullptr);
  j["refine"] = refined ? ojson{{"passes", o.refine},
                                {"passes_run", refined->passes},
                                {"objective_before", refined->cost_before},
                                {"objective_after", refined->cost_after},
                                {"codes_changed", refined->code_changes},
                                {"groups_refit", refined->group_refits}}
                        : ojson(nullptr);
  j["seconds"] = seconds_since(t_start);
  j["seconds_quantize"] = t_quant;
  write_file_atomic(o.report, j.dump(2) + "\n");

  std::printf("%s on %s: W %s, %lld calibration tokens%s\n", o.method.c_str(),
              grid->format() ? grid->format()->canonical_name(grid->group_size()).c_str() : o.grid.c_str(),
              shape_str(w.shape()).c_str(), static_cast<long long>(x.size(0)),
              xh ? fmt::format(", {} held-out", xh->size(0)).c_str() : "");
  std::printf("  weight rel. error ||W'-W||/||W||          %s  (SQNR %s)\n", fmt_rel(weight_rel).c_str(),
              fmt_db(sqnr_db(dw_sq, w_sq)).c_str());
  std::printf("  output rel. error, calibration            %s  (squared error %.6g, SQNR %s)\n",
              fmt_rel(calib.rel()).c_str(), calib.sq_err, fmt_db(calib.sqnr()).c_str());
  if (held)
    std::printf("  output rel. error, held-out               %s  (squared error %.6g, SQNR %s)\n",
                fmt_rel(held->rel()).c_str(), held->sq_err, fmt_db(held->sqnr()).c_str());
  if (refined)
    std::printf("  refine: GPTQ's objective %.6g -> %.6g in %d pass(es), %lld weights moved, %lld groups refit\n",
                refined->cost_before, refined->cost_after, refined->passes,
                static_cast<long long>(refined->code_changes), static_cast<long long>(refined->group_refits));
  std::printf("wrote %s and %s\n", o.out.c_str(), o.report.c_str());
  if (!global.quiet)
    std::fprintf(stderr, "nibble: layer: %.3f s (read %.3f s, statistics %.3f s, %s %.3f s, errors %.3f s)\n",
                 seconds_since(t_start), t_read, t_stats, o.method.c_str(), t_quant, t_err);
}

}  // namespace

void register_layer(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand(
      "layer", "Quantize one matrix (.npy) against its inputs with RTN or GPTQ and report weight and output errors");
  auto o = std::make_shared<LayerOptions>();
  cmd->add_option("--weight", o->weight, "Weight matrix [out, in], .npy (float32; other numeric dtypes converted)")
      ->required();
  cmd->add_option("--inputs", o->inputs, "Calibration inputs X [tokens, in], .npy (the Hessian is XᵀX)")->required();
  cmd->add_option("--heldout", o->heldout, "Held-out inputs [tokens, in], .npy: output error measured on them too");
  cmd->add_option("--method", o->method,
                  "rtn or gptq, optionally after a transform: awq, awq+gptq, rotate, rotate+gptq (AWQ's scales or a "
                  "Hadamard rotation of the inputs; --out holds the effective weights for the original inputs)")
      ->required()
      ->check(CLI::IsMember(quant::method_names()));
  cmd->add_option("--rotate-seed", o->rotate_seed, "rotate: seed of the Hadamard rotation's random signs")
      ->capture_default_str()
      ->check(nonnegative());  // the seed is unsigned: CLI11 would wrap -1 to 2^64 - 1
  cmd->add_option("--grid,--format", o->grid,
                  "A format from the registry (a family name such as int4_asym with --group, or a canonical name "
                  "such as int4_g64_asym, fp8_e4m3_channel, nvfp4; list below), or uniform:step=S (symmetric, no "
                  "clamp)")
      ->capture_default_str();
  cmd->add_option("--group", o->group, "Group size for a format family name that offers a choice")
      ->capture_default_str()
      ->check(positive());
  cmd->add_flag("--mse", o->mse, "Search each group's range (33 shrink factors, |err|^2.4) instead of min/max");
  cmd->add_flag("--act-order", o->act_order, "GPTQ: sweep inputs in decreasing Hessian diagonal");
  cmd->add_option("--refine", o->refine,
                  "GPTQ: up to N passes of coordinate descent over the codes and least-squares refits of each "
                  "group's scale (and min), against GPTQ's objective, after the sweep (0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1000));
  auto* damp = cmd->add_option("--damp", o->damp, "GPTQ: damping, as a fraction of mean(diag H)")
                   ->capture_default_str()
                   ->check(nonnegative());
  cmd->add_option("--out", o->out, "Output .npy: the dequantized weights [out, in], float32")->required();
  cmd->add_option("--report", o->report, "Output JSON report (errors, options, GPTQ's damping and sweep cost)")
      ->required();
  cmd->footer(
      "Output error: ||X(W'-W)^T||_F / ||X W^T||_F over the rows of --inputs (and of --heldout); SQNR:\n"
      "10 log10(||X W^T||^2 / ||X(W'-W)^T||^2) dB (and the same on the weights).\n"
      "Example (GPTQ's textbook case: 2 inputs over 4 tokens, W = [[0.62, 0.37]]):\n"
      "  nibble layer --weight W.npy --inputs X.npy --method gptq --grid uniform:step=0.25 --out Q.npy "
      "--report R.json\n"
      "  nibble layer --weight W.npy --inputs X.npy --heldout X2.npy --method gptq --act-order --mse "
      "--grid int4_g128_asym --out Q.npy --report R.json\n"
      "\nFormats:\n" + format_list_text());
  cmd->callback([&global, o, damp] {
    NIBBLE_CHECK(quant::parse_method(o->method).quantizer->name == std::string_view("gptq") || damp->count() == 0,
                 "--damp applies to GPTQ (--method gptq or TRANSFORM+gptq) only");
    run_layer(*o, global);
  });
}

}  // namespace nibble::cli
