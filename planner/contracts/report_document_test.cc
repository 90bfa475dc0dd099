// The report contract: what `ckplan report -o report.json` writes, read back the same.

#include "planner/contracts/report_document.h"

#include <doctest/doctest.h>

#include <functional>

#include "tests/test_errors.h"
#include "planner/base/error.h"
#include "planner/plan/planner_input.h"
#include "planner/contracts/run_report.h"

using namespace ckplan;

namespace {

// A report of the bundled profile's strategies at the midpoint budget, with
// a run and a per-rank table, made from real plans.
ReportDocument ExampleReport() {
  PlannerInput in = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
  PlanRequest request;
  request.algorithm = Algorithm::kNone;
  request.budget.bytes = int64_t{1} << 50;
  const Plan none = MakePlan(in.chain, in.fixed, request);
  request.algorithm = Algorithm::kOptimal;
  request.budget.bytes = none.peak_bytes;
  request.slots = 200;
  request.sweep = true;
  const Plan top = MakePlan(in.chain, in.fixed, request);
  ReportDocument r;
  r.source = "data/example.profile.json";
  r.budget_bytes = (top.min_budget_bytes + none.peak_bytes) / 2;
  r.fixed_bytes = in.fixed.total();
  r.no_recompute_ms = none.no_recompute_ms;
  request.sweep = false;
  request.budget.bytes = r.budget_bytes;
  const Plan optimal = MakePlan(in.chain, in.fixed, request);
  for (const auto& [name, plan] : {std::pair<std::string, const Plan&>{"none", none}, {"optimal", optimal}}) {
    r.strategies.push_back({name, plan.peak_bytes, plan.time_ms, plan.overhead_pct(), plan.peak_bytes <= r.budget_bytes});
  }
  r.optimal_curve = top.curve;
  r.runs.push_back({"run.json", "optimal", optimal.peak_bytes - 1000, optimal.time_ms * 1.1, optimal.peak_bytes,
                    optimal.time_ms, RunVerdict(optimal.peak_bytes - 1000, r.budget_bytes, 0, 0)});
  RankMemoryRow row;
  row.label = "stage 0";
  row.param_bytes = in.fixed.param_bytes;
  row.activation_budget_bytes = -5;  // a stage over its budget's fixed part: negative, written as is
  row.in_flight = 2;
  row.stored_bytes = 4096;
  row.peak_bytes = optimal.peak_bytes;
  r.distributed = DistributedSummary{"1 pipeline stages, 1f1b, 2 microbatches", {row}};
  return r;
}

}  // namespace

TEST_CASE("reports round-trip through ckplan.report/1") {
  const ReportDocument r = ExampleReport();
  REQUIRE(r.optimal_curve.size() > 10);
  REQUIRE(r.strategies[0].fits != r.strategies[1].fits);  // none does not fit the midpoint; optimal does
  const nlohmann::json doc = ReportToJson(r);
  CHECK(doc["schema"] == "ckplan.report/1");
  CHECK(ReportFromJson(doc, "report.json") == r);
  const nlohmann::json parsed = nlohmann::json::parse(doc.dump(2));
  CHECK(ReportToJson(ReportFromJson(parsed, "report.json")).dump(2) == doc.dump(2));
  // Without the per-rank table the field is absent, and read back so.
  ReportDocument plain = r;
  plain.distributed.reset();
  CHECK(!ReportToJson(plain).contains("distributed"));
  CHECK(ReportFromJson(ReportToJson(plain), "report.json") == plain);
}

TEST_CASE("the report reader names the field it refuses") {
  const nlohmann::json good = ReportToJson(ExampleReport());
  auto message = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(good, mutate, [](const nlohmann::json& doc) { ReportFromJson(doc, "bad.json"); });
  };
  CHECK(message([](nlohmann::json&) {}) == "(no error)");
  CHECK(message([](nlohmann::json& d) { d["schema"] = "ckplan.sweep/1"; }).find("ckplan.report/1") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["strategies"][1]["fits"] = 1; }).find("strategies[1].fits") != std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["optimal_curve"][0].erase("time_ms"); }).find("optimal_curve[0].time_ms") !=
        std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["runs"][0]["measured_peak_bytes"] = -1; }).find("runs[0].measured_peak_bytes") !=
        std::string::npos);
  CHECK(message([](nlohmann::json& d) { d["distributed"]["ranks"][0]["in_flight"] = 0; })
            .find("distributed.ranks[0].in_flight") != std::string::npos);
}
