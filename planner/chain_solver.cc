#include "ckplan/planner/chain_solver.h"

#include <functional>

#include "ckplan/planner/baselines.h"
#include "ckplan/planner/plan.h"
#include "ckplan/planner/simulator.h"

namespace ckplan {
namespace {

// A strategy with one schedule per chain length: feasible when it fits.
class FixedSolver : public ChainSolver {
 public:
  FixedSolver(std::string name, std::function<Schedule(int)> make) : name_(std::move(name)), make_(std::move(make)) {}
  std::string Name() const override { return name_; }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    ChainSolution out;
    out.schedule = make_(chain.length());
    const SimulationResult simulation = Simulate(chain, out.schedule);
    out.time_ms = simulation.time_ms;
    out.peak_bytes = simulation.peak_bytes;
    out.feasible = simulation.peak_bytes <= budget_bytes;
    if (!out.feasible) out.schedule.clear();
    return out;
  }

 private:
  std::string name_;
  std::function<Schedule(int)> make_;
};

class Optimal : public ChainSolver {
 public:
  Optimal(int slots, int threads) : slots_(slots), threads_(threads) {}
  std::string Name() const override { return "optimal"; }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    PlanRequest request;
    request.budget_bytes = budget_bytes;
    request.slots = slots_;
    request.threads = threads_;
    const Plan plan = MakePlan(chain, FixedMemory{}, request);
    ChainSolution out;
    out.feasible = plan.feasible;
    if (!plan.feasible) return out;
    out.schedule = plan.schedule;
    out.time_ms = plan.time_ms;
    out.peak_bytes = plan.simulation.peak_bytes;
    return out;
  }

 private:
  int slots_, threads_;
};

class Modules : public ChainSolver {
 public:
  explicit Modules(const std::vector<WrappableModule>& modules) : modules_(modules) {}
  std::string Name() const override { return "modules"; }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    const ModuleSolution solution = SolveModules(chain, modules_, budget_bytes, ModuleAccounting::kPyTorch);
    ChainSolution out;
    out.feasible = solution.feasible;
    if (!solution.feasible) return out;
    out.schedule = solution.schedule;
    out.time_ms = solution.time_ms;
    out.peak_bytes = solution.peak_bytes;
    return out;
  }

 private:
  const std::vector<WrappableModule>& modules_;
};

}  // namespace

std::unique_ptr<ChainSolver> NoCheckpointSolver() {
  return std::make_unique<FixedSolver>("none", [](int length) { return NoCheckpointSchedule(length); });
}

std::unique_ptr<ChainSolver> EveryNSolver(int n) {
  return std::make_unique<FixedSolver>(n == 1 ? std::string("every") : "every-" + std::to_string(n),
                                       [n](int length) { return EveryNSchedule(length, n); });
}

std::unique_ptr<ChainSolver> SqrtSolver() {
  return std::make_unique<FixedSolver>("sqrt", [](int length) { return SqrtSchedule(length); });
}

std::unique_ptr<ChainSolver> OptimalSolver(int slots, int threads) { return std::make_unique<Optimal>(slots, threads); }

std::unique_ptr<ChainSolver> ModulesSolver(const std::vector<WrappableModule>& modules) {
  return std::make_unique<Modules>(modules);
}

std::vector<std::unique_ptr<ChainSolver>> BaselineSolvers(int length) {
  std::vector<std::unique_ptr<ChainSolver>> solvers;
  solvers.push_back(NoCheckpointSolver());
  solvers.push_back(SqrtSolver());
  for (int n : {1, 2, 4, 8}) {
    if (n <= length) solvers.push_back(EveryNSolver(n));
  }
  return solvers;
}

}  // namespace ckplan
