// The eval report: the comparison table as Markdown cells (the CLI's table)
// and as one self-contained HTML page with inline-SVG plots of each
// candidate's per-position KL (`nibble eval --html`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "nibble/kl.h"

namespace nibble::eval {

struct ReportCandidate {
  std::string name;              // the --candidate spec as given
  std::string source;            // what it resolved to (ModelSource::describe)
  double bits_per_weight = 0;    // stored bits per weight of the decoder linears and a separate head
  std::vector<KlSummary> rows;   // score_candidate's: one per corpus, then "all" when there are several
  std::vector<double> kl;        // KL of every scored position, pooled (score_candidate's per_position_kl)

  const KlSummary& overall() const;  // the pooled row ("all", or the only corpus)
  bool near_noise_floor() const;     // pooled KL mean within 3x the pooled noise floor
};

struct ReportCorpus {
  std::string name;
  int64_t windows = 0, positions = 0;
  double noise_floor = 0;  // KL mean of the bf16-activation reference vs the f32 one
};

struct EvalReport {
  std::string reference;
  int64_t ctx = 0;
  std::vector<ReportCorpus> corpora;
  double noise_floor_all = 0;  // pooled over the corpora
  std::vector<ReportCandidate> candidates;
};

// What a KL cell ends with when its mean is within 3x the noise floor.
inline constexpr std::string_view kNearNoiseFloorMark = " (≤3× noise floor)";

// The comparison table (one row per candidate, pooled over the corpora): its
// header and each row's cells as formatted text, shared by the Markdown table
// and the HTML page so that both show the same numbers.
std::vector<std::string> comparison_header(const EvalReport& r);
std::vector<std::string> comparison_cells(const EvalReport& r, const ReportCandidate& c);
// The per-corpus detail table: its header ("candidate", "corpus", "KL mean
// [95% CI]", median … Δppl) and one row's cells after the candidate's name.
std::vector<std::string> detail_header();
std::vector<std::string> detail_cells(const KlSummary& s);
// Cells as one Markdown table row: "| a | b |".
std::string markdown_row(const std::vector<std::string>& cells);
// A KL mean with its 95 % interval, "0.09480 [0.05000, 0.14000]", or
// "0.09480 [–]" where none was bootstrapped; the cells above and the HTML
// page's summary lines all write it this way.
std::string kl_mean_with_ci(const KlSummary& s);
std::string comparison_markdown(const EvalReport& r);

// A histogram over log-spaced bins: `per_decade` bins per decade from
// 10^lo_decade to 10^hi_decade, bin i = [edge(i), edge(i+1)) with
// edge(i) = 10^(lo_decade + i / per_decade). Values below 10^lo_decade (zeros
// included) are counted in `below`, values at or above 10^hi_decade in `above`.
struct LogHistogram {
  int lo_decade = 0, hi_decade = 0, per_decade = 1;
  std::vector<int64_t> counts;
  int64_t below = 0, above = 0;
  double edge(size_t i) const;
};
LogHistogram log_histogram(const std::vector<double>& values, int lo_decade, int hi_decade, int per_decade);

// Text made safe for HTML element content and quoted attribute values: & < > " '.
std::string html_escape(std::string_view s);

// The report as one HTML page that needs nothing else (no scripts, fonts,
// styles or images from anywhere): the setup, the noise floor, the comparison
// and per-corpus tables, an overlay of every candidate's KL CDF, and per
// candidate a histogram and an empirical CDF of the per-position KL.
std::string html_report(const EvalReport& r);
// html_report written to path.tmp, then renamed to path.
void write_html_report(const std::filesystem::path& path, const EvalReport& r);

}  // namespace nibble::eval
