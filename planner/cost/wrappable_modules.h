#pragma once
/// The modules a PyTorch training job can wrap in torch.utils.checkpoint
/// (what `apply_plan` does), as ranges of a chain's stages.

#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// A module `apply_plan` can wrap, as the stages [first_stage, last_stage]
/// whose ops are exactly the module's.
struct WrappableModule {
  std::string path;
  int first_stage = 0;
  int last_stage = 0;
};

/// The modules of `profile` whose ops are one contiguous run that starts and
/// ends at stage cuts of `chain` (a module run twice, or cut inside a stage,
/// cannot be wrapped), one per stage range (the outermost path). Without a
/// profile (nullptr): the stages that are exactly one module.
std::vector<WrappableModule> WrappableModules(const Chain& chain, const Profile* profile);

}  // namespace ckplan
