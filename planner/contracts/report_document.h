#pragma once
/// The report contract, `ckplan.report/1`, as one value: what `ckplan report
/// -o report.json` writes (cli/report/report.cc makes it from the report model).
/// Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/contracts/batch_table.h"
#include "planner/contracts/sweep_document.h"

namespace ckplan {

/// A run report (`--runs`) as the report lists it.
struct ReportRun {
  std::string file;
  std::string algorithm;
  int64_t measured_peak_bytes = 0;
  double measured_ms = 0;
  int64_t predicted_peak_bytes = 0;
  double predicted_ms = 0;
  std::string verdict;
  bool operator==(const ReportRun& o) const;
};

/// What one rank (or pipeline stage) of a distributed plan is predicted to hold.
struct RankMemoryRow {
  std::string label;              ///< `rank (each of 8)`, `stage 0`
  int64_t param_bytes = 0, grad_bytes = 0, optimizer_bytes = 0, buffer_bytes = 0;
  int64_t gathered_bytes = 0;     ///< FSDP: unsharded parameters, plus the reduce-scatter buffer
  int64_t activation_budget_bytes = 0;
  int in_flight = 1;              ///< microbatches held at once (pipeline)
  int64_t stored_bytes = 0;       ///< kept after the forward, per microbatch (pipeline); 0 otherwise
  int64_t peak_bytes = 0;
  bool operator==(const RankMemoryRow& o) const;
};

struct DistributedSummary {
  std::string what;               ///< `2 ranks, --shard full` or `2 stages, 1f1b, 4 microbatches`
  std::vector<RankMemoryRow> rows;
  bool operator==(const DistributedSummary& o) const;
};

struct ReportDocument {
  std::string source;             ///< the input file
  int64_t budget_bytes = 0;
  int64_t fixed_bytes = 0;
  double no_recompute_ms = 0;
  std::vector<StrategyPoint> strategies;
  std::vector<CurvePoint> optimal_curve;  ///< every budget from the smallest feasible up
  std::vector<ReportRun> runs;
  std::optional<DistributedSummary> distributed;  ///< `--plan` of a distributed plan
  std::optional<BatchTable> batches;              ///< `--batches`: the batch table (ckplan.batches/1)
  bool operator==(const ReportDocument& o) const;
};

/// The `ckplan.report/1` document.
nlohmann::json ReportToJson(const ReportDocument& report);

/// Reads a `ckplan.report/1` document; every field but `distributed` and
/// `batches` is required. Throws BadInput naming `file` and the field.
ReportDocument ReportFromJson(const nlohmann::json& doc, const std::string& file);

}  // namespace ckplan
