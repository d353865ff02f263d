// `shardlm report`'s plots as hand-written SVG: loss curves (train loss against step, one polyline
// per run) and scaling (samples/s against ranks, with the ideal linear line).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "run_report.hpp"
#include "shardlm/core.hpp"

namespace shardlm {

namespace {

constexpr double kPlotWidth = 560, kHeight = 440;  // the plot and its left margin; the legend's column is added
constexpr double kLeft = 70, kLegendMin = 200, kTop = 40, kBottom = 50;  // margins; the legend sits right
// 20 colours told apart side by side (Kelly's and Tableau's, without white, black and near-greys); a 21st
// run takes the first colour again with a dash pattern (line_style).
const char* const kColours[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                                "#7f7f7f", "#bcbd22", "#17becf", "#f3c300", "#875692", "#a1caf1", "#be0032",
                                "#c2b280", "#008856", "#e68fac", "#0067a5", "#604e97", "#882d17"};
const char* const kDashes[] = {"", "6 4", "2 3", "8 3 2 3"};
// Width of a legend text at 12 px: 7.5 px a character is wider than sans-serif's average, so a label is
// never cut off at the picture's edge.
constexpr double kCharWidth = 7.5;

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

std::string label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string xml_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// Ticks at 1, 2 or 5 times a power of ten covering [lo, hi] in about `count` steps.
std::vector<double> nice_ticks(double lo, double hi, int count) {
  const double raw = (hi - lo) / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * power) {
      step = m * power;
      break;
    }
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9; t += step) ticks.push_back(t);
  return ticks;
}

// A plot area mapping data ranges onto the frame, with axes, ticks and titles; the legend's column of
// `right` pixels (legend_column) beside it.
struct Frame {
  double x0, x1, y0, y1;
  double right = kLegendMin;
  double width() const { return kPlotWidth + right; }
  double x(double v) const { return kLeft + (v - x0) / (x1 - x0) * (kPlotWidth - kLeft); }
  double y(double v) const { return kHeight - kBottom - (v - y0) / (y1 - y0) * (kHeight - kTop - kBottom); }

  std::string axes(const std::string& title, const std::string& x_title, const std::string& y_title,
                   const std::vector<double>& x_ticks) const {
    std::string s = concat("<rect x=\"0\" y=\"0\" width=\"", width(), "\" height=\"", kHeight, "\" fill=\"white\"/>\n");
    s += concat("<text x=\"", num(kPlotWidth / 2 + kLeft / 2), "\" y=\"24\" text-anchor=\"middle\" "
                "font-size=\"16\">", xml_escape(title), "</text>\n");
    const double px0 = x(x0), px1 = x(x1), py0 = y(y0), py1 = y(y1);
    s += concat("<path d=\"M", num(px0), " ", num(py1), " V", num(py0), " H", num(px1),
                "\" fill=\"none\" stroke=\"black\"/>\n");
    for (double t : x_ticks) {
      s += concat("<line x1=\"", num(x(t)), "\" y1=\"", num(py0), "\" x2=\"", num(x(t)), "\" y2=\"", num(py0 + 5),
                  "\" stroke=\"black\"/><text x=\"", num(x(t)), "\" y=\"", num(py0 + 18),
                  "\" text-anchor=\"middle\" font-size=\"11\">", label(t), "</text>\n");
    }
    for (double t : nice_ticks(y0, y1, 5)) {
      s += concat("<line x1=\"", num(px0 - 5), "\" y1=\"", num(y(t)), "\" x2=\"", num(px1), "\" y2=\"", num(y(t)),
                  "\" stroke=\"#dddddd\"/><text x=\"", num(px0 - 8), "\" y=\"", num(y(t) + 4),
                  "\" text-anchor=\"end\" font-size=\"11\">", label(t), "</text>\n");
    }
    s += concat("<text x=\"", num((px0 + px1) / 2), "\" y=\"", num(kHeight - 12),
                "\" text-anchor=\"middle\" font-size=\"12\">", xml_escape(x_title), "</text>\n");
    s += concat("<text x=\"16\" y=\"", num((py0 + py1) / 2), "\" text-anchor=\"middle\" font-size=\"12\" "
                "transform=\"rotate(-90 16 ", num((py0 + py1) / 2), ")\">", xml_escape(y_title), "</text>\n");
    return s;
  }
};

// How series i is drawn: its colour and dash pattern ("" solid), distinct for 20 x 4 series.
struct LineStyle {
  std::string colour, dashes;
};
LineStyle line_style(size_t i) {
  return {kColours[i % std::size(kColours)], kDashes[(i / std::size(kColours)) % std::size(kDashes)]};
}

// The legend's column: wide enough for the longest of `labels` after its line sample.
double legend_column(const std::vector<std::string>& labels) {
  size_t longest = 0;
  for (const std::string& l : labels) longest = std::max(longest, l.size());
  return std::max(kLegendMin, 16 + 30 + kCharWidth * static_cast<double>(longest) + 12);
}

std::string dash_attribute(const std::string& dashes) {
  return dashes.empty() ? std::string() : concat(" stroke-dasharray=\"", dashes, "\"");
}

std::string legend_entry(size_t row, const LineStyle& style, const std::string& text) {
  const double ly = kTop + 10 + 20.0 * static_cast<double>(row), lx = kPlotWidth + 16;
  return concat("<line x1=\"", num(lx), "\" y1=\"", num(ly), "\" x2=\"", num(lx + 24), "\" y2=\"", num(ly),
                "\" stroke=\"", style.colour, "\" stroke-width=\"2\"", dash_attribute(style.dashes),
                "/><text x=\"", num(lx + 30), "\" y=\"", num(ly + 4), "\" font-size=\"12\">", xml_escape(text),
                "</text>\n");
}

std::string polyline(const std::vector<std::pair<double, double>>& points, const LineStyle& style,
                     const std::string& title) {
  std::string pts;
  for (const auto& [px, py] : points) pts += (pts.empty() ? "" : " ") + num(px) + "," + num(py);
  return concat("<polyline fill=\"none\" stroke=\"", style.colour, "\" stroke-width=\"2\"",
                dash_attribute(style.dashes), " points=\"", pts, "\"><title>", xml_escape(title),
                "</title></polyline>\n");
}

std::string svg_open(double width) {
  return concat("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"", width, "\" height=\"", kHeight,
                "\" viewBox=\"0 0 ", width, " ", kHeight, "\" font-family=\"sans-serif\">\n");
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

// [lo, hi] widened a little, and made non-empty.
std::pair<double, double> padded(double lo, double hi, double fraction) {
  if (hi <= lo) return {lo - 0.5, hi + 0.5};
  const double pad = (hi - lo) * fraction;
  return {lo - pad, hi + pad};
}

}  // namespace

std::string loss_curves_svg(const std::vector<RunRecord>& runs) {
  double s0 = INFINITY, s1 = -INFINITY, l0 = INFINITY, l1 = -INFINITY;
  for (const RunRecord& r : runs)
    for (const auto& [step, loss] : r.train_loss_by_step) {
      s0 = std::min(s0, static_cast<double>(step));
      s1 = std::max(s1, static_cast<double>(step));
      l0 = std::min(l0, loss);
      l1 = std::max(l1, loss);
    }
  if (!std::isfinite(s0)) {
    return svg_open(kPlotWidth + kLegendMin) + "<text x=\"20\" y=\"40\">no train records in these runs</text>\n</svg>\n";
  }
  std::vector<std::string> labels;
  for (const RunRecord& r : runs) labels.push_back(concat(r.name, " (", r.ranks, ")"));
  const auto [y0, y1] = padded(l0, l1, 0.05);
  const Frame f{0, s1 > 0 ? s1 : 1, y0, y1, legend_column(labels)};
  std::string svg = svg_open(f.width());
  svg += f.axes("train loss", "optimizer step", "loss", nice_ticks(0, f.x1, 6));
  for (size_t i = 0; i < runs.size(); ++i) {
    const LineStyle style = line_style(i);
    std::vector<std::pair<double, double>> points;
    for (const auto& [step, loss] : runs[i].train_loss_by_step) points.emplace_back(f.x(step), f.y(loss));
    if (points.empty()) continue;
    svg += polyline(points, style, runs[i].name);
    if (points.size() == 1)  // a lone point draws no line: mark it
      svg += concat("<circle cx=\"", num(points[0].first), "\" cy=\"", num(points[0].second), "\" r=\"3\" fill=\"",
                    style.colour, "\"/>\n");
    svg += legend_entry(i, style, labels[i]);
  }
  return svg + "</svg>\n";
}

std::string scaling_svg(const std::vector<RunRecord>& runs) {
  // One series per strategy; one point per rank count: the median of that strategy's runs there
  // (repeated runs would otherwise draw a vertical line). Runs on several rank counts are left out.
  std::map<std::string, std::map<int, std::vector<double>>> series;
  size_t mixed = 0;
  for (const RunRecord& r : runs) {
    if (!std::isfinite(r.train_samples_per_second)) continue;
    if (r.mixed_ranks()) {
      ++mixed;
      continue;
    }
    series[r.strategy][r.ranks].push_back(r.train_samples_per_second);
  }
  std::map<std::string, std::map<int, double>> medians;
  size_t repeated = 0;
  double r1 = 0, v1 = 0;
  for (auto& [strategy, by_ranks] : series)
    for (auto& [ranks, values] : by_ranks) {
      if (values.size() > 1) ++repeated;
      medians[strategy][ranks] = median(values);
      r1 = std::max(r1, static_cast<double>(ranks));
      v1 = std::max(v1, medians[strategy][ranks]);
    }
  if (medians.empty()) {
    return svg_open(kPlotWidth + kLegendMin) + "<text x=\"20\" y=\"40\">no finished runs on one rank count (no summary records)</text>\n</svg>\n";
  }
  const RunRecord& base_record = runs[base_run(runs)];
  auto base_series = medians.find(base_record.strategy);
  const bool ideal = !base_record.mixed_ranks() && std::isfinite(base_record.train_samples_per_second) &&
                     base_record.ranks > 0 && base_series != medians.end();
  const double base_value = ideal ? base_series->second.at(base_record.ranks) : 0;
  const double ideal_top = ideal ? base_value * r1 / base_record.ranks : 0;
  std::vector<std::string> labels = {"ideal"};
  for (const auto& [strategy, by_ranks] : medians) labels.push_back(strategy);
  const Frame f{0, r1 * 1.05, 0, std::max(v1, ideal_top) * 1.1, legend_column(labels)};
  std::string svg = svg_open(f.width());
  std::vector<double> x_ticks;
  for (const auto& [strategy, by_ranks] : medians)
    for (const auto& [ranks, value] : by_ranks) x_ticks.push_back(ranks);
  std::sort(x_ticks.begin(), x_ticks.end());
  x_ticks.erase(std::unique(x_ticks.begin(), x_ticks.end()), x_ticks.end());
  svg += f.axes("scaling", "ranks (GPUs)", "train samples/s", x_ticks);
  size_t row = 0;
  if (ideal) {
    const LineStyle grey{"#555555", "6 4"};
    svg += polyline({{f.x(base_record.ranks), f.y(base_value)}, {f.x(r1), f.y(ideal_top)}}, grey,
                    "ideal (linear from " + base_record.name + ")");
    svg += legend_entry(row++, grey, "ideal");
  }
  size_t colour = 0;
  for (const auto& [strategy, by_ranks] : medians) {
    const LineStyle style = line_style(colour++);
    const std::string& c = style.colour;
    std::vector<std::pair<double, double>> points;
    for (const auto& [ranks, value] : by_ranks) {
      points.emplace_back(f.x(ranks), f.y(value));
      const size_t n = series.at(strategy).at(ranks).size();
      svg += concat("<circle cx=\"", num(points.back().first), "\" cy=\"", num(points.back().second),
                    "\" r=\"4\" fill=\"", c, "\"><title>", xml_escape(strategy), ", ", ranks, " rank(s): ", num(value),
                    " samples/s", n > 1 ? concat(" (median of ", n, " runs)") : std::string(), "</title></circle>\n");
    }
    svg += polyline(points, style, strategy);
    svg += legend_entry(row++, style, strategy);
  }
  // Say how the points were made, under the legend.
  const double note_x = kPlotWidth + 16;
  double note_y = kTop + 20.0 * static_cast<double>(row) + 20;
  svg += concat("<text x=\"", num(note_x), "\" y=\"", num(note_y), "\" font-size=\"11\">points: median of the</text>\n");
  svg += concat("<text x=\"", num(note_x), "\" y=\"", num(note_y + 14),
                "\" font-size=\"11\">runs at each rank count", repeated ? concat(" (", repeated, " repeated)") : "",
                "</text>\n");
  if (mixed)
    svg += concat("<text x=\"", num(note_x), "\" y=\"", num(note_y + 28), "\" font-size=\"11\">", mixed,
                  " run(s) resumed on other ranks left out</text>\n");
  return svg + "</svg>\n";
}

}  // namespace shardlm
