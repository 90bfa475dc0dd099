#pragma once
/// Selective activation checkpointing (`--target sac`, PyTorch's
/// torch.utils.checkpoint.create_selective_checkpoint_contexts): which ops of
/// a wrapped module a plan may save, how a policy finds them in the eager
/// run, and what saving each holds and saves.
///
/// A policy sees the ops PyTorch's dispatcher runs, below autograd, not the
/// exported program's: `aten::linear` arrives as mm or addmm,
/// `aten::layer_norm` as native_layer_norm, a fused attention as its kernel.
/// So an op is named by its family and its index among the module's ops of
/// that family; only ops that make exactly one op of their family, whose
/// output is that op's, are candidates (attention on the CPU with dropout
/// runs its math path: two matrix products, neither its output).

#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"
#include "planner/cost/wrappable_modules.h"

namespace ckplan {

/// An op family a selective policy counts, with the ops PyTorch's
/// dispatcher runs for it (the names of torch.ops.aten's overload packets:
/// `aten::linear` arrives as mm or addmm, `aten::layer_norm` as
/// native_layer_norm, attention as its fused kernel on each device).
struct SacFamily {
  std::string name;
  std::vector<std::string> dispatched;
};
/// Every family, the one list: the planner's candidates are named by these
/// families, `--target sac` plans carry the list (`pytorch.sac_families`) and
/// ckplan_torch's policy counts the dispatched ops by it.
const std::vector<SacFamily>& SacFamilies();

/// How `op` appears to a policy on `device` (the profile's, `cpu` or other):
/// its family (empty: none), how many ops of it, and whether one of them
/// carries its output (so that saving it is saving the op).
struct SacDispatch {
  std::string family;
  int count = 0;
  bool carries_output = false;
  /// The dispatched op returns more than the visible output (a norm's mean
  /// and rstd, attention's logsumexp), which saving it holds too.
  bool returns_more = false;
};
SacDispatch SacDispatchOf(const OpRecord& op, const std::string& device);

/// How many ops the policy's dispatch mode handles for `op` in the module's
/// forward (the dispatcher's ops, detach included), estimated from its kind
/// and arguments: a linear on a batch of sequences is view, t, mm and
/// _unsafe_view; dropout is empty_like, bernoulli_, div_ and mul; attention's
/// math path about 26; batch norm and activations that save their output 2;
/// an op that copies nothing (`to` its own dtype, `contiguous` of a
/// contiguous tensor) none; any other op one. tests/python/test_sac.py holds
/// it to the count in PyTorch on every test model.
int SacDispatchedOps(const Profile& profile, const OpRecord& op, const std::string& device);

/// What a selective-checkpointing policy adds per op of a wrapped module's
/// forward, in microseconds: PyTorch runs the forward under
/// _CachingTorchDispatchMode and the recomputation under
/// _CachedTorchDispatchMode, each a Python call per op. Measured (forward and
/// backward) on a stack of tiny transformer-like layers with CPython 3.11
/// and torch 2.15 on the machine of docs/measurements.md (28-31 us; Llama's
/// layers 35, GPT-2's 70); ckplan_torch.plan measures the job's own.
constexpr double kDefaultSacDispatchUs = 30;

/// Fills each module's sac_candidates and sac_family_counts from the
/// profile the chain was cut from. A candidate's output must be its own
/// storage (not a view of its input) that no later op of the module writes
/// in place (PyTorch refuses a saved output that changed).
/// Each module's sac_dispatch_ms is its forward's dispatched ops times
/// `dispatch_us`: what its policy costs once it saves anything.
void AddSacCandidates(const Profile& profile, const Chain& chain, std::vector<WrappableModule>* modules,
                      double dispatch_us = kDefaultSacDispatchUs);

/// The save sets of `module`'s candidates worth solving with (indices, the
/// empty set first): every subset no other beats on bytes held at every point
/// of the module's forward and recomputation and on time, when it has at most
/// kExactSacCandidates candidates; beyond, the Pareto frontier of (bytes
/// held, time saved), at most kMaxSacVariants sets. `exact` says which.
constexpr int kExactSacCandidates = 12;
constexpr int kMaxSacVariants = 256;
std::vector<std::vector<int>> SacVariants(const WrappableModule& module, bool* exact = nullptr);

/// The selective-checkpointing policies people write by hand, by name: the
/// families each saves in every layer (`mm`: PyTorch's "save matmuls";
/// every family: "all but pointwise").
struct HandWrittenSacPolicy {
  std::string name;
  std::vector<std::string> families;
};
std::vector<HandWrittenSacPolicy> HandWrittenSacPolicies();

/// The model's layers (the modules a container of the profile holds, as
/// transformers' gradient_checkpointing_enable() wraps them; else the
/// modules of one stage each, as `every` wraps them), each saving its
/// candidates of `families`. `modules` carry their candidates.
std::vector<WrappableModule> LayersSaving(const std::vector<WrappableModule>& modules, const Profile& profile,
                                          const std::vector<std::string>& families);

}  // namespace ckplan
