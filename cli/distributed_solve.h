#pragma once
/// `ckplan solve` for distributed jobs: --data-parallel/--shard (per-rank
/// fixed part) and --pipeline/--microbatches/--schedule (a plan per stage).
/// Kept apart from cmd_solve.cc, which only registers and dispatches.

#include <string>

#include "cli/batch_solve.h"
#include "planner/plan/planner_input.h"
#include "planner/base/units.h"

namespace CLI {
class App;
}

namespace ckplan {

struct DistributedOptions {
  int data_parallel = 1;
  std::string shard = "none";
  int pipeline = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";
  bool given = false;  ///< any of the options was on the command line
  /// What a rank's plan is for: `pytorch` (modules each rank wraps,
  /// apply_rank_plan; a profile's default) or `schedule` (a chain's).
  std::string target = "pytorch";
};

/// Registers the options on `solve`; call `Finish` in its callback.
void AddDistributedOptions(CLI::App* cmd, DistributedOptions* options);
/// Sets `given` from the parsed options.
void FinishDistributedOptions(CLI::App* cmd, DistributedOptions* options);

/// Checks the counts (exit 2 naming the value) before any work.
void CheckDistributedOptions(const DistributedOptions& options);

/// Solves, prints what a person reads to `human`, writes the plan to
/// `output` (may be empty). Throws Error(kInfeasible) for a budget below the
/// per-rank minimum, naming it.
int RunDistributedSolve(const DistributedOptions& options, const PlannerInput& in, const ByteQuantity& budget,
                        int slots, const std::string& optimizer, const std::string& output);

/// One batch's per-rank answer for `--batch` (cli/batch_solve.h): a data
/// parallel rank's optimal plan and no checkpointing; for a pipeline the
/// profile's batch is one microbatch, and the time per microbatch is the
/// step's ((microbatches + stages - 1) x the slowest stage) over the
/// microbatches, without checkpointing at the fastest split.
BatchPlans DistributedBatchPlans(const DistributedOptions& options, const PlannerInput& in, const ByteQuantity& budget,
                                 int slots, const std::string& optimizer);

}  // namespace ckplan
