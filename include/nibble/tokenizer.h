// A Hugging Face `tokenizer.json` reader that reproduces the `tokenizers`
// library (0.2x) for the Llama family: SentencePiece-style BPE (Llama 2,
// Mistral, TinyLlama: byte fallback, ▁ metaspace) and byte-level BPE (GPT-2,
// Llama 3, Qwen2/3, SmolLM).
//
// The pipeline is the library's: added tokens are cut out of the raw text
// first (longest match, leftmost), every remaining segment is normalized,
// pre-tokenized into words and BPE-merged word by word, and the post-processor
// (e.g. Llama 2's TemplateProcessing, which prepends <s>) adds its tokens when
// add_special_tokens is true.
//
// Supported components (anything else is an error that names it and lists these):
//   model:          BPE (byte_fallback, fuse_unk, ignore_merges, unk_token,
//                   continuing_subword_prefix, end_of_word_suffix; merges as "a b" or ["a","b"])
//   normalizer:     Sequence, Prepend, Replace, NFC, NFD, Strip
//   pre_tokenizer:  Sequence, Split, ByteLevel, Metaspace, Digits
//   post_processor: TemplateProcessing, ByteLevel, Sequence, RobertaProcessing, BertProcessing
//   decoder:        Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip
//
// Regexes (Split patterns, the GPT-2 ByteLevel regex) run on PCRE2 in UTF+UCP
// mode with the JIT; `\s` is narrowed to Unicode White_Space (PCRE2 adds
// U+180E) to match the Oniguruma engine `tokenizers` uses. `\w` is PCRE2's
// (\p{L}\p{N}_), which differs from Oniguruma's on marks; the Llama-family
// patterns do not use it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace nibble {

namespace io::tok {
struct TokenizerImpl;
}

// What tokenizer_config.json (beside tokenizer.json) says; every field optional.
struct TokenizerConfig {
  std::optional<std::string> bos_token;  // "<s>", "<|begin_of_text|>", ...
  std::optional<std::string> eos_token;
  std::optional<std::string> pad_token;
  std::optional<bool> add_bos_token;  // informational: encode() follows tokenizer.json's post-processor
  std::optional<bool> add_eos_token;
  std::string chat_template;  // Jinja source ("" when none); also read from chat_template.jinja
};

class Tokenizer {
 public:
  // Reads tokenizer.json and, when present beside it, tokenizer_config.json
  // (and chat_template.jinja). Throws nibble::Error naming the file on
  // malformed JSON and on unsupported components.
  static Tokenizer from_file(const std::filesystem::path& tokenizer_json);
  // Same from an in-memory tokenizer.json; `origin` names it in errors.
  static Tokenizer from_json(std::string_view tokenizer_json, const std::string& origin = "<memory>",
                             const TokenizerConfig& config = {});

  // Token ids of `text` (which must be valid UTF-8, else nibble::Error).
  // add_special_tokens runs the post-processor (Llama 2: prepend <s>;
  // Qwen: nothing). Special-token text inside `text` ("<s>", "<|im_end|>")
  // always becomes its id, as in `tokenizers`.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;

  // Text of `ids` through the decoder chain, as `tokenizers`' decode. Ids
  // outside [0, vocab_size()) throw; ids inside the range that name no token
  // are skipped (as `tokenizers` does). Invalid UTF-8 produced by byte
  // tokens becomes U+FFFD exactly where `tokenizers` puts it.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  // The bytes one token stands for: byte-level pieces and <0xNN> byte-fallback
  // pieces give their raw bytes (possibly an incomplete UTF-8 sequence), ▁
  // becomes a space, and nothing sequence-level is applied (no leading-space
  // strip). Concatenating decode_token over a sequence gives decode()'s bytes
  // before the leading-space strip and U+FFFD replacement. To print while
  // generating, use StreamDecoder, which only emits complete characters and
  // matches decode() exactly.
  std::string decode_token(int32_t id) const;

  // The words the model sees (after added-token extraction, normalizer and
  // pre-tokenizer), in the model's alphabet (byte-level words use Ġ etc.).
  // Added tokens appear as their content. For inspection and tests.
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  // 1 + the largest id of the model vocab and the added tokens.
  int32_t vocab_size() const;
  std::optional<int32_t> bos_id() const;  // tokenizer_config bos_token, else the post-processor's leading special token
  std::optional<int32_t> eos_id() const;  // tokenizer_config eos_token
  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;  // the vocab string (e.g. "▁the", "Ġthe")
  bool is_special(int32_t id) const;
  const TokenizerConfig& config() const;

 private:
  friend class StreamDecoder;
  explicit Tokenizer(std::shared_ptr<const io::tok::TokenizerImpl> impl) : impl_(std::move(impl)) {}
  // decode(); continuation: the ids continue a sequence past its start, so the
  // decoder's edits at a sequence's start are not applied.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens, bool continuation) const;
  std::shared_ptr<const io::tok::TokenizerImpl> impl_;  // immutable after loading: copies share it
};

// Incremental detokenization for streaming generation. step() returns the
// text that the new id completes: nothing while a multibyte character is
// still split across byte tokens (the decode ends in U+FFFD), and never a
// leading-space strip in the middle of a sequence. The concatenation of all
// step() results plus finish() equals tokenizer.decode(all ids). It keeps the
// ids of the last emitted piece as context, so each step decodes a few ids.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens = false);
  std::string step(int32_t id);
  std::string finish();  // whatever is still pending (incomplete bytes come out as U+FFFD); the next step() starts a new sequence

 private:
  Tokenizer tokenizer_;
  bool skip_special_tokens_;
  std::vector<int32_t> ids_;  // context ids (already emitted) followed by pending ids
  bool at_start_ = true;      // ids_ starts the sequence (no emitted id has been dropped yet)
  size_t context_len_ = 0;
  std::string context_text_;  // decode(ids_[0..context_len_))
};

// The token the post-processor puts in front of every encoding (Llama 2's
// <s>), if any: what a window of text starts with when scored or calibrated.
std::optional<int32_t> leading_bos(const Tokenizer& tok);

}  // namespace nibble
