#pragma once
/// The modules a target chooses among, and the strategy table: one row per
/// checkpointing strategy at a budget (peak, step time, overhead, whether it
/// fits). `ckplan solve` and `ckplan report` take their rows from
/// StrategyTable; the CLI formats them (cli/strategy_table.h).

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/contracts/plan_document.h"  // StrategyPoint
#include "planner/cost/sac_candidates.h"
#include "planner/cost/wrappable_modules.h"
#include "planner/plan/plan.h"
#include "planner/plan/planner_input.h"

namespace ckplan {

/// The modules the pytorch and sac targets choose among: `plain` (what the
/// pytorch target wraps) and, where asked, `selective`, the same with the sac
/// target's save sets (AddSacCandidates). Both empty for the schedule target.
struct TargetModules {
  std::vector<WrappableModule> plain, selective;
  /// The set a plan for `target` solves over: `selective` for sac, else `plain`.
  const std::vector<WrappableModule>& For(const std::string& target) const {
    return target == "sac" ? selective : plain;
  }
};

/// The modules of `in` for `target` (`pytorch`, `sac` or `schedule`), with
/// the selective sets for the sac target or where `with_selective` (a profile
/// only), each policy costing `sac_dispatch_us` per dispatched op. Throws
/// BadInput naming the input where the target needs module paths (a chain
/// whose stages name none) or a profile (sac).
TargetModules ModulesForTarget(const PlannerInput& in, const std::string& target, bool with_selective = false,
                               double sac_dispatch_us = kDefaultSacDispatchUs);

/// The row of `plan` under `name`: its peak, step time and overhead, and
/// whether its peak is within `budget_bytes`.
StrategyPoint StrategyPointOf(const std::string& name, const Plan& plan, int64_t budget_bytes);

/// For a selective plan, the rows beside its own: the best set of whole
/// modules (`plain`, without candidates; left out when `whole_modules` is
/// false, for a table whose plan is that one) and the hand-written policies
/// (HandWrittenSacPolicies around each layer of `selective`), each planned
/// as `request` asks (its budget), in the same model.
std::vector<std::pair<std::string, Plan>> SacComparisons(const PlannerInput& in,
                                                         const std::vector<WrappableModule>& selective,
                                                         const std::vector<WrappableModule>& plain,
                                                         const PlanRequest& request, bool whole_modules = true);

/// The strategy table at `request`'s budget: the baselines of its target
/// (none, every, every-N for each N of `every_n` between 2 and the chain's
/// length less one, sqrt), then `chosen` under `chosen_name` (no row when
/// empty). For an optimal plan of the modules targets, then: where
/// `modules.selective` is given, the selective comparisons (for a sac plan
/// the best set of whole modules where it fits, as the Python helper reads it; for
/// a pytorch plan the sac optimum where feasible; then the hand-written
/// policies), and the nested schedule's optimum where feasible.
std::vector<StrategyPoint> StrategyTable(const PlannerInput& in, const TargetModules& modules,
                                         const PlanRequest& request, const Plan& chosen,
                                         const std::string& chosen_name, const std::vector<int>& every_n = {});

}  // namespace ckplan
