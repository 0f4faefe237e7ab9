// Decoders and post-processors of tokenizer.json, the GPT-2 byte map, and
// StreamDecoder.
#include <algorithm>
#include <array>
#include <cctype>
#include <optional>

#include "io/tokenizer_impl.h"
#include "nibble/error.h"

namespace nibble::io::tok {

// ---- GPT-2 byte map -------------------------------------------------------------

namespace {

// Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the
// other 68 bytes get U+0100, U+0101, ... in byte order (so ' ' is 'Ġ' U+0120).
struct ByteMap {
  std::array<uint32_t, 256> to_char{};
  std::array<int16_t, 324> from_char{};  // code points 0..323 cover the whole map
  ByteMap() {
    from_char.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_char[b] = printable ? static_cast<uint32_t>(b) : next++;
      from_char[to_char[b]] = static_cast<int16_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap m;
  return m;
}

}  // namespace

uint32_t byte_to_char(uint8_t b) { return byte_map().to_char[b]; }

int byte_from_char(uint32_t cp) { return cp < 324 ? byte_map().from_char[cp] : -1; }

namespace {

// ---- Decoders -------------------------------------------------------------------

struct SequenceDecoder : Decoder {
  std::vector<std::unique_ptr<Decoder>> parts;
  void decode_chain(std::vector<std::string>& tokens, DecodeMode mode) const override {
    for (const auto& d : parts) d->decode_chain(tokens, mode);
  }
};

// Maps each token's characters back to bytes (a token with a character
// outside the map, e.g. an added token, keeps its own UTF-8) and joins them;
// the whole byte string then goes through from_utf8_lossy.
struct ByteLevelDecoder : Decoder {
  void decode_chain(std::vector<std::string>& tokens, DecodeMode mode) const override {
    std::string bytes;
    for (const std::string& t : tokens) {
      const size_t mark = bytes.size();
      bool mapped = true;
      for (size_t i = 0; i < t.size();) {
        const int b = byte_from_char(utf8_next(t, i));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes += static_cast<char>(b);
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes += t;
      }
    }
    tokens.assign(1, mode == DecodeMode::token ? std::move(bytes) : utf8_lossy(bytes));
  }
};

// ▁ becomes ' ', except in the first token (when a prefix was prepended),
// where it is dropped.
struct MetaspaceDecoder : Decoder {
  std::string replacement = "\xE2\x96\x81";
  bool strip_first = true;  // prepend_scheme != never
  void decode_chain(std::vector<std::string>& tokens, DecodeMode mode) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const std::string& t = tokens[i];
      std::string out;
      out.reserve(t.size());
      for (size_t p = 0; p < t.size();) {
        if (t.compare(p, replacement.size(), replacement) == 0) {
          if (!(i == 0 && strip_first && mode == DecodeMode::sequence)) out += ' ';
          p += replacement.size();
        } else {
          out += t[p++];
        }
      }
      tokens[i] = std::move(out);
    }
  }
};

struct ReplaceDecoder : Decoder {
  std::unique_ptr<Pattern> pattern;
  std::string content;
  void decode_chain(std::vector<std::string>& tokens, DecodeMode) const override {
    std::vector<std::pair<size_t, size_t>> m;
    for (std::string& t : tokens) {
      m.clear();
      pattern->find_all(t, m);
      if (m.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (auto [a, b] : m) {
        out.append(t, prev, a - prev);
        out += content;
        prev = b;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }
};

// Runs of <0xNN> tokens become the string of their bytes when it is valid
// UTF-8, else one U+FFFD per byte (not from_utf8_lossy: `tokenizers` does this).
struct ByteFallbackDecoder : Decoder {
  static int byte_of(const std::string& t) {
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
    const int hi = hex(t[3]), lo = hex(t[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
  }
  void decode_chain(std::vector<std::string>& tokens, DecodeMode mode) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;
    auto flush = [&] {
      if (pending.empty()) return;
      if (mode == DecodeMode::token || utf8_invalid_at(pending) == std::string_view::npos) {
        out.push_back(pending);
      } else {
        for (size_t k = 0; k < pending.size(); ++k) out.emplace_back(kReplacementChar);
      }
      pending.clear();
    };
    for (std::string& t : tokens) {
      const int b = byte_of(t);
      if (b >= 0) {
        pending += static_cast<char>(b);
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }
};

struct FuseDecoder : Decoder {
  void decode_chain(std::vector<std::string>& tokens, DecodeMode) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

// Removes up to `start` leading and `stop` trailing `content` characters from
// every token (after Fuse there is one: Llama 2's leading space). Skipped for
// one token's bytes: it is a sequence-level edit. In a continuation the first
// token keeps its leading characters: they are not the sequence's.
struct StripDecoder : Decoder {
  std::string content;
  size_t start = 0, stop = 0;
  void decode_chain(std::vector<std::string>& tokens, DecodeMode mode) const override {
    if (mode == DecodeMode::token) return;
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      const size_t lead = i == 0 && mode == DecodeMode::continuation ? 0 : start;
      size_t begin = 0, end = t.size();
      for (size_t k = 0; k < lead && t.compare(begin, content.size(), content) == 0 && begin < end; ++k)
        begin += content.size();
      for (size_t k = 0; k < stop && end >= begin + content.size() &&
                         t.compare(end - content.size(), content.size(), content) == 0;
           ++k)
        end -= content.size();
      t = t.substr(begin, end - begin);
    }
  }
};

constexpr const char* kSupportedDecoders = "Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip";

// ---- Post-processors ------------------------------------------------------------

struct TemplateProcessor : PostProcessor {
  // The "single" template: ids to add (a special token), or the sequence itself (empty vector, is_sequence).
  struct Item {
    bool is_sequence = false;
    std::vector<int32_t> ids;
  };
  std::vector<Item> items;
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + added_count());
    for (const Item& it : items) {
      if (it.is_sequence) out.insert(out.end(), ids.begin(), ids.end());
      else out.insert(out.end(), it.ids.begin(), it.ids.end());
    }
    ids = std::move(out);
  }
  size_t added_count() const override {
    size_t n = 0;
    for (const Item& it : items) n += it.ids.size();
    return n;
  }
  std::optional<int32_t> leading_special() const override {
    if (!items.empty() && !items[0].is_sequence && !items[0].ids.empty()) return items[0].ids[0];
    return std::nullopt;
  }
};

// ByteLevel only trims offsets: no ids change.
struct ByteLevelProcessor : PostProcessor {
  void process(std::vector<int32_t>&) const override {}
  size_t added_count() const override { return 0; }
};

struct SequenceProcessor : PostProcessor {
  std::vector<std::unique_ptr<PostProcessor>> parts;
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts) p->process(ids);
  }
  size_t added_count() const override {
    size_t n = 0;
    for (const auto& p : parts) n += p->added_count();
    return n;
  }
  std::optional<int32_t> leading_special() const override {
    for (const auto& p : parts)
      if (auto id = p->leading_special()) return id;
    return std::nullopt;
  }
};

// RobertaProcessing / BertProcessing on one sequence: cls + ids + sep.
struct ClsSepProcessor : PostProcessor {
  int32_t cls = 0, sep = 0;
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), cls);
    ids.push_back(sep);
  }
  size_t added_count() const override { return 2; }
  std::optional<int32_t> leading_special() const override { return cls; }
};

int32_t token_pair_id(const json& j, const char* key, const std::string& where) {
  NIBBLE_CHECK(j.contains(key) && j[key].is_array() && j[key].size() == 2 && j[key][1].is_number_integer(),
               "{}: '{}' should be [token, id], found {}", where, key, j.contains(key) ? j[key].dump() : "nothing");
  return j[key][1].get<int32_t>();
}

constexpr const char* kSupportedPostProcessors =
    "TemplateProcessing, ByteLevel, Sequence, RobertaProcessing, BertProcessing";

}  // namespace

std::unique_ptr<Decoder> make_decoder(const json& j, const std::string& where) {
  const std::string type = json_type(j, where);
  if (type == "Sequence") {
    auto d = std::make_unique<SequenceDecoder>();
    const json& parts = json_array(j, "decoders", where);
    for (size_t i = 0; i < parts.size(); ++i)
      d->parts.push_back(make_decoder(parts[i], fmt::format("{}.decoders[{}]", where, i)));
    return d;
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelDecoder>();
  if (type == "Metaspace") {
    auto d = std::make_unique<MetaspaceDecoder>();
    d->replacement = json_char(j, "replacement", d->replacement, where);
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      const std::string s = json_string(j, "prepend_scheme", where);
      NIBBLE_CHECK(s == "always" || s == "first" || s == "never",
                   "{}: Metaspace prepend_scheme '{}' is not one of always, first, never", where, s);
      d->strip_first = s != "never";
    } else {
      d->strip_first = json_bool(j, "add_prefix_space", true, where);
    }
    return d;
  }
  if (type == "Replace") {
    NIBBLE_CHECK(j.contains("pattern"), "{}: Replace needs a 'pattern'", where);
    auto d = std::make_unique<ReplaceDecoder>();
    d->pattern = std::make_unique<Pattern>(j["pattern"], where + ".pattern");
    d->content = json_string(j, "content", where);
    return d;
  }
  if (type == "ByteFallback") return std::make_unique<ByteFallbackDecoder>();
  if (type == "Fuse") return std::make_unique<FuseDecoder>();
  if (type == "Strip") {
    auto d = std::make_unique<StripDecoder>();
    d->content = json_char(j, "content", " ", where);
    for (auto [key, field] : {std::pair{"start", &d->start}, std::pair{"stop", &d->stop}}) {
      NIBBLE_CHECK(j.contains(key) && j[key].is_number_unsigned(), "{}: '{}' should be a count, found {}", where, key,
                   j.contains(key) ? j[key].dump() : "nothing");
      *field = j[key].get<size_t>();
    }
    return d;
  }
  NIBBLE_FAIL("{}: decoder type '{}' is not supported (supported: {})", where, type, kSupportedDecoders);
}

std::unique_ptr<PostProcessor> make_post_processor(const json& j, const std::string& where) {
  const std::string type = json_type(j, where);
  if (type == "TemplateProcessing") {
    auto p = std::make_unique<TemplateProcessor>();
    NIBBLE_CHECK(j.contains("special_tokens") && j["special_tokens"].is_object(),
                 "{}: TemplateProcessing needs a 'special_tokens' object", where);
    const json& specials = j["special_tokens"];
    const json& single = json_array(j, "single", where);
    for (size_t i = 0; i < single.size(); ++i) {
      const json& piece = single[i];
      const std::string at = fmt::format("{}.single[{}]", where, i);
      NIBBLE_CHECK(piece.is_object() && piece.size() == 1, "{}: expected {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}, found {}",
                   at, piece.dump());
      TemplateProcessor::Item item;
      if (piece.contains("Sequence")) {
        const std::string seq = json_string(piece["Sequence"], "id", at);
        NIBBLE_CHECK(seq == "A", "{}: the single-sequence template refers to sequence '{}' (expected A)", at, seq);
        item.is_sequence = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = json_string(piece["SpecialToken"], "id", at);
        NIBBLE_CHECK(specials.contains(name), "{}: special token '{}' is not in special_tokens", at, name);
        const json& ids = json_array(specials[name], "ids", fmt::format("{}.special_tokens[{}]", where, name));
        for (const json& id : ids) {
          NIBBLE_CHECK(id.is_number_integer(), "{}: special token '{}' has a non-integer id {}", where, name, id.dump());
          item.ids.push_back(id.get<int32_t>());
        }
      } else {
        NIBBLE_FAIL("{}: expected {{\"SpecialToken\": ...}} or {{\"Sequence\": ...}}, found {}", at, piece.dump());
      }
      p->items.push_back(std::move(item));
    }
    return p;
  }
  if (type == "ByteLevel") return std::make_unique<ByteLevelProcessor>();
  if (type == "Sequence") {
    auto p = std::make_unique<SequenceProcessor>();
    const json& parts = json_array(j, "processors", where);
    for (size_t i = 0; i < parts.size(); ++i)
      p->parts.push_back(make_post_processor(parts[i], fmt::format("{}.processors[{}]", where, i)));
    return p;
  }
  if (type == "RobertaProcessing" || type == "BertProcessing") {
    auto p = std::make_unique<ClsSepProcessor>();
    p->cls = token_pair_id(j, "cls", where);
    p->sep = token_pair_id(j, "sep", where);
    return p;
  }
  NIBBLE_FAIL("{}: post_processor type '{}' is not supported (supported: {})", where, type, kSupportedPostProcessors);
}

}  // namespace nibble::io::tok

namespace nibble {

// ---- StreamDecoder ----------------------------------------------------------------
//
// Decoding a window of ids (the last emitted group as context + the pending
// ids) and emitting what lies past the context's own decode keeps every
// sequence-level decoder rule (Llama 2's leading-space strip, Metaspace's
// first-token rule) exactly as decode() applies it, and a window whose decode
// ends in U+FFFD is waiting for the rest of a multibyte character.

StreamDecoder::StreamDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

namespace {

// A byte-fallback piece, <0xNN>. The ByteFallback decoder decodes a run of
// them together and turns every byte of an invalid run into U+FFFD, so a
// later byte piece can rewrite text the run already decoded to ("I" from
// <0x49> becomes U+FFFD once <0xD4> follows it): the run's text is final only
// once a token of another kind ends it.
bool is_byte_piece(const Tokenizer& tok, int32_t id) {
  const std::optional<std::string> s = tok.id_to_token(id);
  return s && s->size() == 6 && s->compare(0, 3, "<0x") == 0 && (*s)[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>((*s)[3])) && std::isxdigit(static_cast<unsigned char>((*s)[4]));
}

// An id that adds no piece to decode(): one that names no token, or a special
// token being skipped. It does not end a byte-fallback run either (decode()
// joins the runs on both sides), so text before it is not final yet.
bool adds_no_piece(const Tokenizer& tok, int32_t id, bool skip_special_tokens) {
  return !tok.id_to_token(id) || (skip_special_tokens && tok.is_special(id));
}

}  // namespace

std::string StreamDecoder::step(int32_t id) {
  ids_.push_back(id);
  std::string text = tokenizer_.decode(ids_, skip_special_tokens_, !at_start_);
  const std::string_view fffd = io::tok::kReplacementChar;
  const bool incomplete = text.size() >= fffd.size() && text.compare(text.size() - fffd.size(), fffd.size(), fffd) == 0;
  if (text.size() <= context_text_.size() || incomplete || is_byte_piece(tokenizer_, id) ||
      adds_no_piece(tokenizer_, id, skip_special_tokens_))
    return {};
  // (Quoted with invalid UTF-8 replaced: the cut may split a character.)
  const auto quote = [](const std::string& t) {
    return io::tok::json(t).dump(-1, ' ', false, io::tok::json::error_handler_t::replace);
  };
  NIBBLE_CHECK(text.compare(0, context_text_.size(), context_text_) == 0,
               "StreamDecoder: decoding id {} changed text already emitted ({} became {})", id, quote(context_text_),
               quote(text.substr(0, context_text_.size())));
  std::string out = text.substr(context_text_.size());
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(context_len_));
  at_start_ = at_start_ && context_len_ == 0;
  context_len_ = ids_.size();
  context_text_ = tokenizer_.decode(ids_, skip_special_tokens_, !at_start_);
  return out;
}

std::string StreamDecoder::finish() {
  std::string out;
  if (ids_.size() > context_len_) {
    const std::string text = tokenizer_.decode(ids_, skip_special_tokens_, !at_start_);
    if (text.size() > context_text_.size() && text.compare(0, context_text_.size(), context_text_) == 0)
      out = text.substr(context_text_.size());
  }
  ids_.clear();
  at_start_ = true;
  context_len_ = 0;
  context_text_.clear();
  return out;
}

}  // namespace nibble
