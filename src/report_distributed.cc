#include "report_distributed.h"

#include <sstream>

#include "ckplan/planner/error.h"
#include "ckplan/planner/json_io.h"
#include "html_escape.h"
#include "terminal.h"

namespace ckplan {

namespace {

RankMemoryRow RowFrom(const JsonReader& fixed, const std::string& label) {
  RankMemoryRow row;
  row.label = label;
  row.param_bytes = fixed.Field("param_bytes").NonNegativeBytes();
  row.grad_bytes = fixed.Field("grad_bytes").NonNegativeBytes();
  row.optimizer_bytes = fixed.Field("optimizer_bytes").NonNegativeBytes();
  row.buffer_bytes = fixed.Field("buffer_bytes").NonNegativeBytes();
  row.gathered_bytes = fixed.Field("gathered_bytes").NonNegativeBytes() + fixed.Field("reduce_bytes").NonNegativeBytes();
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
  nlohmann::json doc = ReadJsonFile(path);
  JsonReader root(doc, path);
  root.ExpectObject();
  if (root.Field("schema").String() != "ckplan.plan/1") root.Field("schema").Fail("expected \"ckplan.plan/1\"");
  if (!root.Has("distributed")) {
    throw BadInput(path + ": field 'distributed': missing (not a plan from `ckplan solve --data-parallel` or --pipeline)");
  }
  JsonReader d = root.Field("distributed");
  DistributedSummary summary;
  if (d.Has("stages")) {
    JsonReader stages = d.Field("stages");
    summary.what = Format("%zu pipeline stages, %s, %d microbatches", stages.ArraySize(),
                          d.Field("schedule").String().c_str(), d.Field("microbatches").IntegerIn(1, 1 << 30));
    for (size_t s = 0; s < stages.ArraySize(); ++s) {
      JsonReader st = stages.Item(s).Field("pipeline_stage");
      RankMemoryRow row = RowFrom(st.Field("fixed"), Format("stage %zu", s));
      row.activation_budget_bytes = st.Field("activation_budget_bytes").Integer();
      row.in_flight = st.Field("in_flight").IntegerIn(1, 1 << 30);
      row.stored_bytes = st.Field("stored_after_forward_bytes").NonNegativeBytes();
      row.peak_bytes = st.Field("peak_bytes").NonNegativeBytes();
      summary.rows.push_back(row);
    }
  } else {
    const int ranks = d.Field("data_parallel").IntegerIn(1, 1 << 30);
    summary.what = Format("%d data-parallel rank(s), --shard %s", ranks, d.Field("shard").String().c_str());
    JsonReader rank = d.Field("ranks").Item(0);
    RankMemoryRow row = RowFrom(rank.Field("fixed"), Format("each of %d", ranks));
    row.activation_budget_bytes = rank.Field("activation_budget_bytes").Integer();
    row.peak_bytes = rank.Field("peak_bytes").NonNegativeBytes();
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
