#pragma once
/// Making a plan for a chain and a budget (any algorithm), and the plan JSON
/// contract (`ckplan.plan/1`).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "planner/contracts/chain.h"
#include "planner/solvers/chain_solver.h"
#include "planner/contracts/plan_document.h"
#include "planner/plan/pytorch_export.h"
#include "planner/contracts/schedule.h"
#include "planner/cost/simulator.h"
#include "planner/solvers/modules.h"
#include "planner/base/units.h"

namespace ckplan {

enum class Algorithm { kOptimal, kNone, kEvery, kEveryN, kSqrt };

/// `optimal`, `none`, `every`, `every-n`, `sqrt`.
const char* AlgorithmName(Algorithm algorithm);
/// Throws BadInput quoting `name` if unknown.
Algorithm ParseAlgorithm(const std::string& name);

/// What the training step holds besides the chain: parameters, buffers,
/// gradients and optimizer state. Zero for a plain chain.
struct FixedMemory {
  int64_t param_bytes = 0;
  int64_t buffer_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optimizer_bytes = 0;
  std::string optimizer = "none";
  /// Time, not memory, but per optimizer like its state: the optimizer's
  /// update of every parameter, added to every predicted step (0 when
  /// unknown, as for a plain chain).
  double optimizer_step_ms = 0;
  /// Of grad_bytes, those the chain's stages carry (param_grads.h): they
  /// appear during backward and are counted there, so they are listed but
  /// not in total(). 0: every gradient held for the whole step.
  int64_t backward_grad_bytes = 0;
  int64_t total() const { return param_bytes + buffer_bytes + grad_bytes - backward_grad_bytes + optimizer_bytes; }
};

/// The overhead of a step of `time_ms` over one of `baseline_ms`, in
/// percent: the one formula every output uses. 0 for no baseline and for a
/// difference that is only rounding (the same sum in another order).
double OverheadPct(double time_ms, double baseline_ms);

/// Optimizer state per parameter byte: none/sgd 0, momentum 1, adam 2.
/// Throws BadInput for an unknown name.
FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer);

struct PlanRequest {
  Algorithm algorithm = Algorithm::kOptimal;
  int64_t budget_bytes = 0;
  int slots = 500;
  int every_n = 2;        ///< for kEveryN
  int threads = 1;
  bool sweep = false;     ///< keep the optimal memory/time curve
  /// Called with the solver's fraction done (0..1); may be empty.
  std::function<void(double)> progress = nullptr;
  /// kOptimal for the PyTorch target: the fastest set of these modules to
  /// wrap (SolveModules) instead of the nested schedule; null: the schedule target.
  const std::vector<WrappableModule>* pytorch_modules = nullptr;
};

struct Plan {
  Algorithm algorithm = Algorithm::kOptimal;
  int every_n = 0;                     ///< segment length for every-n / sqrt
  int64_t budget_bytes = 0;            ///< the whole step
  FixedMemory fixed;                   ///< subtracted from the budget
  int slots = 0;                       ///< optimal only
  int64_t slot_bytes = 0;              ///< optimal only
  bool feasible = false;
  int64_t min_budget_bytes = 0;        ///< smallest budget that works (whole step)
  Schedule schedule;                   ///< empty when infeasible
  std::vector<int> checkpointed_stages;
  SimulationResult simulation;         ///< of the chain alone, in bytes
  double time_ms = 0;                  ///< predicted step time, the optimizer's update included
  double no_recompute_ms = 0;          ///< the same without checkpointing
  int64_t peak_bytes = 0;              ///< predicted peak of the whole step
  std::vector<CurvePoint> curve;       ///< optimal with sweep: finite points (step times as time_ms)
  /// Optimal only: "exact" (the whole table) or "banded" (long chains); for
  /// banded, a proven lower bound on the optimum and whether the plan is it.
  std::string solver;
  int band = 0;
  double lower_bound_ms = 0;
  /// Banded: a proven lower bound on the smallest budget of the exact
  /// recurrence (min_budget_bytes is the banded solver's own); else equal
  /// to min_budget_bytes.
  int64_t min_budget_lower_bytes = 0;
  bool proven_optimal = true;
  /// How much slower than the optimum the plan can be, at most, in percent
  /// of the lower bound: 0 when proven optimal.
  double gap_bound_pct() const;
  /// "schedule" (the nested optimum, or a baseline) or "pytorch" (optimal
  /// over sets of wrapped modules: the schedule is what apply_plan does).
  std::string target = "schedule";
  ModuleExport pytorch;                ///< what apply_plan() in Python does
  double overhead_pct() const;
};

/// Makes the plan through the request's ChainSolver (chain_solver.h), on
/// the budget less the fixed part. For kOptimal, the DP over `slots` memory
/// slots of floor((budget - fixed) / slots) bytes. The schedule is checked by the
/// simulator (throws Error(kVerifyFailed) if it fails, which is a bug). An
/// infeasible budget is not an error: feasible is false and
/// min_budget_bytes says what would work.
Plan MakePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request);


/// Whether the optimal algorithm with `slots` slots finds a plan within
/// `budget_bytes` (whole step): the feasibility check alone, no DP table.
bool OptimalBudgetFeasible(const Chain& chain, const FixedMemory& fixed, int64_t budget_bytes, int slots);

/// The smallest budget (whole step) for which the optimal algorithm with
/// `slots` slots is feasible.
int64_t MinimumOptimalBudget(const Chain& chain, const FixedMemory& fixed, int slots);

/// The `ckplan.plan/1` document of `plan` (plan_document.h). `source` says
/// where the chain came from (`{"kind":"chain","path":..}` or, for a profile,
/// the model's sha256 and inputs, so that `ckplan run` can refuse a plan made
/// for another model).
PlanDocument MakePlanDocument(const Plan& plan, const Chain& chain, const PlanSource& source);

/// PlanToJson(MakePlanDocument(plan, chain, source)).
nlohmann::json PlanToJson(const Plan& plan, const Chain& chain, const PlanSource& source);

}  // namespace ckplan
