// The run contract and the verdict rule (torch-free: `ckplan run` measures,
// these decide and write).

#include "planner/contracts/run_report.h"

#include <doctest/doctest.h>

#include <cmath>

#include "tests/test_errors.h"
#include "planner/base/error.h"

using namespace ckplan;

TEST_CASE("the verdict: over budget first, then gradients, then the prediction") {
  // Measured 1000 B against a budget of 999: over, whatever else is wrong.
  CHECK(RunVerdict(1000, 999, 2.0, 50.0) == "over_budget");
  CHECK(RunVerdict(1000, 1000, 2.0, 50.0) == "grads_differ");
  // A tolerance ratio of 1 is within tolerance; above it, or NaN, is not.
  CHECK(RunVerdict(1000, 1000, 1.0, 50.0) == "prediction_off");
  CHECK(RunVerdict(1000, 1000, std::nextafter(1.0, 2.0), 0.0) == "grads_differ");
  CHECK(RunVerdict(1000, 1000, std::nan(""), 0.0) == "grads_differ");
  // Within 5% either way is right; just beyond is not.
  CHECK(RunVerdict(1000, 1000, 0.0, kPeakTolerancePct) == "ok");
  CHECK(RunVerdict(1000, 1000, 0.0, -kPeakTolerancePct) == "ok");
  CHECK(RunVerdict(1000, 1000, 0.0, std::nextafter(kPeakTolerancePct, 10.0)) == "prediction_off");
  CHECK(RunVerdict(1000, 1000, 0.0, -5.5) == "prediction_off");
  CHECK(RunVerdict(0, 1000, 0.0, 0.0) == "ok");
}

TEST_CASE("the peak error is in percent of the measured peak") {
  CHECK(PeakErrorPct(1050, 1000) == doctest::Approx(5.0));
  CHECK(PeakErrorPct(950, 1000) == doctest::Approx(-5.0));
  CHECK(PeakErrorPct(123, 0) == 0.0);
  // 1051 predicted against 1000 measured is off, and the verdict says so.
  CHECK(RunVerdict(1000, 2000, 0.0, PeakErrorPct(1051, 1000)) == "prediction_off");
  CHECK(RunVerdict(1000, 2000, 0.0, PeakErrorPct(1049, 1000)) == "ok");
}

TEST_CASE("every failed check is listed, the verdict's first: over budget does not hide the gradients") {
  using Checks = std::vector<std::string>;
  CHECK(FailedRunChecks(1000, 999, 2.0, 50.0) == Checks{"over_budget", "grads_differ", "prediction_off"});
  CHECK(FailedRunChecks(1000, 999, 2.0, 0.0) == Checks{"over_budget", "grads_differ"});
  CHECK(FailedRunChecks(1000, 1000, 0.5, 50.0) == Checks{"prediction_off"});
  CHECK(FailedRunChecks(1000, 1000, 0.5, 0.0).empty());
}

TEST_CASE("gradient tolerances are torch.testing.assert_close's defaults per dtype") {
  CHECK(DefaultGradientTolerance("Float").rtol == 1.3e-6);
  CHECK(DefaultGradientTolerance("Float").atol == 1e-5);
  CHECK(DefaultGradientTolerance("Double").rtol == 1e-7);
  CHECK(DefaultGradientTolerance("Double").atol == 1e-7);
  CHECK(DefaultGradientTolerance("BFloat16").rtol == 1.6e-2);
  CHECK(DefaultGradientTolerance("Half").rtol == 1e-3);
  CHECK(DefaultGradientTolerance("Half").atol == 1e-5);
  // The absolute tolerance scales with the model's largest gradient, never below atol.
  CHECK(ScaledGradientAtol(1e-5, 0.25) == 1e-5);
  CHECK(ScaledGradientAtol(1e-5, 300.0) == doctest::Approx(3e-3));
}

TEST_CASE("an analytically zero gradient's rounding noise beside gradients of 1 is equal; a real difference is not") {
  const GradientTolerance float32 = DefaultGradientTolerance("Float");
  // The plain step's gradients: a weight's of about 1, and a bias whose
  // gradient is analytically zero, rounded to noise of ~4e-11 both times
  // (judged against its own largest element: a difference of 175%).
  const std::vector<double> weight = {1.0, -0.75, 0.5, 1.25};
  const std::vector<double> zero_plain = {4e-11, -1e-11}, zero_plan = {-3e-11, 2e-11};
  const double max_abs_gradient = 1.25;
  std::vector<double> weight_plan = weight;
  weight_plan[1] += 1e-7;  // float32 rounding: within rtol
  GradientCheck check;
  check.Add(CompareGradient("encoder.fc.weight", weight_plan, weight, float32, max_abs_gradient));
  check.Add(CompareGradient("encoder.fc.bias", zero_plan, zero_plain, float32, max_abs_gradient));
  CHECK(check.close());
  CHECK(check.max_abs_diff == doctest::Approx(1e-7));
  CHECK(check.worst.tolerance_ratio < 1e-2);
  CHECK(RunVerdict(1000, 1000, check.worst.tolerance_ratio, 0.0) == "ok");

  // A real difference in one parameter: named, with its difference.
  std::vector<double> head_plain = {0.5, 0.5}, head_plan = {0.5, 0.52};
  check.Add(CompareGradient("head.weight", head_plan, head_plain, float32, max_abs_gradient));
  CHECK(!check.close());
  CHECK(check.worst.parameter == "head.weight");
  CHECK(check.worst.max_abs_diff == doctest::Approx(0.02));
  CHECK(check.worst.tolerance_ratio > 1000);
  CHECK(check.max_abs_diff == doctest::Approx(0.02));
  CHECK(RunVerdict(1000, 1000, check.worst.tolerance_ratio, 0.0) == "grads_differ");
  // Over budget as well: both listed.
  CHECK(FailedRunChecks(1001, 1000, check.worst.tolerance_ratio, 0.0) ==
        std::vector<std::string>{"over_budget", "grads_differ"});

  // A NaN is never equal, and is the worst; a gradient in one step only differs.
  GradientCheck nan;
  nan.Add(CompareGradient("a", {1.0}, {2.0}, float32, 1.0));
  nan.Add(CompareGradient("b", {std::nan("")}, {1.0}, float32, 1.0));
  CHECK(nan.worst.parameter == "b");
  CHECK(!nan.close());
  CHECK(!(CompareGradient("c", {}, {1.0}, float32, 1.0).tolerance_ratio <= 1));
  // Equal infinities are equal, as in torch.
  CHECK(CompareGradient("d", {INFINITY}, {INFINITY}, float32, 1.0).tolerance_ratio == 0.0);
}

namespace {

RunReport Example() {
  RunReport r;
  r.model_path = "data/example.pt";
  r.plan_path = "plan.json";
  r.algorithm = "optimal";
  r.optimizer = "adam";
  r.budget_bytes = 9000000;
  r.measured = {8500000, 7000000, 12.5};
  r.baseline = {11000000, 9500000, 10.0};
  r.predicted_peak_bytes = 8600000;
  r.predicted_time_ms = 12.25;
  r.predicted_overhead_pct = 22.5;
  r.measured_overhead_pct = 25.0;
  r.max_abs_grad_diff = 0;
  r.max_rel_grad_diff = 0;
  r.peak_error_pct = PeakErrorPct(r.predicted_peak_bytes, r.measured.peak_bytes);
  r.worst_grad_parameter = "fc.weight";
  r.worst_grad_abs_diff = 0;
  r.grad_tolerance_ratio = 0;
  r.verdict = RunVerdict(r.measured.peak_bytes, r.budget_bytes, r.grad_tolerance_ratio, r.peak_error_pct);
  r.steps = 3;
  return r;
}

}  // namespace

TEST_CASE("run reports round-trip through ckplan.run/1") {
  const RunReport r = Example();
  CHECK(r.verdict == "ok");
  const nlohmann::json doc = RunReportToJson(r);
  CHECK(doc["schema"] == "ckplan.run/1");
  CHECK(RunReportFromJson(doc, "run.json") == r);
  CHECK(RunReportToJson(RunReportFromJson(doc, "run.json")) == doc);
  // Through text too, as report --runs reads it.
  const nlohmann::json parsed = nlohmann::json::parse(doc.dump(2));
  CHECK(RunReportToJson(RunReportFromJson(parsed, "run.json")).dump(2) == doc.dump(2));
}

TEST_CASE("the run reader needs what the report draws and names what it refuses") {
  const nlohmann::json good = RunReportToJson(Example());
  auto message = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(good, mutate, [](const nlohmann::json& doc) { RunReportFromJson(doc, "bad.json"); });
  };
  CHECK(message([](nlohmann::json& d) { d["schema"] = "ckplan.plan/1"; }).find("ckplan.run/1") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["measured"].erase("step_ms"); }).find("measured.step_ms") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["budget_bytes"] = -3; }).find("bad.json") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["steps"] = "three"; }).find("steps") != std::string::npos);
  // Optional fields may be missing; a gradient difference of NaN is written as null.
  CHECK(message([](nlohmann::json& d) { d.erase("model"); d.erase("peak_error_pct"); }) == "(no error)");
  nlohmann::json nan = good;
  nan["max_rel_grad_diff"] = nullptr;
  CHECK(std::isnan(RunReportFromJson(nan, "nan.json").max_rel_grad_diff));
  // The failed checks: known names, the verdict first.
  CHECK(message([](nlohmann::json& d) { d["failed_checks"] = {"too_slow"}; }).find("failed_checks[0]") !=
        std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["failed_checks"] = {"grads_differ"}; }).find("verdict") !=
        std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["worst_grad"].erase("parameter"); }).find("worst_grad.parameter") !=
        std::string::npos);
}

TEST_CASE("a run file from before failed_checks and worst_grad reads, its verdict the one failed check") {
  nlohmann::json old = RunReportToJson(Example());
  old.erase("failed_checks");
  old.erase("worst_grad");
  CHECK(RunReportFromJson(old, "old.json").failed_checks.empty());
  CHECK(RunReportFromJson(old, "old.json").worst_grad_parameter.empty());
  old["verdict"] = "over_budget";
  CHECK(RunReportFromJson(old, "old.json").failed_checks == std::vector<std::string>{"over_budget"});
  // Written in full, both round-trip.
  RunReport both = Example();
  both.measured.peak_bytes = both.budget_bytes + 1;
  both.worst_grad_abs_diff = 0.02;
  both.grad_tolerance_ratio = 1500;
  both.failed_checks = FailedRunChecks(both.measured.peak_bytes, both.budget_bytes, both.grad_tolerance_ratio, 0);
  both.verdict = both.failed_checks.front();
  const nlohmann::json doc = RunReportToJson(both);
  CHECK(doc["failed_checks"] == nlohmann::json{"over_budget", "grads_differ"});
  CHECK(doc["worst_grad"]["parameter"] == "fc.weight");
  CHECK(RunReportFromJson(nlohmann::json::parse(doc.dump()), "run.json") == both);
}
