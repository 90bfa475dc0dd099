#pragma once
/// One signature for every checkpointing strategy: from a chain and the
/// memory its activations may use to a schedule. The baselines (none,
/// every-n, sqrt), the optimal nested schedule and the PyTorch target's
/// modules each implement it, as PyTorch's knapsack solvers share one
/// signature (torch/_functorch/_activation_checkpointing/knapsack.py) and
/// rotor keeps one solver per file (rotor/algorithms/). Each strategy's own
/// code stays in its file (baselines.cc, solver_*.cc, solver_modules.cc);
/// chain_solver.cc only adapts it to the signature.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckplan/planner/chain.h"
#include "ckplan/planner/schedule.h"
#include "ckplan/planner/solver_modules.h"

namespace ckplan {

struct ChainSolution {
  bool feasible = false;
  Schedule schedule;           ///< empty when infeasible
  double time_ms = 0;          ///< the chain's step time under it (the optimizer's update excluded)
  int64_t peak_bytes = 0;      ///< the peak by the solver's accounting, chain input included
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
/// The optimal nested schedule (MakePlan with Algorithm::kOptimal: `slots`
/// memory slots, refined where rounding costs, never slower than a baseline
/// that fits).
std::unique_ptr<ChainSolver> OptimalSolver(int slots = 500, int threads = 1);
/// The PyTorch target: the fastest set of `modules` to wrap (SolveModules,
/// PyTorch's accounting). `modules` must outlive the solver.
std::unique_ptr<ChainSolver> ModulesSolver(const std::vector<WrappableModule>& modules);

/// The baselines a plan is compared with, in the order `ckplan solve` and the
/// budget search try them: none, sqrt, every-1, -2, -4, -8 (those not longer
/// than the chain).
std::vector<std::unique_ptr<ChainSolver>> BaselineSolvers(int length);

}  // namespace ckplan
