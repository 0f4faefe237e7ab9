// libFuzzer target for loading a model from GGUF (GgufSource: the config from
// `<arch>.*` metadata, the tensor name map, the q/k row order).
//
// The input is written to a file in /dev/shm (GgufSource opens a path),
// opened, and removed. It must either open or throw nibble::Error with one line that starts
// with the file's path. An opened model is used as the forward uses one: its
// config, every tensor's meta, and every tensor of up to 1 MiB loaded, where
// each load may only refuse with such an Error. A loaded tensor must have the
// shape its meta promised. The tokenizer the file carries must build (or
// refuse with such an Error) and encode a fixed text to ids inside its vocabulary.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_checks.h"
#include "nibble/gguf.h"

const char* const fuzz::kTarget = "fuzz_gguf_model";

namespace {

const std::string& input_path() {
  static const std::string path = fuzz::shm_path(".gguf");
  return path;
}

using fuzz::broken;

void check_error(const nibble::Error& e) { fuzz::check_error(e, input_path() + ": "); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::write_file(input_path(), std::string_view(reinterpret_cast<const char*>(data), size));
  try {
    const auto src = nibble::GgufSource::open(input_path());
    const nibble::ModelConfig& c = src->config();
    if (c.num_layers <= 0 || c.hidden_size <= 0 || c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0)
      broken("an opened model has a non-positive size in its config");
    for (const std::string& name : src->names()) {
      if (!src->contains(name)) broken("names() lists a tensor contains() denies");
      const nibble::TensorMeta m = src->meta(name);
      if (src->file().info(src->gguf_name(name)).nbytes > (1u << 20)) continue;
      try {
        const nibble::Tensor t = src->load(name);
        if (t.shape() != m.shape) broken("load() returned another shape than meta()");
      } catch (const nibble::Error& e) {
        check_error(e);
      }
    }
    // The tokenizer the file carries (tokenizer_json_from_gguf), used as run and ppl use it.
    try {
      if (const std::optional<nibble::Tokenizer> tok = src->tokenizer()) {
        const std::vector<int32_t> ids = tok->encode("Once upon a time, 42 caf\xC3\xA9s <s>.\n", true);
        for (int32_t id : ids)
          if (id < 0 || id >= tok->vocab_size()) broken("the file's tokenizer gave an id outside its vocabulary");
        (void)tok->decode(ids);
      }
    } catch (const nibble::Error& e) {
      check_error(e);
    }
  } catch (const nibble::Error& e) {
    check_error(e);
  }
  std::remove(input_path().c_str());  // nothing left in /dev/shm between inputs or after the run
  return 0;
}
