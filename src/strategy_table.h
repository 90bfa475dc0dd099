#pragma once
// The strategy table: one row per checkpointing strategy (peak, step time,
// overhead, whether it fits the budget). `ckplan solve` and `ckplan report`
// print it on the terminal, and the report writes it in Markdown and HTML:
// every one of them takes its cells from StrategyTableRows.

#include <cstdint>
#include <string>
#include <vector>

#include "ckplan/planner/plan.h"
#include "ckplan/planner/units.h"

namespace ckplan {

struct StrategyPoint {
  std::string name;       ///< `none`, `every`, `every-4`, `sqrt (n=4)`, `optimal`
  int64_t peak_bytes = 0;
  double time_ms = 0;
  double overhead_pct = 0;
  bool fits = false;
};

/// The row of `plan` under `name`: its peak, step time and overhead, and
/// whether its peak is within `budget_bytes`.
StrategyPoint StrategyPointOf(const std::string& name, const Plan& plan, int64_t budget_bytes);

/// The header and one row of cells per point: strategy, peak (in `style`),
/// step (`12.34 ms`), overhead (FormatPct), fits (`yes`/`no`).
std::vector<std::vector<std::string>> StrategyTableRows(const std::vector<StrategyPoint>& points, UnitStyle style);

/// The table for a terminal (FormatTable, numbers right-aligned).
std::string StrategyTableText(const std::vector<StrategyPoint>& points, UnitStyle style);

}  // namespace ckplan
