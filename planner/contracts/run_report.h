#pragma once
/// The run contract, `ckplan.run/1`, as one value: what `ckplan run` writes
/// (the executor measures it) and `ckplan report --runs` reads. Torch-free;
/// the verdict rule is here too, so that it is one function with a test.

#include <cstdint>
#include <string>
#include <vector>

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
  double max_abs_grad_diff = 0;  ///< max |plan - plain| over every gradient element
  /// max_abs_grad_diff over the plain step's largest |gradient| (itself
  /// when every gradient is 0).
  double max_rel_grad_diff = 0;
  /// The parameter whose gradient is farthest from its tolerance
  /// (GradientCheck::worst; "": none has a gradient), its max |diff|, and
  /// its tolerance ratio: above 1 (or NaN) the gradients differ.
  std::string worst_grad_parameter;
  double worst_grad_abs_diff = 0;
  double grad_tolerance_ratio = 0;
  double peak_error_pct = 0;  ///< (predicted - measured) / measured
  std::string verdict;        ///< ok, over_budget, grads_differ, prediction_off
  /// Every check the run fails (FailedRunChecks), the verdict first; empty: ok.
  std::vector<std::string> failed_checks;
  int steps = 0;
  bool operator==(const RunReport& o) const;
};

/// Largest |peak_error_pct| of a prediction that counts as right.
inline constexpr double kPeakTolerancePct = 5.0;

/// The predicted peak's error against the measured one, in percent of the
/// measured peak (positive: predicted above); 0 when nothing was measured.
double PeakErrorPct(int64_t predicted_peak_bytes, int64_t measured_peak_bytes);

/// The tolerances torch.testing.assert_close uses by default for a dtype,
/// by its c10 name (as profiles write it): Float rtol 1.3e-6, atol 1e-5;
/// Double 1e-7, 1e-7; BFloat16 1.6e-2, 1e-5; Half 1e-3, 1e-5; a complex
/// type as its real type; any other as Float.
struct GradientTolerance {
  double rtol = 0;
  double atol = 0;
};
GradientTolerance DefaultGradientTolerance(const std::string& dtype);

/// The absolute tolerance of the gradient check: `atol` times max(1, the
/// plain step's largest |gradient| of any parameter). Rounding
/// noise scales with the gradients a value is summed from, not with the
/// value: an analytically zero gradient next to gradients of 1 is noise of
/// ~1e-11 (judged against its own largest element, a difference of 100%),
/// and next to gradients of 1e3 float32 rounds to ~1e-4 (above atol 1e-5).
double ScaledGradientAtol(double atol, double max_abs_gradient);

/// One parameter's gradient under the plan against the plain step's.
struct GradientDiff {
  std::string parameter;
  double max_abs_diff = 0;  ///< over its elements; NaN when either has a NaN
  /// max over its elements of |got - expected| / (atol + rtol * |expected|),
  /// the atol scaled (ScaledGradientAtol): within tolerance while at most 1,
  /// as torch.testing.assert_close judges; NaN for a NaN, infinity for a
  /// gradient in one step only.
  double tolerance_ratio = 0;
};

/// The rule on plain values (the executor runs the same on tensors):
/// `got` and `expected` elementwise, `max_abs_gradient` the plain step's
/// largest |gradient| over every parameter.
GradientDiff CompareGradient(const std::string& parameter, const std::vector<double>& got,
                             const std::vector<double>& expected, GradientTolerance tolerance, double max_abs_gradient);

/// The gradient check over every parameter, one Add each.
struct GradientCheck {
  double max_abs_diff = 0;
  GradientDiff worst;  ///< the largest tolerance ratio (a NaN the largest)
  void Add(const GradientDiff& diff);
  bool close() const { return worst.tolerance_ratio <= 1; }
};

/// The checks a run fails, in the verdict's order: `over_budget` when the
/// measured peak exceeds the budget, `grads_differ` when a gradient is not
/// within tolerance (`grad_tolerance_ratio` above 1, or NaN: GradientCheck),
/// `prediction_off` when the predicted peak is off by more than
/// kPeakTolerancePct.
std::vector<std::string> FailedRunChecks(int64_t measured_peak_bytes, int64_t budget_bytes, double grad_tolerance_ratio,
                                         double peak_error_pct);

/// The verdict: the first of FailedRunChecks, else `ok`.
std::string RunVerdict(int64_t measured_peak_bytes, int64_t budget_bytes, double grad_tolerance_ratio,
                       double peak_error_pct);

/// The `ckplan.run/1` document.
nlohmann::json RunReportToJson(const RunReport& report);

/// Reads a `ckplan.run/1` document. Required: schema, algorithm,
/// budget_bytes, measured.peak_bytes, measured.step_ms, baseline.step_ms,
/// predicted.peak_bytes, predicted.time_ms, verdict; every other field is
/// read, and checked, when present (without `failed_checks`, a file from
/// before it: the verdict alone unless ok). Throws BadInput naming `file`
/// and the field.
RunReport RunReportFromJson(const nlohmann::json& doc, const std::string& file);

}  // namespace ckplan
