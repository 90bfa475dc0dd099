#pragma once
/// What `ckplan solve` and `ckplan report` read: a chain file, or a profile
/// that is cut into a chain. Dispatches on the document's "schema".

#include <string>

#include <nlohmann/json.hpp>

#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/plan/plan.h"
#include "planner/contracts/profile.h"

namespace ckplan {

struct PlannerInput {
  bool from_profile = false;
  Chain chain;
  FixedMemory fixed;        ///< zero for a chain
  PlanSource source;        ///< written into plans and sweeps: where the chain came from
  Profile profile;          ///< when from_profile
};

/// The `source` a plan made from `profile` carries: the model's sha256,
/// path and inputs.
PlanSource ProfileSource(const Profile& profile, const std::string& profile_path);

/// The planner's input for a profile read from (or to be written to)
/// `path`: its chain, with the parameter gradients on its stages, and the
/// fixed part of the step with `optimizer` state.
PlannerInput PlannerInputFromProfile(Profile profile, const std::string& path, const OptimizerChoice& optimizer);

/// Reads `path`. For a profile, the fixed part of the step is parameters,
/// buffers, gradients and `optimizer` state. Throws BadInput naming the file.
PlannerInput LoadPlannerInput(const std::string& path, const OptimizerChoice& optimizer);

}  // namespace ckplan
