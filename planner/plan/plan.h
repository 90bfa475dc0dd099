#pragma once
/// Making a plan for a chain and a budget (any algorithm): the thin layer
/// over the solvers, where the whole step's budget meets the chain's.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/base/units.h"
#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/schedule.h"
#include "planner/contracts/sweep_document.h"
#include "planner/cost/simulator.h"
#include "planner/cost/wrappable_modules.h"
#include "planner/plan/pytorch_export.h"

namespace ckplan {

enum class Algorithm { kOptimal, kNone, kEvery, kEveryN, kSqrt };

/// `optimal`, `none`, `every`, `every-n`, `sqrt`.
const char* AlgorithmName(Algorithm algorithm);
/// Throws BadInput quoting `name` if unknown.
Algorithm ParseAlgorithm(const std::string& name);

/// The overhead of a step of `time_ms` over one of `baseline_ms`, in
/// percent: the one formula every output uses. 0 for no baseline and for a
/// difference that is only rounding (the same sum in another order).
double OverheadPct(double time_ms, double baseline_ms);

struct PlanRequest {
  Algorithm algorithm = Algorithm::kOptimal;
  /// The whole step's budget, as parsed once from what the user wrote
  /// (ParseBytes): its bytes, and the unit style the plan records.
  ByteQuantity budget;
  int slots = 500;
  int every_n = 2;        ///< for kEveryN
  int threads = 1;
  bool sweep = false;     ///< keep the optimal memory/time curve
  /// Called with the solver's fraction done (0..1); may be empty.
  std::function<void(double)> progress = nullptr;
  /// kOptimal for the PyTorch target: the fastest set of these modules to
  /// wrap (SolveModules) instead of the nested schedule; null: the schedule target.
  const std::vector<WrappableModule>* pytorch_modules = nullptr;
  /// With pytorch_modules, in place of the algorithm: wrap exactly these
  /// (a hand-written policy: WrapExactlySolver).
  const std::vector<WrappableModule>* wrap_exactly = nullptr;
};

/// A plan. Its memory figures are the whole step's (the fixed part
/// included) and its times include the optimizer's update, unless a field
/// says `of the chain`: MakePlan and PlanForSchedule convert the solvers'
/// chain figures once.
struct Plan {
  Algorithm algorithm = Algorithm::kOptimal;
  int every_n = 0;                     ///< segment length for every-n / sqrt
  ByteQuantity budget;                 ///< the whole step, as the request gave it
  FixedMemory fixed;                   ///< subtracted from the budget
  int64_t activation_budget_bytes = 0; ///< the budget less the fixed part: what the chain may use
  int slots = 0;                       ///< optimal only
  int64_t slot_bytes = 0;              ///< optimal only
  bool feasible = false;
  /// Infeasible because the fixed part alone takes the budget.
  bool budget_below_fixed = false;
  int64_t min_budget_bytes = 0;        ///< smallest budget that works
  Schedule schedule;                   ///< empty when infeasible
  std::vector<int> checkpointed_stages;
  SimulationResult simulation;         ///< of the chain alone, in bytes
  double time_ms = 0;                  ///< predicted step time
  double no_recompute_ms = 0;          ///< the same without checkpointing
  int64_t peak_bytes = 0;              ///< predicted peak
  int64_t live_after_forward_bytes = 0;  ///< stored when the loss starts (the simulation's)
  /// Per operation of the schedule: the simulated peak during it and what
  /// stays stored after it.
  std::vector<int64_t> timeline_peak_during_bytes, timeline_stored_after_bytes;
  std::vector<CurvePoint> curve;       ///< optimal with sweep: finite points
  /// The solver's method and bounds (plan_solver.h), the whole step's:
  /// lower_bound_ms with the optimizer's update, min_budget_lower_bytes
  /// with the fixed part.
  PlanSolver solver;
  /// How much slower than the optimum the plan can be, at most, in percent
  /// of the lower bound: 0 when proven optimal.
  double gap_bound_pct() const;
  /// "schedule" (the nested optimum, or a baseline), "pytorch" (optimal
  /// over sets of wrapped modules: the schedule is what apply_plan does) or
  /// "sac" (the same, each wrapped module with the ops it saves).
  std::string target = "schedule";
  ModuleExport pytorch;                ///< what apply_plan() in Python does, of the chain
  /// The step as apply_plan runs it, in the PyTorch target's accounting and
  /// prices (pytorch_export.h): its peak, its time, and its time with
  /// nothing wrapped.
  int64_t pytorch_peak_bytes = 0;
  double pytorch_time_ms = 0;
  double pytorch_no_recompute_ms = 0;
  double overhead_pct() const;
};

/// Makes the plan through the request's ChainSolver (chain_solver.h), on
/// the budget less the fixed part. For kOptimal, the DP over `slots` memory
/// slots of floor((budget - fixed) / slots) bytes. The schedule is checked by the
/// simulator (throws Error(kVerifyFailed) if it fails, which is a bug). An
/// infeasible budget is not an error: feasible is false and
/// min_budget_bytes says what would work (budget_below_fixed where the
/// fixed part alone takes the budget).
Plan MakePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request);

/// The plan that runs `schedule` on `chain` within `budget` with `fixed`
/// (a pipeline stage's, solved elsewhere): feasible, its figures those of
/// the simulation, what apply_plan wraps those of ExportForPyTorch.
Plan PlanForSchedule(const Chain& chain, const FixedMemory& fixed, const Schedule& schedule,
                     const ByteQuantity& budget);

/// Whether the optimal algorithm with `slots` slots finds a plan within
/// `budget_bytes` (whole step): the feasibility check alone, no DP table.
bool OptimalBudgetFeasible(const Chain& chain, const FixedMemory& fixed, int64_t budget_bytes, int slots);

/// The smallest budget (whole step) for which the optimal algorithm with
/// `slots` slots is feasible.
int64_t MinimumOptimalBudget(const Chain& chain, const FixedMemory& fixed, int slots);

/// What a plan recomputing `stages` stages does, as the batch table says it:
/// `no checkpointing`, `recompute 1 stage`, `recompute N stages`.
std::string RecomputedStages(size_t stages);

}  // namespace ckplan
