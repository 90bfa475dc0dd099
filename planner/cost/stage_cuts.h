#pragma once
// The stage cuts with a liveness already built (planner-internal:
// ChainFromProfile builds one Liveness for the cuts and the stage costs,
// which on 1000-op profiles is worth not building twice).

#include <vector>

#include "planner/contracts/profile.h"
#include "planner/cost/stages.h"
#include "planner/cost/liveness.h"

namespace ckplan {

/// CutStages(profile) with `liveness` of that profile; `profile` has ops.
std::vector<StageCut> CutStages(const Profile& profile, const Liveness& liveness);

}  // namespace ckplan
