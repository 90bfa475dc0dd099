#pragma once
/// The PyTorch export of a plan: the modules a training job wraps with
/// torch.utils.checkpoint (apply_plan), and what that amounts to.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/schedule.h"
#include "planner/cost/simulator.h"
#include "planner/solvers/modules.h"

namespace ckplan {

/// What a PyTorch training job does with a plan: wrap whole modules with
/// torch.utils.checkpoint (non-reentrant, RNG state kept), each on its own.
/// Checkpointed stages that are not whole modules cannot be wrapped and are
/// run normally. The schedule that amounts to is simulated like any other.
struct ModuleExport {
  std::vector<std::string> checkpoint_modules;
  std::vector<std::string> skipped_stages; ///< checkpointed in the plan, not whole modules
  Schedule schedule;                       ///< per wrapped module: forward keeping its input, recomputed once
  SimulationResult simulation;
  /// Its peak, of the chain: the simulation's, or the module solver's (the
  /// PyTorch target's accounting) where that solver chose the modules.
  int64_t peak_bytes = 0;
  /// The step as the PyTorch target prices it, the optimizer's update
  /// aside: every stage's forward and backward, per wrapped module its
  /// stages' Stage::ModuleNoGradFwdMs() and PyTorchModuleCosts::checkpoint_call_ms, and
  /// Chain::ModuleLossBwdMs().
  double time_ms = 0;
  /// Kept for backward when the loss starts under PyTorch's autograd (which
  /// frees what no op saves), model inputs excluded: needs storages; else
  /// the simulation's figure.
  int64_t held_at_loss_bytes = 0;
  /// The wrapped modules, with what a selective-checkpointing plan saves in
  /// each (WrappableModule::sac_saved).
  std::vector<WrappableModule> wrapped;
};

/// The export of `checkpointed` stages (empty when the chain has no module paths).
ModuleExport ExportForPyTorch(const Chain& chain, const std::vector<int>& checkpointed);

/// The export of wrapping exactly `wrapped` (disjoint stage ranges).
ModuleExport ExportForModules(const Chain& chain, const std::vector<WrappableModule>& wrapped);

}  // namespace ckplan
