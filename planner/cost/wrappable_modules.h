#pragma once
/// The modules a PyTorch training job can wrap in torch.utils.checkpoint
/// (what `apply_plan` does), as ranges of a chain's stages.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// An op whose output a selective-checkpointing plan (`--target sac`) may
/// save inside a wrapped module (CheckpointPolicy.MUST_SAVE): the rest of the
/// module is recomputed in backward, the saved ops' outputs are taken from
/// what was saved instead (planner/cost/sac_candidates.h).
struct SacCandidate {
  int op = 0;               ///< the profile's op id
  std::string kind;         ///< `aten::linear`, as the profile names it
  /// The ops PyTorch's dispatcher runs for it, as a selective-checkpointing
  /// policy sees them (`mm`: mm, addmm, bmm, baddbmm; `convolution`;
  /// `layer_norm`: native_layer_norm; `group_norm`; `sdpa`: the fused
  /// attention kernels), and its index among the module's ops of that family
  /// in execution order: how apply_plan finds it in the eager run.
  std::string family;
  int occurrence = 0;
  int stage = 0;            ///< the chain stage it runs in
  /// What saving it holds from the module's forward to its recomputation:
  /// its outputs' storages (id, bytes as the chain counts them), and what
  /// the dispatched op returns beyond them (native_layer_norm's mean and
  /// rstd) under the id -1 - op.
  std::vector<std::pair<int64_t, int64_t>> storages;
  double recompute_ms = 0;  ///< what rerunning it in the recomputation costs (what saving it saves)
  /// What saving it holds: its storages' bytes.
  int64_t bytes() const {
    int64_t total = 0;
    for (const auto& entry : storages) total += entry.second;
    return total;
  }
  std::vector<int64_t> shape;  ///< its first output's, checked by apply_plan
};

/// A module `apply_plan` can wrap, as the stages [first_stage, last_stage]
/// whose ops are exactly the module's.
struct WrappableModule {
  WrappableModule() = default;
  WrappableModule(std::string path_, int first, int last)
      : path(std::move(path_)), first_stage(first), last_stage(last) {}
  std::string path;
  int first_stage = 0;
  int last_stage = 0;
  /// For `--target sac`: the ops it may save, and per family the count of
  /// the module's ops the policy will see (apply_plan checks them); empty
  /// for plain checkpointing.
  std::vector<SacCandidate> sac_candidates;
  std::map<std::string, int> sac_family_counts;
  /// The save sets worth solving with (SacVariants), the empty one first.
  std::vector<std::vector<int>> sac_variants;
  /// The candidates (indices) saved when it is wrapped; empty: plain
  /// torch.utils.checkpoint, everything recomputed.
  std::vector<int> sac_saved;
  /// Wrapped with a selective-checkpointing policy (`--target sac`).
  bool selective = false;
  /// The ops its forward dispatches (SacDispatchedOps), and what the
  /// policy's dispatch mode adds to the step when it saves any
  /// (planner/cost/sac_candidates.h).
  int sac_dispatched_ops = 0;
  double sac_dispatch_ms = 0;
};

/// The modules of `profile` whose ops are one contiguous run that starts and
/// ends at stage cuts of `chain` (a module run twice, or cut inside a stage,
/// cannot be wrapped), one per stage range (the outermost path). Without a
/// profile (nullptr): the stages that are exactly one module.
std::vector<WrappableModule> WrappableModules(const Chain& chain, const Profile* profile);

}  // namespace ckplan
