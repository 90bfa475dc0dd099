#pragma once
/// Where a profile's ops are cut into the chain's stages: along the module tree.
///
/// The top-level module is split at its children; a child module is split
/// further at its own children only when that adds no live tensor at the
/// cuts (a plain chain of blocks is split, a residual block is not). A cut
/// carries every tensor live across it (skip connections included, each
/// storage once) and never falls just before an op that writes in place.

#include <string>
#include <vector>

#include "planner/contracts/profile.h"
#include "planner/cost/liveness.h"

namespace ckplan {

/// Op ranges [first, last] of the stages, in order, covering every op.
struct StageCut {
  int first_op;
  int last_op;
  std::string name;                  ///< `layer1.0`, or `conv1..maxpool`
  std::vector<std::string> modules;  ///< module paths the stage covers (whole modules)
};

/// The stages of `profile`. Throws BadInput for a profile without ops.
std::vector<StageCut> CutStages(const Profile& profile);

/// The same with `liveness` of that profile already built (ChainFromProfile
/// builds one for the cuts and the stage costs: on 1000-op profiles it is
/// worth not building twice); `profile` has ops.
std::vector<StageCut> CutStages(const Profile& profile, const Liveness& liveness);

}  // namespace ckplan
