#pragma once
// `ckplan report --plan plan.json` for a distributed plan (`solve
// --data-parallel` or `--pipeline`): what each rank or pipeline stage is
// predicted to hold, as rows the report's writers print.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/contracts/report_document.h"  // RankMemoryRow, DistributedSummary: the report contract
#include "planner/base/units.h"

namespace ckplan {

/// Reads a distributed plan. Throws BadInput naming the file and field for
/// a plan that is not one (no `distributed` object).
DistributedSummary ReadDistributedPlan(const std::string& path);

std::string DistributedHtml(const DistributedSummary& summary, UnitStyle style);
std::string DistributedMarkdown(const DistributedSummary& summary, UnitStyle style);

}  // namespace ckplan
