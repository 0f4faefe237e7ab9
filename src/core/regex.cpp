#include "nibble/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>

#include "nibble/error.h"

namespace nibble {

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(code, msg, sizeof msg);
  return reinterpret_cast<const char*>(msg);
}

size_t utf8_lead_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }
}  // namespace

Regex::Regex(std::string pattern, const std::string& where, Mode mode) : pattern_(std::move(pattern)), mode_(mode) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  const uint32_t options = mode == Mode::unicode ? PCRE2_UTF | PCRE2_UCP : 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), options, &err,
                                   &err_offset, nullptr);
  if (!code)
    NIBBLE_FAIL("{}: '{}' is not a valid regular expression: {} (PCRE2, at offset {})", where, pattern_,
                pcre2_message(err), err_offset);
  code_ = code;
  // Fails only where PCRE2 has no JIT; the interpreter then matches.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

// Calls on_match(start, end) for each non-overlapping match, left to right,
// until it returns false.
template <class OnMatch>
void Regex::scan(std::string_view s, OnMatch&& on_match) const {
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(code, nullptr), &pcre2_match_data_free);
  NIBBLE_CHECK(md != nullptr, "regex '{}': out of memory creating PCRE2 match data", pattern_);
  // Made only when a match overflows the JIT's default 32 KiB stack (huge
  // whitespace runs can): then that match is retried with a 64 MiB one.
  std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> mctx(nullptr, &pcre2_match_context_free);
  std::unique_ptr<pcre2_jit_stack, decltype(&pcre2_jit_stack_free)> jit_stack(nullptr, &pcre2_jit_stack_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
  // PCRE2 checks a UTF-8 subject on the first match; checking it again on every
  // later one would make a scan O(n^2).
  uint32_t flags = 0;
  size_t pos = 0;
  while (pos <= s.size()) {
    const int rc = pcre2_match(code, subject, s.size(), pos, flags, md.get(), mctx.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !jit_stack) {
      mctx.reset(pcre2_match_context_create(nullptr));
      jit_stack.reset(pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr));
      NIBBLE_CHECK(mctx && jit_stack, "regex '{}': out of memory creating a PCRE2 JIT stack", pattern_);
      pcre2_jit_stack_assign(mctx.get(), nullptr, jit_stack.get());
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) return;
    // On a UTF-8 error PCRE2 gives the invalid character's offset as the start char (not in the ovector).
    if (rc <= PCRE2_ERROR_UTF8_ERR1 && rc >= PCRE2_ERROR_UTF8_ERR21)
      NIBBLE_FAIL("regex '{}': the text is not valid UTF-8 at byte {}: {}", pattern_,
                  pcre2_get_startchar(md.get()), pcre2_message(rc));
    if (rc < 0) NIBBLE_FAIL("regex '{}': PCRE2 match failed at byte {}: {}", pattern_, pos, pcre2_message(rc));
    flags = PCRE2_NO_UTF_CHECK;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t start = ov[0], end = ov[1];
    if (!on_match(start, end)) return;
    if (end > start) {
      pos = end;
    } else {  // empty match: step over one character so the search moves on
      if (end >= s.size()) return;
      pos = end + (mode_ == Mode::unicode ? utf8_lead_len(static_cast<unsigned char>(s[end])) : 1);
    }
  }
}

void Regex::find_all(std::string_view s, std::vector<std::pair<size_t, size_t>>& out) const {
  scan(s, [&](size_t start, size_t end) {
    out.emplace_back(start, end);
    return true;
  });
}

bool Regex::search(std::string_view s) const {
  bool found = false;
  scan(s, [&](size_t, size_t) { return !(found = true); });
  return found;
}

}  // namespace nibble
