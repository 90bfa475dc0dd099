#pragma once
// The strategy table as the CLI shows it: `ckplan solve` and `ckplan report`
// print it on the terminal, and the report writes it in Markdown and HTML;
// every one of them takes its cells from StrategyTableRows. The rows are the
// planner's (planner/plan/strategies.h).

#include <string>
#include <vector>

#include "planner/base/units.h"
#include "planner/contracts/plan_document.h"  // StrategyPoint

namespace ckplan {

/// The header and one row of cells per point: strategy, peak (in `style`),
/// step (`12.34 ms`), overhead (FormatPct), fits (`yes`/`no`).
std::vector<std::vector<std::string>> StrategyTableRows(const std::vector<StrategyPoint>& points, UnitStyle style);

/// The table for a terminal (FormatTable, numbers right-aligned).
std::string StrategyTableText(const std::vector<StrategyPoint>& points, UnitStyle style);

}  // namespace ckplan
