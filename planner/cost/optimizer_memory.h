#pragma once
/// What the optimizer holds: its state per parameter byte (the step's fixed
/// part), and the temporary its update makes at the step's end.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// Optimizer state per parameter byte: none/sgd 0, momentum 1, adam 2.
/// Throws BadInput for an unknown name.
FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer);

/// The temporary of one update of `parameters` by `optimizer` as `ckplan
/// run` applies it, at the step's end (every gradient made: with gradients
/// appearing in backward the step's end can be its peak). adam updates each
/// parameter in slices of 64K elements: its denominator is at most that
/// many of the largest parameter's elements, and the scalars it wraps as
/// tensors (12 B) are alive meanwhile. 0 for the other optimizers, which
/// update in place.
int64_t UpdateTmpBytes(const std::string& optimizer, const std::vector<ParameterRecord>& parameters);

/// The fixed part of a step of `profile`'s model with `optimizer`:
/// parameters, buffers, gradients and optimizer state, the gradients that
/// `chain` (ChainFromProfile's) carries counted as they appear in backward
/// (backward_grad_bytes), and the optimizer's update time where the profile
/// timed it. Throws BadInput for an unknown optimizer.
FixedMemory FixedMemoryOf(const Profile& profile, const Chain& chain, const std::string& optimizer);

}  // namespace ckplan
