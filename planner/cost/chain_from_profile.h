#pragma once
/// The chain for a profile, built in one place: what the solvers read.

#include <string>

#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// The finished chain for `profile`, with the step's `optimizer` (none,
/// sgd, momentum, adam). Its stages are cut along the module tree
/// (stage_cuts.h); per stage, times summed over its ops (a forward without
/// autograd at the profile's calibration), output bytes at its cut, saved
/// bytes (what its ops keep for backward, plus its output), transient peaks
/// from the ops' tensors' lifetimes; the parameter gradients as PyTorch
/// allocates them, where the profile lists its parameters (gradients.h:
/// each stage's, its backward's peak as PyTorch and as `ckplan run`'s
/// executor run it, what torch.utils.checkpoint keeps per wrapped module);
/// the optimizer update's temporary at the step's end (optimizer_memory.h).
/// Checked as a chain file is (ValidateChain) before it is returned: throws
/// BadInput naming `file` (the profile's, for messages) and the field.
Chain ChainFromProfile(const Profile& profile, const std::string& file = "profile",
                       const OptimizerChoice& optimizer = OptimizerChoice("adam"));

}  // namespace ckplan
