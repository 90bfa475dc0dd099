#include "cli/report/report_figures.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "cli/report/html_escape.h"
#include "cli/report/label_layout.h"
#include "cli/terminal.h"

namespace ckplan {
namespace {

// The charts' memory unit: MiB, or MB where the user wrote decimal units
// (one unit style per output).
struct MemoryUnit {
  double bytes;
  const char* name;
};
MemoryUnit UnitFor(UnitStyle style) {
  return style == UnitStyle::kDecimal ? MemoryUnit{1e6, "MB"} : MemoryUnit{1024.0 * 1024.0, "MiB"};
}

// An axis range that is not empty: `hi` above `lo` by at least a step a
// double can tell apart from `lo` (adding 1 to 1e20 adds nothing).
void WidenRange(double& lo, double& hi) {
  if (!std::isfinite(lo)) lo = 0;
  if (!std::isfinite(hi) || !(hi > lo)) hi = lo + std::max(1.0, std::fabs(lo) * 1e-6);
}

// Ticks at 1, 2 or 5 times a power of ten. Each tick is first + k * step,
// at most a few dozen: adding a step to a running value could stall where
// the step is below the value's rounding unit.
std::vector<double> Ticks(double lo, double hi, int target = 6) {
  WidenRange(lo, hi);
  double raw = (hi - lo) / target;
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (power * m >= raw) {
      step = power * m;
      break;
    }
  }
  std::vector<double> ticks;
  const double first = std::ceil(lo / step) * step;
  for (int k = 0; k <= 4 * target; ++k) {
    const double t = first + k * step;
    if (t > hi + step * 1e-9) break;
    if (!ticks.empty() && t <= ticks.back()) continue;
    ticks.push_back(t);
  }
  return ticks;
}

std::string Num(double v) {
  char buffer[32];
  if (std::fabs(v) >= 100 || v == std::floor(v)) {
    std::snprintf(buffer, sizeof(buffer), "%.0f", v);
  } else if (std::fabs(v) >= 10) {
    std::snprintf(buffer, sizeof(buffer), "%.1f", v);
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f", v);
  }
  return buffer;
}

// A plot area with axes, ticks, labels and a title: an SVG string builder.
class Chart {
 public:
  Chart(double x_lo, double x_hi, double y_lo, double y_hi, std::string x_label, std::string y_label, std::string title)
      : x_lo_(x_lo), x_hi_(x_hi), y_lo_(y_lo), y_hi_(y_hi), x_label_(std::move(x_label)), y_label_(std::move(y_label)),
        title_(std::move(title)) {
    WidenRange(x_lo_, x_hi_);
    WidenRange(y_lo_, y_hi_);
  }
  double X(double x) const { return kLeft + (x - x_lo_) / (x_hi_ - x_lo_) * kPlotW; }
  double Y(double y) const { return kTop + kPlotH - (y - y_lo_) / (y_hi_ - y_lo_) * kPlotH; }

  void Add(const std::string& element) { body_ << element << "\n"; }
  void Polyline(const std::vector<std::pair<double, double>>& points, const std::string& color, double width,
                const std::string& dash = "") {
    std::ostringstream s;
    s << "<polyline fill=\"none\" stroke=\"" << color << "\" stroke-width=\"" << width << "\"";
    if (!dash.empty()) s << " stroke-dasharray=\"" << dash << "\"";
    s << " points=\"";
    for (const auto& [x, y] : points) s << Num2(X(x)) << "," << Num2(Y(y)) << " ";
    s << "\"/>";
    Add(s.str());
  }
  /// A marker at (x, y) with `label` next to it (placed when the SVG is
  /// written, clear of the other labels and markers).
  void Point(double x, double y, const std::string& color, const std::string& label, const std::string& shape = "circle") {
    std::ostringstream s;
    double px = X(x), py = Y(y);
    if (shape == "circle") {
      s << "<circle cx=\"" << Num2(px) << "\" cy=\"" << Num2(py) << "\" r=\"5\" fill=\"" << color << "\"/>";
    } else {
      s << "<path d=\"M" << Num2(px) << " " << Num2(py - 6) << " L" << Num2(px + 6) << " " << Num2(py + 5) << " L"
        << Num2(px - 6) << " " << Num2(py + 5) << " Z\" fill=\"" << color << "\"/>";
    }
    Add(s.str());
    markers_.push_back({px - 6, py - 6, px + 6, py + 6});
    if (!label.empty()) labels_.push_back({LabelKind::kPoint, px, py, label, "#222"});
  }
  void VerticalLine(double x, const std::string& color, const std::string& label) {
    std::ostringstream s;
    s << "<line x1=\"" << Num2(X(x)) << "\" y1=\"" << kTop << "\" x2=\"" << Num2(X(x)) << "\" y2=\"" << kTop + kPlotH
      << "\" stroke=\"" << color << "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>";
    Add(s.str());
    labels_.push_back({LabelKind::kVertical, X(x), kTop + 14, label, color});
  }
  void HorizontalLine(double y, const std::string& color, const std::string& label) {
    std::ostringstream s;
    s << "<line x1=\"" << kLeft << "\" y1=\"" << Num2(Y(y)) << "\" x2=\"" << kLeft + kPlotW << "\" y2=\"" << Num2(Y(y))
      << "\" stroke=\"" << color << "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>";
    Add(s.str());
    labels_.push_back({LabelKind::kHorizontal, kLeft + kPlotW - 4, Y(y), label, color});
  }
  void Legend(const std::vector<std::pair<std::string, std::string>>& entries) {
    double y = kTop + 8;
    for (const auto& [color, label] : entries) {
      std::ostringstream s;
      s << "<rect x=\"" << kLeft + kPlotW + 14 << "\" y=\"" << y << "\" width=\"14\" height=\"10\" fill=\"" << color
        << "\"/><text x=\"" << kLeft + kPlotW + 34 << "\" y=\"" << y + 9 << "\" font-size=\"12\">"
        << Escape(ElideMiddle(label, 12, kWidth - (kLeft + kPlotW + 34) - 4)) << "</text>";
      Add(s.str());
      y += 18;
    }
  }

  std::string Svg() const {
    std::ostringstream s;
    s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << kWidth << "\" height=\"" << kHeight
      << "\" viewBox=\"0 0 " << kWidth << " " << kHeight << "\" role=\"img\" aria-label=\"" << Escape(title_) << "\">\n";
    s << "<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
    s << "<text x=\"" << kWidth / 2 << "\" y=\"20\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">"
      << Escape(title_) << "</text>\n";
    for (double t : Ticks(x_lo_, x_hi_)) {
      s << "<line x1=\"" << Num2(X(t)) << "\" y1=\"" << kTop << "\" x2=\"" << Num2(X(t)) << "\" y2=\"" << kTop + kPlotH
        << "\" stroke=\"#eee\"/><text x=\"" << Num2(X(t)) << "\" y=\"" << kTop + kPlotH + 16
        << "\" font-size=\"11\" text-anchor=\"middle\">" << Num(t) << "</text>\n";
    }
    for (double t : Ticks(y_lo_, y_hi_)) {
      s << "<line x1=\"" << kLeft << "\" y1=\"" << Num2(Y(t)) << "\" x2=\"" << kLeft + kPlotW << "\" y2=\"" << Num2(Y(t))
        << "\" stroke=\"#eee\"/><text x=\"" << kLeft - 6 << "\" y=\"" << Num2(Y(t) + 4)
        << "\" font-size=\"11\" text-anchor=\"end\">" << Num(t) << "</text>\n";
    }
    s << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << kPlotW << "\" height=\"" << kPlotH
      << "\" fill=\"none\" stroke=\"#444\"/>\n";
    s << "<text x=\"" << kLeft + kPlotW / 2 << "\" y=\"" << kHeight - 8 << "\" font-size=\"13\" text-anchor=\"middle\">"
      << Escape(x_label_) << "</text>\n";
    s << "<text transform=\"translate(16 " << kTop + kPlotH / 2 << ") rotate(-90)\" font-size=\"13\" text-anchor=\"middle\">"
      << Escape(y_label_) << "</text>\n";
    s << body_.str() << PlacedLabels() << "</svg>\n";
    return s.str();
  }

  static constexpr double kWidth = 860, kHeight = 420, kLeft = 70, kTop = 34, kPlotW = 580, kPlotH = 330;

 private:
  static std::string Num2(double v) {
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), "%.1f", v);
    return buffer;
  }
  enum class LabelKind { kVertical, kHorizontal, kPoint };
  struct PendingLabel {
    LabelKind kind;
    double x, y;  // the point, or the line's label position
    std::string text;
    std::string color;
  };

  // Every label inside the plot, none over another or over a marker: the
  // lines' labels first (they have the fewest places), then the points'
  // in order; a label moved away from its point gets a leader line.
  std::string PlacedLabels() const {
    LabelLayout layout({kLeft + 2, kTop + 2, kLeft + kPlotW - 2, kTop + kPlotH - 2});
    for (const Box& m : markers_) layout.Block(m);
    std::ostringstream s;
    for (LabelKind kind : {LabelKind::kVertical, LabelKind::kHorizontal, LabelKind::kPoint}) {
      for (const PendingLabel& l : labels_) {
        if (l.kind != kind) continue;
        LabelPlace at = kind == LabelKind::kVertical     ? layout.PlaceOnVerticalLine(l.x, l.y, l.text, 12)
                        : kind == LabelKind::kHorizontal ? layout.PlaceOnHorizontalLine(l.x, l.y, l.text, 12)
                                                         : layout.PlaceNearPoint(l.x, l.y, l.text, 12);
        if (at.moved && kind == LabelKind::kPoint) {
          const double lx = std::clamp(l.x, at.box.left, at.box.right);
          const double ly = std::clamp(l.y, at.box.top, at.box.bottom);
          s << "<line x1=\"" << Num2(l.x) << "\" y1=\"" << Num2(l.y) << "\" x2=\"" << Num2(lx) << "\" y2=\"" << Num2(ly)
            << "\" stroke=\"#999\" stroke-width=\"0.8\"/>";
        }
        s << "<text x=\"" << Num2(at.x) << "\" y=\"" << Num2(at.y) << "\" font-size=\"12\"" << (at.anchor_end ? " text-anchor=\"end\"" : "")
          << " fill=\"" << l.color << "\">" << Escape(l.text) << "</text>\n";
      }
    }
    return s.str();
  }

  double x_lo_, x_hi_, y_lo_, y_hi_;
  std::string x_label_, y_label_, title_;
  std::ostringstream body_;
  std::vector<Box> markers_;
  std::vector<PendingLabel> labels_;
};

const char* kColors[] = {"#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e"};

}  // namespace

std::string TradeoffSvg(const Report& r) {
  const MemoryUnit unit = UnitFor(r.style);
  auto mem = [&unit](int64_t bytes) { return static_cast<double>(bytes) / unit.bytes; };
  double x_lo = 1e300, x_hi = 0, y_lo = 1e300, y_hi = 0;
  auto extend = [&](int64_t bytes, double ms) {
    x_lo = std::min(x_lo, mem(bytes));
    x_hi = std::max(x_hi, mem(bytes));
    y_lo = std::min(y_lo, ms);
    y_hi = std::max(y_hi, ms);
  };
  for (const auto& p : r.strategies) extend(p.peak_bytes, p.time_ms);
  for (const auto& p : r.optimal_curve) extend(p.budget_bytes, p.time_ms);
  for (const auto& run : r.runs) {
    extend(run.run.measured.peak_bytes, run.run.measured.step_ms);
    extend(run.run.predicted_peak_bytes, run.run.predicted_time_ms);
  }
  extend(r.budget_bytes, y_lo);
  double xpad = (x_hi - x_lo) * 0.08 + 1e-9, ypad = (y_hi - y_lo) * 0.1 + 1e-9;
  Chart chart(x_lo - xpad, x_hi + xpad, std::max(0.0, y_lo - ypad), y_hi + ypad,
              std::string("peak memory of the step (") + unit.name + ")", "step time (ms)", "Memory / time trade-off");
  // The optimal curve as a staircase: the best time for each budget.
  std::vector<std::pair<double, double>> stairs;
  for (size_t k = 0; k < r.optimal_curve.size(); ++k) {
    const auto& p = r.optimal_curve[k];
    if (k > 0) stairs.push_back({mem(p.budget_bytes), r.optimal_curve[k - 1].time_ms});
    stairs.push_back({mem(p.budget_bytes), p.time_ms});
  }
  if (!stairs.empty()) chart.Polyline(stairs, kColors[0], 2.5);
  chart.VerticalLine(mem(r.budget_bytes), "#444", "budget " + FormatBytes(r.budget_bytes, r.style));
  std::vector<std::pair<std::string, std::string>> legend = {{kColors[0], "optimal"}};
  for (size_t k = 0; k < r.strategies.size(); ++k) {
    const auto& p = r.strategies[k];
    const char* color = p.name == "optimal" ? kColors[0] : kColors[1 + k % 9];
    chart.Point(mem(p.peak_bytes), p.time_ms, color, p.name);
    if (p.name != "optimal") legend.push_back({color, p.name});
  }
  for (const auto& run : r.runs) {
    chart.Polyline({{mem(run.run.predicted_peak_bytes), run.run.predicted_time_ms},
                    {mem(run.run.measured.peak_bytes), run.run.measured.step_ms}},
                   "#999", 1, "3 3");
    chart.Point(mem(run.run.measured.peak_bytes), run.run.measured.step_ms, "#000", "measured: " + run.run.algorithm,
                "triangle");
  }
  if (!r.runs.empty()) legend.push_back({"#000", "measured by ckplan run"});
  chart.Legend(legend);
  return chart.Svg();
}

std::string TimelineSvg(const Report& r) {
  const MemoryUnit unit = UnitFor(r.style);
  auto mem = [&unit](int64_t bytes) { return static_cast<double>(bytes) / unit.bytes; };
  const SimulationResult& sim = r.chosen.simulation;
  const int64_t fixed = r.fixed.total();
  // The y axis spans the data (and the budget, and the fixed part where there
  // is one), not 0 up: with a large fixed part the schedule's variation
  // would be a flat line at the top. Where the data reach near 0 anyway, the
  // axis starts at 0.
  int64_t low = fixed > 0 ? fixed : std::numeric_limits<int64_t>::max(), high = std::max(r.budget_bytes, fixed + sim.peak_bytes);
  for (size_t k = 0; k < sim.peak_during_bytes.size(); ++k) {
    low = std::min({low, fixed + sim.peak_during_bytes[k], fixed + sim.stored_after_bytes[k]});
  }
  if (low == std::numeric_limits<int64_t>::max()) low = 0;
  double y_lo = mem(low), y_hi = mem(high);
  const double pad = std::max(y_hi - y_lo, 1e-9) * 0.06;
  y_hi += pad;
  y_lo = y_lo - pad < 0.15 * y_hi ? 0 : y_lo - pad;
  std::string y_label = std::string("memory (") + unit.name + ")";
  if (y_lo > 0) y_label = std::string("memory (") + unit.name + "; the axis starts at " + Num(y_lo) + ", not 0)";
  const double n = static_cast<double>(sim.peak_during_bytes.size());
  Chart chart(0, std::max(1.0, n), y_lo, y_hi, "operation of the schedule (forward, loss, backward; recomputations included)",
              y_label, "Memory over the optimal schedule at the budget");
  std::vector<std::pair<double, double>> peak, stored;
  for (size_t k = 0; k < sim.peak_during_bytes.size(); ++k) {
    peak.push_back({static_cast<double>(k), mem(fixed + sim.peak_during_bytes[k])});
    peak.push_back({static_cast<double>(k + 1), mem(fixed + sim.peak_during_bytes[k])});
    stored.push_back({static_cast<double>(k + 1), mem(fixed + sim.stored_after_bytes[k])});
  }
  chart.Polyline(peak, "#f4a582", 1.5);
  chart.Polyline(stored, kColors[1], 2);
  chart.HorizontalLine(mem(r.budget_bytes), "#444", "budget " + FormatBytes(r.budget_bytes, r.style));
  if (fixed > 0) {
    chart.HorizontalLine(mem(fixed), "#2ca02c",
                         "fixed " + FormatBytes(fixed, r.style) + ": parameters, gradients, optimizer state");
  }
  chart.Legend({{"#f4a582", "peak during the op"}, {kColors[1], "stored after it"}});
  return chart.Svg();
}

std::string ModulesSvg(const Report& r) {
  const Chain& c = r.chain;
  const int length = c.length();
  std::vector<bool> checkpointed(static_cast<size_t>(length), false);
  for (int i : r.chosen.checkpointed_stages) checkpointed[static_cast<size_t>(i)] = true;
  int64_t max_saved = 1;
  for (const Stage& s : c.stages) max_saved = std::max(max_saved, s.saved_bytes);
  // The names' column is as wide as the longest name, up to 40% of the
  // figure; longer names lose their middle ("features...denselayer16.conv2"),
  // the whole name in the tooltip. Room on the right for the byte figures.
  constexpr double kFigureW = 860, kFont = 11, kFiguresW = 80;
  double names_w = 40;
  for (const Stage& st : c.stages) names_w = std::max(names_w, TextWidthPx(st.name, kFont));
  names_w = std::min(names_w, 0.4 * kFigureW);
  const double row = 18, left = names_w + 12, width = kFigureW - left - kFiguresW;
  const double height = 60 + row * length;
  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"860\" height=\"" << height << "\" viewBox=\"0 0 860 " << height
    << "\" role=\"img\" aria-label=\"Activation memory per stage\">\n<rect width=\"100%\" height=\"100%\" fill=\"#fff\"/>\n";
  s << "<text x=\"430\" y=\"20\" font-size=\"15\" font-weight=\"bold\" text-anchor=\"middle\">"
       "Activation memory kept for backward, per stage (module)</text>\n";
  for (int i = 0; i < length; ++i) {
    const Stage& st = c.stages[static_cast<size_t>(i)];
    double y = 36 + row * i;
    double w = width * static_cast<double>(st.saved_bytes) / static_cast<double>(max_saved);
    const char* color = checkpointed[static_cast<size_t>(i)] ? "#f4a582" : "#92c5de";
    const std::string name = ElideMiddle(st.name, kFont, names_w);
    if (name != st.name) s << "<g><title>" << Escape(st.name) << "</title>";
    s << "<text x=\"" << left - 6 << "\" y=\"" << y + 12 << "\" font-size=\"11\" text-anchor=\"end\">" << Escape(name)
      << "</text>";
    if (name != st.name) s << "</g>";
    s << "<rect x=\"" << left << "\" y=\"" << y + 2 << "\" width=\"" << std::max(1.0, w)
      << "\" height=\"" << row - 4 << "\" fill=\"" << color << "\"/><text x=\"" << left + w + 6 << "\" y=\"" << y + 12
      << "\" font-size=\"11\">" << FormatBytes(st.saved_bytes, r.style) << "</text>\n";
  }
  s << "<rect x=\"640\" y=\"" << height - 18 << "\" width=\"12\" height=\"10\" fill=\"#f4a582\"/><text x=\"656\" y=\""
    << height - 9 << "\" font-size=\"11\">recomputed in the plan</text>";
  s << "<rect x=\"480\" y=\"" << height - 18 << "\" width=\"12\" height=\"10\" fill=\"#92c5de\"/><text x=\"496\" y=\""
    << height - 9 << "\" font-size=\"11\">kept</text>\n</svg>\n";
  return s.str();
}

std::string BatchesSvg(const Report& r) {
  const BatchTable& t = *r.batches;
  double x_hi = 1, y_hi = 0;
  std::vector<std::pair<double, double>> none, plan;
  for (const BatchRow& row : t.rows) {
    if (!row.error.empty()) continue;
    x_hi = std::max<double>(x_hi, row.batch);
    if (row.none_fits && row.none_samples_per_s > 0) none.push_back({row.batch, row.none_samples_per_s});
    if (row.plan && row.plan->samples_per_s > 0) plan.push_back({row.batch, row.plan->samples_per_s});
    y_hi = std::max({y_hi, row.none_samples_per_s, row.plan ? row.plan->samples_per_s : 0.0});
  }
  const bool seq = t.dimension == "seq";
  const std::string dim = seq ? "sequence length" : "batch", unit = seq ? "tokens" : "samples";
  Chart chart(0, x_hi * 1.05, 0, y_hi * 1.12 + 1e-9, dim, unit + " per second (predicted)",
              (seq ? "Tokens per second by sequence length, within " : "Samples per second by batch, within ") +
                  FormatBytes(t.budget_bytes, r.style));
  if (!plan.empty()) chart.Polyline(plan, kColors[0], 2.5);
  if (!none.empty()) chart.Polyline(none, kColors[1], 2, "6 3");
  for (const auto& [x, y] : plan) chart.Point(x, y, kColors[0], "");
  for (const auto& [x, y] : none) chart.Point(x, y, kColors[1], "");
  if (t.largest_none > 0) chart.VerticalLine(t.largest_none, kColors[1], "largest without: " + std::to_string(t.largest_none));
  if (t.largest_plan > 0) chart.VerticalLine(t.largest_plan, kColors[0], "largest with: " + std::to_string(t.largest_plan));
  for (const BatchRow& row : t.rows) {
    if (row.batch == t.fastest_plan && row.plan) {
      chart.Point(row.batch, row.plan->samples_per_s, "#000", "fastest: " + std::string(seq ? "seq " : "batch ") +
                  std::to_string(row.batch), "triangle");
    }
  }
  chart.Legend({{kColors[0], "best plan (checkpointing)"}, {kColors[1], "no checkpointing"}});
  return chart.Svg();
}

}  // namespace ckplan
