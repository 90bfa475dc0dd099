#include "cli/report/report_distributed.h"

#include <sstream>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/contracts/plan_document.h"
#include "cli/report/html_escape.h"
#include "cli/terminal.h"

namespace ckplan {

namespace {

RankMemoryRow RowFrom(const FixedMemory& fixed, const std::string& label) {
  RankMemoryRow row;
  row.label = label;
  row.param_bytes = fixed.param_bytes;
  row.grad_bytes = fixed.grad_bytes;
  row.optimizer_bytes = fixed.optimizer_bytes;
  row.buffer_bytes = fixed.buffer_bytes;
  row.gathered_bytes = fixed.gathered_bytes + fixed.reduce_bytes;
  return row;
}

std::vector<std::string> Header() {
  return {"rank", "parameters", "gradients", "optimizer", "buffers", "gathered", "activation budget",
          "in flight", "stored / microbatch", "peak"};
}

std::vector<std::string> Cells(const RankMemoryRow& r, UnitStyle style) {
  auto b = [style](int64_t v) { return FormatBytes(v, style); };
  return {r.label, b(r.param_bytes), b(r.grad_bytes), b(r.optimizer_bytes), b(r.buffer_bytes), b(r.gathered_bytes),
          b(r.activation_budget_bytes), std::to_string(r.in_flight), r.stored_bytes > 0 ? b(r.stored_bytes) : "-",
          b(r.peak_bytes)};
}

}  // namespace

DistributedSummary ReadDistributedPlan(const std::string& path) {
  // The plan through its contract (plan_document.h).
  const PlanDocument plan = PlanFromJson(ReadJsonFile(path), path);
  if (!plan.distributed) {
    throw BadInput(path + ": field 'distributed': missing (not a plan from `ckplan solve --data-parallel` or --pipeline)");
  }
  const PlanDistributed& d = *plan.distributed;
  DistributedSummary summary;
  if (!d.stages.empty()) {
    summary.what = Format("%zu pipeline stages, %s, %d microbatches", d.stages.size(), d.schedule.c_str(), d.microbatches);
    for (size_t s = 0; s < d.stages.size(); ++s) {
      const std::optional<PlanPipelineStage>& st = d.stages[s].pipeline_stage;
      if (!st) throw BadInput(Format("%s: field 'distributed.stages[%zu].pipeline_stage': missing", path.c_str(), s));
      RankMemoryRow row = RowFrom(st->fixed, Format("stage %zu", s));
      row.activation_budget_bytes = st->activation_budget_bytes;
      row.in_flight = st->in_flight;
      row.stored_bytes = st->stored_after_forward_bytes;
      row.peak_bytes = st->peak_bytes;
      summary.rows.push_back(row);
    }
  } else {
    summary.what = Format("%d data-parallel rank(s), --shard %s", d.data_parallel, d.shard.c_str());
    const PlanRank& rank = d.ranks.front();
    RankMemoryRow row = RowFrom(rank.fixed, Format("each of %d", d.data_parallel));
    row.activation_budget_bytes = rank.activation_budget_bytes;
    row.peak_bytes = rank.peak_bytes;
    summary.rows.push_back(row);
  }
  return summary;
}

std::string DistributedHtml(const DistributedSummary& summary, UnitStyle style) {
  std::ostringstream s;
  s << "<h2>Per rank: " << Escape(summary.what) << "</h2>\n<table><tr>";
  for (const auto& h : Header()) s << "<th>" << Escape(h) << "</th>";
  s << "</tr>\n";
  for (const auto& row : summary.rows) {
    s << "<tr>";
    for (const auto& cell : Cells(row, style)) s << "<td>" << Escape(cell) << "</td>";
    s << "</tr>\n";
  }
  s << "</table>\n";
  return s.str();
}

std::string DistributedMarkdown(const DistributedSummary& summary, UnitStyle style) {
  std::ostringstream s;
  s << "\nPer rank (" << summary.what << "):\n\n|";
  for (const auto& h : Header()) s << " " << h << " |";
  s << "\n| --- |";
  for (size_t c = 1; c < Header().size(); ++c) s << " ---: |";
  s << "\n";
  for (const auto& row : summary.rows) {
    s << "|";
    for (const auto& cell : Cells(row, style)) s << " " << cell << " |";
    s << "\n";
  }
  return s.str();
}

}  // namespace ckplan
