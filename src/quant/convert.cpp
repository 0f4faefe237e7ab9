// quantize_model / dequantize_model: the whole-checkpoint flows.
#include "nibble/convert.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <fstream>
#include <future>
#include <optional>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "nibble/act_quant.h"
#include "nibble/arch.h"
#include "nibble/checkpoint_writer.h"
#include "nibble/error.h"
#include "nibble/gguf.h"
#include "nibble/hadamard.h"
#include "nibble/transform.h"
#include "nibble/quantizer.h"
#include "nibble/regex.h"
#include "nibble/rival.h"
#include "nibble/source.h"
#include "nibble/util.h"
#include "quant/calibrate.h"

namespace nibble {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

// The first index of a NaN/Inf among n values whose exponent field is `mask`
// (all ones: not finite), or -1. Scanned in the stored dtype, on OpenMP
// threads when `parallel`.
template <typename U>
int64_t first_nonfinite(const U* p, int64_t n, U mask, bool parallel) {
  int64_t bad = n;
#pragma omp parallel for reduction(min : bad) schedule(static) if (parallel && n > (1 << 20))
  for (int64_t i = 0; i < n; ++i)
    if ((p[i] & mask) == mask && i < bad) bad = i;
  return bad == n ? -1 : bad;
}

// Throws (or returns false with allow) when w (a 2-D float tensor in any
// dtype) has a NaN/Inf; names the first one.
bool check_finite(const std::string& name, const Tensor& stored, bool allow, std::vector<std::string>& warnings,
                  bool parallel = true) {
  const Tensor w = stored.is_contiguous() ? stored : stored.contiguous();
  const int64_t n = w.numel();
  int64_t bad = -1;
  switch (w.dtype()) {
    case DType::BF16:
      bad = first_nonfinite(static_cast<const uint16_t*>(w.raw()), n, uint16_t{0x7F80}, parallel);
      break;
    case DType::F16:
      bad = first_nonfinite(static_cast<const uint16_t*>(w.raw()), n, uint16_t{0x7C00}, parallel);
      break;
    case DType::F32:
      bad = first_nonfinite(static_cast<const uint32_t*>(w.raw()), n, uint32_t{0x7F800000}, parallel);
      break;
    default: {
      const Tensor f = w.to_f32();
      bad = first_nonfinite(static_cast<const uint32_t*>(f.raw()), n, uint32_t{0x7F800000}, parallel);
    }
  }
  if (bad < 0) return true;
  const int64_t cols = w.size(1);
  const float value = w.slice_rows(bad / cols, bad / cols + 1).to_f32().data<float>()[bad % cols];
  const std::string where = fmt::format("tensor '{}' has a non-finite value {} at index [{}, {}]", name, value,
                                        bad / cols, bad % cols);
  NIBBLE_CHECK(allow, "{} (pass --allow-nonfinite to keep such tensors unquantized)", where);
  warnings.push_back(where + "; kept unquantized");
  return false;
}

void copy_carried(const fs::path& from, const fs::path& to) {
  for (const fs::path& f : carried_files(from)) {
    fs::copy_file(f, to / f.filename(), fs::copy_options::overwrite_existing);
    // Sources are often read-only (a shared model store); the copy is ours.
    fs::permissions(to / f.filename(), fs::perms::owner_read | fs::perms::owner_write, fs::perm_options::add);
  }
}

// config.json's word for a float dtype.
const char* dtype_word(DType dt) {
  switch (dt) {
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    default: return "float32";
  }
}

// What a checkpoint made from a GGUF file needs beside its weights, written
// into `dir`: config.json (model_config_json, weights in `dtype_word`) and,
// when the file carries a vocabulary, the tokenizer GgufSource builds (so it
// is known to load) as tokenizer.json with the config it was built with.
void write_gguf_companions(const GgufSource& gguf, const fs::path& dir, const char* dtype_word) {
  write_file_atomic(dir / "config.json", model_config_json(gguf.config(), dtype_word));
  const std::optional<GgufSource::TokenizerSpec> spec = gguf.tokenizer_spec();
  if (!spec) return;
  (void)Tokenizer::from_json(spec->json, gguf.describe() + " (tokenizer.ggml.*)", spec->config);  // it loads
  write_file_atomic(dir / "tokenizer.json", spec->json + "\n");
  const TokenizerConfig& c = spec->config;
  ojson tc = {{"tokenizer_class", "PreTrainedTokenizerFast"}};
  if (c.bos_token) tc["bos_token"] = *c.bos_token;
  if (c.eos_token) tc["eos_token"] = *c.eos_token;
  if (c.pad_token) tc["pad_token"] = *c.pad_token;
  if (c.add_bos_token) tc["add_bos_token"] = *c.add_bos_token;
  if (c.add_eos_token) tc["add_eos_token"] = *c.add_eos_token;
  if (!c.chat_template.empty()) tc["chat_template"] = c.chat_template;
  write_file_atomic(dir / "tokenizer_config.json", tc.dump(2) + "\n");
}

}  // namespace

QuantizeResult quantize_model(const fs::path& model_dir, const fs::path& out_dir, const QuantizeOptions& opt) {
  const auto t_start = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  // The source: an HF directory, or a GGUF file (which carries no
  // config.json or tokenizer.json: both are written from what it holds).
  std::unique_ptr<ModelSource> src;
  const GgufSource* gguf = nullptr;
  std::vector<fs::path> weight_files;
  if (is_gguf_file(model_dir)) {
    auto g = GgufSource::open(model_dir);
    gguf = g.get();
    weight_files = {model_dir};
    src = std::move(g);
  } else {
    if (const auto q = rival_quantization_config(model_dir))
      NIBBLE_FAIL("{}: already quantized ({}); quantize the original checkpoint (to quantize its rounded weights "
                  "anyway, `nibble dequantize` it first)",
                  model_dir.string(), q->value("quant_method", "?"));
    auto dir = CheckpointDir::open(model_dir);
    NIBBLE_CHECK(!dir->is_packed(), "{}: already quantized by nibble; quantize the original checkpoint",
                 model_dir.string());
    weight_files = dir->weight_files();
    src = std::move(dir);
  }
  // nibble.json records the source files' SHA-256: hashed on a thread of
  // their own while the quantization runs (an error stops it early).
  std::atomic<bool> stop_hashing{false};
  std::vector<fs::path> hashed = weight_files;
  if (!gguf)
    for (const fs::path& f : carried_files(model_dir)) hashed.push_back(f);
  std::future<ojson> source_hashes = std::async(std::launch::async, [&stop_hashing, hashed] {
    ojson files = ojson::object();
    for (const fs::path& f : hashed) files[f.filename().string()] = sha256_file(f, &stop_hashing);
    return files;
  });
  struct StopHashing {
    std::atomic<bool>& flag;
    ~StopHashing() { flag = true; }
  } stop_on_exit{stop_hashing};
  src->validate_against_config();
  const FormatChoice format = find_format(opt.format, opt.group_size);
  const quant::MethodChoice method = quant::parse_method(opt.method);
  NIBBLE_CHECK(!method.needs_calibration() || !opt.calib.files.empty(),
               "method '{}' needs calibration data: pass --calib FILE (text or .npy token ids)", method.name);
  NIBBLE_CHECK(method.quantizer->name == "gptq" || !opt.act_order,
               "--act-order is a GPTQ option (method '{}' has no column order)", method.name);
  NIBBLE_CHECK(method.quantizer->name == "gptq" || opt.refine == 0,
               "--refine refines GPTQ's result (method '{}' has no Hessian objective)", method.name);
  auto quantizer = method.quantizer->make(
      quant::QuantizerConfig{format, opt.mse, opt.act_order, opt.damp, opt.device, opt.refine});
  // A transform: a view of the whole model (rotation), or a reshaping of each
  // layer during calibration (AWQ, SmoothQuant).
  const quant::TransformConfig tcfg{format, opt.alpha, opt.rotate_seed};
  const quant::TransformSpec* transform = method.transform;
  std::vector<std::string> view_notes;
  std::unique_ptr<ModelSource> view =
      transform && transform->wrap_source ? transform->wrap_source(*src, tcfg, view_notes) : nullptr;
  std::unique_ptr<quant::LayerTransform> layer_transform =
      transform && transform->make_layer ? transform->make_layer(tcfg) : nullptr;
  const ModelSource& model = view ? *view : static_cast<const ModelSource&>(*src);
  // The activation quantizer the checkpoint declares: SmoothQuant exists for
  // W8A8, so it defaults to per-token INT8; "none" declares none.
  std::string activations = opt.activations;
  if (activations.empty() && transform && transform->name == std::string_view("smoothquant")) activations = "int8_token";
  if (activations == "none") activations.clear();
  if (!activations.empty()) find_act_quant(activations);  // an unknown name fails here, listing the known ones
  const ModelConfig& cfg = model.config();
  std::optional<Regex> keep;
  if (!opt.keep_regex.empty()) keep.emplace(opt.keep_regex, "--keep");  // a bad pattern fails here, saying where

  // Which tensors to quantize: the linears of the decoder layers, and the head
  // when it is a tensor of its own. A tied head stays tied (and unquantized);
  // one that a model transform untied (rotation) stays unquantized too, so the
  // transform is compared with plain rounding on the same tensors.
  std::map<std::string, std::string> role;  // name -> note for kept tensors / "" for quantize
  const bool source_tied = src->config().tie_word_embeddings;
  for (const ExpectedTensor& t : expected_tensors(cfg)) {
    if (t.role == TensorRole::Linear || (t.role == TensorRole::Head && !source_tied)) role[t.name] = "";
  }
  QuantizeResult res;
  res.format = format.canonical_name();
  res.notes = view_notes;
  if (!method.needs_calibration() && !opt.calib.files.empty())
    res.warnings.push_back(fmt::format("method '{}' uses no calibration data; --calib ignored", method.name));
  // A calibrated run keeps its state (finished layers) in the staging
  // directory: never throw that away without being asked to.
  const fs::path state_dir_name = ".calib";
  const fs::path old_state = io::OutputDir::staging_for(out_dir) / state_dir_name / "state.json";
  const bool resumable = method.needs_calibration() && fs::exists(old_state);
  NIBBLE_CHECK(!fs::exists(old_state) || opt.resume || opt.force,
               "{}: an interrupted calibrated run left its state in {}; pass --resume to continue it or --force to "
               "start over",
               out_dir.string(), old_state.parent_path().string());
  if (opt.resume && !resumable) res.notes.push_back("--resume: no interrupted run found; starting from the first layer");
  io::OutputDir out(out_dir, opt.force, /*keep_staging=*/opt.resume && resumable);
  res.out_dir = out.target();
  NIBBLE_CHECK(fs::weakly_canonical(model_dir) != out.target(), "{}: the output directory is the input directory",
               out.target().string());

  // The finite check of the weights to quantize. When it can only fail the
  // run (no --allow-nonfinite) and a calibration follows, it runs on a thread
  // of its own beside the calibration (a GPU calibration leaves the CPU idle)
  // instead of before it; a model transform's view is checked in line.
  const bool scan_beside = method.needs_calibration() && !opt.allow_nonfinite && !view;
  std::vector<std::string> to_scan;
  std::future<void> finite_scan;  // joined (get) on every path out of the calibration

  // Plan every output tensor first, so the writer can stream them.
  std::vector<io::OutputUnit> plan;
  std::vector<std::string> names = model.names();
  for (const std::string& name : names) {
    const TensorMeta m = model.meta(name);
    TensorResult tr;
    tr.name = name;
    tr.params = static_cast<uint64_t>(shape_numel(m.shape));
    auto it = role.find(name);
    if (it == role.end()) {
      tr.note = name == "lm_head.weight" && source_tied
                    ? (cfg.tie_word_embeddings ? "tied head" : "head tied in the source (untied by the transform)")
                    : "not a linear";
    } else if (keep && keep->search(name)) {
      tr.note = "--keep";
    } else {
      NIBBLE_CHECK(m.shape.size() == 2, "tensor '{}': only 2-D weights can be quantized, found shape {}", name,
                   shape_str(m.shape));
      NIBBLE_CHECK(dtype_is_float(m.dtype), "tensor '{}': cannot quantize a {} tensor", name, dtype_name(m.dtype));
      if (gguf) {
        // Quantizing a block-quantized weight again would stack two roundings
        // and report only the second one's error.
        NIBBLE_CHECK(gguf->is_plain(name),
                     "{}: tensor '{}' ({}) is stored as {}; quantize from an F32, F16 or BF16 GGUF file or the "
                     "original checkpoint (to quantize the already-rounded weights anyway, `nibble dequantize` the "
                     "file first)",
                     model_dir.string(), name, gguf->gguf_name(name),
                     io::ggml_type_name(gguf->file().info(gguf->gguf_name(name)).type));
      }
      // A bad weight fails the run with nothing written under the target (or,
      // when allowed, keeps just that tensor: decided here, before the plan).
      if (scan_beside) {
        to_scan.push_back(name);
        tr.quantized = true;
      } else {
        tr.quantized = check_finite(name, model.load(name), opt.allow_nonfinite, res.warnings);
        if (!tr.quantized) tr.note = "non-finite values";
      }
    }
    io::OutputUnit u;
    u.logical_name = name;
    if (tr.quantized) {
      const std::string prefix = name.substr(0, name.size() - std::string(".weight").size());
      for (const PartSpec& p : format.spec->parts(m.shape[0], m.shape[1], format.group_size))
        u.stored.push_back({prefix + "." + p.suffix, p.dtype, p.shape});
      u.quant_meta = ojson{{"format", res.format}, {"shape", m.shape}}.dump();
    } else {
      u.stored.push_back({name, m.dtype, m.shape});
    }
    res.tensors.push_back(tr);
    plan.push_back(std::move(u));
  }

  std::map<std::string, std::string> metadata = {{"format", "pt"},
                                                 {kMetaFormat, res.format},
                                                 {kMetaGroupSize, std::to_string(format.group_size)},
                                                 {kMetaVersion, NIBBLE_VERSION}};
  // Without a layer transform the plan is final before the calibration, which
  // then writes each layer into the output as soon as it is done. (A layer
  // transform's replacements change the plan's dtypes: its writer comes after.)
  std::unique_ptr<io::ShardedWriter> writer;
  auto make_writer = [&] {
    writer = std::make_unique<io::ShardedWriter>(out.staging(), plan, opt.max_shard_bytes, metadata);
  };
  if (!layer_transform) make_writer();
  std::unique_ptr<quant::CalibratedParts> calibrated;
  const auto t_calibration = std::chrono::steady_clock::now();
  if (method.needs_calibration()) {
    std::set<std::string> selected;
    for (const TensorResult& t : res.tensors)
      if (t.quantized) selected.insert(t.name);
    if (!to_scan.empty())
      finite_scan = std::async(std::launch::async, [&model, to_scan] {
        std::vector<std::string> unused;
        for (const std::string& name : to_scan)
          check_finite(name, model.load(name), /*allow=*/false, unused, /*parallel=*/false);
      });
    quant::CalibratedParts::Sink sink;
    if (writer) sink = [&w = *writer](const std::string& stored, const Tensor& t) { w.write(stored, t); };
    try {
      calibrated = std::make_unique<quant::CalibratedParts>(
          model_dir, weight_files, model, selected, *quantizer, layer_transform.get(), format, opt,
          out.staging() / state_dir_name, res.warnings, res.notes, sink);
    } catch (...) {
      // A non-finite weight is the better message (and leaves no state: a
      // resumed run would fail the same way).
      if (finite_scan.valid()) finite_scan.get();
      // Keep finished layers for --resume; a run that finished none leaves nothing behind.
      out.keep_on_failure(fs::exists(out.staging() / state_dir_name / "layer-00000.safetensors"));
      throw;
    }
    if (finite_scan.valid()) finite_scan.get();  // rethrows the finite check's error
    res.resumed_from_layer = calibrated->resumed_from_layer();
    res.seconds_calibration = since(t_calibration);
    // A layer transform's versions of plain tensors are stored in F32 (the
    // folded scales are not representable in the source's bf16).
    for (size_t i = 0; i < names.size(); ++i)
      if (!res.tensors[i].quantized && calibrated->replacement(names[i]).defined()) {
        plan[i].stored[0].dtype = DType::F32;
        res.tensors[i].note += res.tensors[i].note.empty() ? "rescaled" : ", rescaled";
      }
  }

  if (!writer) make_writer();

  Progress bar("quantize", static_cast<int64_t>(names.size()), opt.progress, "tensors");
  for (size_t i = 0; i < names.size(); ++i) {
    TensorResult& tr = res.tensors[i];
    bar.set_note(tr.name);
    const Tensor original = model.load(tr.name);
    if (tr.quantized) {
      const int64_t rows = original.size(0), cols = original.size(1);  // [out, in]
      std::vector<Tensor> parts;
      if (calibrated) {
        parts = calibrated->parts(tr.name);
        const quant::QuantizeInfo& info = calibrated->info(tr.name);
        tr.damp_used = info.damp_used;
        tr.damp_retries = info.damp_retries;
        tr.dead_columns = info.dead_columns;
        tr.refine = info.refine;
        // Against the matrix the quantizer was given (a layer transform's
        // rescaled one): computed when it was quantized.
        tr.rel_error = info.rel_error;
        tr.max_abs_error = info.max_abs_error;
      } else {
        const Tensor w = original.to_f32();
        parts = format.spec->pack(quantizer->quantize(w, nullptr));
        // Error of what was actually stored: dequantize from the packed parts.
        std::tie(tr.rel_error, tr.max_abs_error) = quant::weight_error(w, dequantize_parts(format, parts, rows, cols));
      }
      for (size_t p = 0; p < parts.size(); ++p)
        if (!writer->written(plan[i].stored[p].name)) writer->write(plan[i].stored[p].name, parts[p]);
      tr.bits_per_weight = bits_per_weight(format, rows, cols);
      for (const Tensor& p : parts) tr.bytes += p.nbytes();
      res.quantized_params += tr.params;
    } else {
      Tensor t = calibrated ? calibrated->replacement(tr.name) : Tensor();
      if (!t.defined()) t = original;
      const DType dt = plan[i].stored[0].dtype;
      if (t.dtype() != dt) t = t.to(dt);  // a view's F32 values in the stored dtype
      writer->write(tr.name, t);
      tr.bytes = t.nbytes();
    }
    res.total_params += tr.params;
    res.total_bytes += tr.bytes;
    bar.advance();
  }
  bar.finish();
  writer->finish();
  if (gguf)
    write_gguf_companions(*gguf, out.staging(), dtype_word(model.meta("model.embed_tokens.weight").dtype));
  else
    copy_carried(model_dir, out.staging());
  if (cfg.tie_word_embeddings != src->config().tie_word_embeddings) {
    // A model transform untied the head (rotation folds the final norm into
    // it): the copied config.json must say so.
    const fs::path cfg_path = out.staging() / "config.json";
    std::ifstream cf(cfg_path);
    ojson cj = ojson::parse(cf);
    cf.close();
    cj["tie_word_embeddings"] = cfg.tie_word_embeddings;
    write_file_atomic(cfg_path, cj.dump(2) + "\n");
  }
  const bool was_calibrated = calibrated != nullptr;
  const ojson calibration_report = calibrated ? calibrated->report() : ojson();
  calibrated.reset();  // unmaps the state files
  fs::remove_all(out.staging() / state_dir_name);

  uint64_t qbytes = 0;
  for (const auto& t : res.tensors)
    if (t.quantized) qbytes += t.bytes;
  res.quantized_bits_per_weight = res.quantized_params ? 8.0 * qbytes / res.quantized_params : 0;
  res.checkpoint_bits_per_weight = res.total_params ? 8.0 * res.total_bytes / res.total_params : 0;

  // nibble.json: how this checkpoint was made and what it cost per tensor.
  ojson report;
  report["nibble_version"] = NIBBLE_VERSION;
  report["created"] = utc_now_iso8601();
  report["command"] = opt.command_line;
  report["method"] = method.name;
  report["format"] = res.format;
  report["group_size"] = format.group_size;
  report["options"] = {{"keep", opt.keep_regex}, {"allow_nonfinite", opt.allow_nonfinite}, {"mse", opt.mse}};
  if (!activations.empty()) report["activations"] = activations;
  if (transform && transform->wrap_source) report["options"]["rotate_seed"] = opt.rotate_seed;
  if (const auto r = model.down_proj_rotation())
    report["online_rotation"] = {{"down_proj", {{"size", r->size}, {"seed", r->seed}}}};
  if (transform && transform->name == std::string_view("smoothquant")) report["options"]["alpha"] = opt.alpha;
  if (method.quantizer->name == "gptq") {
    report["options"]["act_order"] = opt.act_order;
    report["options"]["damp"] = opt.damp;
    report["options"]["refine"] = opt.refine;
    report["options"]["block_size"] = 128;
    report["options"]["device"] = opt.device;
  }
  if (was_calibrated) report["calibration"] = calibration_report;
  report["source"] = {{"path", fs::absolute(model_dir).lexically_normal().string()},
                      {"sha256", source_hashes.get()}};
  report["summary"] = {{"quantized_tensors", std::count_if(res.tensors.begin(), res.tensors.end(),
                                                           [](const TensorResult& t) { return t.quantized; })},
                       {"total_tensors", res.tensors.size()},
                       {"quantized_params", res.quantized_params},
                       {"total_params", res.total_params},
                       {"total_bytes", res.total_bytes},
                       {"quantized_bits_per_weight", res.quantized_bits_per_weight},
                       {"checkpoint_bits_per_weight", res.checkpoint_bits_per_weight}};
  ojson tensors = ojson::object();
  for (const auto& t : res.tensors) {
    ojson e = {{"quantized", t.quantized}, {"params", t.params}, {"bytes", t.bytes}};
    if (t.quantized) {
      e["format"] = res.format;
      e["rel_error"] = t.rel_error;
      e["max_abs_error"] = t.max_abs_error;
      e["bits_per_weight"] = t.bits_per_weight;
      if (was_calibrated) {
        e["damp_used"] = t.damp_used;
        e["damp_retries"] = t.damp_retries;
        e["dead_columns"] = t.dead_columns;
        if (opt.refine > 0)
          e["refine"] = {{"objective_before", t.refine.cost_before}, {"objective_after", t.refine.cost_after},
                         {"codes_changed", t.refine.code_changes}, {"groups_refit", t.refine.group_refits}};
      }
    } else {
      e["kept"] = t.note;
    }
    tensors[t.name] = e;
  }
  report["tensors"] = tensors;
  report["warnings"] = res.warnings;
  report["notes"] = res.notes;
  res.seconds_total = since(t_start);
  // Before the calibration: opening, planning and the finite check of every weight.
  const double seconds_checks = std::chrono::duration<double>(t_calibration - t_start).count();
  res.seconds_write = res.seconds_total - res.seconds_calibration - seconds_checks;
  report["seconds"] = {{"total", std::round(res.seconds_total * 1000) / 1000},
                       {"checks", std::round(seconds_checks * 1000) / 1000},
                       {"calibration", std::round(res.seconds_calibration * 1000) / 1000},
                       {"write", std::round(res.seconds_write * 1000) / 1000}};
  write_file_atomic(out.staging() / "nibble.json", report.dump(2) + "\n");
  out.commit();
  return res;
}

void dequantize_model(const fs::path& packed_dir, const fs::path& out_dir, const DequantizeOptions& opt) {
  NIBBLE_CHECK(opt.dtype == DType::F32 || opt.dtype == DType::BF16 || opt.dtype == DType::F16,
               "dequantize: --dtype must be f32, bf16 or f16, found {}", dtype_name(opt.dtype));
  // A GGUF file has no config.json or tokenizer.json to carry over: both are written from what it holds.
  std::unique_ptr<ModelSource> src;
  const GgufSource* gguf = nullptr;
  const std::optional<nlohmann::json> rival = rival_quantization_config(packed_dir);
  if (is_gguf_file(packed_dir)) {
    auto g = GgufSource::open(packed_dir);
    gguf = g.get();
    src = std::move(g);
  } else if (rival) {
    src = RivalSource::open(packed_dir, *rival);
  } else {
    src = CheckpointDir::open(packed_dir);
  }
  io::OutputDir out(out_dir, opt.force);
  NIBBLE_CHECK(fs::weakly_canonical(packed_dir) != out.target(), "{}: the output directory is the input directory",
               out.target().string());

  // Every float tensor becomes opt.dtype; integer tensors (none in the
  // supported architectures) would pass through unchanged.
  std::vector<io::OutputUnit> plan;
  for (const std::string& name : src->names()) {
    const TensorMeta m = src->meta(name);
    const DType dt = dtype_is_float(m.dtype) ? opt.dtype : m.dtype;
    plan.push_back({name, {{name, dt, m.shape}}, ""});
  }
  std::optional<quant::HadamardRotation> down_rotation;
  if (const auto r = src->down_proj_rotation()) down_rotation.emplace(r->size, r->seed);
  io::ShardedWriter writer(out.staging(), plan, 4ull << 30, {{"format", "pt"}});
  Progress bar("dequantize", static_cast<int64_t>(plan.size()), opt.progress, "tensors");
  for (const io::OutputUnit& u : plan) {
    bar.set_note(u.logical_name);
    Tensor t = src->load(u.logical_name);
    if (down_rotation && u.logical_name.size() > 21 &&
        u.logical_name.compare(u.logical_name.size() - 21, 21, ".mlp.down_proj.weight") == 0) {
      // The checkpoint's forward rotates down_proj's input (z·Q); a plain
      // checkpoint cannot, so fold it back: W·Qᵀ reads z directly.
      t = t.to_f32();
      down_rotation->apply_transpose(t.data_mut<float>(), t.size(0));
    }
    writer.write(u.logical_name, t.dtype() == u.stored[0].dtype ? t : t.to(u.stored[0].dtype));
    bar.advance();
  }
  bar.finish();
  writer.finish();
  const char* word = dtype_word(opt.dtype);
  if (gguf) {
    write_gguf_companions(*gguf, out.staging(), word);
    out.commit();
    return;
  }
  copy_carried(packed_dir, out.staging());

  // config.json states the dtype the weights are stored in, in the style
  // (transformers 4 "torch_dtype" or 5 "dtype") the source used, and no
  // longer a rival's quantization_config (nor the files AutoGPTQ and
  // auto-round keep it in beside the config).
  const fs::path cfg_path = out.staging() / "config.json";
  std::ifstream cf(cfg_path);
  ojson cfg = ojson::parse(cf);
  cf.close();
  if (rival) {
    cfg.erase("quantization_config");
    fs::remove(out.staging() / "quantize_config.json");      // AutoGPTQ
    fs::remove(out.staging() / "quantization_config.json");  // auto-round
  }
  if (cfg.contains("dtype")) cfg["dtype"] = word;
  if (cfg.contains("torch_dtype") || !cfg.contains("dtype")) cfg["torch_dtype"] = word;
  write_file_atomic(cfg_path, cfg.dump(2) + "\n");
  out.commit();
}

}  // namespace nibble
