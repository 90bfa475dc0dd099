#pragma once
/// What the optimizer holds: its state per parameter byte (the step's fixed
/// part), and the temporaries its update makes at the step's end, as
/// torch.optim's for-loop, foreach and fused implementations make them.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// The optimizers the planner prices, as `--optimizer` names them.
const std::vector<std::string>& OptimizerNames();

/// The optimizer a job names (`--optimizer` and the options beside it, as
/// `ckplan solve` and `report` take them): `named`'s name and flags, with
/// SGD's `momentum` (above 0: `momentum`, SGD with a buffer) and `impl`
/// (`auto`, or an OptimizerImplName; auto leaves it to the profile's
/// device, or foreach where `on_gpu`, what torch picks on CUDA). Throws
/// BadInput naming an option the optimizer does not have.
OptimizerChoice ChooseOptimizer(const OptimizerChoice& named, double momentum, const std::string& impl, bool on_gpu);

/// `chosen` (ChooseOptimizer's) with its param groups (`--optimizer-groups`
/// FILE, read from `file`): a group without a name is `chosen`'s, and each
/// is an optimizer of its kind (adam, adamw, or SGD with or without
/// momentum, each group its own) with the options it has; no parameter in
/// two groups. Throws BadInput naming `file` and the group.
OptimizerChoice WithOptimizerGroups(OptimizerChoice chosen, std::vector<OptimizerGroup> groups,
                                    const std::string& file);

/// Checks that every parameter `optimizer`'s groups name is one of
/// `profile`'s (by name, as named_parameters()); throws BadInput naming
/// the first that is not, and `profile_path`. No groups: nothing to check.
void CheckOptimizerGroups(const OptimizerChoice& optimizer, const Profile& profile, const std::string& profile_path);

/// Optimizer state per parameter byte: none/sgd 0, momentum 1 (SGD's
/// momentum buffer), adam/adamw 2 (both moments; their `step` counters, 4 B
/// per parameter, are added by FixedMemoryOf, which knows the parameters).
/// Throws BadInput for an unknown name.
FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer);

/// What torch picks when the job sets neither `foreach` nor `fused`: foreach
/// where the parameters are on CUDA (a profile measured there, or priced for
/// a GPU with `profile --gpu`), for-loop elsewhere.
OptimizerImpl DefaultOptimizerImpl(const Profile& profile);

/// `optimizer.impl`, or the default for `profile`.
OptimizerImpl ResolvedImpl(const OptimizerChoice& optimizer, const Profile& profile);

/// The options that change `optimizer`'s memory: a coupled weight decay
/// (adam, sgd, momentum; adamw's decoupled one changes nothing), amsgrad
/// (adam, adamw), nesterov (momentum); the others off.
OptimizerFlags EffectiveFlags(const OptimizerChoice& optimizer);

/// What one `optimizer.step()` of torch.optim allocates beyond the state,
/// at its highest, over `parameters` in model.parameters() order (one
/// param group), measured with torch.profiler's memory timeline on torch
/// 2.15 (tests/python/test_optimizer_memory.py checks it):
/// - adam/adamw, for-loop: each parameter's denominator, `sqrt(v) / bc2`
///   (two of its size while the division runs) made while the previous
///   parameter's is still held: max over i of 2 x bytes[i] + bytes[i-1];
///   adam with a weight decay, 3 x bytes[i] (`grad + wd * param` held too).
/// - adam/adamw, foreach: the square roots of a whole dtype group, made
///   while the previous group's are still held (a decay's copy of the
///   group's gradients is dropped before them).
/// - fused: 12 B for adam/adamw (scalars), 0 for sgd.
/// - sgd and momentum: with a weight decay, `grad + wd * param` of a
///   parameter (for-loop) or a dtype group (foreach); nesterov's
///   `grad + momentum * buf` one more parameter's (for-loop; in place in
///   foreach); momentum's scalars with the first; plain sgd 0.
/// The scalars the update wraps as tensors (a double and one of the
/// parameter's dtype) are added where they are alive.
/// With param groups (`optimizer.groups`), torch.optim updates one group
/// at a time, its temporaries freed before the next: the largest group's,
/// each over those of `parameters` it names, in its order, with its own
/// options and implementation (`impl` where it has none); a parameter in
/// no group is not updated.
int64_t UpdateTmpBytes(const OptimizerChoice& optimizer, OptimizerImpl impl,
                       const std::vector<ParameterRecord>& parameters);

/// What torch.amp.GradScaler holds through the optimizer's step in a job
/// under fp16 autocast (the profile's environment.autocast `float16`): its
/// scale, growth tracker and found-inf flag, 4 B each; FixedMemoryOf counts
/// it with the optimizer's state.
constexpr int64_t kGradScalerBytes = 12;

/// The fixed part of a step of `profile`'s model with `optimizer`:
/// parameters, buffers, gradients and optimizer state, the gradients that
/// `chain` (ChainFromProfile's) carries counted as they appear in backward
/// (backward_grad_bytes), the update's temporary (listed, counted in the
/// chain) and the optimizer's update time where the profile timed it.
/// With param groups, the state is each group's, with its options (SGD's
/// momentum buffer only in a group with momentum, amsgrad's tensor only
/// where set), and a trainable parameter in no group has none; the
/// groups' `impl` are resolved as the optimizer's (ResolvedImpl) and
/// their flags are those that change their memory (EffectiveFlags).
/// Throws BadInput for an unknown optimizer.
FixedMemory FixedMemoryOf(const Profile& profile, const Chain& chain, const OptimizerChoice& optimizer);

}  // namespace ckplan
