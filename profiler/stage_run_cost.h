#pragma once
// What a recomputation costs as `ckplan run` runs it (profiler-internal,
// torch): a stage run of the executor costs more than its ops' forward
// without autograd as the profile times it, op by op right after another
// forward. It binds the values at its cut and restores the random state and
// the buffers (a fixed cost per stage run), and it runs in a training step,
// after an optimizer's update and a backward, with colder caches (a cost
// in proportion to the ops' work).

#include <torch/script.h>

#include <vector>

#include "ckplan/planner/profile.h"
#include "device.h"
#include "torch_graph.h"

namespace ckplan {

struct RecomputeCost {
  double stage_run_ms = -1;   ///< per stage run, beyond its ops; -1: not measured
  double nograd_scale = -1;   ///< a step's forward without autograd over its ops' fwd_nograd_ms; -1: not measured
};

/// Measured on the stages ChainFromProfile cuts `profile` into (its ops'
/// fwd_nograd_ms filled in). In turn, `pairs` times each: a step of the
/// schedule without recomputation (adam's update, the planner's default,
/// included), then the forward without autograd timed either stage by
/// stage as recomputations or whole as one first run. nograd_scale: the
/// median whole forward over the sum of the ops' fwd_nograd_ms;
/// stage_run_ms: the median difference (cut less whole) over the stages
/// less one, at least 0 (-1 where the profile cuts into a single stage).
RecomputeCost MeasureRecomputeCost(const Profile& profile, GraphProgram& program, const torch::jit::Module& module,
                                   const std::vector<at::Tensor>& inputs, const DeviceInfo& device, int pairs);

}  // namespace ckplan
