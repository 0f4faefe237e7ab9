// UTF-8 helpers, Unicode White_Space, and NFC/NFD for the tokenizer.
//
// NFC/NFD follow UAX #15: full canonical decomposition (tables + algorithmic
// Hangul), canonical ordering by combining class, then canonical composition
// with the blocking rule. The tables in tokenizer_unicode_data.cpp were
// generated from Python's unicodedata with this script (Unicode version in
// kUnicodeDataVersion):
//
//   for cp in range(0x110000):
//       ccc ranges:  runs of equal unicodedata.combining(chr(cp)) != 0
//       decompositions (skipping Hangul syllables and <compat> ones):
//           parts = unicodedata.decomposition(chr(cp)).split()  # 1 or 2 code points
//           composes = len(parts) == 2 and NFC(NFD(chr(cp))) == chr(cp)   # primary composite
//
// `tokenizers` uses the Rust unicode-normalization tables of its own (older)
// Unicode version; the two agree on every character that existed in both.
#include <algorithm>
#include <unordered_map>

#include "io/tokenizer_impl.h"

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

namespace {

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;

uint8_t ccc_of(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CccRange* end = kCcc + kCccCount;
  const CccRange* it = std::upper_bound(kCcc, end, cp, [](uint32_t c, const CccRange& r) { return c < r.first; });
  if (it == kCcc) return 0;
  --it;
  return cp <= it->last ? it->ccc : 0;
}

const Decomposition* find_decomposition(uint32_t cp) {
  const Decomposition* end = kDecompositions + kDecompositionCount;
  const Decomposition* it =
      std::lower_bound(kDecompositions, end, cp, [](const Decomposition& d, uint32_t c) { return d.cp < c; });
  return (it != end && it->cp == cp) ? it : nullptr;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* d = cp < 0xC0 ? nullptr : find_decomposition(cp);
  if (!d) {
    out.push_back(cp);
    return;
  }
  decompose(d->first, out);
  if (d->second) decompose(d->second, out);
}

// Full canonical decomposition + canonical ordering.
std::vector<uint32_t> canonical_decomposition(std::string_view s) {
  std::vector<uint32_t> cps;
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) decompose(utf8_next(s, i), cps);
  // Stable sort of every run of non-starters by combining class.
  for (size_t i = 0; i < cps.size();) {
    if (ccc_of(cps[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < cps.size() && ccc_of(cps[j]) != 0) ++j;
    std::stable_sort(cps.begin() + static_cast<std::ptrdiff_t>(i), cps.begin() + static_cast<std::ptrdiff_t>(j),
                     [](uint32_t a, uint32_t b) { return ccc_of(a) < ccc_of(b); });
    i = j;
  }
  return cps;
}

const std::unordered_map<uint64_t, uint32_t>& composition_table() {
  static const std::unordered_map<uint64_t, uint32_t> table = [] {
    std::unordered_map<uint64_t, uint32_t> t;
    for (size_t i = 0; i < kDecompositionCount; ++i) {
      const Decomposition& d = kDecompositions[i];
      if (d.composes) t.emplace((uint64_t(d.first) << 21) | d.second, d.cp);
    }
    return t;
  }();
  return table;
}

// The primary composite of (a, b), or 0.
uint32_t compose_pair(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const auto& t = composition_table();
  auto it = t.find((uint64_t(a) << 21) | b);
  return it == t.end() ? 0 : it->second;
}

std::string encode_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) utf8_append(out, cp);
  return out;
}

}  // namespace

std::string nfd(std::string_view s) { return encode_utf8(canonical_decomposition(s)); }

std::string nfc(std::string_view s) {
  // Code points below U+0300 are all NFC-stable and never compose with what
  // follows them unless a combining mark (>= U+0300, lead byte >= 0xCC) comes.
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0xCC; }))
    return std::string(s);
  const std::vector<uint32_t> cps = canonical_decomposition(s);
  std::vector<uint32_t> out;
  out.reserve(cps.size());
  std::ptrdiff_t starter = -1;  // index in `out` of the last starter
  for (uint32_t c : cps) {
    const uint8_t cc = ccc_of(c);
    if (starter >= 0) {
      // Blocked when something sits between the starter and c whose class is 0 or >= c's.
      const bool adjacent = static_cast<std::ptrdiff_t>(out.size()) == starter + 1;
      const uint8_t last_cc = ccc_of(out.back());
      if (adjacent || (last_cc != 0 && last_cc < cc)) {
        if (uint32_t composite = compose_pair(out[static_cast<size_t>(starter)], c)) {
          out[static_cast<size_t>(starter)] = composite;
          continue;
        }
      }
    }
    if (cc == 0) starter = static_cast<std::ptrdiff_t>(out.size());
    out.push_back(c);
  }
  return encode_utf8(out);
}

}  // namespace nibble::io::tok
