// `ckplan solve` as one planner call (solve.h) and the strategy table both
// `solve` and `report` show (strategies.h), on the example profile.

#include <string>
#include <vector>

#include <doctest/doctest.h>

#include "planner/base/error.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/solve.h"
#include "planner/plan/strategies.h"

using namespace ckplan;

namespace {

PlannerInput Example() {
  return LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
}

std::vector<std::string> Names(const std::vector<StrategyPoint>& rows) {
  std::vector<std::string> names;
  for (const StrategyPoint& row : rows) names.push_back(row.name);
  return names;
}

// The smallest budget of `target`, and one halfway to no checkpointing.
std::pair<int64_t, int64_t> Budgets(const PlannerInput& in, const std::string& target) {
  SolveRequest loose;
  loose.plan.budget = ParseBytes("1TB");
  loose.target = target;
  const SolveResult roomy = Solve(in, loose);
  const int64_t none = roomy.strategies.front().peak_bytes;
  return {roomy.plan.min_budget_bytes, (roomy.plan.min_budget_bytes + none) / 2};
}

}  // namespace

TEST_CASE("Solve: the plan of each target, its table and its document") {
  const PlannerInput in = Example();
  for (const std::string target : {"pytorch", "sac", "schedule"}) {
    CAPTURE(target);
    SolveRequest request;
    request.target = target;
    request.plan.budget.bytes = Budgets(in, target).second;
    request.plan.sweep = true;
    const SolveResult solved = Solve(in, request);
    CHECK(solved.plan.feasible);
    CHECK(solved.plan.target == (target == "sac" && solved.modules.selective.empty() ? "pytorch" : target));
    CHECK(solved.plan.peak_bytes <= request.plan.budget.bytes);
    const std::vector<std::string> names = Names(solved.strategies);
    REQUIRE(names.size() >= 4);
    CHECK(names[0] == "none");
    CHECK(names[1] == "every");
    CHECK(names[2].rfind("sqrt (n=", 0) == 0);
    CHECK(names[3] == (target == "schedule" ? "optimal" : "optimal (" + target + ")"));
    // The plan's row is the plan, and it fits.
    CHECK(solved.strategies[3].peak_bytes == solved.plan.peak_bytes);
    CHECK(solved.strategies[3].fits);
    if (target != "schedule") CHECK(names.back() == "optimal (schedule)");
    if (target == "sac") CHECK(names[4] == "optimal (pytorch)");
    CHECK(solved.document.strategies == solved.strategies);
    CHECK(solved.document.target == solved.plan.target);
    REQUIRE(solved.sweep);
    if (target != "schedule") continue;  // the curve is the nested schedule's
    REQUIRE(solved.sweep->points.size() > 13);
    const std::vector<SweepPoint> digest = SweepDigest(*solved.sweep);
    REQUIRE(!digest.empty());
    CHECK(digest.size() <= 13);
    CHECK(digest.back().budget_bytes == solved.sweep->points.back().budget_bytes);
  }
}

TEST_CASE("Solve: a budget below the minimum names the minimum, a budget below the fixed part says so") {
  const PlannerInput in = Example();
  SolveRequest request;
  request.plan.budget = ParseBytes(std::to_string(Budgets(in, "pytorch").first - 1));
  try {
    Solve(in, request);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kInfeasible);
    CHECK(std::string(e.what()).find("is below the minimum " + std::to_string(Budgets(in, "pytorch").first)) !=
          std::string::npos);
  }
  request.plan.budget = ParseBytes("1000");
  try {
    Solve(in, request);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kInfeasible);
    CHECK(std::string(e.what()).find("below the fixed part of the step") != std::string::npos);
  }
  request.target = "nested";
  try {
    Solve(in, request);
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kBadInput);
  }
}

TEST_CASE("StrategyTable: the report's rows (every-N baselines, the sac comparisons beside a pytorch plan)") {
  const PlannerInput in = Example();
  const TargetModules modules = ModulesForTarget(in, "pytorch", /*with_selective=*/true);
  REQUIRE(!modules.plain.empty());
  REQUIRE(modules.selective.size() == modules.plain.size());
  PlanRequest request;
  request.budget.bytes = Budgets(in, "pytorch").second;
  request.pytorch_modules = &modules.plain;
  const Plan chosen = MakePlan(in.chain, in.fixed, request);
  REQUIRE(chosen.feasible);
  const std::vector<StrategyPoint> rows = StrategyTable(in, modules, request, chosen, "optimal", {2, 4, 1000});
  const std::vector<std::string> names = Names(rows);
  REQUIRE(names.size() >= 7);
  CHECK(names[2] == "every-2");
  CHECK(names[3] == "every-4");  // 1000 is longer than the chain: no row
  CHECK(names[4].rfind("sqrt (n=", 0) == 0);
  CHECK(names[5] == "optimal");
  CHECK(names[6] == "optimal (sac)");
  CHECK(names.back() == "optimal (schedule)");
  for (const StrategyPoint& row : rows) CHECK(row.fits == (row.peak_bytes <= request.budget.bytes));
  // A chain has the schedule target only: no module rows.
  PlannerInput chain = in;
  chain.from_profile = false;
  const TargetModules none = ModulesForTarget(chain, "schedule", true);
  CHECK(none.plain.empty());
  CHECK(none.selective.empty());
}

TEST_CASE("StrategyTable: a sac plan's table shows no plan that cannot fit (no row of peak 0)") {
  const PlannerInput in = Example();
  const auto [sac_min, halfway] = Budgets(in, "sac");
  const int64_t pytorch_min = Budgets(in, "pytorch").first;
  int without_whole_modules = 0;
  for (int64_t budget : {sac_min, (sac_min + pytorch_min) / 2, pytorch_min, halfway}) {
    CAPTURE(budget);
    SolveRequest request;
    request.plan.budget = ParseBytes(std::to_string(budget));
    request.target = "sac";
    const SolveResult solved = Solve(in, request);
    REQUIRE(solved.plan.feasible);
    bool whole_modules = false;
    for (const StrategyPoint& row : solved.strategies) {
      CAPTURE(row.name);
      CHECK(row.peak_bytes > 0);
      whole_modules = whole_modules || row.name == "optimal (pytorch)";
    }
    // Wrapping whole modules is shown exactly where it fits.
    CHECK(whole_modules == (budget >= pytorch_min));
    without_whole_modules += whole_modules ? 0 : 1;
  }
  if (sac_min < pytorch_min) CHECK(without_whole_modules > 0);
}
