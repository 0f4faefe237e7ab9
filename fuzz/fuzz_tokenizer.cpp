// libFuzzer target for the tokenizer's encode and decode, on the fixtures'
// real tokenizers (stories260K: SentencePiece with byte fallback; qwen3:
// byte-level BPE), found through NIBBLE_SHARED (default ../shared).
//
// The first input byte picks the tokenizer and the mode; the rest is either
// text to encode or ids (16-bit, taken modulo the vocabulary) to decode.
// - encode: succeeds, or throws one nibble::Error line (text that is not UTF-8).
//   Every id it returns is inside the vocabulary.
// - decode: never throws for ids inside the vocabulary, with and without
//   special tokens skipped.
// - streaming: StreamDecoder's step() results plus finish() equal decode() of
//   the same ids (its documented contract), for encoded text and for any ids.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_checks.h"
#include "nibble/tokenizer.h"

const char* const fuzz::kTarget = "fuzz_tokenizer";

namespace {

std::vector<std::unique_ptr<nibble::Tokenizer>>& tokenizers() {
  static std::vector<std::unique_ptr<nibble::Tokenizer>> t;
  return t;
}

using fuzz::broken;
using fuzz::check_stream;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* env = std::getenv("NIBBLE_SHARED");
  const std::string shared = env ? env : "../shared";
  for (const char* model : {"stories260K", "qwen3-26M-linux"})
    tokenizers().push_back(std::make_unique<nibble::Tokenizer>(
        nibble::Tokenizer::from_file(shared + "/models/" + model + "/tokenizer.json")));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const nibble::Tokenizer& tok = *tokenizers()[data[0] & 1];
  const bool special = (data[0] & 2) != 0, decode_ids = (data[0] & 4) != 0;
  const int32_t vocab = tok.vocab_size();
  if (decode_ids) {
    std::vector<int32_t> ids;
    for (size_t i = 1; i + 1 < size; i += 2) ids.push_back(static_cast<int32_t>((data[i] | (data[i + 1] << 8)) % vocab));
    check_stream(tok, ids, special);
    return 0;
  }
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  std::vector<int32_t> ids;
  try {
    ids = tok.encode(text, special);
  } catch (const nibble::Error& e) {
    fuzz::check_error(e, "");
    return 0;
  }
  for (int32_t id : ids)
    if (id < 0 || id >= vocab) broken("encode() returned an id outside the vocabulary");
  check_stream(tok, ids, false);
  check_stream(tok, ids, true);
  return 0;
}
