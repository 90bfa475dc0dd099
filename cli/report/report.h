#pragma once
// `ckplan report`: the report model, the memory/time trade-off of a model
// with strategies compared (report_figures.h draws it, report_writers.h
// writes it as HTML, Markdown or JSON). Torch-free: planner values only.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/plan/planner_input.h"
#include "planner/plan/plan.h"
#include "planner/contracts/batch_table.h"
#include "planner/contracts/run_report.h"
#include "cli/report/report_distributed.h"
#include "cli/strategy_table.h"

namespace ckplan {

/// A run report from `ckplan run -o` (`--runs`), and its file's name.
struct RunPoint {
  std::string label;  ///< file name
  RunReport run;
};

struct Report {
  std::string source;            ///< the input file
  std::string title;             ///< model path or chain
  int64_t budget_bytes = 0;
  UnitStyle style = UnitStyle::kBinary;
  FixedMemory fixed;
  double no_recompute_ms = 0;
  std::vector<StrategyPoint> strategies;
  std::vector<CurvePoint> optimal_curve;  ///< every budget from the smallest feasible up
  /// `pytorch` for a profile (the plans apply_plan applies; the nested
  /// schedule's optimum is the row `optimal (schedule)` and the curve),
  /// `schedule` for a chain.
  std::string target = "schedule";
  Plan chosen;                   ///< the optimal plan at the budget, for `target`
  Chain chain;
  std::vector<RunPoint> runs;
  DistributedSummary distributed;  ///< `--plan` of a distributed plan: per-rank memory; empty otherwise
  std::optional<BatchTable> batches;  ///< `--batches` (solve --batch-table): samples per second by batch
};

/// Sweeps the budgets (one DP gives the whole optimal curve) and plans every
/// strategy. `budget_bytes` 0: halfway between the smallest feasible budget
/// and the no-checkpointing peak. `progress` (may be empty) hears the
/// fraction done of its two optimal solves.
Report MakeReport(const PlannerInput& input, const std::string& source, int64_t budget_bytes, UnitStyle style,
                  int slots, const std::vector<int>& every_n, const std::vector<std::string>& run_files,
                  const std::function<void(double)>& progress = nullptr);


}  // namespace ckplan
