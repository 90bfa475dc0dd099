#pragma once
/// Parameter gradients in the memory model: they appear during backward.
///
/// PyTorch allocates a parameter's `.grad` in the backward of its last use
/// in the forward, and `optimizer.zero_grad()` (set_to_none, the default
/// since PyTorch 2.0) frees them before the next forward. So a chain carries
/// them per stage (Stage::param_grad_bytes, Stage::param_grad_bwd_bytes):
/// stage i's gradients come into existence at stage i's backward and stay to
/// the end of the step. The simulator, the schedule DPs, the baselines and
/// the PyTorch target all count them so; the fixed part of the step then
/// keeps parameters, buffers and optimizer state only.

#include <cstdint>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"
#include "planner/solvers/modules.h"

namespace ckplan {

/// Sets every stage's param_grad_bytes and param_grad_bwd_bytes from the
/// profile's `parameters` and ops (StageGradientBytes: each parameter once,
/// a tied one at its first gradient). Returns the bytes attached: every
/// parameter's, or 0 for a profile without a `parameters` list (the chain
/// is then left as it is, and gradients stay in the fixed part).
int64_t AttachParamGrads(Chain* chain, const Profile& profile);

/// The chain without parameter gradients (all 0): for a job that holds
/// them for the whole step (a data-parallel rank's gradient buckets, a
/// pipeline stage with several microbatches in flight), counted in the fixed
/// part instead.
Chain WithoutParamGrads(Chain chain);

/// The chain's gradients in the form the PyTorch target's solver takes:
/// per stage, what its backward makes and what its peak holds of them.
StageGradients StageGradientsOf(const Chain& chain);

}  // namespace ckplan
