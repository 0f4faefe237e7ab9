#include "quant/calibrate.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <future>
#include <memory>
#include <optional>

#include "nibble/arch.h"
#include "nibble/calibration.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda_calibrate.h"
#endif

namespace nibble::quant {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {


std::string layer_file(int64_t i) { return fmt::format("layer-{:05d}.safetensors", i); }

constexpr const char* kHeadFile = "head.safetensors";
constexpr const char* kHiddenFile = "hidden.safetensors";
constexpr const char* kStateFile = "state.json";

ojson info_json(const QuantizeInfo& i) {
  return {{"damp_used", i.damp_used},         {"damp_retries", i.damp_retries}, {"dead_columns", i.dead_columns},
          {"rel_error", i.rel_error},         {"max_abs_error", i.max_abs_error},
          {"refine_before", i.refine.cost_before}, {"refine_after", i.refine.cost_after},
          {"refine_codes", i.refine.code_changes}, {"refine_groups", i.refine.group_refits}};
}
QuantizeInfo info_from(const ojson& j) {
  QuantizeInfo i{j.at("damp_used").get<double>(), j.at("damp_retries").get<int>(), j.at("dead_columns").get<int64_t>(),
                 j.at("rel_error").get<double>(), j.at("max_abs_error").get<double>(), {}};
  i.refine.cost_before = j.value("refine_before", 0.0);
  i.refine.cost_after = j.value("refine_after", 0.0);
  i.refine.code_changes = j.value("refine_codes", int64_t{0});
  i.refine.group_refits = j.value("refine_groups", int64_t{0});
  return i;
}


// Test hook: stop the process (as a kill would) after this layer's state is saved.
int64_t abort_after_layer() {
  const char* e = std::getenv("NIBBLE_TEST_ABORT_AFTER_LAYER");
  return e ? std::atoll(e) : -1;
}

// On the GPU a layer takes about a second while the hidden states of a large
// calibration set are gigabytes: they are saved only when this long has passed
// since the last save, so a resumed run redoes at most this much work (a run
// killed during the head redoes the layers after the last save; the head
// follows the last layer within seconds, so there is no save just for it).
constexpr double kGpuHiddenSaveSeconds = 60;

// A layer transform reshapes layer L (what it computes stays the same); the
// plain tensors it may have changed (norm gains, biases, the linears that stay
// unquantized) are kept in `out`, their names in meta["nibble.replaced"].
void transform_layer(const LayerTransform& transform, const ModelConfig& c, DecoderLayer& L,
                     std::map<LinearInput, MatrixStats>& stats, const std::set<std::string>& selected,
                     const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out,
                     std::map<std::string, std::string>& meta) {
  const ojson chosen =
      transform.apply(c, L, stats, [&](const char* slot) { return selected.count(prefix + slot + ".weight") > 0; });
  meta["nibble.transform"] = chosen.dump();
  out.emplace_back(prefix + "input_layernorm.weight", L.input_norm);
  out.emplace_back(prefix + "post_attention_layernorm.weight", L.post_norm);
  for (const LinearSlot& s : decoder_linears()) {
    const LinearWeight& lw = L.*s.member;
    if (lw.bias.defined() && lw.bias.numel() > 0) out.emplace_back(prefix + s.name + ".bias", lw.bias);
    if (!selected.count(prefix + s.name + ".weight")) out.emplace_back(prefix + s.name + ".weight", lw.dense_weight());
  }
  ojson names = ojson::array();
  for (const auto& [n, t] : out) names.push_back(n);
  meta["nibble.replaced"] = names.dump();
}

}  // namespace

std::pair<double, double> weight_error(const Tensor& a, const Tensor& b) {
  double err2 = 0, ref2 = 0, max_abs = 0;
  const int64_t n = a.numel();  // hoisted: numel() walks the shape
  const float *pa = a.data<float>(), *pb = b.data<float>();
  for (int64_t k = 0; k < n; ++k) {
    const double d = static_cast<double>(pb[k]) - pa[k];
    err2 += d * d;
    ref2 += static_cast<double>(pa[k]) * pa[k];
    max_abs = std::max(max_abs, std::abs(d));
  }
  return {ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2), max_abs};
}

CalibratedParts::CalibratedParts(const fs::path& source, const std::vector<fs::path>& weight_files,
                                 const ModelSource& src,
                                 const std::set<std::string>& selected, const Quantizer& quantizer,
                                 const LayerTransform* transform, const FormatChoice& format,
                                 const QuantizeOptions& opt, const fs::path& dir, std::vector<std::string>& warnings,
                                 std::vector<std::string>& notes, const Sink& sink)
    : format_(format) {
  const auto start = std::chrono::steady_clock::now();
  const ModelConfig& c = src.config();
  // ---- the calibration set
  const std::optional<Tokenizer> tok = src.tokenizer();
  const std::optional<int32_t> bos = tok ? leading_bos(*tok) : std::nullopt;
  const CalibrationSet calib =
      load_calibration(opt.calib, tok ? &*tok : nullptr, bos, c.max_position_embeddings, static_cast<int32_t>(c.vocab_size));
  for (const auto& n : calib.notes) notes.push_back("calibration: " + n);

  ojson files = ojson::array();
  for (const auto& f : opt.calib.files) files.push_back(fs::absolute(f).lexically_normal().string());
  report_ = {{"files", files},
             {"samples", opt.calib.samples},
             {"length", calib.length},
             {"seed", opt.calib.seed},
             {"windows", opt.calib.windows},
             {"tokens", calib.length * opt.calib.samples},
             {"data_tokens", calib.stream_tokens},
             {"sequential", opt.sequential},
             {"bos", bos ? ojson(*bos) : ojson()},
             {"ids_sha256", calib.sha256}};

  // ---- state: what a resumed run must agree on
  ojson weights = ojson::object();
  for (const fs::path& f : weight_files) weights[f.filename().string()] = fs::file_size(f);
  ojson sel = ojson::array();
  for (const auto& s : selected) sel.push_back(s);
  const ojson fingerprint = {{"source", fs::absolute(source).lexically_normal().string()},
                             {"weights", weights},
                             {"method", opt.method},
                             {"format", format.canonical_name()},
                             {"mse", opt.mse},
                             {"act_order", opt.act_order},
                             {"refine", opt.refine},
                             {"damp", opt.damp},
                             {"alpha", opt.alpha},
                             {"rotate_seed", opt.rotate_seed},
                             {"sequential", opt.sequential},
                             {"calibration_ids_sha256", calib.sha256},
                             {"quantized", sel}};
  fs::create_directories(dir);
  int64_t next_layer = 0;
  const bool have_state = fs::exists(dir / kStateFile);
  if (have_state) {
    std::ifstream f(dir / kStateFile);
    const ojson old = ojson::parse(f, nullptr, false);
    NIBBLE_CHECK(!old.is_discarded() && old.contains("fingerprint"), "{}: unreadable; pass --force to start over",
                 (dir / kStateFile).string());
    std::vector<std::string> diff;
    for (const auto& [k, v] : fingerprint.items())
      if (!old["fingerprint"].contains(k) || old["fingerprint"][k] != v) diff.push_back(k);
    NIBBLE_CHECK(diff.empty(),
                 "--resume: the interrupted run in {} used different settings ({} differ); pass --force to start over",
                 dir.string(), fmt::join(diff, ", "));
  } else {
    write_file_atomic(dir / kStateFile, ojson{{"version", 1}, {"fingerprint", fingerprint}}.dump(2) + "\n");
  }

  // --device cuda: the whole calibration forward runs on the GPU too
  // (include/nibble/cuda_calibrate.h), which embeds the calibration set
  // itself; the host copy of the hidden states then serves only the
  // checkpoints and is allocated at the first save.
  const bool on_gpu = opt.device == "cuda";
  LayerStream stream(src, calib.sequences, /*embed=*/!on_gpu);
  if (have_state && fs::exists(dir / kHiddenFile)) {
    const io::SafetensorsFile h = io::SafetensorsFile::open(dir / kHiddenFile);
    next_layer = std::stoll(h.metadata().at("next_layer"));
    for (size_t s = 0; s < stream.num_sequences(); ++s) {
      const Tensor t = h.tensor(fmt::format("h.{}", s));
      NIBBLE_CHECK(t.numel() == static_cast<int64_t>(stream.hidden(s).size()), "{}: hidden state {} has the wrong size",
                   (dir / kHiddenFile).string(), s);
      std::copy_n(t.data<float>(), t.numel(), stream.hidden(s).data());
    }
    for (int64_t i = 0; i < next_layer; ++i)
      NIBBLE_CHECK(fs::exists(dir / layer_file(i)), "{}: missing; pass --force to start over",
                   (dir / layer_file(i)).string());
    resumed_from_ = next_layer;
    notes.push_back(fmt::format("resumed: layers 0..{} were done, continuing at layer {}", next_layer - 1, next_layer));
  }

#ifdef NIBBLE_HAVE_CUDA
  std::unique_ptr<cuda::GpuLayerStream> gpu;
  quant::GptqOptions gpu_opt;
  gpu_opt.damp = opt.damp;
  gpu_opt.act_order = opt.act_order;
  if (on_gpu) {
    std::vector<int64_t> lengths;
    for (size_t s = 0; s < stream.num_sequences(); ++s) lengths.push_back(stream.length(s));
    std::string why;
    NIBBLE_CHECK(cuda::GpuLayerStream::supports(src, &why), "--device cuda: {}; use --device cpu", why);
    gpu = std::make_unique<cuda::GpuLayerStream>(c, lengths);
    if (next_layer > 0)  // resumed: the saved states
      for (size_t s = 0; s < stream.num_sequences(); ++s) gpu->upload_hidden(s, stream.hidden(s).data());
    else
      gpu->embed(src.load("model.embed_tokens.weight"), calib.sequences);
    if (!transform && next_layer < c.num_layers) gpu->prefetch_layer(src, next_layer);
  }
#else
  NIBBLE_CHECK(!on_gpu, "--device cuda: this build has no CUDA backend (build with NIBBLE_CUDA=on)");
#endif
  auto last_hidden_save = std::chrono::steady_clock::now();
  // Where the time went, per step (nibble.json "calibration"."seconds"); on
  // the GPU each step waits for its device work, so the split is honest.
  using clock = std::chrono::steady_clock;
  std::map<std::string, double> seconds;
  auto mark = start;
  auto lap = [&](const char* step) {
#ifdef NIBBLE_HAVE_CUDA
    if (on_gpu) cuda::synchronize();
#endif
    const auto now = clock::now();
    seconds[step] += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };

  const bool head_selected = selected.count("lm_head.weight") > 0;
  const int64_t todo = (c.num_layers - next_layer) + (head_selected && !fs::exists(dir / kHeadFile) ? 1 : 0);
  Progress bar("calibrate", todo, opt.progress, "layers");
  const int64_t abort_at = abort_after_layer();

  // The packed parts of a quantized matrix, named after it.
  auto store_parts = [&](const std::string& name, const QuantizedMatrix& q,
                         std::vector<std::pair<std::string, Tensor>>& out) {
    const std::vector<Tensor> parts = format.spec->pack(q);
    const std::string prefix = name.substr(0, name.size() - 7);  // drop ".weight"
    const auto specs = format.spec->parts(q.rows, q.cols, format.group_size);
    for (size_t p = 0; p < parts.size(); ++p) out.emplace_back(prefix + "." + specs[p].suffix, parts[p]);
  };
  // Records a matrix's QuantizeInfo in `infos` (and a warning when the
  // Cholesky needed more damping).
  auto record = [&](const std::string& name, const QuantizeInfo& info, ojson& infos) {
    if (info.damp_retries > 0)
      warnings.push_back(fmt::format("{}: Cholesky failed {} time(s); damping raised to {}", name, info.damp_retries,
                                     info.damp_used));
    infos[name] = info_json(info);
  };
#ifdef NIBBLE_HAVE_CUDA
  // The same for a GPU GPTQ result, whose weight errors are already in `info`.
  auto record_gptq = [&](const std::string& name, const GptqResult& r, QuantizeInfo info, ojson& infos) {
    info.damp_used = r.damp_used;
    info.damp_retries = r.damp_retries;
    info.dead_columns = r.dead_columns;
    record(name, info, infos);
  };
#endif
  // Quantizes w with stats; returns the stored parts and the dequantized weight.
  auto quantize_one = [&](const std::string& name, const Tensor& w, const MatrixStats& stats,
                          std::vector<std::pair<std::string, Tensor>>& out, ojson& infos) {
    QuantizeInfo info;
    const QuantizedMatrix q = quantizer.quantize(w, &stats, &info);
    store_parts(name, q, out);
    Tensor back = Tensor::zeros(DType::F32, {q.rows, q.cols});
    dequantize(q, back.data_mut<float>());
    std::tie(info.rel_error, info.max_abs_error) = weight_error(w, back);
    record(name, info, infos);
    return back;
  };

  lap("setup");  // sampling, tokenizing and embedding the calibration set; the resumed state
  // The layer checkpoint is written by `job`: on the GPU in the background,
  // while the device runs the next layer (one job at a time, in order, so the
  // hidden states never name a layer whose file is not complete).
  std::future<void> writing;
  auto finish_writing = [&] {
    if (writing.valid()) writing.get();  // rethrows the job's error
  };
  for (int64_t i = next_layer; i < c.num_layers; ++i) {
    bar.set_note(fmt::format("layer {}", i));
    const std::string prefix = fmt::format("model.layers.{}.", i);
    auto out = std::make_shared<std::vector<std::pair<std::string, Tensor>>>();
    auto infos = std::make_shared<ojson>(ojson::object());
    auto meta = std::make_shared<std::map<std::string, std::string>>();
    std::set<LinearInput> inputs;  // one Hessian per distinct input that a selected matrix reads
    for (const LinearSlot& s : decoder_linears())
      if (selected.count(prefix + s.name + ".weight")) inputs.insert(s.input);
    std::map<LinearInput, MatrixStats> stats;
    // GPU results still to be packed (by the job).
    auto results = std::make_shared<std::vector<std::pair<std::string, GptqResult>>>();
    if (!on_gpu) {
      DecoderLayer L = DecoderLayer::load(src, i, /*dense=*/true);
      lap("load");
      for (const LinearSlot& s : decoder_linears())
        if (inputs.count(s.input) && !stats.count(s.input))
          stats.emplace(s.input, MatrixStats((L.*s.member).in_features()));
      const InputTap tap = [&](LinearInput which, const float* x, int64_t n, int64_t) {
        auto it = stats.find(which);
        if (it != stats.end()) it->second.add(x, n);
      };
      // Sequential: the stream holds the quantized model's hidden states; the
      // layer's own weights are still the originals here. Not sequential: the
      // stream is the original model's and moves on through the original layer.
      stream.apply(L, stats.empty() ? nullptr : &tap, /*advance=*/!opt.sequential);
      lap("forward + Hessians");
      if (transform) transform_layer(*transform, c, L, stats, selected, prefix, *out, *meta);
      for (const LinearSlot& s : decoder_linears()) {
        const std::string name = prefix + s.name + ".weight";
        if (!selected.count(name)) continue;
        bar.set_note(fmt::format("layer {} {}", i, s.name));
        MatrixStats& st = stats.at(s.input);
        st.finalize();
        LinearWeight& lw = L.*s.member;
        Tensor back = quantize_one(name, lw.dense_weight(), st, *out, *infos);
        Tensor bias = lw.bias;
        lw = LinearWeight::dense(std::move(back));
        lw.bias = bias;
      }
      lap("quantize");
      if (opt.sequential) stream.apply(L, nullptr, /*advance=*/true);
      lap("forward (advance)");
    }
#ifdef NIBBLE_HAVE_CUDA
    if (on_gpu) {
      // The same steps with the Hessians and the weights left on the device.
      std::map<LinearInput, cuda::GpuHessian> hess;
      std::array<cuda::GpuHessian*, 4> taps{};
      for (const LinearSlot& s : decoder_linears())
        if (inputs.count(s.input) && !hess.count(s.input)) {
          const int64_t dim = src.meta(prefix + s.name + ".weight").shape.at(1);
          hess.emplace(s.input, cuda::GpuHessian(dim, cuda::HessianPrecision::BF16));
          taps[static_cast<int>(s.input)] = &hess.at(s.input);
        }
      lap("Hessian buffers");
      std::optional<DecoderLayer> L;  // on the host only for a transform
      if (transform) {
        L = DecoderLayer::load(src, i, /*dense=*/true);
        gpu->load_layer(*L);
      } else {
        gpu->load_layer(src, i);
        if (i + 1 < c.num_layers) gpu->prefetch_layer(src, i + 1);
      }
      lap("load");
      gpu->apply(taps, /*advance=*/!opt.sequential);
      lap("forward + Hessians");
      if (transform) {
        for (auto& [in, h] : hess) stats.emplace(in, h.to_stats());
        transform_layer(*transform, c, *L, stats, selected, prefix, *out, *meta);
        gpu->load_layer(*L);
      }
      std::map<LinearInput, cuda::GpuPreparedHessian> prepared;
      std::map<LinearInput, cuda::DeviceBuffer> objective;  // --refine's A per input
      const auto& slots = decoder_linears();
      for (size_t k = 0; k < slots.size(); ++k) {
        const LinearSlot& s = slots[k];
        const std::string name = prefix + s.name + ".weight";
        if (!selected.count(name)) continue;
        bar.set_note(fmt::format("layer {} {}", i, s.name));
        if (!prepared.count(s.input))
          prepared.emplace(s.input, transform ? cuda::prepare_hessian(stats.at(s.input), gpu_opt)
                                              : cuda::prepare_hessian(hess.at(s.input), gpu_opt));
        if (opt.refine > 0 && !objective.count(s.input))
          objective.emplace(s.input, transform ? cuda::refine_objective(stats.at(s.input), prepared.at(s.input))
                                               : cuda::refine_objective(hess.at(s.input).device_h(),
                                                                        prepared.at(s.input)));
        lap("prepare");
        QuantizeInfo info;
        const cuda::GpuRefine refine{opt.refine, opt.refine > 0 ? &objective.at(s.input) : nullptr, &info.refine};
        GptqResult r = gpu->quantize_linear(k, prepared.at(s.input), format, opt.mse, gpu_opt, &info.rel_error,
                                            &info.max_abs_error, refine);
        record_gptq(name, r, info, *infos);
        results->emplace_back(name, std::move(r));
        lap("sweep");
      }
      if (opt.sequential) gpu->apply({}, /*advance=*/true);
      lap("forward (advance)");
    }
#endif
    // Checkpoint: the layer's parts, then (on the GPU at most every
    // kGpuHiddenSaveSeconds) the hidden states that follow it.
    const double since = std::chrono::duration<double>(clock::now() - last_hidden_save).count();
    const bool save_hidden = !on_gpu || since >= kGpuHiddenSaveSeconds || abort_at == i;
    finish_writing();  // the previous job no longer reads the host hidden states
    lap("wait for the writer");
#ifdef NIBBLE_HAVE_CUDA
    if (on_gpu && save_hidden)
      for (size_t s = 0; s < stream.num_sequences(); ++s) gpu->download_hidden(s, stream.hidden(s).data());
#endif
    if (save_hidden) last_hidden_save = clock::now();
    auto job = [&, i, out, infos, meta, results, save_hidden] {
      for (const auto& [name, r] : *results) store_parts(name, r.to_quantized(*format.spec, format.group_size), *out);
      (*meta)["nibble.infos"] = infos->dump();
      io::save_safetensors(dir / layer_file(i), *out, *meta);
      if (sink)
        for (const auto& [name, t] : *out) sink(name, t);
      if (!save_hidden) return;
      std::vector<std::pair<std::string, Tensor>> hidden;
      for (size_t s = 0; s < stream.num_sequences(); ++s)
        hidden.emplace_back(fmt::format("h.{}", s), Tensor::view(DType::F32, {stream.length(s), c.hidden_size},
                                                                 stream.hidden(s).data(), nullptr));
      io::save_safetensors(dir / kHiddenFile, hidden, {{"next_layer", std::to_string(i + 1)}});
    };
    if (on_gpu)
      writing = std::async(std::launch::async, job);
    else
      job();
    lap(on_gpu ? "download hidden states" : "write");
    bar.advance();
    if (abort_at == i) {
      finish_writing();
      std::_Exit(3);
    }
  }
  if (head_selected && !fs::exists(dir / kHeadFile)) {
    bar.set_note("lm_head");
    std::vector<std::pair<std::string, Tensor>> out;
    ojson infos = ojson::object();
    if (!on_gpu) {
      MatrixStats st(c.hidden_size);
      for (size_t s = 0; s < stream.num_sequences(); ++s) {
        const std::vector<float> xn = stream.final_normed(s);
        st.add(xn.data(), stream.length(s));
      }
      st.finalize();
      lap("head: Hessian");
      quantize_one("lm_head.weight", src.load("lm_head.weight").to_f32(), st, out, infos);
    }
#ifdef NIBBLE_HAVE_CUDA
    if (on_gpu) {
      cuda::GpuHessian h(c.hidden_size);
      gpu->add_final_normed(src.load("model.norm.weight"), h);
      const cuda::GpuPreparedHessian prepared = cuda::prepare_hessian(h, gpu_opt);
      const cuda::DeviceBuffer objective =
          opt.refine > 0 ? cuda::refine_objective(h.device_h(), prepared) : cuda::DeviceBuffer();
      lap("head: Hessian");
      QuantizeInfo info;
      const GptqResult r = cuda::gptq_matrix(src.load("lm_head.weight"), prepared, format, opt.mse, gpu_opt,
                                             &info.rel_error, &info.max_abs_error,
                                             cuda::GpuRefine{opt.refine, &objective, &info.refine});
      store_parts("lm_head.weight", r.to_quantized(*format.spec, format.group_size), out);
      record_gptq("lm_head.weight", r, info, infos);
    }
#endif
    io::save_safetensors(dir / kHeadFile, out, {{"nibble.infos", infos.dump()}});
    if (sink)
      for (const auto& [name, t] : out) sink(name, t);
    lap("head: quantize + write");
    bar.advance();
  }
  finish_writing();  // the last layer's checkpoint, written while the head was quantized
  lap("wait for the writer");
  bar.finish();
  // This run's share (a resumed run counts only what it did itself).
  double total = 0;
  for (const auto& [step, t] : seconds) total += t;
  ojson split = ojson::object();
  for (const auto& [step, t] : seconds) split[step] = std::round(t * 1000) / 1000;
  report_["seconds"] = {{"device", opt.device}, {"total", std::round(total * 1000) / 1000}, {"steps", split}};

  // Index the saved parts.
  std::vector<fs::path> paths;
  for (int64_t i = 0; i < c.num_layers; ++i) paths.push_back(dir / layer_file(i));
  if (head_selected) paths.push_back(dir / kHeadFile);
  for (const fs::path& p : paths) {
    files_.push_back(io::SafetensorsFile::open(p));
    const auto& md = files_.back().metadata();
    // The state files are this program's own; one that is not (another
    // version's, or damaged) is named, not reported as a JSON library's error.
    try {
      const ojson infos = ojson::parse(md.at("nibble.infos"));
      for (const auto& [name, j] : infos.items()) {
        info_[name] = info_from(j);
        file_of_[name] = files_.size() - 1;
      }
      if (auto it = md.find("nibble.replaced"); it != md.end())
        for (const auto& n : ojson::parse(it->second)) replaced_[n.get<std::string>()] = files_.size() - 1;
      if (auto it = md.find("nibble.transform"); it != md.end())
        report_["transform"][p.stem().string()] = ojson::parse(it->second);
    } catch (const std::exception& e) {  // nlohmann's, or std::out_of_range from at()
      NIBBLE_FAIL("{}: not a calibration state file this nibble wrote ({}); pass --force to start over", p.string(),
                  e.what());
    }
  }
  for (const auto& s : selected) NIBBLE_CHECK(info_.count(s), "calibration state has no result for {}", s);
}

Tensor CalibratedParts::replacement(const std::string& name) const {
  auto it = replaced_.find(name);
  return it == replaced_.end() ? Tensor() : files_.at(it->second).tensor(name);
}

std::vector<Tensor> CalibratedParts::parts(const std::string& name) const {
  const io::SafetensorsFile& f = files_.at(file_of_.at(name));
  const std::string prefix = name.substr(0, name.size() - 7);  // drop ".weight"
  std::vector<Tensor> out;
  for (const PartSpec& p : format_.spec->parts(1, 1, format_.group_size)) out.push_back(f.tensor(prefix + "." + p.suffix));
  return out;
}

}  // namespace nibble::quant
