// The eval report's tables (shared by the CLI's Markdown and the HTML page)
// and the log-spaced histogram the page draws.
#include "nibble/report.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "nibble/error.h"

namespace nibble::eval {

const KlSummary& ReportCandidate::overall() const {
  NIBBLE_CHECK(!rows.empty(), "report: candidate {} has no scored corpus", name);
  for (const KlSummary& s : rows)
    if (s.corpus == "all" && rows.size() > 1) return s;
  return rows.front();
}

// The same test as the JSON's within_3x_noise_floor and the Markdown mark.
bool ReportCandidate::near_noise_floor() const { return overall().kl.mean <= 3 * overall().noise_floor; }

namespace {
std::string kl5(double v) { return fmt::format("{:.5f}", v); }
// " [lo, hi]" of an interval with the value's own format, or " [–]" where none was bootstrapped (--bootstrap 0).
std::string interval(bool has, const std::string& lo, const std::string& hi) {
  return has ? " [" + lo + ", " + hi + "]" : " [–]";
}
// The KL mean with its interval, marked where it is within 3× the noise floor.
std::string kl_with_ci(const KlSummary& s, bool near) {
  return fmt::format("{}{}", kl_mean_with_ci(s), near ? kNearNoiseFloorMark : "");
}
}  // namespace

std::string kl_mean_with_ci(const KlSummary& s) {
  return kl5(s.kl.mean) + interval(s.has_ci, kl5(s.kl_ci_lo), kl5(s.kl_ci_hi));
}

std::vector<std::string> comparison_header(const EvalReport& r) {
  std::vector<std::string> h = {"candidate", "bits/weight", "KL mean [95% CI]", "KL p99", "KL max", "top-1", "PPL"};
  for (const ReportCorpus& c : r.corpora) h.push_back("KL " + c.name);
  return h;
}

std::vector<std::string> comparison_cells(const EvalReport& r, const ReportCandidate& c) {
  const KlSummary& o = c.overall();
  std::vector<std::string> cells = {
      c.name,
      fmt::format("{:.3f}", c.bits_per_weight),
      kl_with_ci(o, c.near_noise_floor()),
      fmt::format("{:.4f}", o.kl.p99),
      fmt::format("{:.4f}", o.kl.max),
      fmt::format("{:.2f} %", 100 * o.top1),
      fmt::format("{:.4f}", o.ppl_cand)};
  for (const ReportCorpus& rc : r.corpora) {
    std::string cell = "–";  // a corpus this candidate was not scored on (not produced by nibble eval)
    for (const KlSummary& s : c.rows)
      if (s.corpus == rc.name) cell = kl5(s.kl.mean);
    cells.push_back(cell);
  }
  return cells;
}

std::vector<std::string> detail_header() {
  return {"candidate", "corpus", "KL mean [95% CI]", "median", "p90", "p99", "p99.9", "max", "top-1 [95% CI]",
          "ppl ref", "ppl cand", "Δppl"};
}

std::vector<std::string> detail_cells(const KlSummary& s) {
  const bool near = s.kl.mean <= 3 * s.noise_floor;
  return {s.corpus,
          kl_with_ci(s, near),
          kl5(s.kl.median),
          kl5(s.kl.p90),
          kl5(s.kl.p99),
          kl5(s.kl.p999),
          fmt::format("{:.4f}", s.kl.max),
          fmt::format("{:.2f} %", 100 * s.top1) +
              interval(s.has_ci, fmt::format("{:.2f}", 100 * s.top1_ci_lo), fmt::format("{:.2f}", 100 * s.top1_ci_hi)),
          fmt::format("{:.4f}", s.ppl_ref),
          fmt::format("{:.4f}", s.ppl_cand),
          fmt::format("{:+.4f}", s.ppl_cand - s.ppl_ref)};
}

std::string markdown_row(const std::vector<std::string>& cells) {
  std::string s = "|";
  for (const auto& c : cells) s += " " + c + " |";
  return s;
}

std::string comparison_markdown(const EvalReport& r) {
  const auto header = comparison_header(r);
  std::string s = markdown_row(header) + "\n|";
  for (size_t i = 0; i < header.size(); ++i) s += "---|";
  s += "\n";
  for (const ReportCandidate& c : r.candidates) s += markdown_row(comparison_cells(r, c)) + "\n";
  return s;
}

double LogHistogram::edge(size_t i) const {
  return std::pow(10.0, lo_decade + static_cast<double>(i) / per_decade);
}

LogHistogram log_histogram(const std::vector<double>& values, int lo_decade, int hi_decade, int per_decade) {
  NIBBLE_CHECK(hi_decade > lo_decade && per_decade > 0, "log_histogram: bad range 1e{}..1e{} with {} bins per decade",
               lo_decade, hi_decade, per_decade);
  LogHistogram h;
  h.lo_decade = lo_decade;
  h.hi_decade = hi_decade;
  h.per_decade = per_decade;
  const size_t n = static_cast<size_t>(hi_decade - lo_decade) * static_cast<size_t>(per_decade);
  h.counts.assign(n, 0);
  const double lo = h.edge(0), hi = h.edge(n);
  for (double v : values) {
    if (!(v >= lo)) {  // zeros, and NaN (never produced: KL is clamped at 0)
      ++h.below;
      continue;
    }
    if (v >= hi) {
      ++h.above;
      continue;
    }
    // The bin from the logarithm, then settled against the edges themselves, so
    // that membership is exactly edge(i) <= v < edge(i+1) whatever log10 rounds to.
    auto b = static_cast<int64_t>(std::floor((std::log10(v) - lo_decade) * per_decade));
    b = std::clamp<int64_t>(b, 0, static_cast<int64_t>(n) - 1);
    while (b > 0 && v < h.edge(static_cast<size_t>(b))) --b;
    while (b + 1 < static_cast<int64_t>(n) && v >= h.edge(static_cast<size_t>(b) + 1)) ++b;
    ++h.counts[static_cast<size_t>(b)];
  }
  return h;
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

}  // namespace nibble::eval
