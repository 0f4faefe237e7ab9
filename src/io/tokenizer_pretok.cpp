// PCRE2 regexes, normalizers and pre-tokenizers of tokenizer.json.
#include "io/tokenizer_impl.h"
#include "nibble/error.h"

namespace nibble::io::tok {

// ---- Regex ------------------------------------------------------------------

std::string oniguruma_compatible(std::string_view p) {
  // PCRE2's UCP \s is White_Space plus U+180E (which Unicode 6.3 moved to
  // Cf); Oniguruma's, which `tokenizers` uses, is White_Space. So U+180E is
  // taken out of every \s and put into every \S.
  std::string out;
  out.reserve(p.size() + 32);
  for (size_t i = 0; i < p.size(); ++i) {
    const char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      const char e = p[++i];
      if (e == 's') out += "(?:(?!\\x{180E})\\s)";
      else if (e == 'S') out += "(?:\\x{180E}|\\S)";
      else out += c, out += e;  // any other escape (\p{L}, \r, \\, ...) as written
      continue;
    }
    if (c != '[') {
      out += c;
      continue;
    }
    // A character class: find its end ("[]...]" and "[^]...]" start with a
    // literal ']'; "[:alpha:]" inside does not end it), then wrap it when it
    // holds \s.
    size_t j = i + 1;
    const bool negated = j < p.size() && p[j] == '^';
    if (negated) ++j;
    if (j < p.size() && p[j] == ']') ++j;
    bool has_space = false;
    while (j < p.size() && p[j] != ']') {
      if (p[j] == '\\' && j + 1 < p.size()) {
        has_space = has_space || p[j + 1] == 's';
        j += 2;
      } else if (p[j] == '[' && j + 1 < p.size() && p[j + 1] == ':' && p.find(":]", j + 2) != std::string_view::npos) {
        j = p.find(":]", j + 2) + 2;
      } else {
        ++j;
      }
    }
    if (j >= p.size()) {  // unterminated: let PCRE2 report it
      out.append(p.substr(i));
      break;
    }
    const std::string_view cls = p.substr(i, j + 1 - i);
    if (!has_space) out.append(cls);
    else if (negated) out += "(?:\\x{180E}|", out.append(cls), out += ")";
    else out += "(?:(?!\\x{180E})", out.append(cls), out += ")";
    i = j;
  }
  return out;
}

namespace {
// `where`, and the pattern as written when the rewrite changed it (errors show the rewritten one).
std::string rewritten_where(const std::string& pattern, const std::string& compiled, const std::string& where) {
  return compiled == pattern ? where : where + " (" + json(pattern).dump() + " with Oniguruma's \\s)";
}
}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where)
    : Regex(oniguruma_compatible(pattern), pattern, where) {}

Regex::Regex(const std::string& compiled, const std::string& pattern, const std::string& where)
    : nibble::Regex(compiled, rewritten_where(pattern, compiled, where), Mode::unicode) {}

// ---- Patterns and JSON readers ----------------------------------------------

Pattern::Pattern(const json& j, const std::string& where) {
  NIBBLE_CHECK(j.is_object() && j.size() == 1, "{}: pattern should be {{\"String\": ...}} or {{\"Regex\": ...}}, found {}",
               where, j.dump());
  if (j.contains("String") && j["String"].is_string()) {
    literal_ = j["String"].get<std::string>();
    NIBBLE_CHECK(!literal_.empty(), "{}: an empty String pattern is not supported", where);
  } else if (j.contains("Regex") && j["Regex"].is_string()) {
    regex_ = std::make_unique<Regex>(j["Regex"].get<std::string>(), where);
  } else {
    NIBBLE_FAIL("{}: pattern should be {{\"String\": ...}} or {{\"Regex\": ...}}, found {}", where, j.dump());
  }
}

void Pattern::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  if (regex_) return regex_->find_all(s, out);
  for (size_t pos = s.find(literal_); pos != std::string_view::npos; pos = s.find(literal_, pos + literal_.size()))
    out.emplace_back(pos, pos + literal_.size());
}

std::string json_string(const json& j, const char* key, const std::string& where) {
  NIBBLE_CHECK(j.contains(key) && j[key].is_string(), "{}: '{}' should be a string, found {}", where, key,
               j.contains(key) ? j[key].dump() : "nothing");
  return j[key].get<std::string>();
}

bool json_bool(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  NIBBLE_CHECK(j[key].is_boolean(), "{}: '{}' should be a boolean, found {}", where, key, j[key].dump());
  return j[key].get<bool>();
}

std::string json_char(const json& j, const char* key, const std::string& fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  std::string s = json_string(j, key, where);
  NIBBLE_CHECK(!s.empty() && utf8_invalid_at(s) == std::string_view::npos &&
                   utf8_char_len(static_cast<unsigned char>(s[0])) == s.size(),
               "{}: '{}' should be one character, found {}", where, key, json(s).dump());
  return s;
}

const json& json_array(const json& j, const char* key, const std::string& where) {
  NIBBLE_CHECK(j.contains(key) && j[key].is_array(), "{}: '{}' should be an array, found {}", where, key,
               j.contains(key) ? j[key].dump() : "nothing");
  return j[key];
}

std::string json_type(const json& j, const std::string& where) {
  NIBBLE_CHECK(j.is_object(), "{}: expected an object with a \"type\", found {}", where, j.dump().substr(0, 200));
  return json_string(j, "type", where);
}

namespace {

// ---- Normalizers --------------------------------------------------------------

struct SequenceNormalizer : Normalizer {
  std::vector<std::unique_ptr<Normalizer>> parts;
  void normalize(std::string& s) const override {
    for (const auto& n : parts) n->normalize(s);
  }
};

// Prepends `prepend` to a non-empty string (Llama 2's "▁" dummy prefix).
struct PrependNormalizer : Normalizer {
  std::string prepend;
  void normalize(std::string& s) const override {
    if (!s.empty()) s.insert(0, prepend);
  }
};

struct ReplaceNormalizer : Normalizer {
  std::unique_ptr<Pattern> pattern;
  std::string content;
  void normalize(std::string& s) const override {
    std::vector<std::pair<size_t, size_t>> m;
    pattern->find_all(s, m);
    if (m.empty()) return;
    std::string out;
    out.reserve(s.size() + m.size() * content.size());
    size_t prev = 0;
    for (auto [a, b] : m) {
      out.append(s, prev, a - prev);
      out += content;
      prev = b;
    }
    out.append(s, prev, std::string::npos);
    s = std::move(out);
  }
};

struct NfcNormalizer : Normalizer {
  void normalize(std::string& s) const override { s = nfc(s); }
};
struct NfdNormalizer : Normalizer {
  void normalize(std::string& s) const override { s = nfd(s); }
};

// Strips White_Space characters from either end.
struct StripNormalizer : Normalizer {
  bool left = true, right = true;
  void normalize(std::string& s) const override {
    size_t begin = 0, end = s.size();
    if (left) {
      while (begin < end) {
        size_t next = begin;
        if (!is_white_space(utf8_next(s, next))) break;
        begin = next;
      }
    }
    if (right) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
        size_t next = start;
        if (!is_white_space(utf8_next(s, next))) break;
        end = start;
      }
    }
    s = s.substr(begin, end - begin);
  }
};

constexpr const char* kSupportedNormalizers = "Sequence, Prepend, Replace, NFC, NFD, Strip";

// ---- Pre-tokenizers -------------------------------------------------------------

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Behavior parse_behavior(const std::string& b, const std::string& where) {
  if (b == "Removed") return Behavior::Removed;
  if (b == "Isolated") return Behavior::Isolated;
  if (b == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::MergedWithNext;
  if (b == "Contiguous") return Behavior::Contiguous;
  NIBBLE_FAIL("{}: split behavior '{}' is not supported (supported: Removed, Isolated, MergedWithPrevious, "
              "MergedWithNext, Contiguous)",
              where, b);
}

struct Span {
  size_t start, end;
  bool flag;  // is_match on input; "remove" on output
};

// `tokenizers`' NormalizedString::split: `matches` are the pattern's match
// spans; the text between them fills the gaps. Appends the surviving pieces.
void split_piece(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& matches, bool invert,
                 Behavior behavior, std::vector<Piece>& out) {
  const std::string& s = piece.text;
  std::vector<Span> spans;
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (auto [a, b] : matches) {
    if (prev != a) spans.push_back({prev, a, invert});
    spans.push_back({a, b, !invert});
    prev = b;
  }
  if (prev != s.size()) spans.push_back({prev, s.size(), invert});

  std::vector<Span> res;
  res.reserve(spans.size());
  bool prev_match = false;
  switch (behavior) {
    case Behavior::Isolated:
      for (const Span& sp : spans) res.push_back({sp.start, sp.end, false});
      break;
    case Behavior::Removed:
      res = spans;  // flag == is_match == remove
      break;
    case Behavior::Contiguous:
      for (const Span& sp : spans) {
        if (!res.empty() && sp.flag == prev_match) res.back().end = sp.end;
        else res.push_back({sp.start, sp.end, false});
        prev_match = sp.flag;
      }
      break;
    case Behavior::MergedWithPrevious:
      for (const Span& sp : spans) {
        if (!res.empty() && sp.flag && !prev_match) res.back().end = sp.end;
        else res.push_back({sp.start, sp.end, false});
        prev_match = sp.flag;
      }
      break;
    case Behavior::MergedWithNext:
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (!res.empty() && it->flag && !prev_match) res.back().start = it->start;
        else res.push_back({it->start, it->end, false});
        prev_match = it->flag;
      }
      std::reverse(res.begin(), res.end());
      break;
  }
  for (const Span& sp : res) {
    if (sp.flag || sp.start == sp.end) continue;
    out.push_back({s.substr(sp.start, sp.end - sp.start), piece.at_start && sp.start == 0});
  }
}

template <typename FindAll>
void split_all(std::vector<Piece>& pieces, const FindAll& find_all, bool invert, Behavior behavior) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 2);
  std::vector<std::pair<size_t, size_t>> matches;
  for (const Piece& p : pieces) {
    matches.clear();
    find_all(p.text, matches);
    split_piece(p, matches, invert, behavior, out);
  }
  pieces = std::move(out);
}

struct SequencePreTokenizer : PreTokenizer {
  std::vector<std::unique_ptr<PreTokenizer>> parts;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& p : parts) p->pre_tokenize(pieces);
  }
};

struct SplitPreTokenizer : PreTokenizer {
  std::unique_ptr<Pattern> pattern;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_all(pieces, [this](std::string_view s, auto& m) { pattern->find_all(s, m); }, invert, behavior);
  }
};

// GPT-2's pre-tokenizer regex, used by ByteLevel when use_regex is true.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct ByteLevelPreTokenizer : PreTokenizer {
  bool add_prefix_space = true;
  std::unique_ptr<Regex> regex;  // null when use_regex is false
  std::string mapped[256];       // byte -> UTF-8 of its printable stand-in (Ġ for ' ', ...)

  ByteLevelPreTokenizer() {
    for (int b = 0; b < 256; ++b) utf8_append(mapped[b], byte_to_char(static_cast<uint8_t>(b)));
  }
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    if (add_prefix_space) {
      for (Piece& p : pieces)
        if (p.text.empty() || p.text[0] != ' ') p.text = std::string(1, ' ').append(p.text);  // per piece, as `tokenizers` does
    }
    if (regex) split_all(pieces, [this](std::string_view s, auto& m) { regex->find_all(s, m); }, false, Behavior::Isolated);
    for (Piece& p : pieces) {
      std::string t;
      t.reserve(p.text.size() * 2);
      for (unsigned char c : p.text) t += mapped[c];
      p.text = std::move(t);
    }
  }
};

// Replaces ' ' by the replacement (▁), prepends one per the scheme, and
// optionally splits before every replacement (MergedWithNext).
struct MetaspacePreTokenizer : PreTokenizer {
  enum class Prepend { Always, First, Never };
  std::string replacement = "\xE2\x96\x81";  // U+2581
  Prepend prepend = Prepend::Always;
  bool split = true;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (Piece& p : pieces) {
      std::string t;
      t.reserve(p.text.size() + replacement.size() * 4);
      for (char c : p.text) {
        if (c == ' ') t += replacement;
        else t += c;
      }
      const bool starts = t.compare(0, replacement.size(), replacement) == 0;
      if (!starts && (prepend == Prepend::Always || (prepend == Prepend::First && p.at_start))) t.insert(0, replacement);
      p.text = std::move(t);
    }
    if (split) {
      const std::string& r = replacement;
      split_all(
          pieces,
          [&r](std::string_view s, auto& m) {
            for (size_t pos = s.find(r); pos != std::string_view::npos; pos = s.find(r, pos + r.size()))
              m.emplace_back(pos, pos + r.size());
          },
          false, Behavior::MergedWithNext);
    }
  }
};

// Splits numbers from the rest: each digit alone, or runs of digits.
struct DigitsPreTokenizer : PreTokenizer {
  std::unique_ptr<Regex> regex;
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    split_all(pieces, [this](std::string_view s, auto& m) { regex->find_all(s, m); }, false, Behavior::Isolated);
  }
};

constexpr const char* kSupportedPreTokenizers = "Sequence, Split, ByteLevel, Metaspace, Digits";

}  // namespace

std::unique_ptr<Normalizer> make_normalizer(const json& j, const std::string& where) {
  const std::string type = json_type(j, where);
  if (type == "Sequence") {
    auto n = std::make_unique<SequenceNormalizer>();
    const json& parts = json_array(j, "normalizers", where);
    for (size_t i = 0; i < parts.size(); ++i)
      n->parts.push_back(make_normalizer(parts[i], fmt::format("{}.normalizers[{}]", where, i)));
    return n;
  }
  if (type == "Prepend") {
    auto n = std::make_unique<PrependNormalizer>();
    n->prepend = json_string(j, "prepend", where);
    return n;
  }
  if (type == "Replace") {
    NIBBLE_CHECK(j.contains("pattern"), "{}: Replace needs a 'pattern'", where);
    auto n = std::make_unique<ReplaceNormalizer>();
    n->pattern = std::make_unique<Pattern>(j["pattern"], where + ".pattern");
    n->content = json_string(j, "content", where);
    return n;
  }
  if (type == "NFC") return std::make_unique<NfcNormalizer>();
  if (type == "NFD") return std::make_unique<NfdNormalizer>();
  if (type == "Strip") {
    auto n = std::make_unique<StripNormalizer>();
    n->left = json_bool(j, "strip_left", true, where);
    n->right = json_bool(j, "strip_right", true, where);
    return n;
  }
  NIBBLE_FAIL("{}: normalizer type '{}' is not supported (supported: {})", where, type, kSupportedNormalizers);
}

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const json& j, const std::string& where) {
  const std::string type = json_type(j, where);
  if (type == "Sequence") {
    auto p = std::make_unique<SequencePreTokenizer>();
    const json& parts = json_array(j, "pretokenizers", where);
    for (size_t i = 0; i < parts.size(); ++i)
      p->parts.push_back(make_pre_tokenizer(parts[i], fmt::format("{}.pretokenizers[{}]", where, i)));
    return p;
  }
  if (type == "Split") {
    NIBBLE_CHECK(j.contains("pattern"), "{}: Split needs a 'pattern'", where);
    auto p = std::make_unique<SplitPreTokenizer>();
    p->pattern = std::make_unique<Pattern>(j["pattern"], where + ".pattern");
    p->behavior = parse_behavior(json_string(j, "behavior", where), where);
    p->invert = json_bool(j, "invert", false, where);
    return p;
  }
  if (type == "ByteLevel") {
    auto p = std::make_unique<ByteLevelPreTokenizer>();
    p->add_prefix_space = json_bool(j, "add_prefix_space", true, where);
    if (json_bool(j, "use_regex", true, where)) p->regex = std::make_unique<Regex>(kGpt2Pattern, where + " (GPT-2 regex)");
    return p;
  }
  if (type == "Metaspace") {
    auto p = std::make_unique<MetaspacePreTokenizer>();
    p->replacement = json_char(j, "replacement", p->replacement, where);
    p->split = json_bool(j, "split", true, where);
    if (j.contains("prepend_scheme") && !j["prepend_scheme"].is_null()) {
      const std::string s = json_string(j, "prepend_scheme", where);
      if (s == "always") p->prepend = MetaspacePreTokenizer::Prepend::Always;
      else if (s == "first") p->prepend = MetaspacePreTokenizer::Prepend::First;
      else if (s == "never") p->prepend = MetaspacePreTokenizer::Prepend::Never;
      else NIBBLE_FAIL("{}: Metaspace prepend_scheme '{}' is not one of always, first, never", where, s);
    } else {  // tokenizers < 0.19 files: add_prefix_space
      p->prepend = json_bool(j, "add_prefix_space", true, where) ? MetaspacePreTokenizer::Prepend::Always
                                                                  : MetaspacePreTokenizer::Prepend::Never;
    }
    return p;
  }
  if (type == "Digits") {
    auto p = std::make_unique<DigitsPreTokenizer>();
    p->regex = std::make_unique<Regex>(json_bool(j, "individual_digits", false, where) ? "\\p{N}" : "\\p{N}+", where);
    return p;
  }
  NIBBLE_FAIL("{}: pre_tokenizer type '{}' is not supported (supported: {})", where, type, kSupportedPreTokenizers);
}

}  // namespace nibble::io::tok
