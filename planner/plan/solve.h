#pragma once
/// `ckplan solve` for one process as one call: the plan of a target under a
/// budget, the strategies it is compared with, its sweep and its document.
/// The CLI parses its options into a SolveRequest and prints the result.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "planner/base/units.h"
#include "planner/contracts/plan_document.h"
#include "planner/contracts/sweep_document.h"
#include "planner/cost/sac_candidates.h"
#include "planner/plan/plan.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/strategies.h"

namespace ckplan {

/// The target a solve plans for: `target` (pytorch, sac or schedule), or
/// where empty pytorch for a profile and schedule for a chain. Throws
/// BadInput for any other name.
std::string ResolveTarget(const std::string& target, bool from_profile);

struct SolveRequest {
  /// The algorithm, the budget (as the user wrote it), slots, every_n,
  /// threads, sweep (SolveResult::sweep) and progress; the modules are
  /// Solve's to set, from `target`.
  PlanRequest plan;
  std::string target;        ///< as ResolveTarget takes it
  double sac_dispatch_us = kDefaultSacDispatchUs;
  /// Gradient accumulation (`--global-batch`): the document's global_batch
  /// and accumulation_steps, where it has a batch; 0: none.
  int global_batch = 0;
  /// `--wrap`: the PyTorch target's modules to wrap, given (their paths)
  /// rather than solved: the plan prices them as apply_plan wraps them.
  /// Empty: solved.
  std::vector<std::string> wrap;
};

struct SolveResult {
  Plan plan;                              ///< feasible
  TargetModules modules;                  ///< what the plan's target chose among
  std::vector<StrategyPoint> strategies;  ///< the strategy table at the budget
  std::optional<SweepDocument> sweep;     ///< with SolveRequest::sweep
  PlanDocument document;                  ///< the plan as written, strategies included
};

/// Plans `in` as `request` asks. An infeasible budget throws
/// Error(kInfeasible) saying the smallest budget that works, in the form
/// the budget was written in and checked to be feasible itself, why (the
/// fixed part alone, the modules the target can wrap, the banded solver's
/// bound), and for the modules targets what the nested schedule needs.
SolveResult Solve(const PlannerInput& in, const SolveRequest& request);

/// The rows of a sweep a person reads: where the optimal step time changes,
/// about `rows` of them, and the last point.
std::vector<SweepPoint> SweepDigest(const SweepDocument& sweep, size_t rows = 12);

/// What `--batch` compares at one batch's profile under a budget.
struct BatchPlans {
  bool plan_fits = false;
  int64_t plan_peak_bytes = 0;
  int64_t min_budget_bytes = 0;
  double plan_ms = 0;
  double plan_overhead_pct = 0;
  std::string plan_what;        ///< `wrap 3 modules`, `no checkpointing`
  int64_t none_peak_bytes = 0;
  double none_ms = 0;
  double optimizer_ms = 0;      ///< the update, once per global batch with accumulation
};

/// One batch's profile under the request's budget: the optimal plan of its
/// target and no checkpointing, priced as Solve prices them.
BatchPlans PlanAtBatch(const PlannerInput& in, const SolveRequest& request);

}  // namespace ckplan
