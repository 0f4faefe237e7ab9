// CheckpointDir: an HF model directory (plain or nibble-packed) as a TensorSource.
#include <algorithm>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "nibble/act_quant.h"
#include "nibble/arch.h"
#include "nibble/error.h"
#include "nibble/source.h"
#include "io/json_file.h"

namespace nibble {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Strips the trailing ".weight" of a linear's weight name.
std::string linear_prefix(const std::string& weight_name) {
  constexpr std::string_view kSuffix = ".weight";
  if (weight_name.size() > kSuffix.size() && weight_name.ends_with(kSuffix))
    return weight_name.substr(0, weight_name.size() - kSuffix.size());
  return weight_name;
}

}  // namespace

std::unique_ptr<CheckpointDir> CheckpointDir::open(const fs::path& dir) {
  NIBBLE_CHECK(fs::is_directory(dir), "{}: not a directory", dir.string());
  auto cp = std::unique_ptr<CheckpointDir>(new CheckpointDir());
  cp->dir_ = dir;
  NIBBLE_CHECK(fs::exists(dir / "config.json"), "{}: no config.json (expected a Hugging Face model directory)",
               dir.string());
  cp->config_ = parse_model_config(dir / "config.json");
  cp->has_config_ = true;

  // The weight files: the shards an index names, or the single model.safetensors.
  std::vector<std::string> file_names;
  json weight_map;
  const fs::path index_path = dir / "model.safetensors.index.json";
  if (fs::exists(index_path)) {
    json index = io::read_json_file(index_path);
    NIBBLE_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                 "{}: expected an object with a 'weight_map' object", index_path.string());
    weight_map = index["weight_map"];
    for (auto& [name, file] : weight_map.items()) {
      NIBBLE_CHECK(file.is_string(), "{}: weight_map['{}'] should be a file name, found {}", index_path.string(),
                   name, file.dump());
      const std::string f = file.get<std::string>();
      NIBBLE_CHECK(f.find('/') == std::string::npos && f != ".." && !f.empty(),
                   "{}: weight_map['{}'] names '{}', which is not a file in this directory", index_path.string(),
                   name, f);
      if (std::find(file_names.begin(), file_names.end(), f) == file_names.end()) file_names.push_back(f);
    }
    std::sort(file_names.begin(), file_names.end());
  } else {
    NIBBLE_CHECK(fs::exists(dir / "model.safetensors"),
                 "{}: neither model.safetensors nor model.safetensors.index.json found", dir.string());
    file_names.push_back("model.safetensors");
  }

  for (const std::string& f : file_names) {
    NIBBLE_CHECK(fs::exists(dir / f), "{}: the index names shard '{}', which does not exist", index_path.string(), f);
    cp->files_.push_back(io::SafetensorsFile::open(dir / f));
  }

  cp->index_files();

  // What the forward must do besides the weights, from nibble.json (written
  // by nibble quantize): the activation quantizer a W8A8 checkpoint was made
  // for ("activations"), and an online rotation ("online_rotation").
  if (const fs::path report = dir / "nibble.json"; fs::exists(report)) {
    const json j = io::read_json_file(report);
    if (j.is_object() && j.contains("activations") && !j["activations"].is_null()) {
      NIBBLE_CHECK(j["activations"].is_string(), "{}: \"activations\" should be the name of an activation quantizer "
                   "({}), found {}", report.string(), act_quant_names(), j["activations"].dump());
      cp->activations_ = j["activations"].get<std::string>();
      bool known = cp->activations_ == "none";
      for (const ActQuantSpec& a : act_quants()) known = known || a.name == cp->activations_;
      NIBBLE_CHECK(known, "{}: \"activations\" is '{}', which is not an activation quantizer (known: none, {})",
                   report.string(), cp->activations_, act_quant_names());
      if (cp->activations_ == "none") cp->activations_.clear();
    }
    // down_proj's input rotated online (checkpoints of --method rotate+...).
    if (j.is_object() && j.contains("online_rotation")) {
      const json& r = j["online_rotation"];
      NIBBLE_CHECK(r.is_object() && r.contains("down_proj") && r["down_proj"].contains("size") &&
                       r["down_proj"].contains("seed"),
                   "{}: 'online_rotation' should be {{\"down_proj\": {{\"size\": N, \"seed\": S}}}}, found {}",
                   report.string(), r.dump());
      const int64_t n = r["down_proj"]["size"].get<int64_t>();
      NIBBLE_CHECK(n == cp->config_.intermediate_size,
                   "{}: online_rotation.down_proj.size is {} but the config's intermediate_size is {}",
                   report.string(), n, cp->config_.intermediate_size);
      cp->down_rotation_ = OnlineRotation{n, r["down_proj"]["seed"].get<uint64_t>()};
    }
  }

  // The index and the files must agree.
  for (auto& [name, file] : weight_map.items()) {
    const io::SafetensorsFile* holder = nullptr;
    for (const auto& f : cp->files_)
      if (f.path().filename() == file.get<std::string>()) holder = &f;
    NIBBLE_CHECK(holder && holder->contains(name), "{}: the index puts tensor '{}' in {}, which does not hold it",
                 index_path.string(), name, file.get<std::string>());
  }

  return cp;
}

std::unique_ptr<CheckpointDir> CheckpointDir::open_file(const fs::path& file) {
  auto cp = std::unique_ptr<CheckpointDir>(new CheckpointDir());
  cp->dir_ = file;
  cp->files_.push_back(io::SafetensorsFile::open(file));
  cp->index_files();
  return cp;
}

const ModelConfig& CheckpointDir::config() const {
  NIBBLE_CHECK(has_config_, "{}: no config.json (a lone safetensors file)", dir_.string());
  return config_;
}

const std::map<std::string, std::string>& CheckpointDir::metadata() const {
  static const std::map<std::string, std::string> kEmpty;
  return files_.empty() ? kEmpty : files_[0].metadata();
}

void CheckpointDir::index_files() {
  CheckpointDir* cp = this;
  for (size_t fi = 0; fi < cp->files_.size(); ++fi) {
    const io::SafetensorsFile& file = cp->files_[fi];
    const std::string fname = file.path().string();
    // Quantized matrices this file declares in its metadata.
    std::map<std::string, std::string> part_owner;  // stored part name -> logical name
    std::map<std::string, Entry> quantized;
    if (auto it = file.metadata().find(kMetaTensors); it != file.metadata().end()) {
      cp->packed_ = true;
      json tensors;
      try {
        tensors = json::parse(it->second);
      } catch (const json::exception& e) {  // parse_error, or out_of_range for a number past double
        NIBBLE_FAIL("{}: __metadata__['{}'] is not valid JSON: {}", fname, kMetaTensors, e.what());
      }
      NIBBLE_CHECK(tensors.is_object(), "{}: __metadata__['{}'] should be a JSON object", fname, kMetaTensors);
      for (auto& [name, desc] : tensors.items()) {
        NIBBLE_CHECK(desc.is_object() && desc.contains("format") && desc["format"].is_string() &&
                         desc.contains("shape") && desc["shape"].is_array() && desc["shape"].size() == 2,
                     "{}: quantized tensor '{}' needs a format name and a 2-D shape in {}, found {}", fname, name,
                     kMetaTensors, desc.dump());
        Entry e;
        e.meta.name = name;
        for (const json& d : desc["shape"]) {
          NIBBLE_CHECK(d.is_number_integer() && d.get<int64_t>() > 0, "{}: '{}' has a bad shape {}", fname, name,
                       desc["shape"].dump());
          e.meta.shape.push_back(d.get<int64_t>());
        }
        e.meta.format = find_format(desc["format"].get<std::string>());
        e.meta.dtype = DType::F32;
        const std::string prefix = linear_prefix(name);
        const auto specs = e.meta.format->spec->parts(e.meta.shape[0], e.meta.shape[1], e.meta.format->group_size);
        for (const PartSpec& ps : specs) {
          const std::string stored = prefix + "." + ps.suffix;
          NIBBLE_CHECK(file.contains(stored), "{}: quantized tensor '{}' ({}) is missing its part '{}'", fname, name,
                       e.meta.format->canonical_name(), stored);
          const io::TensorInfo& ti = file.info(stored);
          NIBBLE_CHECK(ti.dtype == ps.dtype && ti.shape == ps.shape,
                       "{}: part '{}' of {} should be {} {}, found {} {}", fname, stored, e.meta.format->canonical_name(),
                       dtype_name(ps.dtype), shape_str(ps.shape), dtype_name(ti.dtype), shape_str(ti.shape));
          e.stored.emplace_back(fi, stored);
          e.meta.stored_bytes += ti.end - ti.begin;
          part_owner[stored] = name;
        }
        quantized[name] = std::move(e);
      }
    }
    for (const io::TensorInfo& ti : file.tensors()) {
      std::string logical = ti.name;
      if (auto po = part_owner.find(ti.name); po != part_owner.end()) {
        logical = po->second;
        if (cp->entries_.count(logical)) continue;  // later part of a matrix already listed
        cp->entries_[logical] = quantized[logical];
      } else {
        NIBBLE_CHECK(!cp->entries_.count(logical), "{}: tensor '{}' is stored twice (also in another shard)", fname,
                     logical);
        Entry e;
        e.meta.name = ti.name;
        e.meta.shape = ti.shape;
        e.meta.dtype = ti.dtype;
        e.meta.stored_bytes = ti.end - ti.begin;
        e.stored.emplace_back(fi, ti.name);
        cp->entries_[logical] = std::move(e);
      }
      cp->order_.push_back(logical);
    }
  }
}

std::vector<fs::path> CheckpointDir::weight_files() const {
  std::vector<fs::path> out;
  for (const auto& f : files_) out.push_back(f.path());
  return out;
}

std::string CheckpointDir::describe() const {
  const std::string files = files_.size() == 1 ? "1 file" : fmt::format("{} shards", files_.size());
  const std::string packed = std::string(packed_ ? ", packed by nibble" : "") +
                             (activations_.empty() ? "" : ", activations " + activations_);
  if (!has_config_) return fmt::format("{} ({}{})", dir_.string(), files, packed);
  return fmt::format("{} ({}, {} layers, {}{})", dir_.string(), config_.model_type, config_.num_layers, files, packed);
}

const CheckpointDir::Entry& CheckpointDir::entry(const std::string& name) const {
  auto it = entries_.find(name);
  NIBBLE_CHECK(it != entries_.end(), "{}: no tensor named '{}'", dir_.string(), name);
  return it->second;
}

TensorMeta CheckpointDir::meta(const std::string& name) const { return entry(name).meta; }

std::vector<Tensor> CheckpointDir::parts(const std::string& name) const {
  const Entry& e = entry(name);
  std::vector<Tensor> out;
  for (const auto& [fi, stored] : e.stored) out.push_back(files_[fi].tensor(stored));
  return out;
}

Tensor CheckpointDir::load(const std::string& name) const {
  const Entry& e = entry(name);
  if (!e.meta.format) return files_[e.stored[0].first].tensor(e.stored[0].second);
  return dequantize_parts(*e.meta.format, parts(name), e.meta.shape[0], e.meta.shape[1]);
}

std::optional<Tokenizer> ModelSource::tokenizer() const {
  const fs::path p = tokenizer_json();
  if (p.empty()) return std::nullopt;
  return Tokenizer::from_file(p);
}

Tokenizer require_tokenizer(const ModelSource& src, const std::string& name) {
  std::optional<Tokenizer> tok = src.tokenizer();
  NIBBLE_CHECK(tok, "{}: no tokenizer (no tokenizer.json beside the weights)", name);
  return std::move(*tok);
}

std::vector<Tensor> ModelSource::parts(const std::string& name) const {
  NIBBLE_FAIL("{}: tensor '{}' has no stored parts", describe(), name);
}

void ModelSource::validate_against_config() const {
  const ModelConfig& c = config();
  for (const ExpectedTensor& t : expected_tensors(c)) {
    NIBBLE_CHECK(contains(t.name), "{}: tensor '{}' is missing (the config implies it: {} with {} layers)",
                 describe(), t.name, c.model_type, c.num_layers);
    const TensorMeta m = meta(t.name);
    NIBBLE_CHECK(m.shape == t.shape, "{}: tensor '{}' has shape {}, but the config implies {}", describe(), t.name,
                 shape_str(m.shape), shape_str(t.shape));
  }
}

std::filesystem::path CheckpointDir::tokenizer_json() const {
  const fs::path p = dir_ / "tokenizer.json";
  return fs::exists(p) ? p : fs::path();
}

void CheckpointDir::validate_against_config() const {
  for (const ExpectedTensor& t : expected_tensors(config_)) {
    NIBBLE_CHECK(contains(t.name), "{}: tensor '{}' is missing (config.json implies it: {} with {} layers)",
                 dir_.string(), t.name, config_.model_type, config_.num_layers);
    const TensorMeta m = meta(t.name);
    NIBBLE_CHECK(m.shape == t.shape, "{}: tensor '{}' has shape {}, but config.json implies {}", dir_.string(),
                 t.name, shape_str(m.shape), shape_str(t.shape));
  }
}

std::vector<fs::path> carried_files(const fs::path& dir) {
  static const std::set<std::string> kExtensions = {".json", ".txt", ".model", ".jinja", ".tiktoken"};
  static const std::set<std::string> kSkip = {"model.safetensors.index.json", "nibble.json"};
  std::vector<fs::path> out;
  for (const auto& de : fs::directory_iterator(dir)) {
    if (!de.is_regular_file()) continue;
    const std::string name = de.path().filename().string();
    if (kSkip.count(name) || !kExtensions.count(de.path().extension().string())) continue;
    out.push_back(de.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace nibble
