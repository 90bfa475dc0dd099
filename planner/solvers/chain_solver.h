#pragma once
/// One signature for every checkpointing strategy: from a chain and the
/// memory its activations may use to a schedule. The baselines (none,
/// every-n, sqrt), the optimal nested schedule and the PyTorch target's
/// modules each implement it, as PyTorch's knapsack solvers share one
/// signature (torch/_functorch/_activation_checkpointing/knapsack.py) and
/// rotor keeps one solver per file (rotor/algorithms/). Each strategy's own
/// code stays in its file (baselines.cc, recurrence.cc, modules.cc);
/// chain_solver.cc adapts it to the signature. MakePlan (plan.h) solves
/// through it alone, and so do the budget search's baselines.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/plan_solver.h"
#include "planner/contracts/sweep_document.h"
#include "planner/contracts/schedule.h"
#include "planner/solvers/modules.h"

namespace ckplan {

struct ChainSolution {
  bool feasible = false;
  Schedule schedule;           ///< empty when infeasible
  /// The schedule's step time over the chain (the optimizer's update
  /// excluded) and its peak by the strategy's accounting, chain input
  /// included. A fixed strategy (one schedule) gives them also when that
  /// schedule does not fit; a search that found none leaves them 0.
  double time_ms = 0;
  int64_t peak_bytes = 0;
  /// The smallest budget for which the strategy is feasible.
  int64_t min_budget_bytes = 0;
  /// Its method and bounds, of the chain (plan_solver.h).
  PlanSolver solver;
  /// The optimal solver: its grid (`memory_slots` slots of `slot_bytes`)
  /// and `curve` (with OptimalOptions::curve: every budget's optimum up to
  /// this one, finite points).
  int memory_slots = 0;
  int64_t slot_bytes = 0;
  std::vector<CurvePoint> curve;
  /// Counted as the PyTorch target counts (the modules solver and its
  /// baselines): `wrapped` is what apply_plan wraps and
  /// `held_at_loss_bytes` what is held when the loss starts.
  bool module_target = false;
  std::vector<WrappableModule> wrapped;
  int64_t held_at_loss_bytes = 0;
};

class ChainSolver {
 public:
  virtual ~ChainSolver() = default;
  /// `none`, `every`, `every-4`, `sqrt`, `optimal`, `modules`.
  virtual std::string Name() const = 0;
  /// The fastest schedule the strategy has for `chain` whose peak is at
  /// most `budget_bytes` (the chain input included); feasible false when
  /// there is none. A fixed strategy (the baselines) has one schedule,
  /// feasible when it fits.
  virtual ChainSolution Solve(const Chain& chain, int64_t budget_bytes) const = 0;
};

/// Every stage with autograd, no recomputation.
std::unique_ptr<ChainSolver> NoCheckpointSolver();
/// Segments of `n` stages (n = 1: every).
std::unique_ptr<ChainSolver> EveryNSolver(int n);
/// Segments of about sqrt(L) stages.
std::unique_ptr<ChainSolver> SqrtSolver();

struct OptimalOptions {
  int slots = 500;                         ///< memory slots of the DP (refined where rounding costs)
  int threads = 1;
  bool curve = false;                      ///< keep the optimal memory/time curve
  std::function<void(double)> progress;    ///< the DP's fraction done; may be empty
};
/// The optimal nested schedule: the DP over `slots` memory slots, refined
/// where rounding costs, never slower than a baseline that fits, checked by
/// the simulator (throws Error(kVerifyFailed) if it fails, a bug).
std::unique_ptr<ChainSolver> OptimalSolver(const OptimalOptions& options);
std::unique_ptr<ChainSolver> OptimalSolver(int slots = 500, int threads = 1);
/// The PyTorch target: the fastest set of `modules` to wrap (SolveModules,
/// PyTorch's accounting, the chain's parameter gradients as they appear).
/// `modules` must outlive the solver.
std::unique_ptr<ChainSolver> ModulesSolver(const std::vector<WrappableModule>& modules);
/// A baseline for the PyTorch target: segments of `n` stages as apply_plan
/// can wrap them (a module covering a whole segment, else each stage of it
/// that is a module; n = 0 wraps nothing), counted as ModulesSolver counts,
/// so that its optimum is never slower than it. `modules` must outlive it.
std::unique_ptr<ChainSolver> ModuleBaselineSolver(const std::vector<WrappableModule>& modules, int n);

/// The PyTorch target wrapping exactly `wrapped` (disjoint; with what each
/// saves where selective): a policy a user writes by hand (save the matrix
/// products in every layer), counted as ModulesSolver counts. `wrapped` must
/// outlive it.
std::unique_ptr<ChainSolver> WrapExactlySolver(const std::vector<WrappableModule>& wrapped);

/// The baselines a plan is compared with, in the order `ckplan solve` and the
/// budget search try them: none, sqrt, every-1, -2, -4, -8 (those not longer
/// than the chain).
std::vector<std::unique_ptr<ChainSolver>> BaselineSolvers(int length);

}  // namespace ckplan
