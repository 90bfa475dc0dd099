#include "ckplan/planner/run_report.h"

#include <climits>
#include <cmath>
#include <limits>

#include "ckplan/planner/json_io.h"

namespace ckplan {

bool StepMeasure::operator==(const StepMeasure& o) const {
  return peak_bytes == o.peak_bytes && live_after_forward_bytes == o.live_after_forward_bytes && step_ms == o.step_ms;
}

bool RunReport::operator==(const RunReport& o) const {
  return model_path == o.model_path && plan_path == o.plan_path && algorithm == o.algorithm &&
         optimizer == o.optimizer && budget_bytes == o.budget_bytes && measured == o.measured &&
         baseline == o.baseline && predicted_peak_bytes == o.predicted_peak_bytes &&
         predicted_time_ms == o.predicted_time_ms && predicted_overhead_pct == o.predicted_overhead_pct &&
         measured_overhead_pct == o.measured_overhead_pct && max_abs_grad_diff == o.max_abs_grad_diff &&
         max_rel_grad_diff == o.max_rel_grad_diff && peak_error_pct == o.peak_error_pct && verdict == o.verdict &&
         steps == o.steps;
}

double PeakErrorPct(int64_t predicted_peak_bytes, int64_t measured_peak_bytes) {
  return measured_peak_bytes > 0
             ? static_cast<double>(predicted_peak_bytes - measured_peak_bytes) / measured_peak_bytes * 100
             : 0;
}

std::string RunVerdict(int64_t measured_peak_bytes, int64_t budget_bytes, double max_rel_grad_diff,
                       double peak_error_pct) {
  if (measured_peak_bytes > budget_bytes) return "over_budget";
  if (max_rel_grad_diff > kGradientTolerance) return "grads_differ";
  if (std::fabs(peak_error_pct) > kPeakTolerancePct) return "prediction_off";
  return "ok";
}

nlohmann::json RunReportToJson(const RunReport& r) {
  auto measure = [](const StepMeasure& m) {
    return nlohmann::json{{"peak_bytes", m.peak_bytes}, {"live_after_forward_bytes", m.live_after_forward_bytes},
                          {"step_ms", m.step_ms}};
  };
  return {{"schema", "ckplan.run/1"},
          {"model", r.model_path},
          {"plan", r.plan_path},
          {"algorithm", r.algorithm},
          {"optimizer", r.optimizer},
          {"steps", r.steps},
          {"measured", measure(r.measured)},
          {"baseline", measure(r.baseline)},
          {"predicted", {{"peak_bytes", r.predicted_peak_bytes}, {"time_ms", r.predicted_time_ms},
                         {"overhead_pct", r.predicted_overhead_pct}}},
          {"measured_overhead_pct", r.measured_overhead_pct},
          {"peak_error_pct", r.peak_error_pct},
          {"budget_bytes", r.budget_bytes},
          {"max_abs_grad_diff", r.max_abs_grad_diff},
          {"max_rel_grad_diff", r.max_rel_grad_diff},
          {"verdict", r.verdict}};
}

namespace {

// A number that may be written as null: JSON has no NaN or infinity (a
// gradient difference of NaN is written as null).
double NumberOrNull(const JsonReader& field) {
  if (field.node().is_null()) return std::numeric_limits<double>::quiet_NaN();
  return field.FiniteNumber();
}

}  // namespace

RunReport RunReportFromJson(const nlohmann::json& json, const std::string& file) {
  JsonReader doc(json, file);
  if (doc.Field("schema").String() != "ckplan.run/1") doc.Field("schema").Fail("expected \"ckplan.run/1\"");
  RunReport r;
  r.algorithm = doc.Field("algorithm").String();
  r.budget_bytes = doc.Field("budget_bytes").NonNegativeBytes();
  r.measured.peak_bytes = doc.Field("measured").Field("peak_bytes").NonNegativeBytes();
  r.measured.step_ms = doc.Field("measured").Field("step_ms").NonNegativeNumber();
  r.baseline.step_ms = doc.Field("baseline").Field("step_ms").NonNegativeNumber();
  r.predicted_peak_bytes = doc.Field("predicted").Field("peak_bytes").NonNegativeBytes();
  r.predicted_time_ms = doc.Field("predicted").Field("time_ms").NonNegativeNumber();
  r.verdict = doc.Field("verdict").String();
  const JsonReader measured = doc.Field("measured"), baseline = doc.Field("baseline"), predicted = doc.Field("predicted");
  // Read when present.
  if (doc.Has("model")) r.model_path = doc.Field("model").String();
  if (doc.Has("plan")) r.plan_path = doc.Field("plan").String();
  if (doc.Has("optimizer")) r.optimizer = doc.Field("optimizer").String();
  if (doc.Has("steps")) r.steps = doc.Field("steps").IntegerIn(0, INT_MAX);
  if (measured.Has("live_after_forward_bytes")) {
    r.measured.live_after_forward_bytes = measured.Field("live_after_forward_bytes").NonNegativeBytes();
  }
  if (baseline.Has("peak_bytes")) r.baseline.peak_bytes = baseline.Field("peak_bytes").NonNegativeBytes();
  if (baseline.Has("live_after_forward_bytes")) {
    r.baseline.live_after_forward_bytes = baseline.Field("live_after_forward_bytes").NonNegativeBytes();
  }
  if (predicted.Has("overhead_pct")) r.predicted_overhead_pct = predicted.Field("overhead_pct").FiniteNumber();
  if (doc.Has("measured_overhead_pct")) r.measured_overhead_pct = doc.Field("measured_overhead_pct").FiniteNumber();
  if (doc.Has("peak_error_pct")) r.peak_error_pct = doc.Field("peak_error_pct").FiniteNumber();
  if (doc.Has("max_abs_grad_diff")) r.max_abs_grad_diff = NumberOrNull(doc.Field("max_abs_grad_diff"));
  if (doc.Has("max_rel_grad_diff")) r.max_rel_grad_diff = NumberOrNull(doc.Field("max_rel_grad_diff"));
  return r;
}

}  // namespace ckplan
