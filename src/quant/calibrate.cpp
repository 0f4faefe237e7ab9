#include "quant/calibrate.h"

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "nibble/arch.h"
#include "nibble/calibration.h"
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"

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
          {"rel_error", i.rel_error},         {"max_abs_error", i.max_abs_error}};
}
QuantizeInfo info_from(const ojson& j) {
  return {j.at("damp_used").get<double>(), j.at("damp_retries").get<int>(), j.at("dead_columns").get<int64_t>(),
          j.at("rel_error").get<double>(), j.at("max_abs_error").get<double>()};
}


// Test hook: stop the process (as a kill would) after this layer's state is saved.
int64_t abort_after_layer() {
  const char* e = std::getenv("NIBBLE_TEST_ABORT_AFTER_LAYER");
  return e ? std::atoll(e) : -1;
}

}  // namespace

std::pair<double, double> weight_error(const Tensor& a, const Tensor& b) {
  double err2 = 0, ref2 = 0, max_abs = 0;
  for (int64_t k = 0; k < a.numel(); ++k) {
    const double d = static_cast<double>(b.data<float>()[k]) - a.data<float>()[k];
    err2 += d * d;
    ref2 += static_cast<double>(a.data<float>()[k]) * a.data<float>()[k];
    max_abs = std::max(max_abs, std::abs(d));
  }
  return {ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2), max_abs};
}

CalibratedParts::CalibratedParts(const CheckpointDir& checkpoint, const ModelSource& src,
                                 const std::set<std::string>& selected, const Quantizer& quantizer,
                                 const LayerTransform* transform, const FormatChoice& format,
                                 const QuantizeOptions& opt, const fs::path& dir, std::vector<std::string>& warnings,
                                 std::vector<std::string>& notes)
    : format_(format) {
  const ModelConfig& c = src.config();
  // ---- the calibration set
  std::unique_ptr<Tokenizer> tok;
  if (const fs::path tj = src.tokenizer_json(); !tj.empty()) tok = std::make_unique<Tokenizer>(Tokenizer::from_file(tj));
  const std::optional<int32_t> bos = tok ? leading_bos(*tok) : std::nullopt;
  const CalibrationSet calib =
      load_calibration(opt.calib, tok.get(), bos, c.max_position_embeddings, static_cast<int32_t>(c.vocab_size));
  for (const auto& n : calib.notes) notes.push_back("calibration: " + n);

  ojson files = ojson::array();
  for (const auto& f : opt.calib.files) files.push_back(fs::absolute(f).lexically_normal().string());
  report_ = {{"files", files},
             {"samples", opt.calib.samples},
             {"length", calib.length},
             {"seed", opt.calib.seed},
             {"tokens", calib.length * opt.calib.samples},
             {"data_tokens", calib.stream_tokens},
             {"sequential", opt.sequential},
             {"bos", bos ? ojson(*bos) : ojson()},
             {"ids_sha256", calib.sha256}};

  // ---- state: what a resumed run must agree on
  ojson weights = ojson::object();
  for (const fs::path& f : checkpoint.weight_files()) weights[f.filename().string()] = fs::file_size(f);
  ojson sel = ojson::array();
  for (const auto& s : selected) sel.push_back(s);
  const ojson fingerprint = {{"source", fs::absolute(checkpoint.dir()).lexically_normal().string()},
                             {"weights", weights},
                             {"method", opt.method},
                             {"format", format.canonical_name()},
                             {"mse", opt.mse},
                             {"act_order", opt.act_order},
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

  LayerStream stream(src, calib.sequences);
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

  const bool head_selected = selected.count("lm_head.weight") > 0;
  const int64_t todo = (c.num_layers - next_layer) + (head_selected && !fs::exists(dir / kHeadFile) ? 1 : 0);
  Progress bar("calibrate", todo, opt.progress, "layers");
  const int64_t abort_at = abort_after_layer();

  // Quantizes w with stats; returns the stored parts and the dequantized weight.
  auto quantize_one = [&](const std::string& name, const Tensor& w, const MatrixStats& stats,
                          std::vector<std::pair<std::string, Tensor>>& out, ojson& infos) {
    QuantizeInfo info;
    const QuantizedMatrix q = quantizer.quantize(w, &stats, &info);
    if (info.damp_retries > 0)
      warnings.push_back(fmt::format("{}: Cholesky failed {} time(s); damping raised to {}", name, info.damp_retries,
                                     info.damp_used));
    const std::vector<Tensor> parts = format.spec->pack(q);
    const std::string prefix = name.substr(0, name.size() - 7);  // drop ".weight"
    const auto specs = format.spec->parts(q.rows, q.cols, format.group_size);
    for (size_t p = 0; p < parts.size(); ++p) out.emplace_back(prefix + "." + specs[p].suffix, parts[p]);
    Tensor back = Tensor::zeros(DType::F32, {q.rows, q.cols});
    dequantize(q, back.data_mut<float>());
    std::tie(info.rel_error, info.max_abs_error) = weight_error(w, back);
    infos[name] = info_json(info);
    return back;
  };

  for (int64_t i = next_layer; i < c.num_layers; ++i) {
    bar.set_note(fmt::format("layer {}", i));
    DecoderLayer L = DecoderLayer::load(src, i, /*dense=*/true);
    const std::string prefix = fmt::format("model.layers.{}.", i);
    // One Hessian per distinct input that a selected matrix reads.
    std::map<LinearInput, MatrixStats> stats;
    for (const LinearSlot& s : decoder_linears())
      if (selected.count(prefix + s.name + ".weight") && !stats.count(s.input))
        stats.emplace(s.input, MatrixStats((L.*s.member).in_features()));
    const InputTap tap = [&](LinearInput which, const float* x, int64_t n, int64_t) {
      auto it = stats.find(which);
      if (it != stats.end()) it->second.add(x, n);
    };
    // Sequential: the stream holds the quantized model's hidden states; the
    // layer's own weights are still the originals here. Not sequential: the
    // stream is the original model's and moves on through the original layer.
    stream.apply(L, stats.empty() ? nullptr : &tap, /*advance=*/!opt.sequential);
    std::vector<std::pair<std::string, Tensor>> out;
    ojson infos = ojson::object();
    std::map<std::string, std::string> meta;
    if (transform) {
      // Reshape the layer (what it computes stays the same), then keep every
      // plain tensor the transform may have changed: the norm gains, the
      // biases and the linears that stay unquantized.
      const ojson chosen = transform->apply(
          c, L, stats, [&](const char* slot) { return selected.count(prefix + slot + ".weight") > 0; });
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
    for (const LinearSlot& s : decoder_linears()) {
      const std::string name = prefix + s.name + ".weight";
      if (!selected.count(name)) continue;
      bar.set_note(fmt::format("layer {} {}", i, s.name));
      MatrixStats& st = stats.at(s.input);
      st.finalize();
      LinearWeight& lw = L.*s.member;
      Tensor back = quantize_one(name, lw.dense_weight(), st, out, infos);
      Tensor bias = lw.bias;
      lw = LinearWeight::dense(std::move(back));
      lw.bias = bias;
    }
    if (opt.sequential) stream.apply(L, nullptr, /*advance=*/true);
    // Checkpoint: the layer's parts, then the hidden states that follow it.
    meta["nibble.infos"] = infos.dump();
    io::save_safetensors(dir / layer_file(i), out, meta);
    std::vector<std::pair<std::string, Tensor>> hidden;
    for (size_t s = 0; s < stream.num_sequences(); ++s)
      hidden.emplace_back(fmt::format("h.{}", s),
                          Tensor::view(DType::F32, {stream.length(s), c.hidden_size}, stream.hidden(s).data(), nullptr));
    io::save_safetensors(dir / kHiddenFile, hidden, {{"next_layer", std::to_string(i + 1)}});
    bar.advance();
    if (abort_at == i) std::_Exit(3);
  }

  if (head_selected && !fs::exists(dir / kHeadFile)) {
    bar.set_note("lm_head");
    MatrixStats st(c.hidden_size);
    for (size_t s = 0; s < stream.num_sequences(); ++s) {
      const std::vector<float> xn = stream.final_normed(s);
      st.add(xn.data(), stream.length(s));
    }
    st.finalize();
    std::vector<std::pair<std::string, Tensor>> out;
    ojson infos = ojson::object();
    quantize_one("lm_head.weight", src.load("lm_head.weight").to_f32(), st, out, infos);
    io::save_safetensors(dir / kHeadFile, out, {{"nibble.infos", infos.dump()}});
    bar.advance();
  }
  bar.finish();

  // Index the saved parts.
  std::vector<fs::path> paths;
  for (int64_t i = 0; i < c.num_layers; ++i) paths.push_back(dir / layer_file(i));
  if (head_selected) paths.push_back(dir / kHeadFile);
  for (const fs::path& p : paths) {
    files_.push_back(io::SafetensorsFile::open(p));
    const ojson infos = ojson::parse(files_.back().metadata().at("nibble.infos"));
    for (const auto& [name, j] : infos.items()) {
      info_[name] = info_from(j);
      file_of_[name] = files_.size() - 1;
    }
    const auto& md = files_.back().metadata();
    if (auto it = md.find("nibble.replaced"); it != md.end())
      for (const auto& n : ojson::parse(it->second)) replaced_[n.get<std::string>()] = files_.size() - 1;
    if (auto it = md.find("nibble.transform"); it != md.end())
      report_["transform"][p.stem().string()] = ojson::parse(it->second);
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
