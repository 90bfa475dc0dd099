// Every strategy through the one solver signature: each schedule it returns
// fits the budget by the simulator (or, for the PyTorch target, by its own
// accounting), and the optimum is never slower than a strategy that fits.

#include "ckplan/planner/chain_solver.h"

#include <doctest/doctest.h>

#include "../tests/test_chains.h"
#include "ckplan/planner/baselines.h"
#include "ckplan/planner/input.h"
#include "ckplan/planner/simulator.h"
#include "ckplan/planner/solver.h"

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
