// tokenizer.ggml.* -> tokenizer.json (see gguf.h, tokenizer_json_from_gguf).
#include <algorithm>
#include <map>
#include <string_view>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "io/tokenizer_impl.h"
#include "nibble/error.h"
#include "nibble/gguf.h"

namespace nibble::io {

namespace {

using ojson = nlohmann::ordered_json;

// llama.cpp's token types (llama_token_type).
enum TokenType : int32_t { kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5, kByte = 6 };

// The pre-tokenizers of byte-level BPE vocabularies, by tokenizer.ggml.pre, as
// the tokenizer.json of the models they come from has them.
ojson split_then_bytes(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
}

ojson gpt2_bytes() {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
}

constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct PreRow {
  std::vector<std::string_view> names;
  bool llama3;  // Llama 3's conventions: BOS added and merges ignored for whole-vocabulary words
  ojson (*make)();
};

const std::vector<PreRow>& pre_rows() {
  static const std::vector<PreRow> rows = {
      {{"llama-bpe", "llama3", "llama-v3"}, true, [] { return split_then_bytes(kLlama3Regex); }},
      {{"qwen2"}, false, [] { return split_then_bytes(kQwen2Regex); }},
      {{"smollm"},
       false,
       [] {
         return ojson{{"type", "Sequence"},
                      {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}, gpt2_bytes()}}};
       }},
      {{"gpt-2"}, false, [] { return gpt2_bytes(); }},
  };
  return rows;
}

std::string known_pre_names() {
  std::string out;
  for (const PreRow& r : pre_rows())
    for (std::string_view n : r.names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

// The UTF-8 character boundaries of s (0 and s.size() included).
std::vector<size_t> char_bounds(const std::string& s) {
  std::vector<size_t> b;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) b.push_back(i);
  b.push_back(s.size());
  return b;
}

// transformers' SentencePieceExtractor: for each piece in id order, every
// split into two pieces of the vocabulary (ordered by the halves' ids); then
// all of them, stably, by the whole piece's score, highest first.
ojson merges_from_scores(const GgufVocab& v, const std::unordered_map<std::string, int64_t>& ids) {
  struct Merge {
    int64_t left, right;
    float score;
  };
  std::vector<Merge> merges;
  for (size_t id = 0; id < v.tokens.size(); ++id) {
    const std::string& piece = v.tokens[id];
    std::vector<Merge> local;
    const std::vector<size_t> bounds = char_bounds(piece);
    for (size_t k = 1; k + 1 < bounds.size(); ++k) {
      const auto l = ids.find(piece.substr(0, bounds[k])), r = ids.find(piece.substr(bounds[k]));
      if (l != ids.end() && r != ids.end()) local.push_back({l->second, r->second, v.scores[id]});
    }
    std::sort(local.begin(), local.end(),
              [](const Merge& a, const Merge& b) { return std::pair(a.left, a.right) < std::pair(b.left, b.right); });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) { return a.score > b.score; });
  ojson out = ojson::array();
  for (const Merge& m : merges) out.push_back(ojson::array({v.tokens[m.left], v.tokens[m.right]}));
  return out;
}

// TemplateProcessing that puts BOS before (and EOS after) each sequence.
ojson bos_eos_template(const GgufVocab& v, bool bos, bool eos) {
  ojson special = ojson::object();
  auto sequence = [&](const char* id, int type_id) {
    ojson out = ojson::array();
    auto token = [&](int64_t t) {
      out.push_back({{"SpecialToken", {{"id", v.tokens[t]}, {"type_id", type_id}}}});
      special[v.tokens[t]] = {{"id", v.tokens[t]}, {"ids", {t}}, {"tokens", {v.tokens[t]}}};
    };
    if (bos) token(*v.bos_id);
    out.push_back({{"Sequence", {{"id", id}, {"type_id", type_id}}}});
    if (eos) token(*v.eos_id);
    return out;
  };
  ojson single = sequence("A", 0), pair = sequence("A", 0);
  for (const ojson& e : sequence("B", 1)) pair.push_back(e);
  return {{"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", special}};
}

}  // namespace

std::string tokenizer_json_from_gguf(const GgufVocab& v, const std::string& origin) {
  NIBBLE_CHECK(!v.tokens.empty(), "{}: the file carries no tokenizer (no tokenizer.ggml.tokens)", origin);
  const bool spm = v.model == "llama", bpe = v.model == "gpt2";
  NIBBLE_CHECK(spm || bpe,
               "{}: tokenizer.ggml.model '{}' is not supported (supported: llama (SentencePiece BPE), gpt2 (byte-level "
               "BPE))",
               origin, v.model);
  const int64_t n = static_cast<int64_t>(v.tokens.size());
  // GGUF strings are UTF-8, and tokenizer.json is JSON: a token or merge that is not cannot be carried over.
  for (int64_t i = 0; i < n; ++i)
    NIBBLE_CHECK(tok::utf8_invalid_at(v.tokens[i]) == std::string::npos,
                 "{}: tokenizer.ggml.tokens[{}] is not valid UTF-8", origin, i);
  for (size_t i = 0; i < v.merges.size(); ++i)
    NIBBLE_CHECK(tok::utf8_invalid_at(v.merges[i]) == std::string::npos,
                 "{}: tokenizer.ggml.merges[{}] is not valid UTF-8", origin, i);
  for (auto [what, id] : {std::pair{"bos", v.bos_id}, {"eos", v.eos_id}, {"unknown", v.unknown_id}})
    NIBBLE_CHECK(!id || (*id >= 0 && *id < n), "{}: tokenizer.ggml.{}_token_id {} is outside the {} tokens", origin,
                 what, *id, n);
  std::unordered_map<std::string, int64_t> ids;
  ojson vocab = ojson::object();
  for (int64_t i = 0; i < n; ++i) {
    // A token listed twice keeps its first id, as a JSON object's first key would not.
    if (ids.emplace(v.tokens[i], i).second) vocab[v.tokens[i]] = i;
  }
  auto type_of = [&](int64_t i) { return v.token_types.empty() ? int32_t{kNormal} : v.token_types[i]; };

  ojson added = ojson::array();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = type_of(i);
    if (t != kControl && t != kUnknown && t != kUserDefined) continue;
    added.push_back({{"id", i},
                     {"content", v.tokens[i]},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", t != kUserDefined}});
  }

  ojson j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"added_tokens", added}};
  if (spm) {
    NIBBLE_CHECK(v.scores.size() == v.tokens.size(), "{}: a SentencePiece vocabulary needs tokenizer.ggml.scores",
                 origin);
    const bool prefix = v.add_space_prefix.value_or(true);
    ojson norm = ojson::array();
    if (prefix) norm.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    norm.push_back({{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", norm}};
    j["pre_tokenizer"] = nullptr;
    const bool bos = v.add_bos.value_or(true) && v.bos_id, eos = v.add_eos.value_or(false) && v.eos_id;
    j["post_processor"] = bos_eos_template(v, bos, eos);
    ojson dec = {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                 {{"type", "ByteFallback"}},
                 {{"type", "Fuse"}}};
    if (prefix) dec.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    j["decoder"] = {{"type", "Sequence"}, {"decoders", dec}};
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", v.unknown_id ? ojson(v.tokens[*v.unknown_id]) : ojson(nullptr)},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", true},
                  {"byte_fallback", true},
                  {"ignore_merges", false},
                  {"vocab", vocab},
                  {"merges", merges_from_scores(v, ids)}};
  } else {
    const PreRow* row = nullptr;
    for (const PreRow& r : pre_rows())
      if (std::find(r.names.begin(), r.names.end(), v.pre) != r.names.end()) row = &r;
    // A file without one ("default") leaves llama.cpp guessing; nibble does not guess.
    NIBBLE_CHECK(row, "{}: tokenizer.ggml.pre '{}' is not a pre-tokenizer nibble knows (known: {})", origin,
                 v.pre.empty() ? "(none)" : v.pre, known_pre_names());
    ojson merges = ojson::array();
    for (const std::string& m : v.merges) {
      const size_t sp = m.find(' ', 1);
      NIBBLE_CHECK(sp != std::string::npos && m.find(' ', sp + 1) == std::string::npos,
                   "{}: tokenizer.ggml.merges entry '{}' is not two tokens separated by one space", origin, m);
      merges.push_back(ojson::array({m.substr(0, sp), m.substr(sp + 1)}));
    }
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = row->make();
    const ojson bytes = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
    const bool bos = v.add_bos.value_or(row->llama3) && v.bos_id, eos = v.add_eos.value_or(false) && v.eos_id;
    j["post_processor"] = bos || eos ? ojson{{"type", "Sequence"}, {"processors", {bytes, bos_eos_template(v, bos, eos)}}}
                                     : bytes;
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
    j["model"] = {{"type", "BPE"},
                  {"dropout", nullptr},
                  {"unk_token", nullptr},
                  {"continuing_subword_prefix", nullptr},
                  {"end_of_word_suffix", nullptr},
                  {"fuse_unk", false},
                  {"byte_fallback", false},
                  {"ignore_merges", row->llama3},
                  {"vocab", vocab},
                  {"merges", merges}};
  }
  return j.dump();
}

}  // namespace nibble::io
