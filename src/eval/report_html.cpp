// The eval report as one self-contained HTML page: tables, and inline SVG
// plots of each candidate's per-position KL (histogram over log-spaced bins,
// empirical CDF) with the noise floor drawn on them. Nothing is loaded from
// anywhere: no scripts, no fonts, no external styles or images (the inline
// <svg> elements need no xmlns attribute inside HTML).
#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "nibble/report.h"
#include "nibble/util.h"

namespace nibble::eval {
namespace {

// KL spans decades (1e-6 where two models agree, 1..10 where they do not), so
// every plot has a log KL axis, in 5 bins per decade for the histograms. One
// range for all candidates, so their plots line up: from the decade below the
// smallest positive value (KL or noise floor) to the decade above the largest,
// but at most 9 decades: a few rounding-level values (1e-15 where two models
// all but agree) would otherwise squeeze everything else into a corner. What
// falls below the range (zeros included) is counted in a bar of its own.
constexpr int kPerDecade = 5;
constexpr int kMaxDecades = 9;
// An empirical CDF is drawn through at most this many of its steps (each an
// exact point of the CDF; a polyline between them): at 480 px, more adds nothing.
constexpr size_t kMaxCdfSteps = 600;

const char* const kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"};
const char* color(size_t i) { return kColors[i % (sizeof kColors / sizeof kColors[0])]; }

struct Decades {
  int lo = -6, hi = 0;
};

Decades kl_decades(const EvalReport& r) {
  double lo = std::numeric_limits<double>::infinity(), hi = 0;
  auto take = [&](double v) {
    if (v > 0 && std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
  };
  for (const ReportCandidate& c : r.candidates) {
    for (double v : c.kl) take(v);
    take(c.overall().noise_floor);
  }
  take(r.noise_floor_all);
  Decades d;
  if (hi == 0) return d;  // everything exactly 0: any range shows that
  d.hi = static_cast<int>(std::floor(std::log10(hi))) + 1;
  while (std::pow(10.0, d.hi) <= hi) ++d.hi;  // the largest value lies inside, whatever log10 rounds to
  d.lo = static_cast<int>(std::floor(std::log10(lo)));
  while (std::pow(10.0, d.lo) > lo) --d.lo;
  d.lo = std::clamp(d.lo, d.hi - kMaxDecades, d.hi - 2);
  return d;
}

std::string px(double v) { return fmt::format("{:.2f}", v); }

std::string decade_label(int d) {
  if (d >= -3 && d <= 3) return fmt::format("{:g}", std::pow(10.0, d));
  return fmt::format("1e{}", d);
}

// Three significant digits, exponents without padding ("4e-5", not "4e-05").
std::string g3(double v) {
  std::string s = fmt::format("{:.3g}", v);
  for (const char* pad : {"e-0", "e+0"})
    if (const size_t p = s.find(pad); p != std::string::npos) s.erase(p + 2, 1);
  return s;
}

// Ticks at 0, step, 2·step … top for counts up to `max`: step 1, 2 or 5 × 10^k, 3 to 7 of them.
void nice_ticks(double max, double& step, double& top) {
  if (max <= 0) max = 1;
  const double raw = max / 6, mag = std::pow(10.0, std::floor(std::log10(raw)));
  step = raw <= mag ? mag : raw <= 2 * mag ? 2 * mag : raw <= 5 * mag ? 5 * mag : 10 * mag;
  step = std::max(step, 1.0);  // counts
  top = std::ceil(max / step) * step;
}

// One plot's geometry: the SVG size, the plotting area, the log KL axis.
struct Frame {
  double width = 560, height = 300;
  double left = 64, right = 16, top = 44, bottom = 52;
  double axis_x0 = 0;  // where the log axis starts (after the "below" slot in histograms)
  Decades d;
  double x1() const { return width - right; }
  double y0() const { return height - bottom; }  // the baseline
  double plot_h() const { return height - bottom - top; }
  double x(double v) const { return axis_x0 + (std::log10(v) - d.lo) / (d.hi - d.lo) * (x1() - axis_x0); }
  bool in_range(double v) const { return v >= std::pow(10.0, d.lo) && v < std::pow(10.0, d.hi); }
};

std::string svg_open(const Frame& f, const std::string& cls, const std::string& label) {
  return fmt::format("<svg class=\"{}\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" role=\"img\" aria-label=\"{}\">\n",
                     cls, f.width, f.height, f.width, f.height, html_escape(label));
}

// The log KL axis: a tick and label per decade, minor ticks at the bin edges.
std::string x_axis(const Frame& f, const std::string& title) {
  std::string s = fmt::format("<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(f.axis_x0),
                              px(f.y0()), px(f.x1()), px(f.y0()));
  for (int k = 0; k <= (f.d.hi - f.d.lo) * kPerDecade; ++k) {
    const double v = std::pow(10.0, f.d.lo + static_cast<double>(k) / kPerDecade), x = f.x(v);
    const bool major = k % kPerDecade == 0;
    s += fmt::format("<line class=\"tick\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(x), px(f.y0()), px(x),
                     px(f.y0() + (major ? 6 : 3)));
    if (major)
      s += fmt::format("<text class=\"xtick\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", px(x),
                       px(f.y0() + 18), decade_label(f.d.lo + k / kPerDecade));
  }
  s += fmt::format("<text class=\"label\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                   px((f.axis_x0 + f.x1()) / 2), px(f.height - 10), html_escape(title));
  return s;
}

// A linear y axis from 0 to `top` with gridlines every `step`; labels by `fmt_tick`.
template <typename F>
std::string y_axis(const Frame& f, double step, double top, const std::string& title, F fmt_tick) {
  std::string s = fmt::format("<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(f.left),
                              px(f.top), px(f.left), px(f.y0()));
  const int n = static_cast<int>(std::lround(top / step));
  for (int i = 0; i <= n; ++i) {
    const double v = i * step, y = f.y0() - v / top * f.plot_h();
    if (i > 0)
      s += fmt::format("<line class=\"grid\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(f.left), px(y), px(f.x1()),
                       px(y));
    s += fmt::format("<line class=\"tick\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(f.left - 5), px(y),
                     px(f.left), px(y));
    s += fmt::format("<text class=\"ytick\" x=\"{}\" y=\"{}\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                     px(f.left - 8), px(y), fmt_tick(v));
  }
  const double cy = f.top + f.plot_h() / 2;
  s += fmt::format("<text class=\"label\" x=\"14\" y=\"{}\" text-anchor=\"middle\" transform=\"rotate(-90 14 {})\">{}</text>\n",
                   px(cy), px(cy), html_escape(title));
  return s;
}

// A vertical marker line at KL = v with its label on text row `row` above the
// plot (two rows, so two markers' labels never overlap).
std::string marker(const Frame& f, double v, const std::string& cls, const std::string& text, int row) {
  if (!(v > 0) || !f.in_range(v)) return "";
  const double x = f.x(v), ty = f.top - 26 + 14 * row;
  const bool right_half = x > (f.axis_x0 + f.x1()) / 2;
  return fmt::format("<line class=\"marker {}\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n"
                     "<text class=\"marker-label {}\" x=\"{}\" y=\"{}\" text-anchor=\"{}\">{}</text>\n",
                     cls, px(x), px(ty + 3), px(x), px(f.y0()), cls, px(x + (right_half ? -4 : 4)), px(ty),
                     right_half ? "end" : "start", html_escape(text));
}

// The shaded region KL ≤ 3 × noise floor (candidates whose mean falls in it are marked).
std::string floor_band(const Frame& f, double floor) {
  if (!(floor > 0)) return "";
  const double hi = std::min(f.x(std::max(3 * floor, std::pow(10.0, f.d.lo))), f.x1());
  if (hi <= f.axis_x0) return "";
  return fmt::format("<rect class=\"floor-band\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"><title>KL ≤ 3 × noise floor "
                     "({})</title></rect>\n",
                     px(f.axis_x0), px(f.top), px(hi - f.axis_x0), px(f.plot_h()), g3(3 * floor));
}

std::string markers(const Frame& f, double floor, const KlSummary* s) {
  std::string out = marker(f, floor, "noise-floor", "noise floor " + g3(floor), 0);
  if (s) out += marker(f, s->kl.mean, "mean", "mean KL " + g3(s->kl.mean), 1);
  return out;
}

// The histogram of one candidate's per-position KL. Its own count scale: one
// shared by all would flatten every other candidate's bars under one whose
// positions mostly fall in a single bin (the "below" bar of a near-lossless one).
std::string histogram_svg(const ReportCandidate& c, const Decades& d, const char* fill) {
  Frame f;
  f.d = d;
  const double slot = 40;  // the "below the range" bar's own slot left of the log axis
  f.axis_x0 = f.left + slot + 24;
  const LogHistogram h = log_histogram(c.kl, d.lo, d.hi, kPerDecade);
  double count_max = static_cast<double>(h.below);
  for (int64_t n : h.counts) count_max = std::max(count_max, static_cast<double>(n));
  double step = 1, top = 1;
  nice_ticks(count_max, step, top);
  std::string s = svg_open(f, "hist", "histogram of per-position KL for " + c.name);
  s += floor_band(f, c.overall().noise_floor);
  s += y_axis(f, step, top, "positions per bin", [](double v) { return fmt::format("{:g}", v); });
  s += x_axis(f, fmt::format("KL per position (log scale, {} bins per decade)", kPerDecade));
  auto bar = [&](double x0, double x1, int64_t n, const std::string& cls, const std::string& what) {
    if (n == 0) return;
    const double hgt = static_cast<double>(n) / top * f.plot_h();
    s += fmt::format("<rect class=\"{}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"><title>{}: {} "
                     "positions</title></rect>\n",
                     cls, px(x0), px(f.y0() - hgt), px(x1 - x0), px(hgt), fill, what, n);
  };
  const std::string lo_label = decade_label(d.lo);
  bar(f.left + 10, f.left + slot - 4, h.below, "bar below", "KL &lt; " + lo_label + " (0 included)");
  s += fmt::format("<line class=\"axis\" x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\"/>\n", px(f.left), px(f.y0()),
                   px(f.left + slot), px(f.y0()));
  s += fmt::format("<text class=\"xtick below\" x=\"{}\" y=\"{}\" text-anchor=\"middle\">&lt;{}</text>\n",
                   px(f.left + 3 + slot / 2), px(f.y0() + 18), lo_label);
  for (size_t i = 0; i < h.counts.size(); ++i)
    bar(f.x(h.edge(i)), f.x(h.edge(i + 1)), h.counts[i], "bar", fmt::format("[{}, {})", g3(h.edge(i)), g3(h.edge(i + 1))));
  s += markers(f, c.overall().noise_floor, &c.overall());
  return s + "</svg>\n";
}

// The empirical CDF F(x) = (positions with KL ≤ x) / N as a polyline through
// exact points of it: at each drawn value v, (v, F(v⁻)) then (v, F(v)).
std::string cdf_points(const Frame& f, const std::vector<double>& kl) {
  std::vector<double> s(kl);
  std::sort(s.begin(), s.end());
  const double n = static_cast<double>(s.size());
  auto y = [&](size_t count) { return f.y0() - static_cast<double>(count) / n * f.plot_h(); };
  const double lo = std::pow(10.0, f.d.lo), hi = std::pow(10.0, f.d.hi);
  const size_t first = static_cast<size_t>(std::lower_bound(s.begin(), s.end(), lo) - s.begin());
  const size_t last = static_cast<size_t>(std::lower_bound(s.begin(), s.end(), hi) - s.begin());
  std::string pts = px(f.axis_x0) + "," + px(y(first));
  // Drawn values: every distinct one in range, or evenly spaced ranks of them when there are too many.
  const size_t m = last - first;
  const size_t stride = m > kMaxCdfSteps ? (m + kMaxCdfSteps - 1) / kMaxCdfSteps : 1;
  double prev = -1;
  for (size_t i = first; i < last; i += stride) {
    const double v = s[i];
    if (v == prev) continue;
    prev = v;
    const size_t below = static_cast<size_t>(std::lower_bound(s.begin(), s.end(), v) - s.begin());
    const size_t at_most = static_cast<size_t>(std::upper_bound(s.begin(), s.end(), v) - s.begin());
    pts += fmt::format(" {},{} {},{}", px(f.x(v)), px(y(below)), px(f.x(v)), px(y(at_most)));
  }
  if (m > 0 && s[last - 1] != prev) {  // the largest value in range is always a step
    const double v = s[last - 1];
    const size_t below = static_cast<size_t>(std::lower_bound(s.begin(), s.end(), v) - s.begin());
    pts += fmt::format(" {},{} {},{}", px(f.x(v)), px(y(below)), px(f.x(v)), px(y(last)));
  }
  return pts + fmt::format(" {},{}", px(f.x1()), px(y(last)));
}

std::string cdf_svg(const std::vector<const ReportCandidate*>& cs, const Decades& d, double floor, double width,
                    const std::string& label, bool mean_marker, size_t color0) {
  Frame f;
  f.width = width;
  f.d = d;
  f.axis_x0 = f.left;
  std::string s = svg_open(f, "cdf", label);
  s += floor_band(f, floor);
  s += y_axis(f, 0.2, 1.0, "fraction of positions with KL ≤ x", [](double v) { return fmt::format("{:.1f}", v); });
  s += x_axis(f, "KL per position (log scale)");
  for (size_t i = 0; i < cs.size(); ++i) {
    if (cs[i]->kl.empty()) continue;
    s += fmt::format("<polyline class=\"cdf\" stroke=\"{}\" points=\"{}\"><title>{}</title></polyline>\n",
                     color(color0 + i), cdf_points(f, cs[i]->kl), html_escape(cs[i]->name));
  }
  s += markers(f, floor, mean_marker && cs.size() == 1 ? &cs[0]->overall() : nullptr);
  return s + "</svg>\n";
}

std::string table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
                  const std::vector<std::string>& row_classes, size_t left_cols) {
  std::string s = "<div class=\"wide\"><table>\n<thead><tr>";
  for (const auto& h : header) s += "<th>" + html_escape(h) + "</th>";
  s += "</tr></thead>\n<tbody>\n";
  for (size_t r = 0; r < rows.size(); ++r) {
    s += row_classes[r].empty() ? "<tr>" : "<tr class=\"" + row_classes[r] + "\">";
    for (size_t i = 0; i < rows[r].size(); ++i) {
      // The Markdown's "(≤3× noise floor)" after a KL becomes a badge here (the row is highlighted too).
      std::string_view cell = rows[r][i], badge;
      if (cell.ends_with(kNearNoiseFloorMark)) {
        cell.remove_suffix(kNearNoiseFloorMark.size());
        badge = " <span class=\"badge\">≤3× floor</span>";
      }
      s += (i < left_cols ? "<td class=\"text\">" : "<td>") + html_escape(cell) + std::string(badge) + "</td>";
    }
    s += "</tr>\n";
  }
  return s + "</tbody>\n</table></div>\n";
}

const char* kStyle = R"(<style>
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; color: #222;
       margin: 20px auto; max-width: 1168px; padding: 0 12px; line-height: 1.4; }
h1 { font-size: 1.5em; margin-bottom: 0.2em; }
h2 { font-size: 1.2em; margin-top: 1.6em; border-bottom: 1px solid #ddd; padding-bottom: 0.2em; }
h3 { font-size: 1.0em; margin: 1.2em 0 0.2em; font-family: ui-monospace, "DejaVu Sans Mono", monospace; word-break: break-all; }
code { font-family: ui-monospace, "DejaVu Sans Mono", monospace; font-size: 0.92em; word-break: break-all; }
.wide { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.78em; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 3px 5px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; }
td.text { text-align: left; font-family: ui-monospace, "DejaVu Sans Mono", monospace; white-space: normal;
          overflow-wrap: anywhere; min-width: 9em; max-width: 26em; }
tr.near td { background: #eaf6ea; }
.badge { background: #2a7a2a; color: #fff; border-radius: 3px; padding: 0 5px; font-size: 0.8em; }
.note { color: #555; font-size: 0.9em; }
.plots { display: flex; flex-wrap: wrap; gap: 8px; }
.legend { list-style: none; padding: 0; margin: 0.3em 0; font-size: 0.86em; }
.legend li { display: inline-block; margin-right: 18px; font-family: ui-monospace, "DejaVu Sans Mono", monospace; }
.swatch { display: inline-block; width: 14px; height: 4px; vertical-align: middle; margin-right: 5px; }
svg { background: #fff; border: 1px solid #e4e4e4; font-family: system-ui, "DejaVu Sans", sans-serif; }
svg text { font-size: 11px; fill: #333; }
svg text.below { font-size: 10px; }
svg .label { font-size: 12px; fill: #222; }
svg .axis { stroke: #333; stroke-width: 1; }
svg .tick { stroke: #333; stroke-width: 1; }
svg .grid { stroke: #e6e6e6; stroke-width: 1; }
svg .bar { stroke: #fff; stroke-width: 0.5; }
svg .bar.below { fill: #999; }
svg .cdf { fill: none; stroke-width: 1.6; }
svg .marker { stroke-width: 1.3; }
svg .marker.noise-floor { stroke: #2a7a2a; stroke-dasharray: 5 3; }
svg .marker.mean { stroke: #000; }
svg .marker-label.noise-floor { fill: #2a7a2a; }
svg .floor-band { fill: #2a7a2a; fill-opacity: 0.08; }
</style>
)";

}  // namespace

std::string html_report(const EvalReport& r) {
  const Decades d = kl_decades(r);
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>nibble eval: " +
                  html_escape(r.reference) + "</title>\n" + kStyle + "</head>\n<body>\n";
  s += "<h1>nibble eval</h1>\n";
  s += fmt::format("<p>Reference <code>{}</code>. Each corpus is cut into non-overlapping {}-token windows; positions "
                   "{}..{} of each window are scored (llama.cpp's protocol): KL(reference ‖ candidate) over the whole "
                   "vocabulary, top-1 agreement and the true next token's perplexity. Intervals are bootstrap 95 % over "
                   "windows.</p>\n",
                   html_escape(r.reference), r.ctx, r.ctx / 2, r.ctx - 2);

  s += "<h2>Noise floor</h2>\n";
  s += fmt::format("<p>The ruler's own error: the KL between the reference and itself computed with every linear's "
                   "input rounded to bf16 (what a bf16 inference engine does). Pooled: <b class=\"noise-floor\">{}</b>. "
                   "Candidates whose KL mean is within 3× of it are marked <span class=\"badge\">≤3× noise floor</span>; "
                   "on the plots it is the dashed green line, and the shaded band is KL ≤ 3× noise floor.</p>\n",
                   g3(r.noise_floor_all));
  {
    std::vector<std::vector<std::string>> rows;
    for (const ReportCorpus& c : r.corpora) {
      std::string ppl = "–";  // the reference's perplexity, the same in every candidate's row of this corpus
      for (const KlSummary& k : r.candidates.empty() ? std::vector<KlSummary>{} : r.candidates[0].rows)
        if (k.corpus == c.name) ppl = fmt::format("{:.4f}", k.ppl_ref);
      rows.push_back({c.name, fmt::format("{}", c.windows), fmt::format("{}", c.positions), g3(c.noise_floor), ppl});
    }
    s += table({"corpus", "windows", "scored positions", "noise floor (KL mean)", "reference ppl"}, rows,
               std::vector<std::string>(rows.size()), 1);
  }
  if (r.candidates.empty()) return s + "</body>\n</html>\n";

  s += "<h2>Comparison</h2>\n<p class=\"note\">Pooled over the corpora; bits/weight: stored bits per weight of the "
       "decoder linears and a separate head; top-1: how often the candidate's most likely next token is the "
       "reference's; PPL: the candidate's perplexity (reference: " +
       fmt::format("{:.4f}", r.candidates[0].overall().ppl_ref) + ").</p>\n";
  {
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> classes;
    for (const ReportCandidate& c : r.candidates) {
      rows.push_back(comparison_cells(r, c));
      classes.push_back(c.near_noise_floor() ? "near" : "");
    }
    s += table(comparison_header(r), rows, classes, 1);
  }
  s += "<h2>Per corpus</h2>\n";
  {
    // The Markdown's per-corpus table less its "ppl ref" column (in the corpus table above), to fit the page.
    std::vector<std::string> header = detail_header();
    const size_t drop = static_cast<size_t>(std::find(header.begin(), header.end(), "ppl ref") - header.begin());
    std::vector<std::vector<std::string>> rows;
    std::vector<std::string> classes;
    for (const ReportCandidate& c : r.candidates)
      for (const KlSummary& k : c.rows) {
        std::vector<std::string> row = {c.name};
        for (auto& cell : detail_cells(k)) row.push_back(std::move(cell));
        if (drop < row.size()) row.erase(row.begin() + static_cast<std::ptrdiff_t>(drop));
        rows.push_back(std::move(row));
        classes.push_back(k.kl.mean <= 3 * k.noise_floor ? "near" : "");
      }
    if (drop < header.size()) header.erase(header.begin() + static_cast<std::ptrdiff_t>(drop));
    s += table(header, rows, classes, 2);
  }

  s += "<h2>KL per position</h2>\n";
  s += fmt::format("<p class=\"note\">Every plot's KL axis is logarithmic, from {} to {}, the same for every candidate. "
                   "Histograms: {} log-spaced bins per decade, bin k = [10^(k/{}), 10^((k+1)/{})); the grey bar on the "
                   "left counts positions below {} (KL exactly 0 included); bar height = positions in the bin (each "
                   "histogram on its own scale). CDFs: the fraction of positions whose KL is at most x. Solid black line: "
                   "the candidate's mean KL.</p>\n",
                   decade_label(d.lo), decade_label(d.hi), kPerDecade, kPerDecade, kPerDecade, decade_label(d.lo));
  std::vector<const ReportCandidate*> all;
  for (const ReportCandidate& c : r.candidates) all.push_back(&c);
  s += "<h3>All candidates</h3>\n" + cdf_svg(all, d, r.noise_floor_all, 1100, "KL CDF of every candidate", false, 0);
  s += "<ul class=\"legend\">\n";
  for (size_t i = 0; i < all.size(); ++i)
    s += fmt::format("<li><span class=\"swatch\" style=\"background:{}\"></span>{}</li>\n", color(i),
                     html_escape(all[i]->name));
  s += "</ul>\n";

  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const ReportCandidate& c = r.candidates[i];
    const KlSummary& o = c.overall();
    s += fmt::format("<section class=\"candidate\">\n<h3>{}</h3>\n", html_escape(c.name));
    s += fmt::format("<p class=\"note\">{} · {:.3f} bits/weight · {} positions · KL mean {} · p99 {} · max {}{}</p>\n",
                     html_escape(c.source), c.bits_per_weight, c.kl.size(), kl_mean_with_ci(o), fmt::format("{:.4f}", o.kl.p99),
                     fmt::format("{:.4f}", o.kl.max),
                     c.near_noise_floor() ? " <span class=\"badge\">≤3× noise floor</span>" : "");
    s += "<div class=\"plots\">\n" + histogram_svg(c, d, color(i)) +
         cdf_svg({&c}, d, o.noise_floor, 560, "empirical CDF of per-position KL for " + c.name, true, i) + "</div>\n";
    s += "</section>\n";
  }
  return s + "</body>\n</html>\n";
}

void write_html_report(const std::filesystem::path& path, const EvalReport& r) { write_file_atomic(path, html_report(r)); }

}  // namespace nibble::eval
