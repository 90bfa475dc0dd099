#pragma once
/// What a solver says of its answer, one value carried from the solver
/// (ChainSolution, in the chain's figures) to the plan (Plan, the whole
/// step's: MakePlan converts it once) and written as the plan's `solver`
/// (plan_document.h).

#include <cstdint>
#include <string>

namespace ckplan {

struct PlanSolver {
  /// `exact` or `banded` (the optimal solver, once it solved), `modules`
  /// (the PyTorch target), `in-flight` (a pipeline stage's); empty for the
  /// baselines and where the budget left nothing to solve.
  std::string method;
  bool proven_optimal = true;
  /// The banded solver's band (0: not banded), and its proven lower bound
  /// on the optimum's time (exact and banded: 0 unless solved).
  int band = 0;
  double lower_bound_ms = 0;
  /// How much slower than the optimum the plan can be, at most, in percent
  /// of the lower bound (Plan::gap_bound_pct): the document's, set when it
  /// is written.
  double gap_bound_pct = 0;
  /// A proven lower bound on the exact recurrence's smallest budget (banded:
  /// min_budget_bytes is the banded solver's own); else min_budget_bytes.
  int64_t min_budget_lower_bytes = 0;
  /// The modules solver (SolveModules): the profile's time noise in
  /// percent, and the band it makes around the fastest plan's time (that
  /// percentage of its recomputation), in the chain's ms; `tied_plans`
  /// other plans were within the band, and the one chosen has the largest
  /// peak, then the earliest modules. Written where the noise is known.
  double time_noise_pct = 0;
  double tie_ms = 0;
  int tied_plans = 0;
  bool operator==(const PlanSolver& o) const {
    return method == o.method && proven_optimal == o.proven_optimal && band == o.band &&
           lower_bound_ms == o.lower_bound_ms && gap_bound_pct == o.gap_bound_pct &&
           min_budget_lower_bytes == o.min_budget_lower_bytes && time_noise_pct == o.time_noise_pct &&
           tie_ms == o.tie_ms && tied_plans == o.tied_plans;
  }
};

}  // namespace ckplan
