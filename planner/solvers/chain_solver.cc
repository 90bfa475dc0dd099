#include "planner/solvers/chain_solver.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "planner/solvers/budget_search.h"
#include "planner/solvers/baselines.h"
#include "planner/base/error.h"
#include "planner/cost/simulator.h"
#include "planner/solvers/recurrence.h"

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
    out.min_budget_bytes = out.solver.min_budget_lower_bytes = out.peak_bytes;
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
  explicit Optimal(OptimalOptions options) : options_(std::move(options)) {}
  std::string Name() const override { return "optimal"; }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    ChainSolution out;
    CheckStageCount(chain);
    const int slots = options_.slots;
    SlotGrid grid = GridFor(budget_bytes, slots);
    out.memory_slots = slots;
    out.slot_bytes = grid.slot_bytes;
    DiscreteChain discrete = Discretize(chain, std::max<int64_t>(grid.slot_bytes, 1));
    // Refuse a table that cannot fit before any other work (throws BadInput).
    if (grid.memory_slots >= 0) CheckSolverFits(discrete, grid.memory_slots);
    out.min_budget_bytes = MinimumOptimalChainBudget(chain, slots);
    out.solver.min_budget_lower_bytes = out.min_budget_bytes;
    if (ChooseSolver(chain.length(), slots) == SolverMethod::kBanded) {
      // Sizes in bytes: rounding to slots only adds.
      out.solver.min_budget_lower_bytes = std::min(out.min_budget_bytes, MinimumMemoryLowerBound(Discretize(chain, 1)));
    }
    if (grid.memory_slots < 0) return out;
    SolverOptions solver_options;
    solver_options.threads = options_.threads;
    solver_options.progress = options_.progress;
    OptimalSolution solution = SolveChain(discrete, grid.memory_slots, solver_options);
    RefineSlots(chain, budget_bytes, slots, options_.threads, &grid, &solution);
    out.memory_slots = static_cast<int>(grid.memory_slots);
    out.slot_bytes = grid.slot_bytes;
    out.solver.method = solution.band > 0 ? "banded" : "exact";
    out.solver.band = solution.band;
    out.solver.proven_optimal = solution.proven_optimal;
    out.solver.lower_bound_ms = solution.lower_bound_ms;
    if (options_.curve) {
      for (size_t m = 0; m < solution.curve_ms.size(); ++m) {
        if (solution.curve_ms[m] < kInfinity) {
          out.curve.push_back({static_cast<int64_t>(m) * grid.slot_bytes, solution.curve_ms[m]});
        }
      }
    }
    // A baseline that fits and is faster (or fits where the rounded sizes do
    // not) is the plan: the solver's figures would not be optimal.
    std::optional<ChainSolution> baseline = FastestFitting(chain, budget_bytes);
    const bool take_baseline = baseline && (!solution.feasible || baseline->time_ms < solution.time_ms * (1 - 1e-12));
    if (!solution.feasible && !take_baseline) return out;
    out.feasible = true;
    if (take_baseline) {
      out.schedule = std::move(baseline->schedule);
      out.time_ms = baseline->time_ms;
      if (out.solver.band > 0) out.solver.proven_optimal = solution.lower_bound_ms >= out.time_ms * (1 - 1e-12);
    } else {
      out.schedule = std::move(solution.schedule);
      out.time_ms = solution.time_ms;
    }
    const SimulationResult simulation = Simulate(chain, out.schedule);
    out.peak_bytes = simulation.peak_bytes;
    if (simulation.peak_bytes > budget_bytes) {
      throw Error(ExitCode::kVerifyFailed, "internal check failed: the optimal schedule simulates to " +
                                               std::to_string(simulation.peak_bytes) +
                                               " B, above the activation budget " + std::to_string(budget_bytes) + " B");
    }
    const double tolerance = 1e-9 * std::max(1.0, std::fabs(out.time_ms));
    if (std::fabs(simulation.time_ms - out.time_ms) > tolerance) {
      throw Error(ExitCode::kVerifyFailed, "internal check failed: simulated time differs from the solver's");
    }
    return out;
  }

 private:
  OptimalOptions options_;
};

// A feasible module solution as the one signature gives it.
void AddModules(const ModuleSolution& solution, ChainSolution* out) {
  out->feasible = true;
  out->schedule = solution.schedule;
  out->time_ms = solution.time_ms;
  out->peak_bytes = solution.peak_bytes;
  out->wrapped = solution.wrapped;
  out->held_at_loss_bytes = solution.kept_bytes;
}

// Whether a baseline the strategy table prices (wrapping every n-th
// stage's modules: none, every, every-2, -4, -8, sqrt) fits `budget_bytes`
// and is faster than `time_ms` (defined after ModuleBaseline).
bool BaselineFaster(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget_bytes,
                    double time_ms);

// The PyTorch target: exact in bytes, no slots. One memory model: the
// gradients the chain carries appear during backward.
class Modules : public ChainSolver {
 public:
  explicit Modules(const std::vector<WrappableModule>& modules) : modules_(modules) {}
  std::string Name() const override { return "modules"; }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    CheckStageCount(chain);
    ChainSolution out;
    out.solver.method = "modules";
    out.module_target = true;
    out.min_budget_bytes = out.solver.min_budget_lower_bytes =
        MinimumModulesMemory(chain, modules_, ModuleAccounting::kPyTorch);
    if (budget_bytes <= 0) return out;
    ModuleSolution solution = SolveModules(chain, modules_, budget_bytes, ModuleAccounting::kPyTorch);
    if (!solution.feasible) return out;
    // A plan the band chose is never slower than a baseline that fits: the
    // band gives way to the fastest where one is (the optimum beats them all).
    if (solution.tie_ms > 0 && BaselineFaster(chain, modules_, budget_bytes, solution.time_ms)) {
      Chain exact = chain;
      exact.pytorch.time_noise_pct = 0;
      solution = SolveModules(exact, modules_, budget_bytes, ModuleAccounting::kPyTorch);
    }
    if (solution.peak_bytes > budget_bytes) {
      throw Error(ExitCode::kVerifyFailed, "internal check failed: the module plan peaks at " +
                                               std::to_string(solution.peak_bytes) +
                                               " B, above the activation budget " + std::to_string(budget_bytes) + " B");
    }
    AddModules(solution, &out);
    if (chain.pytorch.time_noise_pct > 0 && solution.tie_ms > 0) {
      out.solver.time_noise_pct = chain.pytorch.time_noise_pct;
      out.solver.tie_ms = solution.tie_ms;
      out.solver.tied_plans = solution.tied_plans;
    }
    return out;
  }

 private:
  const std::vector<WrappableModule>& modules_;
};

// A fixed strategy's figures, fitting or not.
ChainSolution FixedModulesSolution(const ModuleSolution& solution, int64_t budget_bytes) {
  ChainSolution out;
  out.module_target = true;
  out.min_budget_bytes = out.solver.min_budget_lower_bytes = solution.peak_bytes;
  if (solution.peak_bytes <= budget_bytes) {
    AddModules(solution, &out);
  } else {
    out.time_ms = solution.time_ms;
    out.peak_bytes = solution.peak_bytes;
  }
  return out;
}

class WrapExactly : public ChainSolver {
 public:
  explicit WrapExactly(const std::vector<WrappableModule>& wrapped) : wrapped_(wrapped) {}
  std::string Name() const override { return "wrap"; }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    return FixedModulesSolution(EvaluateModules(chain, wrapped_, ModuleAccounting::kPyTorch), budget_bytes);
  }

 private:
  const std::vector<WrappableModule>& wrapped_;
};

class ModuleBaseline : public ChainSolver {
 public:
  ModuleBaseline(const std::vector<WrappableModule>& modules, int n) : modules_(modules), n_(n) {}
  std::string Name() const override { return n_ == 0 ? "none" : n_ == 1 ? "every" : "every-" + std::to_string(n_); }
  ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const override {
    const int length = chain.length();
    std::vector<WrappableModule> wrapped;
    for (int begin = 0; n_ > 0 && begin < length; begin += n_) {
      const int end = std::min(length, begin + n_) - 1;
      auto whole = std::find_if(modules_.begin(), modules_.end(),
                                [&](const WrappableModule& m) { return m.first_stage == begin && m.last_stage == end; });
      if (whole != modules_.end()) {
        wrapped.push_back(*whole);
        continue;
      }
      for (int k = begin; k <= end; ++k) {
        auto single = std::find_if(modules_.begin(), modules_.end(),
                                   [&](const WrappableModule& m) { return m.first_stage == k && m.last_stage == k; });
        if (single != modules_.end()) wrapped.push_back(*single);
      }
    }
    return FixedModulesSolution(EvaluateModules(chain, wrapped, ModuleAccounting::kPyTorch), budget_bytes);
  }

 private:
  const std::vector<WrappableModule>& modules_;
  int n_;
};

bool BaselineFaster(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget_bytes,
                    double time_ms) {
  for (int n : {0, 1, 2, 4, 8, SqrtSegmentLength(chain.length())}) {
    const ChainSolution baseline = ModuleBaseline(modules, n).Solve(chain, budget_bytes);
    if (baseline.feasible && baseline.time_ms < time_ms * (1 - 1e-12)) return true;
  }
  return false;
}

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

std::unique_ptr<ChainSolver> OptimalSolver(const OptimalOptions& options) { return std::make_unique<Optimal>(options); }

std::unique_ptr<ChainSolver> OptimalSolver(int slots, int threads) {
  OptimalOptions options;
  options.slots = slots;
  options.threads = threads;
  return OptimalSolver(options);
}

std::unique_ptr<ChainSolver> ModulesSolver(const std::vector<WrappableModule>& modules) {
  return std::make_unique<Modules>(modules);
}

std::unique_ptr<ChainSolver> WrapExactlySolver(const std::vector<WrappableModule>& wrapped) {
  return std::make_unique<WrapExactly>(wrapped);
}

std::unique_ptr<ChainSolver> ModuleBaselineSolver(const std::vector<WrappableModule>& modules, int n) {
  return std::make_unique<ModuleBaseline>(modules, n);
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
