// Internals of nibble::Tokenizer (include/nibble/tokenizer.h), split by concern:
//   tokenizer.cpp          loading tokenizer.json / tokenizer_config.json, added tokens, encode/decode
//   tokenizer_bpe.cpp      the BPE model (rank-ordered merges per word, byte fallback, unk)
//   tokenizer_pretok.cpp   PCRE2 regexes, normalizers, pre-tokenizers
//   tokenizer_decode.cpp   decoders, post-processors, the GPT-2 byte map, StreamDecoder
//   tokenizer_unicode.cpp  UTF-8 helpers, White_Space, NFC/NFD (utf8proc)
//
// Each component mirrors the `tokenizers` component of the same JSON "type",
// with the same semantics (the comments say where they are subtle), so the
// ids match the library exactly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/regex.h"
#include "nibble/tokenizer.h"

namespace nibble::io::tok {

using json = nlohmann::json;

// ---- Unicode / UTF-8 (tokenizer_unicode.cpp) -------------------------------

// Byte offset of the first invalid UTF-8 sequence, or npos when `s` is valid
// (overlongs, surrogates and code points above U+10FFFF are invalid).
size_t utf8_invalid_at(std::string_view s);
// Decodes the code point at s[i] (s must be valid) and advances i.
uint32_t utf8_next(std::string_view s, size_t& i);
size_t utf8_char_len(unsigned char lead);  // 1..4 for a valid lead byte
void utf8_append(std::string& out, uint32_t cp);
// Rust's String::from_utf8_lossy: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

bool is_white_space(uint32_t cp);  // Unicode White_Space (Rust char::is_whitespace)
std::string nfc(std::string_view s);
std::string nfd(std::string_view s);



// ---- Regex (tokenizer_pretok.cpp) -------------------------------------------

// A tokenizer.json regex: nibble::Regex in unicode mode, after
// oniguruma_compatible() (below). Matching checks the subject's UTF-8 once per
// find_all; encode() has validated it already, so that check never fails here.
class Regex : public nibble::Regex {
 public:
  // `where` names the pattern's place for errors ("file: pre_tokenizer.pretokenizers[0]").
  Regex(const std::string& pattern, const std::string& where);

 private:
  // `compiled`: the pattern rewritten for Oniguruma's \s, computed once.
  Regex(const std::string& compiled, const std::string& pattern, const std::string& where);
};

// A Split/Replace pattern: {"String": s} (matched literally; `tokenizers`
// compiles it as an escaped regex, which gives the same matches) or {"Regex": r}.
class Pattern {
 public:
  Pattern(const json& j, const std::string& where);
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
};

// JSON field readers; `where` names the object in errors ("file: decoder.decoders[2]").
std::string json_string(const json& j, const char* key, const std::string& where);
bool json_bool(const json& j, const char* key, bool fallback, const std::string& where);
const json& json_array(const json& j, const char* key, const std::string& where);
std::string json_type(const json& j, const std::string& where);  // the "type" of a component object
// One Unicode character (Metaspace's replacement, Strip's content) as UTF-8.
std::string json_char(const json& j, const char* key, const std::string& fallback, const std::string& where);

// Rewrites a pattern so PCRE2's `\s` means what Oniguruma's does (Unicode
// White_Space: PCRE2 also counts U+180E). Other escapes are kept.
std::string oniguruma_compatible(std::string_view pattern);

// ---- Normalizers and pre-tokenizers (tokenizer_pretok.cpp) ------------------

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& s) const = 0;
};
std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where);

// A word during pre-tokenization. at_start: it begins at offset 0 of the
// original text (Metaspace prepend_scheme "first" only prepends there).
struct Piece {
  std::string text;
  bool at_start = false;
};

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their splits; empty pieces are dropped (as `tokenizers` does).
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where);

// ---- BPE model (tokenizer_bpe.cpp) ------------------------------------------

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  BpeModel(const json& model, const std::string& where);
  // Appends the ids of one pre-tokenized word.
  void tokenize(std::string_view word, std::vector<int32_t>& out) const;
  std::optional<int32_t> token_to_id(std::string_view token) const;
  const Vocab& vocab() const { return vocab_; }

 private:
  struct Merge {
    int32_t rank;
    int32_t new_id;
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  void merge_word(std::string_view word, std::vector<int32_t>& out) const;

  Vocab vocab_;
  std::unordered_map<uint64_t, Merge> merges_;  // (left id, right id) -> rank, merged id
  std::string unk_token_;          // "" when the model has none
  std::optional<int32_t> unk_id_;  // its id (unset if it is missing from the vocab)
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  int32_t byte_ids_[256];  // id of "<0xNN>", -1 when absent
};

// ---- Decoders and post-processors (tokenizer_decode.cpp) --------------------

// The GPT-2 byte <-> printable code point map of the ByteLevel components.
uint32_t byte_to_char(uint8_t b);
int byte_from_char(uint32_t cp);  // -1 when cp is not in the map

// What decode_chain decodes:
// - sequence: a whole sequence (decode());
// - continuation: ids that continue a sequence past its start (StreamDecoder's
//   windows): the same, without the edits at a sequence's start (Strip's
//   leading `start`, Metaspace's first-token rule), which the start's own
//   window has already applied;
// - token: one token's raw bytes (decode_token: byte pieces stay raw bytes, no
//   U+FFFD, no sequence-level stripping).
enum class DecodeMode { sequence, continuation, token };

class Decoder {
 public:
  virtual ~Decoder() = default;
  // `tokenizers`' decode_chain.
  virtual void decode_chain(std::vector<std::string>& tokens, DecodeMode mode) const = 0;
};
std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where);

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;  // add_special_tokens == true
  virtual size_t added_count() const = 0;                     // how many ids process() adds
  virtual std::optional<int32_t> leading_special() const { return std::nullopt; }
};
std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where);

// ---- The tokenizer (tokenizer.cpp) ------------------------------------------

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

// Finds added tokens in a text: leftmost match, longest at that position
// (aho-corasick LeftmostLongest in `tokenizers`).
class AddedTokenMatcher {
 public:
  void add(std::string pattern, size_t token_index);
  void finish();  // sorts candidates longest first
  bool empty() const { return entries_.empty(); }
  // First match at or after `from`: {start, length, token index}.
  bool find(std::string_view text, size_t from, size_t& start, size_t& len, size_t& token_index) const;

 private:
  struct Entry {
    std::string pattern;
    size_t token_index;
  };
  std::vector<Entry> entries_;
  std::vector<std::vector<uint32_t>> by_first_byte_ = std::vector<std::vector<uint32_t>>(256);
};

struct TokenizerImpl {
  std::string origin;  // file path (or "<memory>") for error messages
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<Normalizer> normalizer;
  std::unique_ptr<PreTokenizer> pre_tokenizer;
  std::unique_ptr<PostProcessor> post_processor;
  std::unique_ptr<Decoder> decoder;
  std::vector<AddedToken> added;
  std::unordered_map<std::string, size_t> added_by_content;
  AddedTokenMatcher raw_matcher;         // added tokens with normalized == false, on the raw text
  AddedTokenMatcher normalized_matcher;  // normalized == true, on the normalized text
  std::vector<std::string> id_to_token;  // what decode() sees; "" with has_token false for holes
  std::vector<uint8_t> has_token;
  std::vector<uint8_t> special;          // content is a special added token
  std::optional<size_t> truncation_max_length;
  bool truncation_left = false;
  TokenizerConfig config;

  // The text (valid UTF-8) cut into added tokens and pre-tokenized words, in order.
  struct Word {
    std::string text;       // the word, or the added token's content
    int32_t added_id = -1;  // >= 0: an added token, not to be run through the model
  };
  void words(std::string_view text, std::vector<Word>& out) const;
};

}  // namespace nibble::io::tok
