#pragma once
// What a recomputation costs as `ckplan run` runs it (the profiler,
// torch): a stage run of the executor costs more than its ops' forward
// without autograd as the profile times it, op by op right after another
// forward. It binds the values at its cut and restores the random state and
// the buffers (a fixed cost per stage run), and it runs in a training step,
// after an optimizer's update and a backward, with colder caches, and the
// backward that follows it finds the recomputed values fresh in the caches
// (costs in proportion to the ops' work). And the step without
// recomputation, stage by stage in a loop of steps, is not the step the
// profile timed whole and alone.

#include <torch/script.h>

#include <vector>

#include "planner/contracts/profile.h"
#include "libtorch/runtime/device.h"
#include "libtorch/runtime/graph_program.h"

namespace ckplan {

/// The profile's Calibration (planner/contracts/profile.h), measured on the
/// stages ChainFromProfile cuts `profile` into (its ops' fwd_nograd_ms
/// filled in), with adam (the planner's default) updating the
/// parameters after each step: rounds (at least `pairs`, more on small
/// models) of a step without recomputation and one with every stage
/// checkpointed, in alternating order, then a forward without autograd,
/// timed in turn stage by stage as recomputations or whole as one first
/// run. run_step_ms: the median step without recomputation; stage_run_ms:
/// the median difference (stage by stage less whole) over the stages less
/// one, at least 0 (unset where the profile cuts into a single stage);
/// nograd_scale: the median difference of the two steps, less a stage run
/// per stage, over the sum of the ops' fwd_nograd_ms (at least 0.25).
/// The first rounds after the warm-up (at least `pairs`, more on small
/// models) also run the PyTorch target's step as `ckplan run` runs it
/// (ScheduleRunner::RunModules), the order turning: nothing wrapped, every
/// single-stage module a plan can wrap (WrappableModules) wrapped, and the
/// outermost such modules wrapped. module_step_ms: the median step nothing
/// wrapped; the two sets' median differences from it, each n wraps over
/// ops of o ms (fwd_nograd_ms), solved for checkpoint_call_ms (per wrap, at
/// least 0) and module_nograd_scale (per ms of ops, at least 0.25); where
/// no module spans several stages, the scale alone (checkpoint_call_ms
/// unset). Without `schedules`, the PyTorch target's figures only (the
/// module rounds, no step without recomputation or with every stage
/// checkpointed, no stage runs timed): run_step_ms, stage_run_ms and
/// nograd_scale unset.
Calibration MeasureCalibration(const Profile& profile, GraphProgram& program, const torch::jit::Module& module,
                               const std::vector<at::Tensor>& inputs, const DeviceInfo& device, int pairs,
                               bool schedules = true);

}  // namespace ckplan
