#include "ckplan/planner/plan.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "budget_search.h"
#include "ckplan/planner/baselines.h"
#include "ckplan/planner/error.h"
#include "ckplan/planner/param_grads.h"
#include "ckplan/planner/solver.h"
#include "ckplan/planner/units.h"

namespace ckplan {

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kOptimal: return "optimal";
    case Algorithm::kNone: return "none";
    case Algorithm::kEvery: return "every";
    case Algorithm::kEveryN: return "every-n";
    case Algorithm::kSqrt: return "sqrt";
  }
  return "?";
}

Algorithm ParseAlgorithm(const std::string& name) {
  for (Algorithm a : {Algorithm::kOptimal, Algorithm::kNone, Algorithm::kEvery,
                      Algorithm::kEveryN, Algorithm::kSqrt}) {
    if (name == AlgorithmName(a)) return a;
  }
  throw BadInput("unknown algorithm '" + name + "' (use optimal, none, every, every-n or sqrt)");
}

FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer) {
  FixedMemory fixed;
  fixed.param_bytes = param_bytes;
  fixed.buffer_bytes = buffer_bytes;
  fixed.optimizer = optimizer;
  fixed.grad_bytes = param_bytes;
  if (optimizer == "none" || optimizer == "sgd") {
    fixed.optimizer_bytes = 0;
  } else if (optimizer == "momentum") {
    fixed.optimizer_bytes = param_bytes;
  } else if (optimizer == "adam") {
    fixed.optimizer_bytes = 2 * param_bytes;
  } else {
    throw BadInput("unknown optimizer '" + optimizer + "' (use none, sgd, momentum or adam)");
  }
  return fixed;
}

// The gap is the plan's overhead over the proven lower bound: the one formula.
double Plan::gap_bound_pct() const { return proven_optimal ? 0 : OverheadPct(time_ms, lower_bound_ms); }

double OverheadPct(double time_ms, double baseline_ms) {
  if (!(baseline_ms > 0)) return 0;
  const double pct = (time_ms - baseline_ms) / baseline_ms * 100.0;
  return std::fabs(pct) < 1e-9 ? 0.0 : pct;  // the same sum in another order is no overhead
}

double Plan::overhead_pct() const { return OverheadPct(time_ms, no_recompute_ms); }

namespace {

// The PyTorch target: exact in bytes, no slots.
Plan MakeModulePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request, Plan plan) {
  CheckStageCount(chain);
  const std::vector<WrappableModule>& modules = *request.pytorch_modules;
  // One memory model: the gradients the chain carries appear during backward
  // (those in the fixed part are held for the whole step).
  const StageGradients grads = StageGradientsOf(chain);
  const int64_t fixed_bytes = fixed.total();
  const int64_t chain_budget = request.budget_bytes - fixed_bytes;
  plan.target = "pytorch";
  plan.solver = "modules";
  plan.min_budget_bytes = fixed_bytes + MinimumModulesMemory(chain, modules, ModuleAccounting::kPyTorch, grads);
  plan.min_budget_lower_bytes = plan.min_budget_bytes;
  if (chain_budget <= 0) return plan;
  ModuleSolution solution = SolveModules(chain, modules, chain_budget, ModuleAccounting::kPyTorch, grads);
  if (!solution.feasible) return plan;
  plan.feasible = true;
  plan.schedule = solution.schedule;
  plan.time_ms = solution.time_ms + fixed.optimizer_step_ms;  // as every plan: the optimizer's update included
  // Predicted as PyTorch runs it (apply_plan): the solver's own accounting.
  // The simulation (what `ckplan run`'s executor holds) gives the timeline.
  plan.simulation = Simulate(chain, plan.schedule);
  plan.peak_bytes = fixed_bytes + solution.peak_bytes;
  plan.checkpointed_stages = CheckpointedStages(plan.schedule, chain.length());
  plan.pytorch = ExportForModules(chain, solution.wrapped);
  // pytorch.predicted.peak_bytes is written as fixed.total() + this.
  plan.pytorch.simulation.peak_bytes = solution.peak_bytes;
  plan.pytorch.held_at_loss_bytes = solution.kept_bytes;
  if (solution.peak_bytes > chain_budget) {
    throw Error(ExitCode::kVerifyFailed, "internal check failed: the module plan peaks at " +
                                             std::to_string(solution.peak_bytes) +
                                             " B, above the activation budget " + std::to_string(chain_budget) + " B");
  }
  return plan;
}

// A baseline for the PyTorch target: its segments as apply_plan can wrap
// them (a module covering a whole segment, else each stage of it that is a
// module), counted as the PyTorch target counts (EvaluateModules): the
// optimum over sets of modules is then never slower than it, and `none`
// (nothing wrapped) peaks where that optimum with nothing wrapped does.
void ModuleBaseline(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request, Plan* plan) {
  const std::vector<WrappableModule>& modules = *request.pytorch_modules;
  const int length = chain.length();
  std::vector<WrappableModule> wrapped;
  const int n = plan->every_n;
  for (int begin = 0; n > 0 && begin < length; begin += n) {
    const int end = std::min(length, begin + n) - 1;
    auto whole = std::find_if(modules.begin(), modules.end(),
                              [&](const WrappableModule& m) { return m.first_stage == begin && m.last_stage == end; });
    if (whole != modules.end()) {
      wrapped.push_back(*whole);
      continue;
    }
    for (int k = begin; k <= end; ++k) {
      auto single = std::find_if(modules.begin(), modules.end(),
                                 [&](const WrappableModule& m) { return m.first_stage == k && m.last_stage == k; });
      if (single != modules.end()) wrapped.push_back(*single);
    }
  }
  const ModuleSolution solution = EvaluateModules(chain, wrapped, ModuleAccounting::kPyTorch, StageGradientsOf(chain));
  plan->target = "pytorch";
  plan->schedule = solution.schedule;
  plan->simulation = Simulate(chain, plan->schedule);
  plan->time_ms = solution.time_ms + fixed.optimizer_step_ms;
  plan->peak_bytes = fixed.total() + solution.peak_bytes;
  plan->min_budget_bytes = plan->min_budget_lower_bytes = plan->peak_bytes;
  plan->feasible = plan->peak_bytes <= request.budget_bytes;
  plan->checkpointed_stages = CheckpointedStages(plan->schedule, length);
  plan->pytorch = ExportForModules(chain, solution.wrapped);
  plan->pytorch.simulation.peak_bytes = solution.peak_bytes;
  plan->pytorch.held_at_loss_bytes = solution.kept_bytes;
}

}  // namespace

Plan MakePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request) {
  if (request.slots < 1) throw BadInput("invalid --slots " + std::to_string(request.slots) + ": must be at least 1");
  Plan plan;
  plan.algorithm = request.algorithm;
  plan.budget_bytes = request.budget_bytes;
  plan.fixed = fixed;
  // Every predicted step time includes the optimizer's update (chain times
  // plus `step`); the solver and the simulator work on the chain alone.
  const double step = fixed.optimizer_step_ms;
  plan.no_recompute_ms = chain.NoRecomputeTimeMs() + step;
  const int length = chain.length();
  const int64_t chain_budget = request.budget_bytes - fixed.total();

  if (request.algorithm != Algorithm::kOptimal) {
    switch (request.algorithm) {
      case Algorithm::kNone: plan.schedule = NoCheckpointSchedule(length); break;
      case Algorithm::kEvery:
        plan.every_n = 1;
        plan.schedule = EveryNSchedule(length, 1);
        break;
      case Algorithm::kEveryN:
        if (request.every_n < 1) throw BadInput("invalid --every " + std::to_string(request.every_n) + ": must be at least 1");
        plan.every_n = request.every_n;
        plan.schedule = EveryNSchedule(length, request.every_n);
        break;
      case Algorithm::kSqrt:
        plan.every_n = SqrtSegmentLength(length);
        plan.schedule = SqrtSchedule(length);
        break;
      default: break;
    }
    if (request.pytorch_modules != nullptr) {
      ModuleBaseline(chain, fixed, request, &plan);
      return plan;
    }
    plan.simulation = Simulate(chain, plan.schedule);
    plan.time_ms = plan.simulation.time_ms + step;
    plan.peak_bytes = fixed.total() + plan.simulation.peak_bytes;
    plan.min_budget_bytes = plan.peak_bytes;
    plan.min_budget_lower_bytes = plan.min_budget_bytes;
    plan.feasible = plan.peak_bytes <= request.budget_bytes;
    plan.checkpointed_stages = CheckpointedStages(plan.schedule, length);
    plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
    return plan;
  }

  if (request.pytorch_modules != nullptr) return MakeModulePlan(chain, fixed, request, std::move(plan));
  plan.slots = request.slots;
  CheckStageCount(chain);
  SlotGrid grid = GridFor(chain_budget, request.slots);
  plan.slot_bytes = grid.slot_bytes;
  DiscreteChain discrete = Discretize(chain, std::max<int64_t>(grid.slot_bytes, 1));
  // Refuse a table that cannot fit before any other work (throws BadInput).
  if (grid.memory_slots >= 0) CheckSolverFits(discrete, grid.memory_slots);
  plan.min_budget_bytes = MinimumOptimalBudget(chain, fixed, request.slots);
  plan.min_budget_lower_bytes = plan.min_budget_bytes;
  if (ChooseSolver(chain.length(), request.slots) == SolverMethod::kBanded) {
    // Sizes in bytes: rounding to slots only adds.
    plan.min_budget_lower_bytes =
        std::min(plan.min_budget_bytes, fixed.total() + MinimumMemoryLowerBound(Discretize(chain, 1)));
  }
  if (grid.memory_slots < 0) return plan;
  SolverOptions options;
  options.threads = request.threads;
  options.progress = request.progress;
  OptimalSolution solution = SolveChain(discrete, grid.memory_slots, options);
  RefineSlots(chain, chain_budget, request, &grid, &solution);
  plan.slots = static_cast<int>(grid.memory_slots);
  plan.slot_bytes = grid.slot_bytes;
  plan.solver = solution.band > 0 ? "banded" : "exact";
  plan.band = solution.band;
  plan.proven_optimal = solution.proven_optimal;
  plan.lower_bound_ms = solution.lower_bound_ms + step;
  if (request.sweep) {
    for (size_t m = 0; m < solution.curve_ms.size(); ++m) {
      if (solution.curve_ms[m] < kInfinity) {
        plan.curve.push_back({fixed.total() + static_cast<int64_t>(m) * grid.slot_bytes, solution.curve_ms[m] + step});
      }
    }
  }
  // A baseline that fits and is faster (or fits where the rounded sizes do
  // not) is the plan: the solver's figures would not be optimal.
  std::optional<Baseline> baseline = FastestFitting(chain, chain_budget);
  const bool take_baseline =
      baseline && (!solution.feasible || baseline->simulation.time_ms < solution.time_ms * (1 - 1e-12));
  if (!solution.feasible && !take_baseline) return plan;
  plan.feasible = true;
  double chain_ms = 0;  // the schedule's time over the chain, without the optimizer's update
  if (take_baseline) {
    plan.schedule = std::move(baseline->schedule);
    chain_ms = baseline->simulation.time_ms;
    if (plan.band > 0) plan.proven_optimal = solution.lower_bound_ms >= chain_ms * (1 - 1e-12);
  } else {
    plan.schedule = std::move(solution.schedule);
    chain_ms = solution.time_ms;
  }
  plan.time_ms = chain_ms + step;
  plan.simulation = Simulate(chain, plan.schedule);
  plan.peak_bytes = fixed.total() + plan.simulation.peak_bytes;
  plan.checkpointed_stages = CheckpointedStages(plan.schedule, length);
  plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
  if (plan.simulation.peak_bytes > chain_budget) {
    throw Error(ExitCode::kVerifyFailed,
                "internal check failed: the optimal schedule simulates to " +
                    std::to_string(plan.simulation.peak_bytes) + " B, above the activation budget " +
                    std::to_string(chain_budget) + " B");
  }
  const double tolerance = 1e-9 * std::max(1.0, std::fabs(chain_ms));
  if (std::fabs(plan.simulation.time_ms - chain_ms) > tolerance) {
    throw Error(ExitCode::kVerifyFailed, "internal check failed: simulated time differs from the solver's");
  }
  return plan;
}

}  // namespace ckplan
