// The sweep contract: what `solve --sweep` writes, read back the same.

#include "planner/contracts/sweep_document.h"

#include <doctest/doctest.h>

#include <functional>

#include "tests/test_errors.h"
#include "planner/base/error.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/plan.h"
#include "planner/plan/plan_to_document.h"

using namespace ckplan;

namespace {

// The sweep of the bundled profile's optimal plan at its no-checkpointing peak.
SweepDocument ExampleSweep(Plan* plan_out = nullptr) {
  PlannerInput in = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
  PlanRequest none;
  none.algorithm = Algorithm::kNone;
  none.budget.bytes = int64_t{1} << 50;
  PlanRequest request;
  request.budget.bytes = MakePlan(in.chain, in.fixed, none).peak_bytes;
  request.slots = 200;
  request.sweep = true;
  Plan plan = MakePlan(in.chain, in.fixed, request);
  if (plan_out) *plan_out = plan;
  return MakeSweepDocument(plan, in.source);
}

}  // namespace

TEST_CASE("a sweep holds the plan's curve, each point's overhead by the one formula") {
  Plan plan;
  const SweepDocument sweep = ExampleSweep(&plan);
  REQUIRE(plan.feasible);
  REQUIRE(plan.curve.size() > 10);
  REQUIRE(sweep.points.size() == plan.curve.size());
  CHECK(sweep.fixed_bytes == plan.fixed.total());
  CHECK(sweep.slots == plan.slots);
  for (size_t k = 0; k < plan.curve.size(); ++k) {
    CHECK(sweep.points[k].budget_bytes == plan.curve[k].budget_bytes);
    CHECK(sweep.points[k].time_ms == plan.curve[k].time_ms);
    CHECK(sweep.points[k].overhead_pct == OverheadPct(plan.curve[k].time_ms, plan.no_recompute_ms));
  }
  // More budget is never slower; the curve is the DP's over slots, and the
  // plan at the largest budget is never slower than it (a baseline that fits
  // in bytes, here no checkpointing, can beat the rounded sizes).
  for (size_t k = 1; k < sweep.points.size(); ++k) CHECK(sweep.points[k].time_ms <= sweep.points[k - 1].time_ms);
  CHECK(sweep.points.back().budget_bytes <= plan.budget.bytes);
  CHECK(plan.time_ms <= sweep.points.back().time_ms * (1 + 1e-12));
}

TEST_CASE("sweeps round-trip through ckplan.sweep/1") {
  const SweepDocument sweep = ExampleSweep();
  const nlohmann::json doc = SweepToJson(sweep);
  CHECK(doc["schema"] == "ckplan.sweep/1");
  CHECK(SweepFromJson(doc, "sweep.json") == sweep);
  const nlohmann::json parsed = nlohmann::json::parse(doc.dump(2));
  CHECK(SweepToJson(SweepFromJson(parsed, "sweep.json")).dump(2) == doc.dump(2));
}

TEST_CASE("the sweep reader names the field it refuses") {
  const nlohmann::json good = SweepToJson(ExampleSweep());
  auto message = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(good, mutate, [](const nlohmann::json& doc) { SweepFromJson(doc, "bad.json"); });
  };
  CHECK(message([](nlohmann::json&) {}) == "(no error)");
  CHECK(message([](nlohmann::json& d) { d["schema"] = "ckplan.plan/1"; }).find("ckplan.sweep/1") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["points"][1].erase("time_ms"); }).find("points[1].time_ms") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["slot_bytes"] = -1; }).find("slot_bytes") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["source"] = "x"; }).find("source") != std::string::npos);
}
