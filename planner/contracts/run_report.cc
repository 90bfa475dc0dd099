#include "planner/contracts/run_report.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <limits>

#include "planner/base/json_io.h"

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
         max_rel_grad_diff == o.max_rel_grad_diff && worst_grad_parameter == o.worst_grad_parameter &&
         worst_grad_abs_diff == o.worst_grad_abs_diff && grad_tolerance_ratio == o.grad_tolerance_ratio &&
         peak_error_pct == o.peak_error_pct && verdict == o.verdict && failed_checks == o.failed_checks &&
         steps == o.steps;
}

double PeakErrorPct(int64_t predicted_peak_bytes, int64_t measured_peak_bytes) {
  return measured_peak_bytes > 0
             ? static_cast<double>(predicted_peak_bytes - measured_peak_bytes) / measured_peak_bytes * 100
             : 0;
}

GradientTolerance DefaultGradientTolerance(const std::string& dtype) {
  if (dtype == "Double" || dtype == "ComplexDouble") return {1e-7, 1e-7};
  if (dtype == "BFloat16") return {1.6e-2, 1e-5};
  if (dtype == "Half" || dtype == "ComplexHalf") return {1e-3, 1e-5};
  return {1.3e-6, 1e-5};
}

double ScaledGradientAtol(double atol, double max_abs_gradient) {
  return atol * std::max(1.0, std::isfinite(max_abs_gradient) ? max_abs_gradient : 1.0);
}

GradientDiff CompareGradient(const std::string& parameter, const std::vector<double>& got,
                             const std::vector<double>& expected, GradientTolerance tolerance,
                             double max_abs_gradient) {
  GradientDiff diff{parameter, 0, 0};
  if (got.size() != expected.size()) {
    diff.max_abs_diff = diff.tolerance_ratio = std::numeric_limits<double>::infinity();
    return diff;
  }
  const double atol = ScaledGradientAtol(tolerance.atol, max_abs_gradient);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] == expected[i] ? 0 : std::fabs(got[i] - expected[i]);  // infinities equal
    const double ratio = d / (atol + tolerance.rtol * std::fabs(expected[i]));
    // As torch's max: a NaN anywhere is the result.
    diff.max_abs_diff = std::isnan(d) || std::isnan(diff.max_abs_diff) ? nan : std::max(diff.max_abs_diff, d);
    diff.tolerance_ratio =
        std::isnan(ratio) || std::isnan(diff.tolerance_ratio) ? nan : std::max(diff.tolerance_ratio, ratio);
  }
  return diff;
}

void GradientCheck::Add(const GradientDiff& diff) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  max_abs_diff =
      std::isnan(diff.max_abs_diff) || std::isnan(max_abs_diff) ? nan : std::max(max_abs_diff, diff.max_abs_diff);
  const bool worse = worst.parameter.empty() || std::isnan(diff.tolerance_ratio) ||
                     (!std::isnan(worst.tolerance_ratio) && diff.tolerance_ratio > worst.tolerance_ratio);
  if (worse) worst = diff;
}

std::vector<std::string> FailedRunChecks(int64_t measured_peak_bytes, int64_t budget_bytes, double grad_tolerance_ratio,
                                         double peak_error_pct) {
  std::vector<std::string> failed;
  if (measured_peak_bytes > budget_bytes) failed.push_back("over_budget");
  if (!(grad_tolerance_ratio <= 1)) failed.push_back("grads_differ");  // NaN included
  if (std::fabs(peak_error_pct) > kPeakTolerancePct) failed.push_back("prediction_off");
  return failed;
}

std::string RunVerdict(int64_t measured_peak_bytes, int64_t budget_bytes, double grad_tolerance_ratio,
                       double peak_error_pct) {
  const std::vector<std::string> failed =
      FailedRunChecks(measured_peak_bytes, budget_bytes, grad_tolerance_ratio, peak_error_pct);
  return failed.empty() ? "ok" : failed.front();
}

nlohmann::json RunReportToJson(const RunReport& r) {
  auto measure = [](const StepMeasure& m) {
    return nlohmann::json{{"peak_bytes", m.peak_bytes}, {"live_after_forward_bytes", m.live_after_forward_bytes},
                          {"step_ms", m.step_ms}};
  };
  nlohmann::json doc = {{"schema", "ckplan.run/1"},
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
                        {"verdict", r.verdict},
                        {"failed_checks", r.failed_checks}};
  if (!r.worst_grad_parameter.empty()) {
    doc["worst_grad"] = {{"parameter", r.worst_grad_parameter},
                         {"max_abs_diff", r.worst_grad_abs_diff},
                         {"tolerance_ratio", r.grad_tolerance_ratio}};
  }
  return doc;
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
  if (doc.Has("worst_grad")) {
    const JsonReader worst = doc.Field("worst_grad");
    r.worst_grad_parameter = worst.Field("parameter").String();
    r.worst_grad_abs_diff = NumberOrNull(worst.Field("max_abs_diff"));
    r.grad_tolerance_ratio = NumberOrNull(worst.Field("tolerance_ratio"));
  }
  if (doc.Has("failed_checks")) {
    const JsonReader failed = doc.Field("failed_checks");
    static const std::vector<std::string> kChecks = {"over_budget", "grads_differ", "prediction_off"};
    for (size_t i = 0; i < failed.ArraySize(); ++i) {
      const std::string check = failed.Item(i).String();
      if (std::find(kChecks.begin(), kChecks.end(), check) == kChecks.end()) {
        failed.Item(i).Fail("unknown check '" + check + "': use over_budget, grads_differ or prediction_off");
      }
      r.failed_checks.push_back(check);
    }
    if ((r.failed_checks.empty() ? "ok" : r.failed_checks.front()) != r.verdict) {
      failed.Fail("disagrees with verdict '" + r.verdict + "': the verdict is the first failed check, or ok");
    }
  } else if (r.verdict != "ok") {
    r.failed_checks = {r.verdict};  // a file from before the field: what its verdict says
  }
  return r;
}

}  // namespace ckplan
