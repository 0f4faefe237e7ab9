// UTF-8 helpers, Unicode White_Space, and NFC/NFD (through utf8proc) for the tokenizer.

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>

#include "io/tokenizer_impl.h"
#include "nibble/error.h"

namespace nibble::io::tok {

// ---- UTF-8 ------------------------------------------------------------------

namespace {

// Length of the well-formed sequence at p (Unicode Table 3-7), or minus the
// length of its maximal ill-formed subpart (>= 1) when it is not well formed.
int check_sequence(const unsigned char* p, size_t n) {
  const unsigned char c = p[0];
  if (c < 0x80) return 1;
  int len = 0;
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c == 0xE0) {
    len = 3, lo = 0xA0;
  } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
    len = 3;
  } else if (c == 0xED) {
    len = 3, hi = 0x9F;  // no surrogates
  } else if (c == 0xF0) {
    len = 4, lo = 0x90;  // no overlongs
  } else if (c >= 0xF1 && c <= 0xF3) {
    len = 4;
  } else if (c == 0xF4) {
    len = 4, hi = 0x8F;  // <= U+10FFFF
  } else {
    return -1;
  }
  for (int k = 1; k < len; ++k) {
    if (static_cast<size_t>(k) >= n) return -k;
    const unsigned char b = p[k];
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return -k;
  }
  return len;
}

}  // namespace

size_t utf8_invalid_at(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const int r = check_sequence(p + i, s.size() - i);
    if (r < 0) return i;
    i += static_cast<size_t>(r);
  }
  return std::string_view::npos;
}

size_t utf8_char_len(unsigned char lead) {
  if (lead < 0x80) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

uint32_t utf8_next(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  const size_t n = utf8_char_len(p[0]);
  uint32_t cp;
  switch (n) {
    case 1: cp = p[0]; break;
    case 2: cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu); break;
    case 3: cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu); break;
    default: cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu); break;
  }
  i += n;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int r = check_sequence(p + i, bytes.size() - i);
    if (r > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(r));
      i += static_cast<size_t>(r);
    } else {
      out += kReplacementChar;  // one U+FFFD per maximal ill-formed subpart, as Rust does
      i += static_cast<size_t>(-r);
    }
  }
  return out;
}

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

// ---- NFC / NFD --------------------------------------------------------------
// utf8proc (Debian's libutf8proc) implements UAX #15; tokenizers uses Rust's
// unicode-normalization. They can differ only on characters added in Unicode
// versions one of them lacks.

namespace {
std::string normalize_with(std::string_view s, utf8proc_option_t options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options | UTF8PROC_STABLE));
  NIBBLE_CHECK(n >= 0, "Unicode normalization failed: {}", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}
}  // namespace

std::string nfd(std::string_view s) { return normalize_with(s, UTF8PROC_DECOMPOSE); }

std::string nfc(std::string_view s) {
  // Text below U+0300 (lead bytes < 0xCC) is NFC already: skip the copy.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return std::string(s);
  return normalize_with(s, UTF8PROC_COMPOSE);
}

}  // namespace nibble::io::tok
