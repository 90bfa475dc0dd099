#pragma once
/// The run contract, `ckplan.run/1`, as one value: what `ckplan run` writes
/// (the executor measures it) and `ckplan report --runs` reads. Torch-free;
/// the verdict rule is here too, so that it is one function with a test.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ckplan {

struct StepMeasure {
  int64_t peak_bytes = 0;               ///< the step's peak, everything included
  int64_t live_after_forward_bytes = 0; ///< live when the loss starts
  double step_ms = 0;                   ///< median over steps
  bool operator==(const StepMeasure& o) const;
};

struct RunReport {
  std::string model_path;
  std::string plan_path;
  std::string algorithm;
  std::string optimizer;
  int64_t budget_bytes = 0;
  StepMeasure measured;   ///< under the plan
  StepMeasure baseline;   ///< no checkpointing
  int64_t predicted_peak_bytes = 0;
  double predicted_time_ms = 0;
  double predicted_overhead_pct = 0;
  double measured_overhead_pct = 0;
  double max_abs_grad_diff = 0;
  double max_rel_grad_diff = 0;
  double peak_error_pct = 0;  ///< (predicted - measured) / measured
  std::string verdict;        ///< ok, over_budget, grads_differ, prediction_off
  int steps = 0;
  bool operator==(const RunReport& o) const;
};

/// Largest relative gradient difference that still counts as equal.
inline constexpr double kGradientTolerance = 1e-6;
/// Largest |peak_error_pct| of a prediction that counts as right.
inline constexpr double kPeakTolerancePct = 5.0;

/// The predicted peak's error against the measured one, in percent of the
/// measured peak (positive: predicted above); 0 when nothing was measured.
double PeakErrorPct(int64_t predicted_peak_bytes, int64_t measured_peak_bytes);

/// The verdict rule: `over_budget` when the measured peak exceeds the
/// budget, else `grads_differ` when the gradients' max relative difference
/// is above kGradientTolerance, else `prediction_off` when the predicted
/// peak is off by more than kPeakTolerancePct, else `ok`.
std::string RunVerdict(int64_t measured_peak_bytes, int64_t budget_bytes, double max_rel_grad_diff,
                       double peak_error_pct);

/// The `ckplan.run/1` document.
nlohmann::json RunReportToJson(const RunReport& report);

/// Reads a `ckplan.run/1` document. Required: schema, algorithm,
/// budget_bytes, measured.peak_bytes, measured.step_ms, baseline.step_ms,
/// predicted.peak_bytes, predicted.time_ms, verdict; every other field is
/// read, and checked, when present. Throws BadInput naming `file` and the field.
RunReport RunReportFromJson(const nlohmann::json& doc, const std::string& file);

}  // namespace ckplan
