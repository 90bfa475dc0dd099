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
#include "planner/contracts/schedule.h"
#include "planner/cost/wrappable_modules.h"

namespace ckplan {

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
  /// SolveModules: plans whose time is within `tie_ms` of the fastest's
  /// (the chain's time_noise_pct of the fastest's recomputation) are tied,
  /// and the one chosen has the largest peak, then the earliest modules;
  /// `tied_plans` others were within it (0: the fastest had no rival).
  double tie_ms = 0;
  int tied_plans = 0;
};

/// The fastest set of `modules` to wrap (or, of the sets within the
/// chain's time noise of the fastest, the one with the largest peak, then
/// the earliest modules: the same plan from every profile of a model) whose
/// peak, counted value by value
/// as the simulator counts a chain without storages, is within
/// `budget_bytes` (the chain input included), by `accounting`: exact, by a Pareto frontier of
/// (bytes held, time) over the stage boundaries. Infeasible: feasible false.
/// The chain's parameter gradients (Stage::param_grad_bytes, as a chain
/// cut from a profile carries them: gradients.h) are counted as PyTorch
/// allocates them: those of stages after k held during stage k's backward
/// with its own (Chain::GradsAtBackwardPeakBytes), and those after a wrapped module
/// during its recomputation, none during the forward. A stage's backward
/// is its replay as PyTorch runs it where the chain has it
/// (Stage::pytorch_bwd_peak_bytes), and each wrapped module holds
/// PyTorchModuleCosts::checkpoint_state_bytes.
ModuleSolution SolveModules(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget_bytes,
                            ModuleAccounting accounting = ModuleAccounting::kSimulator);

/// Wrapping exactly `wrapped` (disjoint, by stage range), counted as
/// SolveModules counts it: a baseline in the PyTorch target's accounting
/// (feasible is true; peak_bytes whatever it is).
ModuleSolution EvaluateModules(const Chain& chain, const std::vector<WrappableModule>& wrapped,
                               ModuleAccounting accounting = ModuleAccounting::kSimulator);

/// The smallest budget (chain input included) for which SolveModules is feasible.
int64_t MinimumModulesMemory(const Chain& chain, const std::vector<WrappableModule>& modules,
                             ModuleAccounting accounting = ModuleAccounting::kSimulator);

}  // namespace ckplan
