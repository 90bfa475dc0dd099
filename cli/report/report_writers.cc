#include "cli/report/report_writers.h"

#include <algorithm>
#include <sstream>

#include "cli/report/html_escape.h"
#include "cli/report/report_figures.h"
#include "cli/terminal.h"

namespace ckplan {
namespace {

// One row of the batch table, each cell between `open` and `close`.
std::string BatchCells(const BatchRow& row, UnitStyle style, const char* open, const char* close) {
  std::vector<std::string> cells = {std::to_string(row.batch)};
  auto rate = [](double v) { return v > 0 ? Format("%.1f", v) : std::string("-"); };
  if (!row.error.empty()) {
    cells.insert(cells.end(), {"not profiled: " + row.error, "", "", "", "", ""});
  } else {
    cells.push_back(FormatBytes(row.none_peak_bytes, style) + (row.none_fits ? "" : " (over)"));
    cells.push_back(row.none_fits ? rate(row.none_samples_per_s) : "-");
    if (row.plan) {
      cells.insert(cells.end(), {row.plan->what, FormatBytes(row.plan->peak_bytes, style), FormatPct(row.plan->overhead_pct),
                                 rate(row.plan->samples_per_s)});
    } else {
      cells.insert(cells.end(), {"does not fit", "needs " + FormatBytes(row.min_budget_bytes, style), "", "-"});
    }
  }
  std::string out;
  for (const std::string& c : cells) out += open + Escape(c) + close;
  return out;
}

std::string BatchSummary(const BatchTable& t) {
  const bool seq = t.dimension == "seq";
  const std::string dim = seq ? "sequence length" : "batch";
  std::string s = "Largest " + dim + " without checkpointing: " +
                  (t.largest_none > 0 ? std::to_string(t.largest_none) : "none") +
                  "; with checkpointing: " + (t.largest_plan > 0 ? std::to_string(t.largest_plan) : "none");
  if (t.fastest_plan > 0) {
    s += std::string("; the most ") + (seq ? "tokens" : "samples") + " per second: " + dim + " " +
         std::to_string(t.fastest_plan);
  }
  if (t.global_batch) s += Format(" (accumulated to a global batch of %d)", *t.global_batch);
  return s + ". Every row was profiled at its " + dim + " (ckplan solve --" + (seq ? "seq" : "batch") + ").";
}

}  // namespace


std::string ReportHtml(const Report& r) {
  std::ostringstream s;
  s << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>ckplan report: " << Escape(r.title)
    << "</title>\n<style>body{font-family:sans-serif;margin:24px auto;max-width:900px;color:#222}"
       "table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}"
       "th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}figure{margin:18px 0}"
       ".note{color:#555;font-size:14px}</style></head><body>\n";
  s << "<h1>ckplan report</h1>\n<p>" << Escape(r.title) << " &mdash; budget <b>" << FormatBytes(r.budget_bytes, r.style)
    << "</b>";
  if (r.fixed.total() > 0) {
    s << ", of which fixed " << FormatBytes(r.fixed.total(), r.style) << " (parameters, gradients, " << Escape(r.fixed.optimizer.name)
      << " state)";
  }
  s << ". Without recomputation a step takes " << FormatMs(r.no_recompute_ms) << ".</p>\n";
  s << "<p>The optimal plan at the budget: peak " << FormatBytes(r.chosen.peak_bytes, r.style) << ", step "
    << Format("%.2f ms (%s)", r.chosen.time_ms, FormatPct(r.chosen.overhead_pct()).c_str()) << ", "
    << r.chosen.checkpointed_stages.size() << " of " << r.chain.length() << " stages recomputed"
    << (r.target == "pytorch" ? Format(" (the PyTorch target: %zu modules wrapped with torch.utils.checkpoint by apply_plan, "
                                       "as `ckplan solve` plans by default; the row `optimal (schedule)` is the nested "
                                       "schedule `ckplan run` runs with --target schedule)",
                                       r.chosen.pytorch.checkpoint_modules.size())
                              : std::string())
    << ".</p>\n";
  s << "<figure>" << TradeoffSvg(r) << "<figcaption class=\"note\">Each strategy's predicted peak memory and step time; "
       "the line: the optimal nested schedule's best time (`--target schedule`) for every budget from its smallest feasible one ("
    << (r.optimal_curve.empty() ? std::string("-") : FormatBytes(r.optimal_curve.front().budget_bytes, r.style))
    << ")."
    << (r.runs.empty() ? "" : " Triangles: what ckplan run measured (median training steps, timed whole), each joined by a "
                              "dotted line to the plan's predicted point.")
    << "</figcaption></figure>\n";
  s << "<h2>Strategies</h2>\n<table><tr>";
  auto rows = StrategyTableRows(r.strategies, r.style);
  for (const auto& h : rows[0]) s << "<th>" << Escape(h) << "</th>";
  s << "</tr>\n";
  for (size_t k = 1; k < rows.size(); ++k) {
    s << "<tr>";
    for (const auto& cell : rows[k]) s << "<td>" << Escape(cell) << "</td>";
    s << "</tr>\n";
  }
  s << "</table>\n";
  if (!r.runs.empty()) {
    s << "<h2>Measured by ckplan run</h2>\n<table><tr><th>run</th><th>algorithm</th><th>predicted peak</th><th>measured peak"
         "</th><th>predicted step</th><th>measured step</th><th>verdict</th></tr>\n";
    for (const auto& run : r.runs) {
      s << "<tr><td>" << Escape(run.label) << "</td><td>" << Escape(run.run.algorithm) << "</td><td>"
        << FormatBytes(run.run.predicted_peak_bytes, r.style) << "</td><td>"
        << FormatBytes(run.run.measured.peak_bytes, r.style) << "</td><td>"
        << FormatMs(run.run.predicted_time_ms) << "</td><td>" << FormatMs(run.run.measured.step_ms)
        << "</td><td>" << Escape(run.run.verdict) << "</td></tr>\n";
    }
    s << "</table>\n";
  }
  if (!r.distributed.rows.empty()) s << DistributedHtml(r.distributed, r.style);
  if (r.batches) {
    const bool seq = r.batches->dimension == "seq";
    const std::string dim = seq ? "seq" : "batch", rate = seq ? "tokens/s" : "samples/s";
    s << "<h2>" << (seq ? "Tokens per second by sequence length" : "Samples per second by batch") << "</h2>\n<figure>"
      << BatchesSvg(r) << "</figure>\n<table><tr><th>" << dim << "</th><th>no checkpointing: peak</th><th>" << rate
      << "</th><th>best plan</th><th>peak</th><th>overhead</th><th>" << rate << "</th></tr>\n";
    for (const BatchRow& row : r.batches->rows) s << "<tr>" << BatchCells(row, r.style, "<td>", "</td>") << "</tr>\n";
    s << "</table>\n<p class=\"note\">" << Escape(BatchSummary(*r.batches)) << "</p>\n";
  }
  s << "<h2>The plan over time</h2>\n<figure>" << TimelineSvg(r) << "</figure>\n";
  s << "<h2>Where the memory goes</h2>\n<figure>" << ModulesSvg(r) << "</figure>\n";
  s << "<p class=\"note\">Predicted by ckplan's simulator from " << Escape(r.source)
    << "; times are the profile's medians.</p>\n</body></html>\n";
  return s.str();
}

std::string ReportMarkdown(const Report& r) {
  std::ostringstream s;
  s << "## ckplan report: " << r.title << "\n\nBudget **" << FormatBytes(r.budget_bytes, r.style) << "**";
  if (r.fixed.total() > 0) s << " (fixed " << FormatBytes(r.fixed.total(), r.style) << ")";
  s << "; no recomputation: " << FormatMs(r.no_recompute_ms) << " a step.\n\n";
  auto rows = StrategyTableRows(r.strategies, r.style);
  for (size_t k = 0; k < rows.size(); ++k) {
    s << "|";
    for (const auto& cell : rows[k]) s << " " << cell << " |";
    s << "\n";
    if (k == 0) {
      s << "|";
      for (size_t c = 0; c < rows[0].size(); ++c) s << (c == 0 ? " --- |" : " ---: |");
      s << "\n";
    }
  }
  if (!r.runs.empty()) {
    s << "\n| run | algorithm | predicted peak | measured peak | predicted step | measured step | verdict |\n"
         "| --- | --- | ---: | ---: | ---: | ---: | --- |\n";
    for (const auto& run : r.runs) {
      s << "| " << run.label << " | " << run.run.algorithm << " | " << FormatBytes(run.run.predicted_peak_bytes, r.style)
        << " | " << FormatBytes(run.run.measured.peak_bytes, r.style) << " | "
        << FormatMs(run.run.predicted_time_ms) << " | " << FormatMs(run.run.measured.step_ms) << " | "
        << run.run.verdict << " |\n";
    }
  }
  if (!r.distributed.rows.empty()) s << DistributedMarkdown(r.distributed, r.style);
  if (r.batches) {
    const bool seq = r.batches->dimension == "seq";
    const std::string dim = seq ? "seq" : "batch", rate = seq ? "tokens/s" : "samples/s";
    s << "\n" << (seq ? "Tokens per second by sequence length" : "Samples per second by batch") << ", within "
      << FormatBytes(r.batches->budget_bytes, r.style) << ":\n\n| " << dim << " | no checkpointing: peak | " << rate
      << " | best plan | peak | overhead | " << rate << " |\n| ---: | ---: | ---: | --- | ---: | ---: | ---: |\n";
    for (const BatchRow& row : r.batches->rows) s << "|" << BatchCells(row, r.style, " ", " |") << "\n";
    s << "\n" << BatchSummary(*r.batches) << "\n";
  }
  s << "\nOptimal nested schedule's step time by budget (`--target schedule`):\n\n| budget | step | overhead |\n| ---: | ---: | ---: |\n";
  size_t stride = std::max<size_t>(1, r.optimal_curve.size() / 10);
  for (size_t k = 0; k < r.optimal_curve.size(); k += stride) {
    const auto& p = r.optimal_curve[k];
    const double overhead = OverheadPct(p.time_ms, r.no_recompute_ms);
    s << "| " << FormatBytes(p.budget_bytes, r.style) << " | " << FormatMs(p.time_ms) << " | "
      << FormatPct(overhead) << " |\n";
  }
  return s.str();
}

nlohmann::json ReportJson(const Report& r) {
  ReportDocument doc;
  doc.source = r.source;
  doc.budget_bytes = r.budget_bytes;
  doc.fixed_bytes = r.fixed.total();
  doc.no_recompute_ms = r.no_recompute_ms;
  doc.strategies = r.strategies;
  doc.optimal_curve = r.optimal_curve;
  for (const RunPoint& run : r.runs) {
    doc.runs.push_back({run.label, run.run.algorithm, run.run.measured.peak_bytes, run.run.measured.step_ms,
                        run.run.predicted_peak_bytes, run.run.predicted_time_ms, run.run.verdict});
  }
  if (!r.distributed.rows.empty()) doc.distributed = r.distributed;
  doc.batches = r.batches;
  return ReportToJson(doc);
}

}  // namespace ckplan
