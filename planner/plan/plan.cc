#include "planner/plan/plan.h"

#include "planner/base/format.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "planner/solvers/baselines.h"
#include "planner/solvers/budget_search.h"
#include "planner/solvers/chain_solver.h"
#include "planner/base/error.h"
#include "planner/base/units.h"

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

// The gap is the plan's overhead over the proven lower bound: the one formula.
double Plan::gap_bound_pct() const { return solver.proven_optimal ? 0 : OverheadPct(time_ms, solver.lower_bound_ms); }

double OverheadPct(double time_ms, double baseline_ms) {
  if (!(baseline_ms > 0)) return 0;
  const double pct = (time_ms - baseline_ms) / baseline_ms * 100.0;
  return std::fabs(pct) < 1e-9 ? 0.0 : pct;  // the same sum in another order is no overhead
}

double Plan::overhead_pct() const { return OverheadPct(time_ms, no_recompute_ms); }

namespace {

// The strategy the request names, through the one solver signature.
std::unique_ptr<ChainSolver> SolverFor(const PlanRequest& request, int every_n) {
  if (request.pytorch_modules != nullptr && request.wrap_exactly != nullptr) return WrapExactlySolver(*request.wrap_exactly);
  if (request.algorithm == Algorithm::kOptimal) {
    if (request.pytorch_modules != nullptr) return ModulesSolver(*request.pytorch_modules);
    OptimalOptions options;
    options.slots = request.slots;
    options.threads = request.threads;
    options.curve = request.sweep;
    options.progress = request.progress;
    return OptimalSolver(options);
  }
  if (request.pytorch_modules != nullptr) return ModuleBaselineSolver(*request.pytorch_modules, every_n);
  switch (request.algorithm) {
    case Algorithm::kNone: return NoCheckpointSolver();
    case Algorithm::kSqrt: return SqrtSolver();
    default: return EveryNSolver(every_n);
  }
}

}  // namespace

bool OptimalBudgetFeasible(const Chain& chain, const FixedMemory& fixed, int64_t budget_bytes, int slots) {
  return OptimalChainBudgetFeasible(chain, budget_bytes - fixed.total(), slots);
}

int64_t MinimumOptimalBudget(const Chain& chain, const FixedMemory& fixed, int slots) {
  return fixed.total() + MinimumOptimalChainBudget(chain, slots);
}

namespace {

// The whole step's figures of a feasible plan whose schedule, checkpointed
// stages and export are set: the simulation (what `ckplan run`'s executor
// holds) gives the timeline; the PyTorch target's peak and time are by its
// own accounting and prices, against its own step without recomputation.
void SetScheduleFigures(const Chain& chain, Plan* plan) {
  const int64_t fixed = plan->fixed.total();
  const double step = plan->fixed.optimizer_step_ms;
  plan->simulation = Simulate(chain, plan->schedule);
  plan->live_after_forward_bytes = fixed + plan->simulation.live_after_forward_bytes;
  plan->timeline_peak_during_bytes.clear();
  plan->timeline_stored_after_bytes.clear();
  for (size_t k = 0; k < plan->simulation.peak_during_bytes.size(); ++k) {
    plan->timeline_peak_during_bytes.push_back(fixed + plan->simulation.peak_during_bytes[k]);
    plan->timeline_stored_after_bytes.push_back(fixed + plan->simulation.stored_after_bytes[k]);
  }
  plan->pytorch_peak_bytes = fixed + plan->pytorch.peak_bytes;
  plan->pytorch_time_ms = plan->pytorch.time_ms + step;
  plan->pytorch_no_recompute_ms = chain.ModuleNoRecomputeTimeMs() + step;
}

}  // namespace

Plan MakePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request) {
  if (request.slots < 1) throw BadInput("invalid --slots " + std::to_string(request.slots) + ": must be at least 1");
  Plan plan;
  plan.algorithm = request.algorithm;
  plan.budget = request.budget;
  plan.fixed = fixed;
  // The one conversion: the solvers and the simulator work on the chain,
  // within the budget less the fixed part; every figure of the plan is the
  // whole step's, and every predicted step time includes the optimizer's
  // update (`step`).
  const int64_t fixed_bytes = fixed.total();
  const double step = fixed.optimizer_step_ms;
  plan.activation_budget_bytes = request.budget.bytes - fixed_bytes;
  plan.budget_below_fixed = plan.activation_budget_bytes <= 0;
  // The PyTorch target's step without recomputation is its own: run eagerly.
  plan.no_recompute_ms =
      (request.pytorch_modules != nullptr ? chain.ModuleNoRecomputeTimeMs() : chain.NoRecomputeTimeMs()) + step;
  const int length = chain.length();
  switch (request.algorithm) {
    case Algorithm::kEvery: plan.every_n = 1; break;
    case Algorithm::kEveryN:
      if (request.every_n < 1) throw BadInput("invalid --every " + std::to_string(request.every_n) + ": must be at least 1");
      plan.every_n = request.every_n;
      break;
    case Algorithm::kSqrt: plan.every_n = SqrtSegmentLength(length); break;
    default: break;
  }
  const ChainSolution solution = SolverFor(request, plan.every_n)->Solve(chain, plan.activation_budget_bytes);

  if (request.pytorch_modules != nullptr) {
    const bool selective = !request.pytorch_modules->empty() && request.pytorch_modules->front().selective;
    plan.target = selective ? "sac" : "pytorch";
  }
  if (request.algorithm == Algorithm::kOptimal && request.pytorch_modules == nullptr) {
    plan.slots = solution.memory_slots;
    plan.slot_bytes = solution.slot_bytes;
  }
  plan.min_budget_bytes = fixed_bytes + solution.min_budget_bytes;
  plan.solver = solution.solver;
  plan.solver.min_budget_lower_bytes += fixed_bytes;
  const bool optimal = solution.solver.method == "exact" || solution.solver.method == "banded";
  plan.solver.lower_bound_ms = optimal ? solution.solver.lower_bound_ms + step : 0;
  for (const CurvePoint& point : solution.curve) {
    plan.curve.push_back({fixed_bytes + point.budget_bytes, point.time_ms + step});
  }
  // A fixed strategy's figures are its one schedule's, fitting or not.
  if (solution.feasible || request.algorithm != Algorithm::kOptimal || request.wrap_exactly != nullptr) {
    plan.time_ms = solution.time_ms + step;
    plan.peak_bytes = fixed_bytes + solution.peak_bytes;
  }
  if (!solution.feasible) return plan;
  plan.feasible = true;
  plan.schedule = solution.schedule;
  plan.checkpointed_stages = CheckpointedStages(plan.schedule, length);
  if (solution.module_target) {
    plan.pytorch = ExportForModules(chain, solution.wrapped);
    plan.pytorch.peak_bytes = solution.peak_bytes;  // the solver's accounting
    plan.pytorch.held_at_loss_bytes = solution.held_at_loss_bytes;
    plan.pytorch.time_ms = solution.time_ms;  // the solver's own sum
  } else {
    plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
  }
  SetScheduleFigures(chain, &plan);
  return plan;
}

Plan PlanForSchedule(const Chain& chain, const FixedMemory& fixed, const Schedule& schedule,
                     const ByteQuantity& budget) {
  Plan plan;
  plan.budget = budget;
  plan.fixed = fixed;
  plan.activation_budget_bytes = budget.bytes - fixed.total();
  plan.feasible = true;
  plan.schedule = schedule;
  plan.checkpointed_stages = CheckpointedStages(schedule, chain.length());
  plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
  SetScheduleFigures(chain, &plan);
  plan.time_ms = plan.simulation.time_ms + fixed.optimizer_step_ms;
  plan.no_recompute_ms = chain.NoRecomputeTimeMs() + fixed.optimizer_step_ms;
  plan.peak_bytes = fixed.total() + plan.simulation.peak_bytes;
  return plan;
}

std::string RecomputedStages(size_t stages) {
  return stages == 0 ? "no checkpointing" : Format("recompute %zu stage%s", stages, stages == 1 ? "" : "s");
}

}  // namespace ckplan
