#pragma once
// `ckplan report --plan plan.json` for a distributed plan (`solve
// --data-parallel` or `--pipeline`): what each rank or pipeline stage is
// predicted to hold, as rows the report's writers print.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "ckplan/planner/units.h"

namespace ckplan {

struct RankMemoryRow {
  std::string label;              ///< `rank (each of 8)`, `stage 0`
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, buffer_bytes = 0;
  int64_t gathered_bytes = 0;     ///< FSDP: unsharded parameters, plus the reduce-scatter buffer
  int64_t activation_budget_bytes = 0;
  int in_flight = 1;              ///< microbatches held at once (pipeline)
  int64_t stored_bytes = 0;       ///< kept after the forward, per microbatch (pipeline); 0 otherwise
  int64_t peak_bytes = 0;
};

struct DistributedSummary {
  std::string what;               ///< `2 ranks, --shard full` or `2 stages, 1f1b, 4 microbatches`
  std::vector<RankMemoryRow> rows;
};

/// Reads a distributed plan. Throws BadInput naming the file and field for
/// a plan that is not one (no `distributed` object).
DistributedSummary ReadDistributedPlan(const std::string& path);

std::string DistributedHtml(const DistributedSummary& summary, UnitStyle style);
std::string DistributedMarkdown(const DistributedSummary& summary, UnitStyle style);
nlohmann::json DistributedJson(const DistributedSummary& summary);

}  // namespace ckplan
