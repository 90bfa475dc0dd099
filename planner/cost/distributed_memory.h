#pragma once
/// What one rank of a data-parallel job holds besides its activations: the
/// parameters, gradients and optimizer state as each sharding mode divides
/// them (DDP, ZeRO-1, ZeRO-2, FSDP2 / ZeRO-3), plus what FSDP gathers
/// unsharded while a unit runs. Torch-free; see the README ("Distributed
/// plans") for the model and its sources.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/plan/plan.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// `none` (DDP: everything replicated), `optimizer` (ZeRO-1), `grad`
/// (ZeRO-2: gradients and optimizer state), `full` (FSDP2 fully_shard,
/// ZeRO-3: parameters too).
enum class ShardMode { kNone, kOptimizer, kGrad, kFull };

const char* ShardModeName(ShardMode mode);
/// Throws BadInput quoting `name` if unknown.
ShardMode ParseShardMode(const std::string& name);

/// A module FSDP shards on its own (`fully_shard(module)`): its parameters
/// are gathered unsharded while it runs. The root unit (empty name) holds the
/// parameters no unit covers; FSDP2 keeps it unsharded from its forward to its
/// backward.
struct ShardUnit {
  std::string name;            ///< module path; empty for the root
  int64_t param_bytes = 0;     ///< unsharded
  int64_t shard_bytes = 0;     ///< this rank's shard (the first dimension padded to a multiple of the ranks)
};

/// The per-rank fixed part of the step, by component.
struct RankMemory {
  ShardMode shard = ShardMode::kNone;
  int data_parallel = 1;
  int64_t param_bytes = 0;       ///< resident parameters (this rank's shard under `full`)
  int64_t buffer_bytes = 0;      ///< buffers (replicated in every mode)
  int64_t grad_bytes = 0;        ///< gradients kept for the optimizer (sharded under `grad` and `full`)
  int64_t optimizer_bytes = 0;   ///< optimizer state (sharded unless `none`)
  std::string optimizer = "adam";
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
    return param_bytes + buffer_bytes + grad_bytes + optimizer_bytes + gathered_bytes + reduce_bytes;
  }
  /// The same total as a FixedMemory (for MakePlan): the gathered and reduce
  /// parts are counted with the parameters and gradients.
  FixedMemory AsFixed() const;
};

/// The units FSDP shards by default: each module a chain stage covers
/// (`Stage::modules`) that owns parameters; the rest is the root unit.
/// Parameters are assigned to the longest module path prefixing their name.
std::vector<ShardUnit> DefaultShardUnits(const Chain& chain, const std::vector<ParameterRecord>& parameters,
                                         int data_parallel);

/// The bytes of one rank's FSDP2 shard of `p`: dim 0 split in ceil(dim0 / N)
/// rows per rank (scalars are not split).
int64_t ShardBytes(const ParameterRecord& p, int data_parallel);

/// The fixed part one rank holds. `parameters` (from the profile) may be
/// empty: sharded sizes are then ceil(bytes / N) and `full` needs the list
/// (throws BadInput naming `file`). Throws BadInput for data_parallel < 1.
RankMemory RankFixedMemory(const Chain& chain, const std::vector<ParameterRecord>& parameters, int64_t param_bytes,
                           int64_t buffer_bytes, const std::string& optimizer, int data_parallel, ShardMode shard,
                           const std::string& file);

/// A RankMemory as the plan contract writes it (`distributed.ranks[].fixed`,
/// `pipeline_stage.fixed`: plan_document.h).
PlanRankFixed RankFixedOf(const RankMemory& memory);

}  // namespace ckplan
