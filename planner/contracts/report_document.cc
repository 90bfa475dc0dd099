#include "planner/contracts/report_document.h"

#include "planner/base/json_io.h"

namespace ckplan {

bool ReportRun::operator==(const ReportRun& o) const {
  return file == o.file && algorithm == o.algorithm && measured_peak_bytes == o.measured_peak_bytes &&
         measured_ms == o.measured_ms && predicted_peak_bytes == o.predicted_peak_bytes &&
         predicted_ms == o.predicted_ms && verdict == o.verdict;
}

bool RankMemoryRow::operator==(const RankMemoryRow& o) const {
  return label == o.label && param_bytes == o.param_bytes && grad_bytes == o.grad_bytes &&
         optimizer_bytes == o.optimizer_bytes && buffer_bytes == o.buffer_bytes && gathered_bytes == o.gathered_bytes &&
         activation_budget_bytes == o.activation_budget_bytes && in_flight == o.in_flight &&
         stored_bytes == o.stored_bytes && peak_bytes == o.peak_bytes;
}

bool DistributedSummary::operator==(const DistributedSummary& o) const { return what == o.what && rows == o.rows; }

bool ReportDocument::operator==(const ReportDocument& o) const {
  auto same_curve = [](const std::vector<CurvePoint>& a, const std::vector<CurvePoint>& b) {
    if (a.size() != b.size()) return false;
    for (size_t k = 0; k < a.size(); ++k) {
      if (a[k].budget_bytes != b[k].budget_bytes || a[k].time_ms != b[k].time_ms) return false;
    }
    return true;
  };
  return source == o.source && budget_bytes == o.budget_bytes && fixed_bytes == o.fixed_bytes &&
         no_recompute_ms == o.no_recompute_ms && strategies == o.strategies &&
         same_curve(optimal_curve, o.optimal_curve) && runs == o.runs && distributed == o.distributed &&
         batches == o.batches;
}

nlohmann::json ReportToJson(const ReportDocument& r) {
  nlohmann::json strategies = nlohmann::json::array();
  for (const auto& p : r.strategies) strategies.push_back(StrategyPointToJson(p));
  nlohmann::json curve = nlohmann::json::array();
  for (const auto& p : r.optimal_curve) curve.push_back({{"budget_bytes", p.budget_bytes}, {"time_ms", p.time_ms}});
  nlohmann::json runs = nlohmann::json::array();
  for (const auto& run : r.runs) {
    runs.push_back({{"file", run.file}, {"algorithm", run.algorithm},
                    {"measured_peak_bytes", run.measured_peak_bytes}, {"measured_ms", run.measured_ms},
                    {"predicted_peak_bytes", run.predicted_peak_bytes}, {"predicted_ms", run.predicted_ms},
                    {"verdict", run.verdict}});
  }
  nlohmann::json doc = {{"schema", "ckplan.report/1"}, {"source", r.source}, {"budget_bytes", r.budget_bytes},
                        {"fixed_bytes", r.fixed_bytes}, {"no_recompute_ms", r.no_recompute_ms},
                        {"strategies", strategies}, {"optimal_curve", curve}, {"runs", runs}};
  if (r.distributed) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.distributed->rows) {
      rows.push_back({{"label", row.label}, {"param_bytes", row.param_bytes}, {"grad_bytes", row.grad_bytes},
                      {"optimizer_bytes", row.optimizer_bytes}, {"buffer_bytes", row.buffer_bytes},
                      {"gathered_bytes", row.gathered_bytes}, {"activation_budget_bytes", row.activation_budget_bytes},
                      {"in_flight", row.in_flight}, {"stored_after_forward_bytes", row.stored_bytes},
                      {"peak_bytes", row.peak_bytes}});
    }
    doc["distributed"] = {{"what", r.distributed->what}, {"ranks", rows}};
  }
  if (r.batches) doc["batches"] = BatchTableToJson(*r.batches);
  return doc;
}

ReportDocument ReportFromJson(const nlohmann::json& json, const std::string& file) {
  JsonReader root(json, file);
  root.ExpectObject();
  if (root.Field("schema").String() != "ckplan.report/1") root.Field("schema").Fail("expected \"ckplan.report/1\"");
  ReportDocument r;
  r.source = root.Field("source").String();
  r.budget_bytes = root.Field("budget_bytes").NonNegativeBytes();
  r.fixed_bytes = root.Field("fixed_bytes").NonNegativeBytes();
  r.no_recompute_ms = root.Field("no_recompute_ms").NonNegativeNumber();
  r.strategies = StrategyPointsFromJson(root.Field("strategies"));
  const JsonReader curve = root.Field("optimal_curve");
  for (size_t k = 0; k < curve.ArraySize(); ++k) {
    const JsonReader p = curve.Item(k);
    r.optimal_curve.push_back({p.Field("budget_bytes").NonNegativeBytes(), p.Field("time_ms").NonNegativeNumber()});
  }
  const JsonReader runs = root.Field("runs");
  for (size_t k = 0; k < runs.ArraySize(); ++k) {
    const JsonReader run = runs.Item(k);
    r.runs.push_back({run.Field("file").String(), run.Field("algorithm").String(),
                      run.Field("measured_peak_bytes").NonNegativeBytes(), run.Field("measured_ms").NonNegativeNumber(),
                      run.Field("predicted_peak_bytes").NonNegativeBytes(), run.Field("predicted_ms").NonNegativeNumber(),
                      run.Field("verdict").String()});
  }
  if (root.Has("distributed")) {
    const JsonReader d = root.Field("distributed");
    DistributedSummary summary;
    summary.what = d.Field("what").String();
    const JsonReader ranks = d.Field("ranks");
    for (size_t k = 0; k < ranks.ArraySize(); ++k) {
      const JsonReader row = ranks.Item(k);
      RankMemoryRow out;
      out.label = row.Field("label").String();
      out.param_bytes = row.Field("param_bytes").NonNegativeBytes();
      out.grad_bytes = row.Field("grad_bytes").NonNegativeBytes();
      out.optimizer_bytes = row.Field("optimizer_bytes").NonNegativeBytes();
      out.buffer_bytes = row.Field("buffer_bytes").NonNegativeBytes();
      out.gathered_bytes = row.Field("gathered_bytes").NonNegativeBytes();
      out.activation_budget_bytes = row.Field("activation_budget_bytes").Integer();
      out.in_flight = row.Field("in_flight").IntegerIn(1, 1 << 30);
      out.stored_bytes = row.Field("stored_after_forward_bytes").NonNegativeBytes();
      out.peak_bytes = row.Field("peak_bytes").NonNegativeBytes();
      summary.rows.push_back(out);
    }
    r.distributed = summary;
  }
  if (root.Has("batches")) r.batches = BatchTableFromJson(root.Field("batches").node(), file);
  return r;
}

}  // namespace ckplan
