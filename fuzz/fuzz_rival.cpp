// libFuzzer target for the rival schemes (src/io/rival_source.cpp): GPTQ,
// AWQ, compressed-tensors, bitsandbytes and auto-round linears read back from
// their packed tensors.
//
// An input is a safetensors image like the unit tests' vectors
// (tests/data/rivals/): the tensors of one linear named "layer.*", and the
// quantization_config as the string `__metadata__.quantization_config`. It is
// tried as a whole file and "framed" (as fuzz_safetensors does: the bytes up to
// the first NUL are the header JSON, the rest the data, with a correct length
// prefix put in front), so mutations reach the config and the tensor table as
// well as the packed words.
//
// For a parsed image whose config names a scheme, every stored tensor is asked
// whether it marks a linear, and each such linear's parts are listed and its
// weight dequantized, as RivalSource::open and load() do. Each step must
// succeed or throw nibble::Error with one line that starts with the input's
// name. A dequantized weight must be a 2-D F32 tensor whose bytes are all
// readable; a linear's parts must be stored tensors and include its marker.
//
// The same image is then opened as a whole checkpoint directory, as `nibble
// eval --candidate DIR` opens one: model.safetensors beside a small fixed
// config.json carrying the quantization_config (in /dev/shm), through
// RivalSource::open. It must open or be refused with one line that names the
// directory; once open, every logical tensor's load() must give its meta()'s
// shape and dtype, and its bytes must all be readable.
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_checks.h"
#include "nibble/rival.h"
#include "nibble/safetensors.h"
#include "nibble/source.h"

const char* const fuzz::kTarget = "fuzz_rival";

namespace {

using fuzz::broken;
constexpr const char* kName = "fuzz-input";

void check_error(const nibble::Error& e) { fuzz::check_error(e, std::string(kName) + ": "); }

// The parsed image as the TensorSource the schemes read (what CheckpointDir
// is for a one-file checkpoint).
class BufferSource final : public nibble::TensorSource {
 public:
  explicit BufferSource(const nibble::io::SafetensorsFile& f) : f_(f) {}
  std::string describe() const override { return kName; }
  std::vector<std::string> names() const override {
    std::vector<std::string> n;
    for (const auto& t : f_.tensors()) n.push_back(t.name);
    return n;
  }
  bool contains(const std::string& name) const override { return f_.contains(name); }
  nibble::TensorMeta meta(const std::string& name) const override {
    const nibble::io::TensorInfo& t = f_.info(name);
    nibble::TensorMeta m;
    m.name = name;
    m.shape = t.shape;
    m.dtype = t.dtype;
    m.stored_bytes = t.end - t.begin;
    return m;
  }
  nibble::Tensor load(const std::string& name) const override { return f_.tensor(name); }

 private:
  const nibble::io::SafetensorsFile& f_;
};

// The image's quantization_config when it parses as JSON and makes a scheme (else nullopt).
std::optional<nlohmann::json> read_linears(const nibble::io::SafetensorsFile& f) {
  auto it = f.metadata().find("quantization_config");
  if (it == f.metadata().end()) return std::nullopt;
  const nlohmann::json q = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (q.is_discarded()) return std::nullopt;  // config.json itself is read by io::read_json_file (fuzz_hf_json)
  std::unique_ptr<nibble::RivalScheme> scheme;
  try {
    scheme = nibble::make_rival_scheme(q, kName);
    (void)scheme->describe();
  } catch (const nibble::Error& e) {
    check_error(e);
    return std::nullopt;
  }
  const BufferSource raw(f);
  for (const std::string& stored : raw.names()) {
    try {
      const std::optional<std::string> prefix = scheme->linear_of(stored, raw);
      if (!prefix) continue;
      const std::vector<std::string> parts = scheme->parts(*prefix, raw);
      bool has_marker = false;
      for (const std::string& p : parts) {
        if (!raw.contains(p)) broken("parts() lists a tensor that is not stored");
        has_marker = has_marker || p == stored;
      }
      if (!has_marker) broken("parts() leaves out the tensor that marks the linear");
      const nibble::Tensor w = scheme->dequantize(*prefix, raw);
      if (w.dtype() != nibble::DType::F32 || w.dim() != 2) broken("dequantize() gave no 2-D F32 tensor");
      fuzz::touch(w.raw(), w.nbytes());
    } catch (const nibble::Error& e) {
      check_error(e);
    }
  }
  return q;
}

// A small Llama config around the quantization_config: the linears are "layer.*", which the config does not
// expect, so RivalSource takes their shapes from dequantizing them.
constexpr const char* kConfig = R"({"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
  "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1, "vocab_size": 64,
  "rms_norm_eps": 1e-5, "max_position_embeddings": 128})";

void open_directory(const uint8_t* data, size_t size, const nlohmann::json& q) {
  static const std::string dir = fuzz::shm_path("_dir");
  std::filesystem::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(kConfig);
  cfg["quantization_config"] = q;
  fuzz::write_file(dir + "/config.json", cfg.dump());
  fuzz::write_file(dir + "/model.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const auto src = nibble::RivalSource::open(dir);
    for (const std::string& name : src->names()) {
      const nibble::TensorMeta m = src->meta(name);
      const nibble::Tensor t = src->load(name);
      if (t.shape() != m.shape) broken("load() gave another shape than meta()");
      if (t.dtype() != m.dtype) broken("load() gave another dtype than meta()");
      const nibble::Tensor c = t.contiguous();
      fuzz::touch(c.raw(), c.nbytes());
    }
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, dir);
  }
  std::filesystem::remove_all(dir);  // nothing left in /dev/shm between inputs or after the run
}

void parse_one(const uint8_t* data, size_t size) {
  std::optional<nlohmann::json> q;
  try {
    const auto f = nibble::io::SafetensorsFile::from_buffer(nullptr, data, size, kName);
    q = read_linears(f);
  } catch (const nibble::Error& e) {
    check_error(e);
  }
  if (q) open_directory(data, size, *q);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::whole_and_framed(data, size, parse_one);
  return 0;
}
