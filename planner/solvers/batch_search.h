#pragma once
/// The search for the largest batch that fits a budget, with and without
/// checkpointing (`ckplan solve MODEL --batch auto`). Each batch is judged by
/// a caller-given evaluation (in the CLI: a profile at that batch and the
/// plans solved from it), so every answer rests on a measurement at that
/// batch, never on an extrapolation: the search only picks which batches to
/// measure.
///
/// It measures 1, 2, 4, ... until the best plan no longer fits (or
/// `max_batch`), then narrows each bracket (last batch that fits, first that
/// does not) by interpolating the figure that decides it (no
/// checkpointing's peak, the plan's smallest feasible budget; both close to
/// affine in the batch), bisecting when an interpolation does not halve the
/// bracket. It ends with the largest batch that fits and the next one
/// measured not to. Fitting is assumed to be monotone in the batch (more
/// samples never need less memory).

#include <cstdint>
#include <functional>
#include <map>
#include <string>

namespace ckplan {

/// One batch, measured.
struct BatchPoint {
  int batch = 0;
  /// Empty when measured; else why the batch could not be (a profile that
  /// failed: the machine cannot hold it, or the model refuses the batch).
  /// A failed batch fits nothing.
  std::string error;
  bool none_fits = false;          ///< no checkpointing within the budget
  bool plan_fits = false;          ///< the best plan within the budget
  int64_t none_peak_bytes = 0;     ///< no checkpointing's predicted peak
  int64_t min_budget_bytes = 0;    ///< the plan's smallest feasible budget
  double none_ms = 0;              ///< no checkpointing's predicted step
  double plan_ms = 0;              ///< the best plan's predicted step (when it fits)
  double samples_per_s(bool with_plan) const;
};

using EvaluateBatch = std::function<BatchPoint(int batch)>;

struct BatchSearch {
  std::map<int, BatchPoint> points;  ///< every batch measured, by batch
  int largest_none = 0;              ///< 0: not even batch 1 fits without checkpointing
  int largest_plan = 0;              ///< 0: not even batch 1 fits with the best plan
  /// The batch with the most samples per second among those measured that
  /// fit with the best plan (0 when none does), and among those that fit
  /// without checkpointing.
  int fastest_plan = 0;
  int fastest_none = 0;
};

/// Sets the answers (largest_* and fastest_*) from `search->points`: the
/// largest measured batch that fits, and the most samples per second among
/// those that fit. SearchBatches ends with it; a caller that measures more
/// batches calls it again.
void SetAnswers(BatchSearch* search);

/// Searches batches 1..max_batch under `budget_bytes` (the figures the
/// evaluation returns are compared with it). `max_batch` >= 1.
BatchSearch SearchBatches(int max_batch, int64_t budget_bytes, const EvaluateBatch& evaluate);

}  // namespace ckplan
