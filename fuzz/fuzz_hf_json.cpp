// libFuzzer target for the JSON files of a Hugging Face directory that nibble
// parses itself: config.json (parse_model_config), tokenizer.json
// (Tokenizer::from_json) and tokenizer_config.json (Tokenizer::from_file).
// The first input byte picks the file (its value mod 3); the rest is the
// file's text.
// - config.json is written to a file in /dev/shm (the parser opens a path),
//   parsed, and removed. It parses, or throws nibble::Error with one line that
//   starts with the file's path. A parsed config keeps the promises the
//   forward relies on: positive sizes, a head count divisible by the kv-head
//   count, an even head_dim, one window per layer, a positive rope theta.
// - tokenizer.json parses, or throws one such line starting with its origin.
//   A parsed tokenizer encodes a fixed sample (special tokens and bytes
//   outside ASCII in it) to ids inside its vocabulary, or refuses with one
//   nibble::Error line; decode and StreamDecoder of those ids agree, and
//   every id below 512 decodes without throwing.
// - tokenizer_config.json is written to a directory in /dev/shm beside a fixed
//   tokenizer.json, and the tokenizer is loaded from the directory. It loads,
//   or throws one Error line that starts with the directory; a loaded
//   tokenizer's bos and eos ids, when it names them, are tokens.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checks.h"
#include "nibble/model_config.h"
#include "nibble/tokenizer.h"

const char* const fuzz::kTarget = "fuzz_hf_json";

namespace {

using fuzz::broken;
using fuzz::check_stream;

const std::string& config_path() {
  static const std::string path = fuzz::shm_path("_config.json");
  return path;
}

void fuzz_config(std::string_view text) {
  fuzz::write_file(config_path(), text);
  try {
    const nibble::ModelConfig c = nibble::parse_model_config(config_path());
    if (c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 || c.num_heads <= 0 ||
        c.num_kv_heads <= 0 || c.vocab_size <= 0)
      broken("a parsed config has a non-positive size");
    if (c.num_heads % c.num_kv_heads != 0) broken("num_heads is not a multiple of num_kv_heads");
    if (c.head_dim <= 0 || c.head_dim % 2 != 0) broken("head_dim is not positive and even");
    if (static_cast<int64_t>(c.layer_windows.size()) != c.num_layers) broken("layer_windows is not one per layer");
    if (!(c.rope_theta > 0)) broken("rope_theta is not positive");
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, config_path() + ": ");
  }
  std::remove(config_path().c_str());  // nothing left in /dev/shm between inputs or after the run
}

void fuzz_tokenizer(std::string_view text) {
  static const std::string origin = "fuzz/tokenizer.json";
  try {
    const nibble::Tokenizer tok = nibble::Tokenizer::from_json(text, origin);
    const int32_t vocab = tok.vocab_size();
    if (vocab <= 0) broken("a parsed tokenizer has an empty vocabulary");
    for (const bool special : {false, true}) {
      std::vector<int32_t> ids;
      try {
        ids = tok.encode("<s>Hello, world!  \t12 345 caf\xC3\xA9 \xE2\x96\x81x</s><|im_end|>\n", special);
      } catch (const nibble::Error& e) {
        // A vocabulary may lack what the sample needs (no byte fallback, no unk).
        fuzz::check_error(e, "");
        continue;
      }
      for (int32_t id : ids)
        if (id < 0 || id >= vocab) broken("encode() returned an id outside the vocabulary");
      check_stream(tok, ids, false);
      check_stream(tok, ids, true);
    }
    std::vector<int32_t> all;
    for (int32_t id = 0; id < vocab && id < 512; ++id) all.push_back(id);
    check_stream(tok, all, false);
    check_stream(tok, all, true);
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, origin + ": ");
  }
}

const std::string& tokenizer_dir() {
  static const std::string dir = fuzz::shm_path("");
  return dir;
}

// A fixed tokenizer.json for tokenizer_config.json to go beside: three tokens
// and Llama 2's post-processor.
constexpr const char* kFixedTokenizer = R"({"added_tokens": [
  {"id": 0, "content": "<s>", "special": true}, {"id": 1, "content": "</s>", "special": true}],
 "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
   {"Sequence": {"id": "A", "type_id": 0}}], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}},
 "model": {"type": "BPE", "vocab": {"<s>": 0, "</s>": 1, "a": 2}, "merges": []}})";

void fuzz_tokenizer_config(std::string_view text) {
  const std::string dir = tokenizer_dir();
  std::filesystem::create_directories(dir);
  fuzz::write_file(dir + "/tokenizer.json", kFixedTokenizer);
  fuzz::write_file(dir + "/tokenizer_config.json", text);
  try {
    const nibble::Tokenizer tok = nibble::Tokenizer::from_file(dir + "/tokenizer.json");
    for (const std::optional<int32_t> id : {tok.bos_id(), tok.eos_id()})
      if (id && (*id < 0 || *id >= tok.vocab_size())) broken("a bos or eos id outside the vocabulary");
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, dir + "/");
  }
  std::filesystem::remove_all(dir);  // nothing left in /dev/shm between inputs or after the run
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 3) {
    case 0:
      fuzz_config(text);
      break;
    case 1:
      fuzz_tokenizer(text);
      break;
    default:
      fuzz_tokenizer_config(text);
  }
  return 0;
}
