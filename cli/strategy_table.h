#pragma once
// The strategy table: one row per checkpointing strategy (peak, step time,
// overhead, whether it fits the budget). `ckplan solve` and `ckplan report`
// print it on the terminal, and the report writes it in Markdown and HTML:
// every one of them takes its cells from StrategyTableRows.

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "planner/plan/plan.h"
#include "planner/plan/planner_input.h"
#include "planner/contracts/report_document.h"  // StrategyPoint
#include "planner/base/units.h"

namespace ckplan {

/// The row of `plan` under `name`: its peak, step time and overhead, and
/// whether its peak is within `budget_bytes`.
StrategyPoint StrategyPointOf(const std::string& name, const Plan& plan, int64_t budget_bytes);

/// For the sac target, the rows beside its own: the best set of whole
/// modules (`plain`, without candidates) and the hand-written policies
/// (HandWrittenSacPolicies around each layer of `selective`), each planned
/// as `request` asks (its budget), in the same model.
std::vector<std::pair<std::string, Plan>> SacComparisons(const PlannerInput& in,
                                                         const std::vector<WrappableModule>& selective,
                                                         const std::vector<WrappableModule>& plain,
                                                         const PlanRequest& request);

/// The header and one row of cells per point: strategy, peak (in `style`),
/// step (`12.34 ms`), overhead (FormatPct), fits (`yes`/`no`).
std::vector<std::vector<std::string>> StrategyTableRows(const std::vector<StrategyPoint>& points, UnitStyle style);

/// The table for a terminal (FormatTable, numbers right-aligned).
std::string StrategyTableText(const std::vector<StrategyPoint>& points, UnitStyle style);

}  // namespace ckplan
