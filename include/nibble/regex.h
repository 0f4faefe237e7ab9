// Regular expressions through PCRE2 (JIT when available), for every pattern
// nibble matches: tokenizer.json's pre-tokenizers, --keep and overlay keep=
// over tensor names, the numbers of GSM8K answers. PCRE2 matches iteratively;
// std::regex (libstdc++) recurses once per character and overflows the stack
// on long subjects.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nibble {

class Regex {
 public:
  enum class Mode {
    bytes,    // ASCII classes (\d is [0-9], . is one byte): what std::regex's ECMAScript grammar does
    unicode,  // UTF-8 subjects, Unicode properties and classes (PCRE2_UTF | PCRE2_UCP)
  };
  // `where` names the pattern's place in errors ("--keep", "tokenizer.json: pre_tokenizer").
  // A pattern that does not compile throws nibble::Error saying where and at which offset.
  Regex(std::string pattern, const std::string& where, Mode mode = Mode::bytes);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the [start, end) byte spans of all non-overlapping matches, left to right
  // (an empty match moves the search on by one character). In unicode mode a subject
  // that is not valid UTF-8 throws.
  void find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const;
  // Whether the pattern matches anywhere in `s` (std::regex_search).
  bool search(std::string_view s) const;
  const std::string& pattern() const { return pattern_; }

 private:
  template <class OnMatch>
  void scan(std::string_view s, OnMatch&& on_match) const;

  std::string pattern_;
  Mode mode_;
  void* code_ = nullptr;  // pcre2_code_8*
};

}  // namespace nibble
