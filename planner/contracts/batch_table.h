#pragma once
/// The batch table, `ckplan.batches/1`: what `ckplan solve MODEL --batch`
/// found at each batch it profiled (`--batch-table`), and what `ckplan
/// report --batches` draws. Torch-free.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace ckplan {

/// The best plan at one batch, when it fits the budget.
struct BatchPlanFit {
  int64_t peak_bytes = 0;
  double time_ms = 0;
  double overhead_pct = 0;
  std::string what;             ///< `wrap 3 modules`, `no checkpointing`
  double samples_per_s = 0;     ///< 0 where it cannot train the global batch (a batch that does not divide it)
  bool operator==(const BatchPlanFit& o) const;
};

struct BatchRow {
  int batch = 0;
  std::string error;            ///< not profiled: why (then nothing else is set)
  int64_t none_peak_bytes = 0;
  double none_ms = 0;
  bool none_fits = false;
  double none_samples_per_s = 0;   ///< 0 when it does not fit
  int64_t min_budget_bytes = 0;    ///< the best plan's smallest feasible budget
  std::optional<BatchPlanFit> plan;  ///< when the best plan fits the budget
  bool operator==(const BatchRow& o) const;
};

struct BatchTable {
  /// What was searched: `batch` (rows' `batch` is the batch, rates samples
  /// per second) or `seq` (rows' `batch` is the sequence length at the
  /// inputs' batch, rates tokens per second).
  std::string dimension = "batch";
  std::string model;
  int64_t budget_bytes = 0;
  int max_batch = 0;
  std::string device;
  std::optional<int> global_batch;
  int largest_none = 0;         ///< 0: none fits
  int largest_plan = 0;
  int fastest_none = 0;
  int fastest_plan = 0;
  int chosen = 0;               ///< the batch the plan was written for (0: none)
  std::vector<BatchRow> rows;   ///< by batch
  bool operator==(const BatchTable& o) const;
};

nlohmann::json BatchTableToJson(const BatchTable& table);

/// Reads a `ckplan.batches/1` document; throws BadInput naming `file` and
/// the field.
BatchTable BatchTableFromJson(const nlohmann::json& doc, const std::string& file);

}  // namespace ckplan
