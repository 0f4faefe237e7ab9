// nibble::Tokenizer: loading tokenizer.json (+ tokenizer_config.json), added
// tokens, and the encode/decode pipelines. See tokenizer_impl.h for the map.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "io/tokenizer_impl.h"
#include "nibble/error.h"
#include "nibble/tokenizer.h"

namespace nibble {
namespace io::tok {

// ---- Added tokens -----------------------------------------------------------------

void AddedTokenMatcher::add(std::string pattern, size_t token_index) {
  if (pattern.empty()) return;  // can never match
  entries_.push_back({std::move(pattern), token_index});
}

void AddedTokenMatcher::finish() {
  for (auto& b : by_first_byte_) b.clear();
  for (size_t i = 0; i < entries_.size(); ++i)
    by_first_byte_[static_cast<unsigned char>(entries_[i].pattern[0])].push_back(static_cast<uint32_t>(i));
  for (auto& b : by_first_byte_) {
    std::stable_sort(b.begin(), b.end(),
                     [&](uint32_t x, uint32_t y) { return entries_[x].pattern.size() > entries_[y].pattern.size(); });
  }
}

bool AddedTokenMatcher::find(std::string_view text, size_t from, size_t& start, size_t& len,
                             size_t& token_index) const {
  for (size_t i = from; i < text.size(); ++i) {
    for (uint32_t e : by_first_byte_[static_cast<unsigned char>(text[i])]) {
      const std::string& p = entries_[e].pattern;
      if (text.compare(i, p.size(), p) == 0) {  // longest first: the first hit is the longest
        start = i, len = p.size(), token_index = entries_[e].token_index;
        return true;
      }
    }
  }
  return false;
}

namespace {

struct Segment {
  size_t start, end;
  int32_t added_id;  // -1: plain text
};

// Rust char::is_alphanumeric (Alphabetic or Numeric) or '_', for single_word.
bool is_word_char(uint32_t cp) {
  static const Regex word(R"(^[\p{Alphabetic}\p{N}_])", "single_word check");
  std::string s;
  utf8_append(s, cp);
  std::vector<std::pair<size_t, size_t>> m;
  word.find_all(s, m);
  return !m.empty();
}

uint32_t last_char(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  return utf8_next(s, i);
}

// `tokenizers`' AddedVocabulary::find_matches: every match of an added token
// cuts the text, subject to single_word (skip the match unless it stands
// alone), lstrip / rstrip (take the White_Space before / after it too).
void split_on_added(std::string_view s, const AddedTokenMatcher& matcher, const std::vector<AddedToken>& added,
                    std::vector<Segment>& out) {
  size_t start_offset = 0, from = 0, mstart = 0, mlen = 0, index = 0;
  while (from < s.size() && matcher.find(s, from, mstart, mlen, index)) {
    const AddedToken& t = added[index];
    size_t start = mstart, stop = mstart + mlen;
    from = stop;  // the search goes on after the match itself, whatever the strips take
    if (start < start_offset) continue;  // inside what the previous token's rstrip took
    if (t.single_word) {
      const bool space_before = start == 0 || !is_word_char(last_char(s.substr(0, start)));
      size_t k = stop;
      const bool space_after = stop == s.size() || !is_word_char(utf8_next(s, k));
      if (!space_before || !space_after) continue;
    }
    if (t.lstrip) {
      size_t left = start;
      while (left > start_offset) {
        size_t p = left - 1;
        while (p > 0 && (static_cast<unsigned char>(s[p]) & 0xC0) == 0x80) --p;
        size_t q = p;
        if (!is_white_space(utf8_next(s, q))) break;
        left = p;
      }
      start = left;
    }
    if (t.rstrip) {
      while (stop < s.size()) {
        size_t q = stop;
        if (!is_white_space(utf8_next(s, q))) break;
        stop = q;
      }
    }
    if (start_offset < start) out.push_back({start_offset, start, -1});
    out.push_back({start, stop, t.id});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back({start_offset, s.size(), -1});
}

}  // namespace

void TokenizerImpl::words(std::string_view text, std::vector<Word>& out) const {
  std::vector<Segment> segments, inner;
  split_on_added(text, raw_matcher, added, segments);
  std::vector<Piece> pieces;
  for (const Segment& seg : segments) {
    if (seg.added_id >= 0) {
      out.push_back({std::string(text.substr(seg.start, seg.end - seg.start)), seg.added_id});
      continue;
    }
    // Each segment between added tokens is normalized on its own (so Llama
    // 2's Prepend("▁") applies after every special token too).
    std::string norm(text.substr(seg.start, seg.end - seg.start));
    if (normalizer) normalizer->normalize(norm);
    inner.clear();
    split_on_added(norm, normalized_matcher, added, inner);
    for (const Segment& sub : inner) {
      std::string piece = norm.substr(sub.start, sub.end - sub.start);
      if (sub.added_id >= 0) {
        out.push_back({std::move(piece), sub.added_id});
        continue;
      }
      pieces.clear();
      pieces.push_back({std::move(piece), seg.start == 0 && sub.start == 0});
      if (pre_tokenizer) pre_tokenizer->pre_tokenize(pieces);
      for (Piece& p : pieces)
        if (!p.text.empty()) out.push_back({std::move(p.text), -1});
    }
  }
}

namespace {

json parse_json(std::string_view text, const std::string& origin) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    NIBBLE_FAIL("{}: malformed JSON: {}", origin, e.what());
  }
}

std::string read_file(const std::filesystem::path& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  NIBBLE_CHECK(f.good(), "{}: cannot open {} ({})", path.string(), what, std::strerror(errno));
  std::ostringstream ss;
  ss << f.rdbuf();
  NIBBLE_CHECK(!f.bad(), "{}: cannot read {} ({})", path.string(), what, std::strerror(errno));
  return ss.str();
}

// bos_token / eos_token: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> config_token(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  const json& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  NIBBLE_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(),
               "{}: '{}' should be a string or {{\"content\": ...}}, found {}", where, key, v.dump());
  return v["content"].get<std::string>();
}

TokenizerConfig read_config(const std::filesystem::path& path) {
  const std::string where = path.string();
  const json j = parse_json(read_file(path, "tokenizer_config.json"), where);
  NIBBLE_CHECK(j.is_object(), "{}: expected a JSON object at top level", where);
  TokenizerConfig c;
  c.bos_token = config_token(j, "bos_token", where);
  c.eos_token = config_token(j, "eos_token", where);
  c.pad_token = config_token(j, "pad_token", where);
  for (auto [key, field] : {std::pair{"add_bos_token", &c.add_bos_token}, std::pair{"add_eos_token", &c.add_eos_token}})
    if (j.contains(key) && !j[key].is_null()) *field = json_bool(j, key, false, where);
  if (j.contains("chat_template") && !j["chat_template"].is_null()) {
    const json& t = j["chat_template"];
    if (t.is_string()) {
      c.chat_template = t.get<std::string>();
    } else {  // [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
      NIBBLE_CHECK(t.is_array(), "{}: 'chat_template' should be a string or a list of named templates", where);
      for (const json& e : t) {
        NIBBLE_CHECK(e.is_object() && e.contains("template") && e["template"].is_string(),
                     "{}: a chat_template entry should be {{\"name\": ..., \"template\": ...}}, found {}", where,
                     e.dump().substr(0, 200));
        NIBBLE_CHECK(!e.contains("name") || e["name"].is_string(), "{}: a chat_template entry's name should be a "
                     "string, found {}", where, e["name"].dump().substr(0, 200));
        if (c.chat_template.empty() || e.value("name", "") == "default") c.chat_template = e["template"].get<std::string>();
      }
    }
  }
  return c;
}

}  // namespace
}  // namespace io::tok

using io::tok::json;
using io::tok::TokenizerImpl;

Tokenizer Tokenizer::from_file(const std::filesystem::path& tokenizer_json) {
  const std::string text = io::tok::read_file(tokenizer_json, "tokenizer.json");
  TokenizerConfig config;
  const std::filesystem::path dir = tokenizer_json.parent_path();
  std::filesystem::path config_path = dir / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) config = io::tok::read_config(config_path);
  if (config.chat_template.empty() && std::filesystem::exists(dir / "chat_template.jinja"))
    config.chat_template = io::tok::read_file(dir / "chat_template.jinja", "chat_template.jinja");
  Tokenizer t = from_json(text, tokenizer_json.string(), config);
  for (const auto* name : {&config.bos_token, &config.eos_token}) {
    NIBBLE_CHECK(!*name || t.token_to_id(**name), "{}: {} {} is not a token of {}", config_path.string(),
                 name == &config.bos_token ? "bos_token" : "eos_token", json(**name).dump(), tokenizer_json.string());
  }
  return t;
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, const std::string& origin, const TokenizerConfig& config) {
  const json j = io::tok::parse_json(tokenizer_json, origin);
  NIBBLE_CHECK(j.is_object(), "{}: expected a JSON object at top level", origin);
  auto impl = std::make_shared<TokenizerImpl>();
  impl->origin = origin;
  impl->config = config;

  NIBBLE_CHECK(j.contains("model") && j["model"].is_object(), "{}: missing the 'model' object", origin);
  const json& model = j["model"];
  // Old files leave out "type" for BPE (recognisable by its merges).
  const std::string model_type = model.contains("type") ? io::tok::json_string(model, "type", origin + ": model")
                                                        : (model.contains("merges") ? "BPE" : "?");
  NIBBLE_CHECK(model_type == "BPE", "{}: model type '{}' is not supported (supported: BPE)", origin, model_type);
  impl->model = std::make_unique<io::tok::BpeModel>(model, origin);

  auto component = [&](const char* key) -> const json* {
    return j.contains(key) && !j[key].is_null() ? &j[key] : nullptr;
  };
  if (const json* n = component("normalizer")) impl->normalizer = io::tok::make_normalizer(*n, origin + ": normalizer");
  if (const json* p = component("pre_tokenizer"))
    impl->pre_tokenizer = io::tok::make_pre_tokenizer(*p, origin + ": pre_tokenizer");
  if (const json* p = component("post_processor"))
    impl->post_processor = io::tok::make_post_processor(*p, origin + ": post_processor");
  if (const json* d = component("decoder")) impl->decoder = io::tok::make_decoder(*d, origin + ": decoder");
  if (const json* t = component("truncation")) {
    NIBBLE_CHECK(t->is_object() && t->contains("max_length") && (*t)["max_length"].is_number_unsigned(),
                 "{}: 'truncation' should have a max_length, found {}", origin, t->dump());
    impl->truncation_max_length = (*t)["max_length"].get<size_t>();
    impl->truncation_left = t->value("direction", "Right") == "Left";
  }
  if (const json* p = component("padding")) {
    // Padding only changes batches (BatchLongest); a fixed length would pad single encodes too.
    NIBBLE_CHECK(!(p->is_object() && p->contains("strategy") && (*p)["strategy"].is_object()),
                 "{}: padding to a fixed length ({}) is not supported", origin, p->dump());
  }

  // Added tokens get their ids the way `tokenizers` assigns them on loading
  // (it only warns when the file says otherwise): the id of the same string
  // in the vocab, else the next id after the vocab and the added tokens so
  // far. Real files agree with this; hand-edited ones may not.
  const auto model_size = static_cast<int64_t>(impl->model->vocab().size());
  int64_t max_id = -1, max_added = -1, defined = model_size;  // defined: distinct tokens
  for (const auto& [token, id] : impl->model->vocab()) max_id = std::max<int64_t>(max_id, id);
  if (const json* added = component("added_tokens")) {
    NIBBLE_CHECK(added->is_array(), "{}: 'added_tokens' should be an array", origin);
    for (size_t i = 0; i < added->size(); ++i) {
      const json& a = (*added)[i];
      const std::string at = fmt::format("{}: added_tokens[{}]", origin, i);
      NIBBLE_CHECK(a.is_object(), "{}: expected an object, found {}", at, a.dump().substr(0, 200));
      io::tok::AddedToken t;
      t.content = io::tok::json_string(a, "content", at);
      t.special = io::tok::json_bool(a, "special", false, at);
      t.single_word = io::tok::json_bool(a, "single_word", false, at);
      t.lstrip = io::tok::json_bool(a, "lstrip", false, at);
      t.rstrip = io::tok::json_bool(a, "rstrip", false, at);
      t.normalized = io::tok::json_bool(a, "normalized", !t.special, at);
      if (impl->added_by_content.count(t.content)) continue;  // first definition wins
      if (auto id = impl->model->token_to_id(t.content)) {
        t.id = *id;
      } else {
        t.id = static_cast<int32_t>(max_added >= model_size ? max_added + 1 : model_size);
        ++defined;
      }
      max_added = std::max<int64_t>(max_added, t.id);
      max_id = std::max<int64_t>(max_id, t.id);
      impl->added_by_content.emplace(t.content, impl->added.size());
      impl->added.push_back(std::move(t));
    }
  }
  NIBBLE_CHECK(max_id >= 0, "{}: the vocabulary is empty", origin);
  NIBBLE_CHECK(max_id < INT32_MAX, "{}: token ids go past int32", origin);
  // The id tables are dense (one entry per id up to the largest), as every
  // real vocabulary is; a lone huge id is a broken file, refused before it
  // sizes gigabytes of table (found by fuzz_hf_json).
  NIBBLE_CHECK(max_id < 2 * defined + 65536, "{}: token id {} is far past the {} tokens the file defines", origin,
               max_id, defined);
  const auto n = static_cast<size_t>(max_id + 1);
  impl->id_to_token.assign(n, std::string());
  impl->has_token.assign(n, 0);
  impl->special.assign(n, 0);
  for (const auto& [token, id] : impl->model->vocab()) {
    impl->id_to_token[static_cast<size_t>(id)] = token;
    impl->has_token[static_cast<size_t>(id)] = 1;
  }
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const io::tok::AddedToken& t = impl->added[i];
    // A normalized added token is looked for in normalized text, so its
    // pattern is its normalized content; `tokenizers` also decodes it as
    // that pattern (Prepend makes "Lily" come back as "▁Lily", i.e. " Lily").
    std::string pattern = t.content;
    if (t.normalized && impl->normalizer) impl->normalizer->normalize(pattern);
    impl->id_to_token[static_cast<size_t>(t.id)] = pattern;  // added tokens win over the vocab
    impl->has_token[static_cast<size_t>(t.id)] = 1;
    (t.normalized ? impl->normalized_matcher : impl->raw_matcher).add(std::move(pattern), i);
  }
  // skip_special_tokens goes by the decoded string being a special token's
  // content, as `tokenizers` does (so a special token whose normalized
  // pattern differs from its content is not skipped there either).
  for (size_t id = 0; id < n; ++id) {
    auto it = impl->added_by_content.find(impl->id_to_token[id]);
    if (impl->has_token[id] && it != impl->added_by_content.end() && impl->added[it->second].special) impl->special[id] = 1;
  }
  impl->raw_matcher.finish();
  impl->normalized_matcher.finish();
  return Tokenizer(std::move(impl));
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const size_t bad = io::tok::utf8_invalid_at(text);
  NIBBLE_CHECK(bad == std::string_view::npos, "{}: cannot encode text that is not valid UTF-8 (bad byte 0x{:02X} at offset {})",
               impl_->origin, bad == std::string_view::npos ? 0 : static_cast<unsigned char>(text[bad]), bad);
  std::vector<TokenizerImpl::Word> words;
  impl_->words(text, words);
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  // A word's ids do not depend on its neighbours (BPE merges inside one pre-tokenized word), and a corpus repeats
  // most of its words: each distinct word is merged once, its later occurrences copy the ids of its first
  // ([begin, end) in ids). A megabyte of code or prose has some tens of thousands of distinct words.
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;
  for (const TokenizerImpl::Word& w : words) {
    if (w.added_id >= 0) {
      ids.push_back(w.added_id);
      continue;
    }
    const auto [it, fresh] = seen.try_emplace(w.text, ids.size(), ids.size());
    if (fresh) {
      impl_->model->tokenize(w.text, ids);
      it->second.second = ids.size();
    } else {
      const auto [b, e] = it->second;
      const size_t at = ids.size();
      ids.resize(at + (e - b));
      std::copy(ids.begin() + static_cast<std::ptrdiff_t>(b), ids.begin() + static_cast<std::ptrdiff_t>(e),
                ids.begin() + static_cast<std::ptrdiff_t>(at));
    }
  }
  const bool post = add_special_tokens && impl_->post_processor;
  if (impl_->truncation_max_length) {
    const size_t reserved = post ? impl_->post_processor->added_count() : 0;
    const size_t keep = *impl_->truncation_max_length > reserved ? *impl_->truncation_max_length - reserved : 0;
    if (ids.size() > keep) {
      if (impl_->truncation_left) ids.erase(ids.begin(), ids.end() - static_cast<std::ptrdiff_t>(keep));
      else ids.resize(keep);
    }
  }
  if (post) impl_->post_processor->process(ids);
  return ids;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  const size_t bad = io::tok::utf8_invalid_at(text);
  NIBBLE_CHECK(bad == std::string_view::npos, "{}: cannot pre-tokenize text that is not valid UTF-8 (offset {})",
               impl_->origin, bad);
  std::vector<TokenizerImpl::Word> words;
  impl_->words(text, words);
  std::vector<std::string> out;
  out.reserve(words.size());
  for (auto& w : words) out.push_back(std::move(w.text));
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return decode(ids, skip_special_tokens, /*continuation=*/false);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens, bool continuation) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    NIBBLE_CHECK(id >= 0 && id < vocab_size(), "{}: cannot decode id {}: out of range (vocab size {})", impl_->origin,
                 id, vocab_size());
    const auto i = static_cast<size_t>(id);
    if (!impl_->has_token[i] || (skip_special_tokens && impl_->special[i])) continue;
    tokens.push_back(impl_->id_to_token[i]);
  }
  if (!impl_->decoder) {  // `tokenizers` joins with spaces when there is no decoder
    std::string out;
    for (size_t k = 0; k < tokens.size(); ++k) out += (k ? " " : "") + tokens[k];
    return out;
  }
  impl_->decoder->decode_chain(tokens, continuation ? io::tok::DecodeMode::continuation : io::tok::DecodeMode::sequence);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

std::string Tokenizer::decode_token(int32_t id) const {
  NIBBLE_CHECK(id >= 0 && id < vocab_size(), "{}: cannot decode id {}: out of range (vocab size {})", impl_->origin, id,
               vocab_size());
  const auto i = static_cast<size_t>(id);
  if (!impl_->has_token[i]) return {};
  std::vector<std::string> tokens{impl_->id_to_token[i]};
  if (impl_->decoder) impl_->decoder->decode_chain(tokens, io::tok::DecodeMode::token);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

std::optional<int32_t> Tokenizer::bos_id() const {
  if (impl_->config.bos_token) return token_to_id(*impl_->config.bos_token);
  if (impl_->post_processor) return impl_->post_processor->leading_special();
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::eos_id() const {
  if (impl_->config.eos_token) return token_to_id(*impl_->config.eos_token);
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto it = impl_->added_by_content.find(std::string(token)); it != impl_->added_by_content.end())
    return impl_->added[it->second].id;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (id < 0 || id >= vocab_size() || !impl_->has_token[static_cast<size_t>(id)]) return std::nullopt;
  return impl_->id_to_token[static_cast<size_t>(id)];
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->special[static_cast<size_t>(id)];
}

const TokenizerConfig& Tokenizer::config() const { return impl_->config; }

std::optional<int32_t> leading_bos(const Tokenizer& tok) {
  const auto with = tok.encode("a", true), without = tok.encode("a", false);
  if (with.size() > without.size() && !with.empty()) return with[0];
  return std::nullopt;
}

}  // namespace nibble
