#pragma once
/// What a training step holds besides its activations: the `fixed` part of
/// a plan, one type for a single process and for one rank of a
/// data-parallel or pipeline job.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "planner/base/units.h"

namespace ckplan {

/// What data parallelism shards: `none` (DDP: everything replicated),
/// `optimizer` (ZeRO-1), `grad` (ZeRO-2: gradients and optimizer state),
/// `full` (FSDP2 fully_shard, ZeRO-3: parameters too).
enum class ShardMode { kNone, kOptimizer, kGrad, kFull };

const char* ShardModeName(ShardMode mode);
/// Throws BadInput quoting `name` if unknown.
ShardMode ParseShardMode(const std::string& name);

/// How torch.optim runs an update (its `foreach` and `fused` flags):
/// `for-loop` (one parameter at a time; the default on the CPU), `foreach`
/// (a whole dtype group at once; the default on CUDA), `fused` (one kernel,
/// no temporaries; never the default).
enum class OptimizerImpl { kForLoop, kForeach, kFused };

const char* OptimizerImplName(OptimizerImpl impl);
/// Throws BadInput quoting `name` if unknown.
OptimizerImpl ParseOptimizerImpl(const std::string& name);

/// torch.optim options that change what an update allocates or the state
/// it keeps, off by default as in torch.optim: `weight_decay` a coupled
/// decay (Adam, SGD: `grad + weight_decay * param`, a new tensor; AdamW's
/// decay is decoupled, in place, and changes nothing), `amsgrad` (adam,
/// adamw: a third state tensor per parameter), `nesterov` (SGD with
/// momentum: `grad + momentum * buf`, a new tensor).
struct OptimizerFlags {
  double weight_decay = 0;
  bool amsgrad = false;
  bool nesterov = false;
  bool operator==(const OptimizerFlags& o) const {
    return weight_decay == o.weight_decay && amsgrad == o.amsgrad && nesterov == o.nesterov;
  }
  bool any() const { return weight_decay != 0 || amsgrad || nesterov; }
};

/// One of torch.optim's param groups (`ckplan solve --optimizer-groups`):
/// torch.optim's step() updates each group on its own, with its own
/// options, implementation and temporaries (freed before the next group).
/// `name` is the optimizer's (`sgd` or `momentum` per group: SGD's momentum
/// is a group option); `params` the parameters it updates, by name (as
/// named_parameters()), in its order. No `impl`: the optimizer's.
struct OptimizerGroup {
  std::string name;
  std::optional<OptimizerImpl> impl;
  OptimizerFlags flags;
  std::vector<std::string> params;
  bool operator==(const OptimizerGroup& o) const {
    return name == o.name && impl == o.impl && flags == o.flags && params == o.params;
  }
};

/// The optimizer a plan is priced for: its torch.optim name (`none`, `sgd`,
/// `momentum` for SGD with momentum, `adam`, `adamw`), how it runs and its
/// options. No `impl`: what torch picks on the plan's device
/// (DefaultOptimizerImpl). The one definition: `ckplan solve` parses its
/// options into it (ChooseOptimizer) and a plan's fixed part holds it.
/// `groups`: its param groups where given (`--optimizer-groups`), each
/// priced with its own options and parameters; none: one group of every
/// trainable parameter with `flags`.
struct OptimizerChoice {
  std::string name = "adam";
  std::optional<OptimizerImpl> impl;
  OptimizerFlags flags;
  std::vector<OptimizerGroup> groups;
  OptimizerChoice() = default;
  OptimizerChoice(const char* n) : name(n) {}  // NOLINT: "adam" reads as a choice
  OptimizerChoice(std::string n, std::optional<OptimizerImpl> i = std::nullopt) : name(std::move(n)), impl(i) {}
  bool operator==(const OptimizerChoice& o) const {
    return name == o.name && impl == o.impl && flags == o.flags && groups == o.groups;
  }
};

/// A param group as an optimizer of its own (its name, impl or else
/// `optimizer`'s, and flags; no groups).
OptimizerChoice GroupOptimizer(const OptimizerChoice& optimizer, const OptimizerGroup& group);

/// A module FSDP shards on its own (`fully_shard(module)`): its parameters
/// are gathered unsharded while it runs. The root unit (empty module) holds
/// the parameters no unit covers; FSDP2 keeps it unsharded from its forward
/// to its backward.
struct ShardUnit {
  std::string module;          ///< module path; empty for the root
  int64_t param_bytes = 0;     ///< unsharded
  int64_t shard_bytes = 0;     ///< this rank's shard (the first dimension padded to a multiple of the ranks)
  bool operator==(const ShardUnit& o) const;
};

/// Parameters, buffers, gradients and optimizer state, and for a rank of a
/// data-parallel job what sharding adds. All zero for a plain chain.
struct FixedMemory {
  int64_t param_bytes = 0;      ///< resident parameters (a rank's shard under `--shard full`)
  int64_t buffer_bytes = 0;     ///< buffers (replicated in every shard mode)
  int64_t grad_bytes = 0;       ///< gradients kept for the optimizer (sharded under `grad` and `full`)
  int64_t optimizer_bytes = 0;  ///< optimizer state (sharded unless `none`)
  /// The optimizer whose state this counts, as the plan writes it
  /// (`optimizer`, `optimizer_impl`, `optimizer_options`): its `impl` is
  /// always set, and its flags are those that change its memory
  /// (EffectiveFlags).
  OptimizerChoice optimizer = OptimizerChoice("none", OptimizerImpl::kForLoop);
  /// What the optimizer's update allocates at the step's end, as
  /// torch.optim runs it (planner/cost/optimizer_memory.h): the chain's
  /// `update_tmp_bytes`, counted there, listed here, not in total().
  int64_t update_tmp_bytes = 0;
  /// Time, not memory, but per optimizer like its state: the optimizer's
  /// update of every parameter, added to every predicted step (0 when
  /// unknown, as for a plain chain).
  double optimizer_step_ms = 0;
  /// Of grad_bytes, those the chain's stages carry (planner/cost/gradients.h):
  /// they appear during backward and are counted there, so they are listed
  /// but not in total(). 0: every gradient held for the whole step.
  int64_t backward_grad_bytes = 0;
  /// A data-parallel rank (`--data-parallel`, `--shard`); `shard` kNone and
  /// one rank for a single process.
  ShardMode shard = ShardMode::kNone;
  int data_parallel = 1;
  /// `full`: the root unit unsharded, plus the largest two adjacent units
  /// unsharded (the one running and the one prefetched).
  int64_t gathered_bytes = 0;
  /// `full`: the largest unit's unsharded gradient before its reduce-scatter;
  /// `grad`: the largest gradient bucket before its reduce-scatter (the
  /// largest unit). 0 for `none` and `optimizer` (DDP with
  /// gradient_as_bucket_view: its buckets are the gradients).
  int64_t reduce_bytes = 0;
  std::vector<ShardUnit> units;  ///< `full`: the units, root first
  int64_t total() const {
    return param_bytes + buffer_bytes + grad_bytes - backward_grad_bytes + optimizer_bytes + gathered_bytes +
           reduce_bytes;
  }
  bool operator==(const FixedMemory& o) const;
};

/// The fixed part in words, in `style`: `parameters 1.00 GiB + buffers 0 B +
/// gradients ... + adam state ... = total`, and the gradients counted as
/// they appear in backward where some are.
std::string DescribeFixed(const FixedMemory& fixed, UnitStyle style);

/// A data-parallel or pipeline rank's fixed part in words, with what
/// sharding adds (`gathered`, `reduce-scatter`) where some.
std::string DescribeRankFixed(const FixedMemory& rank, UnitStyle style);

}  // namespace ckplan
