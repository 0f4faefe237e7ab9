// The eval report: log-spaced histogram counts against hand-placed values, and
// the HTML page read back the way a viewer would: bars and CDF points mapped
// through the axes' own tick labels must give back the synthetic data's
// counts and CDF; no external references; text escaped.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

// nibble::Regex (PCRE2): std::regex recurses per character and overflows the stack on whole SVGs.
#include "nibble/regex.h"
#include "nibble/report.h"

namespace nibble {
namespace {

using eval::EvalReport;
using eval::ReportCandidate;

TEST(Report, LogHistogramBinsByEdges) {
  // 5 bins per decade from 1e-3 to 10: bin k = [10^(-3 + k/5), 10^(-3 + (k+1)/5)).
  // 1.2e-3: log10 = -2.92 -> (0.08 * 5) = 0.4 -> bin 0; 2e-3: -2.70 -> 1.5 -> bin 1;
  // 0.05: -1.30 -> 8.49 -> bin 8; 0.5: -0.30 -> 13.49 -> bin 13; 9.99: 0.9996 -> 19.998 -> bin 19.
  const std::vector<double> v = {0, 5e-4, 1.2e-3, 2e-3, 2e-3, 0.05, 0.5, 0.5, 0.5, 9.99, 10, 12};
  const eval::LogHistogram h = eval::log_histogram(v, -3, 1, 5);
  ASSERT_EQ(h.counts.size(), 20u);
  std::vector<int64_t> want(20, 0);
  want[0] = 1, want[1] = 2, want[8] = 1, want[13] = 3, want[19] = 1;
  EXPECT_EQ(h.counts, want);
  EXPECT_EQ(h.below, 2);  // 0 and 5e-4
  EXPECT_EQ(h.above, 2);  // 10 (the range is half-open) and 12
  EXPECT_NEAR(h.edge(1), std::pow(10.0, -2.8), 1e-15);
  // Every value sits where its edges say it does, whatever log10 rounds to.
  std::vector<double> edges_exact;
  for (size_t i = 0; i <= 20; ++i) edges_exact.push_back(h.edge(i));
  const eval::LogHistogram e = eval::log_histogram(edges_exact, -3, 1, 5);
  EXPECT_EQ(e.counts, std::vector<int64_t>(20, 1));
  EXPECT_EQ(e.above, 1);
}

TEST(Report, HtmlEscapesEveryMarkupCharacter) {
  EXPECT_EQ(eval::html_escape(R"(a<b>&"c'd)"), "a&lt;b&gt;&amp;&quot;c&#39;d");
  EXPECT_EQ(eval::html_escape("plain ≤3×"), "plain ≤3×");
}

// --- reading the page back ------------------------------------------------

// A Markdown table cell as the page shows it: escaped, the near-floor mark as a badge.
std::string html_cell(const std::string& cell) {
  std::string_view v = cell;
  std::string badge;
  if (v.ends_with(eval::kNearNoiseFloorMark)) {
    v.remove_suffix(eval::kNearNoiseFloorMark.size());
    badge = " <span class=\"badge\">≤3× floor</span>";
  }
  return fmt::format(">{}{}</td>", eval::html_escape(v), badge);
}

std::vector<std::string> all_of(const std::string& s, const std::string& pattern) {
  std::vector<std::pair<size_t, size_t>> spans;
  Regex(pattern, "test pattern", Regex::Mode::unicode).find_all(s, spans);
  std::vector<std::string> out;
  for (const auto& [b, e] : spans) out.push_back(s.substr(b, e - b));
  return out;
}

double attr(const std::string& tag, const std::string& name) {
  const std::vector<std::string> found = all_of(tag, "\\b" + name + "=\"[-0-9.]+\"");
  if (found.empty()) {
    ADD_FAILURE() << "no " << name << " in " << tag;
    return 0;
  }
  return std::stod(found[0].substr(name.size() + 2));
}

// The affine map pixel -> value that a plot's tick labels define (log10 of the
// label for the KL axis), fitted through the first and last tick, checked on all.
struct Axis {
  double a = 0, b = 0;  // value = a + b * pixel
  double at(double p) const { return a + b * p; }
};
Axis axis_from_ticks(const std::string& svg, const std::string& cls, const char* coord, bool log) {
  std::vector<std::pair<double, double>> t;  // pixel, value
  for (const auto& tag : all_of(svg, "<text class=\"" + cls + "\"[^>]*>[^<]*</text>")) {
    const double label = std::stod(tag.substr(tag.find('>') + 1));
    t.emplace_back(attr(tag, coord), log ? std::log10(label) : label);
  }
  EXPECT_GE(t.size(), 3u) << cls;
  if (t.size() < 2) return {};
  Axis ax;
  ax.b = (t.back().second - t.front().second) / (t.back().first - t.front().first);
  ax.a = t.front().second - ax.b * t.front().first;
  for (const auto& [p, v] : t) EXPECT_NEAR(ax.at(p), v, 1e-3) << cls << " tick at " << p;
  return ax;
}

std::vector<std::string> svgs(const std::string& html, const std::string& cls) {
  return all_of(html, "<svg class=\"" + cls + "\"[\\s\\S]*?</svg>");
}

// Two candidates with hand-placed per-position KL (b's 1e-4 on a bin edge); the second's name needs escaping.
EvalReport synthetic_report() {
  EvalReport r;
  r.reference = "models/ref";
  r.ctx = 64;
  r.corpora = {{"ts", 2, 62, 1e-4}};
  r.noise_floor_all = 1e-4;
  ReportCandidate a;
  a.name = "out/rtn-g64";
  a.source = "packed:out/rtn-g64";
  a.bits_per_weight = 4.514;
  for (int i = 0; i < 3; ++i) a.kl.push_back(0);
  for (int i = 0; i < 4; ++i) a.kl.push_back(2e-4);
  for (int i = 0; i < 6; ++i) a.kl.push_back(3e-3);
  for (int i = 0; i < 5; ++i) a.kl.push_back(0.05);
  for (int i = 0; i < 2; ++i) a.kl.push_back(0.7);
  eval::KlSummary s;
  s.corpus = "ts";
  s.positions = 20;
  s.kl.mean = 0.0948;
  s.kl.p99 = 0.7, s.kl.max = 0.7;
  s.has_ci = true, s.kl_ci_lo = 0.05, s.kl_ci_hi = 0.14;
  s.top1 = 0.8;
  s.ppl_ref = 5.5, s.ppl_cand = 6.25;
  s.noise_floor = 1e-4;
  a.rows = {s};
  ReportCandidate b;
  b.name = R"(overlay:x<y>,keep=a&b"c'd)";
  b.source = "overlay <&>";
  b.bits_per_weight = 6.5;
  b.kl = {1.5e-6, 3e-5, 3e-5, 1e-4, 2.5, 0, 4e-4, 4e-4, 4e-4, 4e-4};
  s.kl.mean = 2.5e-4;  // within 3x the noise floor
  s.kl.max = 2.5;
  b.rows = {s};
  r.candidates = {a, b};
  return r;
}

TEST(Report, HtmlIsSelfContainedAndEscaped) {
  const EvalReport r = synthetic_report();
  const std::string html = eval::html_report(r);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("</html>"), std::string::npos);
  for (const char* bad : {"http://", "https://", "src=", "href=", "url(", "@import", "<script", "<link", "<img"})
    EXPECT_EQ(html.find(bad), std::string::npos) << bad;
  // The escaped name everywhere it appears (title of the CDF line, legend, tables, headings), never the raw one.
  EXPECT_EQ(html.find("x<y>"), std::string::npos);
  EXPECT_EQ(html.find("a&b"), std::string::npos);
  EXPECT_EQ(html.find("overlay <&>"), std::string::npos);
  EXPECT_GE(all_of(html, "overlay:x&lt;y&gt;,keep=a&amp;b&quot;c&#39;d").size(), 5u);
  // The comparison table shows the same cells as the Markdown table, and marks
  // the candidate within 3x the noise floor (and only it).
  const std::string md = eval::comparison_markdown(r);
  for (const auto& c : r.candidates)
    for (const auto& cell : eval::comparison_cells(r, c)) {
      EXPECT_NE(md.find(fmt::format("| {} |", cell)), std::string::npos) << cell;
      EXPECT_NE(html.find(html_cell(cell)), std::string::npos) << cell;
    }
  EXPECT_NE(md.find("0.00025 [0.05000, 0.14000] (≤3× noise floor)"), std::string::npos) << md;
  const auto near_rows = all_of(html, "<tr class=\"near\">.*</tr>");
  ASSERT_EQ(near_rows.size(), 2u);  // comparison and per-corpus tables
  for (const auto& row : near_rows) {
    EXPECT_NE(row.find("x&lt;y&gt;"), std::string::npos) << row;
    EXPECT_NE(row.find(">0.00025 [0.05000, 0.14000] <span class=\"badge\">≤3× floor</span></td>"), std::string::npos) << row;
  }
  EXPECT_EQ(all_of(html, "≤3× floor</span>").size(), 2u);
  EXPECT_NE(html.find("noise floor 0.0001"), std::string::npos);
}

TEST(Report, HistogramBarsAreTheDataCountsOnTheDrawnAxes) {
  const EvalReport r = synthetic_report();
  const std::string html = eval::html_report(r);
  const auto hists = svgs(html, "hist");
  ASSERT_EQ(hists.size(), 2u);
  // Both candidates share one axis range: 1e-6 (below b's smallest positive 1.5e-6) to 10 (above b's 2.5).
  for (const auto& svg : hists) {
    const auto ticks = all_of(svg, "<text class=\"xtick\"[^>]*>[^<]*</text>");
    ASSERT_EQ(ticks.size(), 8u);
    EXPECT_NE(ticks.front().find(">1e-6<"), std::string::npos);
    EXPECT_NE(ticks.back().find(">10<"), std::string::npos);
  }
  for (size_t c = 0; c < 2; ++c) {
    const std::string& svg = hists[c];
    const std::vector<double>& kl = r.candidates[c].kl;
    const Axis x = axis_from_ticks(svg, "xtick", "x", true);
    const Axis y = axis_from_ticks(svg, "ytick", "y", false);
    int64_t total = 0;
    for (const auto& tag : all_of(svg, "<rect class=\"bar\"[^>]*>")) {
      const double l0 = x.at(attr(tag, "x")), l1 = x.at(attr(tag, "x") + attr(tag, "width"));  // log10 of the edges
      EXPECT_NEAR(l1 - l0, 0.2, 1e-3);  // 5 bins per decade
      EXPECT_NEAR(5 * l0, std::round(5 * l0), 5e-3) << "bins start on decade fifths";
      // Snapped to the exact fifths, so that a value on an edge (b's 1e-4) is counted where the half-open bins put it.
      const double lo = std::pow(10.0, std::round(5 * l0) / 5), hi = std::pow(10.0, std::round(5 * l1) / 5);
      const double height = y.at(attr(tag, "y")) - y.at(attr(tag, "y") + attr(tag, "height"));
      const int64_t want = std::count_if(kl.begin(), kl.end(), [&](double v) { return v >= lo && v < hi; });
      EXPECT_GT(want, 0) << "a bar where there is no data: " << tag;
      EXPECT_NEAR(height, static_cast<double>(want), 0.01) << tag;
      total += want;
    }
    // The bar left of the axis: everything below 1e-6, i.e. the zeros.
    const auto below = all_of(svg, "<rect class=\"bar below\"[^>]*>");
    ASSERT_EQ(below.size(), 1u);
    const int64_t zeros = std::count(kl.begin(), kl.end(), 0.0);
    EXPECT_NEAR(y.at(attr(below[0], "y")) - y.at(attr(below[0], "y") + attr(below[0], "height")),
                static_cast<double>(zeros), 0.01);
    EXPECT_EQ(total + zeros, static_cast<int64_t>(kl.size())) << "every position in some bar";
    // The noise floor line at 1e-4, the mean line at the candidate's mean.
    const auto nf = all_of(svg, "<line class=\"marker noise-floor\"[^>]*>");
    ASSERT_EQ(nf.size(), 1u);
    EXPECT_NEAR(x.at(attr(nf[0], "x1")), -4.0, 1e-3);
    const auto mean = all_of(svg, "<line class=\"marker mean\"[^>]*>");
    ASSERT_EQ(mean.size(), 1u);
    EXPECT_NEAR(x.at(attr(mean[0], "x1")), std::log10(r.candidates[c].overall().kl.mean), 1e-3);
  }
}

TEST(Report, CdfPointsAreTheEmpiricalCdf) {
  const EvalReport r = synthetic_report();
  const std::string html = eval::html_report(r);
  const auto cdfs = svgs(html, "cdf");
  ASSERT_EQ(cdfs.size(), 3u);  // all candidates together, then one per candidate
  EXPECT_EQ(all_of(cdfs[0], "<polyline").size(), 2u);
  for (size_t c = 0; c < 2; ++c) {
    const std::string& svg = cdfs[c + 1];
    std::vector<double> kl = r.candidates[c].kl;
    const double n = static_cast<double>(kl.size());
    const Axis x = axis_from_ticks(svg, "xtick", "x", true);
    const Axis y = axis_from_ticks(svg, "ytick", "y", false);
    const auto lines = all_of(svg, "points=\"[^\"]*\"");
    ASSERT_EQ(lines.size(), 1u);
    std::vector<std::pair<double, double>> pts;  // (log10 KL, F)
    for (const auto& pair : all_of(lines[0], "[-0-9.]+,[-0-9.]+")) {
      const size_t comma = pair.find(',');
      pts.emplace_back(x.at(std::stod(pair.substr(0, comma))), y.at(std::stod(pair.substr(comma + 1))));
    }
    ASSERT_GE(pts.size(), 3u);
    // Starts at the left edge (1e-6) at the fraction below it (the zeros), ends at F = 1.
    EXPECT_NEAR(pts.front().first, -6.0, 1e-3);
    EXPECT_NEAR(pts.front().second, std::count(kl.begin(), kl.end(), 0.0) / n, 1e-4);
    EXPECT_NEAR(pts.back().second, 1.0, 1e-4);
    // Every inner vertex is at a data value, at F just below it or at it; every distinct value is drawn.
    std::map<double, int> seen;
    for (size_t i = 1; i + 1 < pts.size(); ++i) {
      const double v = std::pow(10.0, pts[i].first);
      const auto hit = std::find_if(kl.begin(), kl.end(), [&](double k) { return k > 0 && std::fabs(k / v - 1) < 2e-3; });
      ASSERT_NE(hit, kl.end()) << "vertex at KL " << v << " is no data value";
      const double lt = std::count_if(kl.begin(), kl.end(), [&](double k) { return k < *hit; }) / n;
      const double le = std::count_if(kl.begin(), kl.end(), [&](double k) { return k <= *hit; }) / n;
      EXPECT_TRUE(std::fabs(pts[i].second - lt) < 1e-4 || std::fabs(pts[i].second - le) < 1e-4)
          << "F(" << *hit << ") drawn " << pts[i].second << ", data " << lt << " / " << le;
      seen[*hit]++;
      EXPECT_GE(pts[i].first, pts[i - 1].first - 1e-9);
      EXPECT_GE(pts[i].second, pts[i - 1].second - 1e-9);
    }
    std::sort(kl.begin(), kl.end());
    kl.erase(std::unique(kl.begin(), kl.end()), kl.end());
    EXPECT_EQ(seen.size(), static_cast<size_t>(std::count_if(kl.begin(), kl.end(), [](double k) { return k > 0; })));
    for (const auto& [v, count] : seen) EXPECT_EQ(count, 2) << v;  // (v, F(v-)) and (v, F(v))
    ASSERT_EQ(all_of(svg, "<line class=\"marker noise-floor\"[^>]*>").size(), 1u);
  }
}

TEST(Report, CdfOfManyPositionsIsThinnedToExactPoints) {
  EvalReport r = synthetic_report();
  r.candidates.resize(1);
  std::vector<double>& kl = r.candidates[0].kl;
  kl.clear();
  for (int i = 0; i < 20000; ++i) kl.push_back(1e-5 * std::pow(1e5, (i % 997) / 996.0));  // 997 distinct, 1e-5..1
  const auto cdfs = svgs(eval::html_report(r), "cdf");
  ASSERT_EQ(cdfs.size(), 2u);
  const auto pts = all_of(cdfs[1], "[-0-9.]+,[-0-9.]+");
  EXPECT_LE(pts.size(), 2u * 600 + 4);
  EXPECT_GE(pts.size(), 2u * 300);
  const Axis y = axis_from_ticks(cdfs[1], "ytick", "y", false);
  EXPECT_NEAR(y.at(std::stod(pts.back().substr(pts.back().find(',') + 1))), 1.0, 1e-4);
}

}  // namespace
}  // namespace nibble
