#pragma once
/// Parameter gradients in the memory model: they appear during backward.
///
/// PyTorch allocates a parameter's `.grad` in the backward of its last use
/// in the forward (AccumulateGrad keeps the tensor the op's backward
/// produced), and `optimizer.zero_grad()` (set_to_none, the default since
/// PyTorch 2.0) frees them before the next forward. So a chain carries them
/// per stage (Stage::param_grad_bytes, Stage::param_grad_bwd_bytes): stage
/// i's gradients come into existence at stage i's backward and stay to the
/// end of the step. The simulator, the schedule DPs, the baselines and the
/// PyTorch target all count them so; the fixed part of the step then keeps
/// parameters, buffers and optimizer state only. ChainFromProfile sets them
/// from these figures; the solvers read them from the chain.

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"
#include "planner/cost/liveness.h"

namespace ckplan {

/// Parameter gradients as PyTorch allocates them: a parameter's `.grad` is
/// made by the backward of its last use in the forward (AccumulateGrad keeps
/// the tensor the op's backward produced) and `zero_grad(set_to_none=True)`
/// frees it before the next forward.
struct StageGradients {
  /// Per stage: the gradient bytes its backward allocates.
  std::vector<int64_t> bytes;
  /// Per stage: its own gradients held at its backward's peak on top of its
  /// bwd_tmp_bytes (the profiler measures an op's backward with the
  /// gradients it makes; those of the stage's later ops are then held):
  /// its backward replayed op by op as the stage's bwd_tmp_bytes is.
  std::vector<int64_t> held_at_bwd_peak_bytes;
  /// Optional (empty, or per stage; unset where unknown): the stage's backward
  /// peak above what it keeps and the gradients of later stages' parameters,
  /// as PyTorch runs it: its ops' backward replayed in reverse, the gradient
  /// of each of its output storages that some tensor requiring grad lives in
  /// (not a mask or rotary table passed along) held until the op that made it has
  /// back-propagated, each gradient of its input made by the first op that
  /// back-propagates into it and held from then on, its parameters'
  /// gradients held once made, saved storages released when the profile
  /// measured it (TensorRecord::released_by: its own storages that later
  /// stages' backward released gone from the start), else by the op that
  /// made them; for the last stage, the model output released by the loss
  /// unless an op saves it. Replaces `grad(i+1) + grad(i) + bwd_tmp_bytes +
  /// held_at_bwd_peak_bytes` (each at its maximum over the stage) in SolveModules.
  std::vector<std::optional<int64_t>> pytorch_bwd_peak_bytes;
  /// Optional (empty, or per stage; unset where unknown): the same replay as
  /// `ckplan run`'s executor runs the stage's backward (what the simulator
  /// and the schedule DPs take: Stage::executor_bwd_peak_bytes). The executor
  /// holds every value of the stage's cuts (the model's inputs and each
  /// stage's output storages, skip connections included) and the gradient
  /// of the stage's output to the stage's end: only the stage's other saved
  /// storages are released (as measured), none by later stages' backward,
  /// the model output not by the loss.
  std::vector<std::optional<int64_t>> executor_bwd_peak_bytes;
  /// What torch.utils.checkpoint keeps per wrapped module from its forward
  /// to the end of its backward beyond tensors (preserve_rng_state: the CPU
  /// generator's state, torch.get_rng_state(), 5,056 B; with CUDA each
  /// device's too, 16 B). 0: not counted (chains without a profile).
  int64_t checkpoint_state_bytes = 0;
};

/// A parameter goes to the last op (and stage) that uses it: by the module
/// that owns it (its own ops, else its submodules'); a weight tied into a
/// module that owns no parameter of that shape (an `lm_head` sharing
/// `wte.weight`) is found by the shapes of that module's op arguments that
/// are not its tensor inputs; one no op is found to use goes to the last
/// stage (alive through the whole backward); a frozen one (requires_grad false) has none. `bytes` sums to
/// every trainable parameter's.
/// `chain` is the profile's, cut (ChainFromProfile, before its gradients are
/// set); `liveness` the profile's.
StageGradients GradientsFromProfile(const Chain& chain, const Profile& profile, const Liveness& liveness);

/// The chain without parameter gradients (all 0): for a job that holds
/// them for the whole step (a data-parallel rank's gradient buckets, a
/// pipeline stage with several microbatches in flight), counted in the fixed
/// part instead.
Chain WithoutParamGrads(Chain chain);

}  // namespace ckplan
