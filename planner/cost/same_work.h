#pragma once
/// Ops that do the same work (a transformer's layers, a ResNet's repeated
/// blocks), timed together: each op's time the median of every sample of
/// its group, so that layers that do the same work cost the same to the
/// planner (a plan's choice between them is then a tie its rule decides, not
/// the measurement's noise), and the noise those samples show.

#include <vector>

#include "planner/contracts/profile.h"

namespace ckplan {

/// Per op of `profile`, the id of the first op of its group: ops of the same
/// kind with the same tensor arguments (shapes and dtypes, parameters
/// included where the profile lists them, else its inputs and outputs), and
/// the same dropout, approximation and causal flag. With `backward`, also the
/// same inputs requiring gradients and the same for the parameters of its
/// module (trained, frozen or none), which decide what its backward computes
/// (the first layer's, fed the model's input, computes no input gradient).
std::vector<int> SameWorkGroups(const Profile& profile, bool backward);

struct PooledTimes {
  std::vector<double> ms;  ///< per op: the median of its group's samples
  /// The samples' spread: the median over the ops in groups of two or more
  /// samples, weighted by time, of each sample's distance from its group's
  /// median, relative to it, in percent; unset when no group has two.
  std::optional<double> noise_pct;
};

/// `samples[op]` (one per repetition, each op's own) pooled by `groups`
/// (SameWorkGroups').
PooledTimes PoolSamples(const std::vector<int>& groups, const std::vector<std::vector<double>>& samples);

}  // namespace ckplan
