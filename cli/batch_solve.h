#pragma once
/// `ckplan solve MODEL --batch auto`: the largest batch that fits the budget,
/// with and without checkpointing, and the batch and plan that train the
/// most samples per second. Each batch it answers for is profiled at that
/// batch (`ckplan profile`, run as a child process: `ckplan` stays
/// LibTorch-free) and solved; planner/solvers/batch_search.h picks which
/// batches to profile.

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "planner/base/units.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/solve.h"  // BatchPlans

namespace CLI {
class App;
}

namespace ckplan {

struct BatchOptions {
  std::string mode;             ///< --batch: auto (the fastest), largest, or a number; empty: off
  int max_batch = 4096;         ///< --max-batch
  std::vector<std::string> inputs;  ///< --input, as `ckplan profile` takes them; the first dimension is the batch
  std::string device = "cpu";   ///< --device for the profiles
  std::string dtype;            ///< --dtype for the profiles
  int reps = 0;                 ///< --reps for the profiles (0: profile's default)
  std::string profiles_dir;     ///< --profiles: keep each batch's profile here
  std::string table_out;        ///< --batch-table: the table as JSON (ckplan.batches/1)
  int global_batch = 0;         ///< --global-batch: micro-batches accumulated to this many samples
  std::string scope;            ///< what the figures are of, for a distributed job: `per rank (of 8)`, `per pipeline`
  /// --seq (auto, largest or N) and --max-seq: the same search over the
  /// second dimension of the integer inputs (token ids, labels, masks) at
  /// the inputs' batch, in tokens per second. cmd_solve sets `dim` 1 and
  /// copies them into mode and max_batch (Normalized).
  std::string seq;
  int max_seq = 65536;
  int dim = 0;                  ///< 0: the batch (the first dimension of every input); 1: the sequence
  bool given() const { return !mode.empty() || !seq.empty(); }
  const char* DimName() const { return dim == 1 ? "seq" : "batch"; }
  const char* RateName() const { return dim == 1 ? "tokens/s" : "samples/s"; }
  /// --seq as the search runs it: mode and max_batch from --seq and --max-seq.
  BatchOptions Normalized() const;
};

using SolveAtBatch = std::function<BatchPlans(const PlannerInput&)>;

void AddBatchOptions(CLI::App* cmd, BatchOptions* options);
/// Throws BadInput for an option out of range, before any work.
void CheckBatchOptions(const BatchOptions& options);

/// Profiles `model` at the batches the search needs, prints the table and
/// the answers on `human`, writes --batch-table, and returns the planner
/// input (its profile) of the batch --batch chooses. Exit code 3 (Error)
/// when not even a batch of 1 fits.
PlannerInput SolveBatches(const BatchOptions& options, const std::string& model, const std::string& gpu,
                          const ByteQuantity& budget, const OptimizerChoice& optimizer, const SolveAtBatch& solve,
                          FILE* human);

}  // namespace ckplan
