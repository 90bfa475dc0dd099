// The run contract and the verdict rule (torch-free: `ckplan run` measures,
// these decide and write).

#include "ckplan/planner/run_report.h"

#include <doctest/doctest.h>

#include <cmath>

#include "../tests/test_errors.h"
#include "ckplan/planner/error.h"

using namespace ckplan;

TEST_CASE("the verdict: over budget first, then gradients, then the prediction") {
  // Measured 1000 B against a budget of 999: over, whatever else is wrong.
  CHECK(RunVerdict(1000, 999, 1.0, 50.0) == "over_budget");
  CHECK(RunVerdict(1000, 1000, 1.0, 50.0) == "grads_differ");
  CHECK(RunVerdict(1000, 1000, kGradientTolerance, 50.0) == "prediction_off");
  CHECK(RunVerdict(1000, 1000, 2 * kGradientTolerance, 0.0) == "grads_differ");
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
  r.verdict = RunVerdict(r.measured.peak_bytes, r.budget_bytes, r.max_rel_grad_diff, r.peak_error_pct);
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
}
