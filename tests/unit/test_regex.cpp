// nibble::Regex (PCRE2) against spans worked out by hand (and what Python's
// re.finditer gives for the same pattern and text): non-overlapping matches
// left to right, empty matches stepping one character, byte offsets in UTF-8.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "nibble/error.h"
#include "nibble/regex.h"
#include "test_util.h"

namespace nibble {
namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

Spans spans(const Regex& re, std::string_view s) {
  Spans out;
  re.find_all(s, out);
  return out;
}

TEST(Regex, FindsAllMatchesLeftToRight) {
  const Regex digits("\\d+", "test");
  EXPECT_EQ(spans(digits, "a1b22c333"), (Spans{{1, 2}, {3, 5}, {6, 9}}));
  EXPECT_EQ(spans(digits, "none"), Spans{});
  // re.finditer("x*", "ab"): an empty match at 0, 1 and 2.
  EXPECT_EQ(spans(Regex("x*", "test"), "ab"), (Spans{{0, 0}, {1, 1}, {2, 2}}));
  // re.finditer("a|ab", "abab"): leftmost alternative first, as ECMAScript and
  // Perl do.
  EXPECT_EQ(spans(Regex("a|ab", "test"), "abab"), (Spans{{0, 1}, {2, 3}}));
}

TEST(Regex, SearchIsAMatchAnywhere) {
  // What --keep and overlay keep= ask of a tensor name.
  const std::string name = "model.layers.0.mlp.down_proj.weight";
  EXPECT_TRUE(Regex("mlp", "--keep").search(name));
  EXPECT_FALSE(Regex("^mlp", "--keep").search(name));
  EXPECT_TRUE(Regex("layers\\.[02]\\.mlp\\.down_proj|q_proj", "--keep").search(name));
  EXPECT_FALSE(Regex("layers\\.[13]\\.", "--keep").search(name));
  EXPECT_TRUE(Regex("", "--keep").search(""));
}

TEST(Regex, UnicodeModeCountsCharactersAndBytesModeBytes) {
  // "héllo wörld": é and ö are two bytes each, so the words are bytes [0, 6)
  // and [7, 13).
  const std::string text = "h\xC3\xA9llo w\xC3\xB6rld";
  EXPECT_EQ(spans(Regex("\\p{L}+", "test", Regex::Mode::unicode), text), (Spans{{0, 6}, {7, 13}}));
  // An empty match steps over a whole character in unicode mode: "é" has
  // positions 0 and 2.
  EXPECT_EQ(spans(Regex("x*", "test", Regex::Mode::unicode), "\xC3\xA9"), (Spans{{0, 0}, {2, 2}}));
  // ARABIC-INDIC DIGIT THREE (U+0663) is a digit to Unicode, not to ASCII \d.
  const std::string three = "\xD9\xA3";
  EXPECT_EQ(spans(Regex("\\d", "test", Regex::Mode::unicode), three), (Spans{{0, 2}}));
  EXPECT_EQ(spans(Regex("\\d", "test"), three), Spans{});
  // Bytes mode takes any bytes; unicode mode says where the text stops being
  // UTF-8.
  EXPECT_EQ(spans(Regex("\\d", "test"),
                  "1\xFF"
                  "2"),
            (Spans{{0, 1}, {2, 3}}));
  const std::string bad = test::error_of([] {
    spans(Regex("\\d", "test", Regex::Mode::unicode),
          "12\xFF"
          "3");
  });
  EXPECT_NE(bad.find("not valid UTF-8 at byte 2"), std::string::npos) << bad;
}

TEST(Regex, ABadPatternSaysWhereAndWhat) {
  const std::string e = test::error_of([] { Regex("(['", "--keep"); });
  EXPECT_NE(e.find("--keep: '(['"), std::string::npos) << e;
  EXPECT_NE(e.find("is not a valid regular expression"), std::string::npos) << e;
  EXPECT_NE(e.find("at offset 3"), std::string::npos) << e;
}

TEST(Regex, LongSubjectsDoNotExhaustTheStack) {
  // libstdc++'s std::regex recurses once per character of such a match and
  // overflows an 8 MiB stack long before this; the JIT falls back to a larger
  // heap stack when its own runs out.
  std::string s;
  for (int i = 0; i < 500000; ++i) s += i % 3 ? "ab" : "ba";
  s += "c";
  EXPECT_EQ(spans(Regex("(?:a|b)*c", "test"), s), (Spans{{0, s.size()}}));
  EXPECT_EQ(spans(Regex("(a|b)+?c", "test", Regex::Mode::unicode), s), (Spans{{0, s.size()}}));
}

}  // namespace
}  // namespace nibble
