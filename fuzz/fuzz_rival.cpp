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
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_checks.h"
#include "nibble/rival.h"
#include "nibble/safetensors.h"

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

void read_linears(const nibble::io::SafetensorsFile& f) {
  auto it = f.metadata().find("quantization_config");
  if (it == f.metadata().end()) return;
  const nlohmann::json q = nlohmann::json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (q.is_discarded()) return;  // config.json itself is read by io::read_json_file (fuzz_hf_json)
  std::unique_ptr<nibble::RivalScheme> scheme;
  try {
    scheme = nibble::make_rival_scheme(q, kName);
    (void)scheme->describe();
  } catch (const nibble::Error& e) {
    check_error(e);
    return;
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
}

void parse_one(const uint8_t* data, size_t size) {
  try {
    const auto f = nibble::io::SafetensorsFile::from_buffer(nullptr, data, size, kName);
    read_linears(f);
  } catch (const nibble::Error& e) {
    check_error(e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::whole_and_framed(data, size, parse_one);
  return 0;
}
