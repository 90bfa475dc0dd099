#pragma once
/// `ckplan solve` for distributed jobs as planner calls: a data-parallel
/// rank's plan (`--data-parallel`, `--shard`: the per-rank fixed part) and a
/// pipeline's (`--pipeline`, `--microbatches`, `--schedule`: a plan per
/// stage), each with its document; and what `--batch` compares for them.

#include <string>

#include "planner/base/units.h"
#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/plan_document.h"
#include "planner/plan/plan.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/solve.h"  // BatchPlans
#include "planner/solvers/pipeline.h"

namespace ckplan {

/// How the job is distributed, as `ckplan solve` takes it.
struct DistributedJob {
  int data_parallel = 1;
  std::string shard = "none";    ///< ShardModeName
  int pipeline = 1;
  int microbatches = 1;
  std::string schedule = "1f1b";  ///< PipelineScheduleName
  /// What a rank's plan is for: `pytorch` (modules each rank wraps,
  /// apply_rank_plan; a profile's default) or `schedule` (a chain's).
  std::string target = "pytorch";
};

/// Checks the counts (BadInput naming the option and the value).
void CheckDistributedJob(const DistributedJob& job);

/// One data-parallel rank: its fixed part, the chain it runs (its gradients
/// are in the fixed part) and its plan, and the plan's document.
struct DataParallelPlan {
  FixedMemory rank;
  Chain chain;
  Plan plan;
  PlanDocument document;
};

/// Plans one rank of `job` (pipeline 1) at `budget`. Throws
/// Error(kInfeasible) naming the per-rank minimum and fixed part.
DataParallelPlan PlanDataParallel(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget,
                                  int slots);

/// A pipeline's plan: the split and each stage's schedule, and the document
/// (its `distributed.stages` one plan per stage, in the same order).
struct PipelineJobPlan {
  PipelinePlan plan;
  PlanDocument document;
};

/// Plans `job` (pipeline > 1) at `budget`, per stage rank. Throws
/// Error(kInfeasible) naming the per-stage minimum.
PipelineJobPlan PlanPipelineJob(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget,
                                int slots);

/// One batch's per-rank answer for `--batch`: a data-parallel rank's optimal
/// plan and no checkpointing; for a pipeline the profile's batch is one
/// microbatch, and the time per microbatch is the step's ((microbatches +
/// stages - 1) x the slowest stage) over the microbatches, without
/// checkpointing at the fastest split.
BatchPlans DistributedPlanAtBatch(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget,
                                  int slots);

}  // namespace ckplan
