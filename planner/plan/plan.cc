#include "planner/plan/plan.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "planner/solvers/baselines.h"
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

// The strategy the request names, through the one solver signature.
std::unique_ptr<ChainSolver> SolverFor(const PlanRequest& request, int every_n) {
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

Plan MakePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request) {
  if (request.slots < 1) throw BadInput("invalid --slots " + std::to_string(request.slots) + ": must be at least 1");
  Plan plan;
  plan.algorithm = request.algorithm;
  plan.budget_bytes = request.budget_bytes;
  plan.fixed = fixed;
  // Every predicted step time includes the optimizer's update (chain times
  // plus `step`); the solvers and the simulator work on the chain alone.
  const double step = fixed.optimizer_step_ms;
  // The PyTorch target's step without recomputation is its own: run eagerly.
  plan.no_recompute_ms =
      (request.pytorch_modules != nullptr ? chain.ModuleNoRecomputeTimeMs() : chain.NoRecomputeTimeMs()) + step;
  const int length = chain.length();
  const int64_t chain_budget = request.budget_bytes - fixed.total();
  switch (request.algorithm) {
    case Algorithm::kEvery: plan.every_n = 1; break;
    case Algorithm::kEveryN:
      if (request.every_n < 1) throw BadInput("invalid --every " + std::to_string(request.every_n) + ": must be at least 1");
      plan.every_n = request.every_n;
      break;
    case Algorithm::kSqrt: plan.every_n = SqrtSegmentLength(length); break;
    default: break;
  }
  const ChainSolution solution = SolverFor(request, plan.every_n)->Solve(chain, chain_budget);

  if (request.pytorch_modules != nullptr) plan.target = "pytorch";
  if (request.algorithm == Algorithm::kOptimal && request.pytorch_modules == nullptr) {
    plan.slots = solution.memory_slots;
    plan.slot_bytes = solution.slot_bytes;
  }
  plan.min_budget_bytes = fixed.total() + solution.min_budget_bytes;
  plan.min_budget_lower_bytes = fixed.total() + solution.min_budget_lower_bytes;
  plan.solver = solution.method;
  plan.band = solution.band;
  plan.proven_optimal = solution.proven_optimal;
  if (solution.method == "exact" || solution.method == "banded") plan.lower_bound_ms = solution.lower_bound_ms + step;
  for (const CurvePoint& point : solution.curve) {
    plan.curve.push_back({fixed.total() + point.budget_bytes, point.time_ms + step});
  }
  // A fixed strategy's figures are its one schedule's, fitting or not.
  if (solution.feasible || request.algorithm != Algorithm::kOptimal) {
    plan.time_ms = solution.time_ms + step;
    plan.peak_bytes = fixed.total() + solution.peak_bytes;
  }
  if (!solution.feasible) return plan;
  plan.feasible = true;
  plan.schedule = solution.schedule;
  // The simulation (what `ckplan run`'s executor holds) gives the timeline;
  // the PyTorch target's peak is by its own accounting.
  plan.simulation = Simulate(chain, plan.schedule);
  plan.checkpointed_stages = CheckpointedStages(plan.schedule, length);
  if (solution.module_target) {
    plan.pytorch = ExportForModules(chain, solution.wrapped);
    // pytorch.predicted.peak_bytes is written as fixed.total() + this.
    plan.pytorch.simulation.peak_bytes = solution.peak_bytes;
    plan.pytorch.held_at_loss_bytes = solution.held_at_loss_bytes;
    plan.pytorch.time_ms = solution.time_ms;  // the solver's own sum
  } else {
    plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
  }
  return plan;
}

}  // namespace ckplan
