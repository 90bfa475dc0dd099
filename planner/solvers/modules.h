#pragma once
/// The PyTorch target: the fastest set of disjoint modules to wrap in
/// non-reentrant torch.utils.checkpoint (what `apply_plan` does) under a
/// budget. A wrapped module keeps its input, drops what its ops save, and in
/// backward runs its forward again with autograd, each recomputed value
/// freed by the backward that uses it: on the chain, a segment of stages run
/// forward without autograd keeping its input, then recomputed with autograd
/// and back-propagated (the schedule `ModuleSchedule` writes). Memory is the
/// simulator's, in bytes, with no rounding.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"
#include "planner/contracts/schedule.h"

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
  /// its backward replayed op by op as ChainFromProfile does.
  std::vector<int64_t> held_in_bwd;
  /// Optional (empty, or per stage; -1 where unknown): the stage's backward
  /// peak above what it keeps and the gradients of later stages' parameters,
  /// as PyTorch runs it: its ops' backward replayed in reverse, the gradient
  /// of each of its output storages held until the op that made it has
  /// back-propagated, each gradient of its input made by the first op that
  /// back-propagates into it and held from then on, its parameters'
  /// gradients held once made, saved storages released when the profile
  /// measured it (TensorRecord::released_by: its own storages that later
  /// stages' backward released gone from the start), else by the op that
  /// made them; for the last stage, the model output released by the loss
  /// unless an op saves it. Replaces `grad(i+1) + grad(i) + bwd_tmp_bytes +
  /// held_in_bwd` (each at its maximum over the stage) in SolveModules.
  std::vector<int64_t> bwd_peak_bytes;
  /// Optional (empty, or per stage; -1 where unknown): the same replay as
  /// `ckplan run`'s executor runs the stage's backward (what the simulator
  /// and the schedule DPs take: Stage::bwd_run_peak_bytes). The executor
  /// holds every value of the stage's cuts (the model's inputs and each
  /// stage's output storages, skip connections included) and the gradient
  /// of the stage's output to the stage's end: only the stage's other saved
  /// storages are released (as measured), none by later stages' backward,
  /// the model output not by the loss.
  std::vector<int64_t> run_bwd_peak_bytes;
  /// What torch.utils.checkpoint keeps per wrapped module from its forward
  /// to the end of its backward beyond tensors (preserve_rng_state: the CPU
  /// generator's state, torch.get_rng_state(), 5,056 B; with CUDA each
  /// device's too, 16 B). 0: not counted (chains without a profile).
  int64_t checkpoint_state_bytes = 0;
  /// The loss and the gradient its backward starts from (two float32
  /// scalars, kLossScalarBytes), held by the caller from the loss to the
  /// backward's end: counted by PyTorch's accounting. 0: not counted (chains
  /// without a profile).
  int64_t loss_scalar_bytes = 0;
};

constexpr int64_t kLossScalarBytes = 8;

/// A parameter goes to the last op (and stage) that uses it: by the module
/// that owns it (its own ops, else its submodules'); a weight tied into a
/// module that owns no parameter of that shape (an `lm_head` sharing
/// `wte.weight`) is found by the shapes of that module's op arguments that
/// are not its tensor inputs; one no op is found to use goes to the last
/// stage (alive through the whole backward). `bytes` sums to every parameter's.
StageGradients StageGradientBytes(const Chain& chain, const Profile& profile);

/// The schedule of wrapping `wrapped` (disjoint, by stage range): per
/// wrapped module its first stage forward keeping its input, the rest
/// without autograd, and in backward all of it again with autograd, then
/// its backward.
Schedule ModuleSchedule(int length, const std::vector<WrappableModule>& wrapped);

/// How memory is counted: as the simulator (and `ckplan run`'s executor)
/// does, every stage output held while anything may read it; or as
/// PyTorch's autograd does under apply_plan, where a stage output no op saves
/// is freed once read, unless a wrapped module holds it as its input
/// (recomputation is still counted as the simulator counts it).
enum class ModuleAccounting { kSimulator, kPyTorch };

struct ModuleSolution {
  bool feasible = false;
  std::vector<WrappableModule> wrapped;  ///< in stage order
  Schedule schedule;                      ///< ModuleSchedule of wrapped
  double time_ms = 0;
  /// The peak by the accounting solved for (chain input included): the
  /// simulator's peak of `schedule` for kSimulator.
  int64_t peak_bytes = 0;
  /// Held when the loss starts, chain input excluded: for kPyTorch, what
  /// saved_tensors_hooks see plus the wrapped modules' inputs and the outputs.
  int64_t kept_bytes = 0;
};

/// The fastest set of `modules` to wrap whose peak, counted value by value
/// as the simulator counts a chain without storages, is within
/// `budget_bytes` (the chain input included), by `accounting`: exact, by a Pareto frontier of
/// (bytes held, time) over the stage boundaries. Infeasible: feasible false.
/// `grads` (empty, or one per stage: StageGradientBytes): the gradients
/// counted as PyTorch allocates them, those of stages after k held during
/// stage k's backward with its own `held_in_bwd` (and those after
/// a wrapped module during its recomputation), none during the forward; the
/// peak then includes them.
ModuleSolution SolveModules(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget_bytes,
                            ModuleAccounting accounting = ModuleAccounting::kSimulator,
                            const StageGradients& grads = {});

/// Wrapping exactly `wrapped` (disjoint, by stage range), counted as
/// SolveModules counts it: a baseline in the PyTorch target's accounting
/// (feasible is true; peak_bytes whatever it is).
ModuleSolution EvaluateModules(const Chain& chain, const std::vector<WrappableModule>& wrapped,
                               ModuleAccounting accounting = ModuleAccounting::kSimulator,
                               const StageGradients& grads = {});

/// The smallest budget (chain input included) for which SolveModules is feasible.
int64_t MinimumModulesMemory(const Chain& chain, const std::vector<WrappableModule>& modules,
                             ModuleAccounting accounting = ModuleAccounting::kSimulator,
                             const StageGradients& grads = {});

}  // namespace ckplan
