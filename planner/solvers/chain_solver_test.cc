// Every strategy through the one solver signature: each schedule it returns
// fits the budget by the simulator (or, for the PyTorch target, by its own
// accounting), and the optimum is never slower than a strategy that fits.

#include "planner/solvers/chain_solver.h"

#include <doctest/doctest.h>

#include "tests/test_chains.h"
#include "planner/solvers/baselines.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/plan.h"
#include "planner/cost/simulator.h"
#include "planner/solvers/recurrence.h"

using namespace ckplan;

TEST_CASE("baselines, the optimum and the modules target share one signature") {
  PlannerInput in = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
  const Chain& chain = in.chain;
  const std::vector<WrappableModule> modules = WrappableModules(chain, &in.profile);
  REQUIRE(!modules.empty());
  std::vector<std::unique_ptr<ChainSolver>> solvers = BaselineSolvers(chain.length());
  REQUIRE(solvers.size() == 6);  // none, sqrt, every-1, -2, -4, -8: the example has 11 stages
  CHECK(solvers[0]->Name() == "none");
  CHECK(solvers[2]->Name() == "every");
  solvers.push_back(OptimalSolver());
  solvers.push_back(ModulesSolver(modules));
  const int64_t none_peak = Simulate(chain, NoCheckpointSchedule(chain.length())).peak_bytes;
  int feasible_seen = 0, infeasible_seen = 0;
  for (double share : {0.3, 0.5, 0.7, 0.9, 1.1}) {
    const int64_t budget = static_cast<int64_t>(share * static_cast<double>(none_peak));
    CAPTURE(budget);
    double fastest_fitting = kInfinity, optimal_ms = kInfinity;
    for (const auto& solver : solvers) {
      CAPTURE(solver->Name());
      const ChainSolution s = solver->Solve(chain, budget);
      if (!s.feasible) {
        CHECK(s.schedule.empty());
        ++infeasible_seen;
        continue;
      }
      ++feasible_seen;
      CHECK(s.peak_bytes <= budget);
      const SimulationResult sim = Simulate(chain, s.schedule);
      CHECK(sim.time_ms == doctest::Approx(s.time_ms).epsilon(1e-12));
      if (solver->Name() != "modules") {
        CHECK(sim.peak_bytes == s.peak_bytes);  // the simulator's accounting
        fastest_fitting = std::min(fastest_fitting, s.time_ms);
      }
      if (solver->Name() == "optimal") optimal_ms = s.time_ms;
    }
    if (fastest_fitting < kInfinity) CHECK(optimal_ms <= fastest_fitting * (1 + 1e-12));
  }
  CHECK(feasible_seen > 0);
  CHECK(infeasible_seen > 0);
}

TEST_CASE("a fixed strategy is feasible exactly when its simulated peak fits") {
  const Chain chain = testing::RandomChain(9, 11);
  for (int n : {1, 2, 3}) {
    const auto solver = EveryNSolver(n);
    const int64_t peak = Simulate(chain, EveryNSchedule(chain.length(), n)).peak_bytes;
    CHECK(solver->Solve(chain, peak).feasible);
    CHECK(!solver->Solve(chain, peak - 1).feasible);
    CHECK(solver->Solve(chain, peak).schedule == EveryNSchedule(chain.length(), n));
  }
}

TEST_CASE("MakePlan solves through the strategy's ChainSolver, on the budget less the fixed part") {
  PlannerInput in = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
  const Chain& chain = in.chain;
  const int64_t none_peak = in.fixed.total() + Simulate(chain, NoCheckpointSchedule(chain.length())).peak_bytes;
  for (double share : {0.6, 0.8, 1.0}) {
    const int64_t budget = static_cast<int64_t>(share * static_cast<double>(none_peak));
    CAPTURE(budget);
    struct Case {
      Algorithm algorithm;
      int every_n;
      std::unique_ptr<ChainSolver> solver;
    };
    std::vector<Case> cases;
    cases.push_back({Algorithm::kNone, 0, NoCheckpointSolver()});
    cases.push_back({Algorithm::kSqrt, 0, SqrtSolver()});
    cases.push_back({Algorithm::kEveryN, 3, EveryNSolver(3)});
    cases.push_back({Algorithm::kOptimal, 0, OptimalSolver(200)});
    for (const Case& c : cases) {
      CAPTURE(c.solver->Name());
      PlanRequest request;
      request.algorithm = c.algorithm;
      request.every_n = c.every_n;
      request.budget.bytes = budget;
      request.slots = 200;
      const Plan plan = MakePlan(chain, in.fixed, request);
      const ChainSolution s = c.solver->Solve(chain, budget - in.fixed.total());
      CHECK(plan.feasible == s.feasible);
      CHECK(plan.schedule == s.schedule);
      CHECK(plan.min_budget_bytes == in.fixed.total() + s.min_budget_bytes);
      if (s.feasible) {
        CHECK(plan.peak_bytes == in.fixed.total() + s.peak_bytes);
        CHECK(plan.time_ms == s.time_ms + in.fixed.optimizer_step_ms);
      }
    }
  }
}

TEST_CASE("the PyTorch target is never slower than its module baselines that fit") {
  PlannerInput in = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
  const Chain& chain = in.chain;
  const std::vector<WrappableModule> modules = WrappableModules(chain, &in.profile);
  const auto optimum = ModulesSolver(modules);
  const int64_t huge = int64_t{1} << 50;
  int wrapped_seen = 0;
  for (int n : {0, 1, 2, 4}) {
    CAPTURE(n);
    const ChainSolution baseline = ModuleBaselineSolver(modules, n)->Solve(chain, huge);
    REQUIRE(baseline.feasible);
    CHECK(baseline.module_target);
    if (n == 0) CHECK(baseline.wrapped.empty());
    wrapped_seen += static_cast<int>(baseline.wrapped.size());
    // Fits exactly at its own peak, not a byte below.
    CHECK(ModuleBaselineSolver(modules, n)->Solve(chain, baseline.peak_bytes).feasible);
    CHECK(!ModuleBaselineSolver(modules, n)->Solve(chain, baseline.peak_bytes - 1).feasible);
    const ChainSolution best = optimum->Solve(chain, baseline.peak_bytes);
    REQUIRE(best.feasible);
    CHECK(best.peak_bytes <= baseline.peak_bytes);
    CHECK(best.time_ms <= baseline.time_ms * (1 + 1e-12));
  }
  CHECK(wrapped_seen > 0);
}
