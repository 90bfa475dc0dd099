#pragma once
/// `ckplan solve` for distributed jobs: --data-parallel/--shard (per-rank
/// fixed part) and --pipeline/--microbatches/--schedule (a plan per stage).
/// The planning is planner/plan/distributed_plan.h's; this registers the
/// options and prints.

#include <string>

#include "planner/base/units.h"
#include "planner/plan/distributed_plan.h"
#include "planner/plan/planner_input.h"

namespace CLI {
class App;
}

namespace ckplan {

/// Registers the options on `solve`.
void AddDistributedOptions(CLI::App* cmd, DistributedJob* job);
/// Whether any of them was on the command line (in the callback).
bool DistributedOptionsGiven(CLI::App* cmd);

/// Solves, prints what a person reads (on stderr where the plan goes to
/// stdout), writes the plan to `output` (may be empty). Throws
/// Error(kInfeasible) for a budget below the per-rank minimum, naming it.
int RunDistributedSolve(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget, int slots,
                        const std::string& output);

}  // namespace ckplan
