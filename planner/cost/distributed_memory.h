#pragma once
/// What one rank of a data-parallel job holds besides its activations: the
/// parameters, gradients and optimizer state as each sharding mode divides
/// them (DDP, ZeRO-1, ZeRO-2, FSDP2 / ZeRO-3), plus what FSDP gathers
/// unsharded while a unit runs. Torch-free; docs/memory-model.md gives the
/// model and its sources.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// The chain stage each parameter belongs to, for a pipeline's stages: the
/// longest module path of a stage prefixing its name; a parameter of no
/// stage goes to stage 0.
std::vector<int> ParameterStages(const Chain& chain, const std::vector<ParameterRecord>& parameters);

/// Each parameter as one rank holds it when the optimizer's state is sharded
/// over `data_parallel` ranks: its first dimension split, rounded up (FSDP2's
/// dim-0 shards; ZeRO's flat partitions come to about the same). The
/// optimizer updates these, so its temporaries are theirs.
std::vector<ParameterRecord> ShardedParameters(const std::vector<ParameterRecord>& parameters, int data_parallel);

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
/// (throws BadInput naming `file`). With `flags.amsgrad` (adam, adamw), a
/// third state tensor the size of the rank's parameters. Throws BadInput
/// for data_parallel < 1.
FixedMemory RankFixedMemory(const Chain& chain, const std::vector<ParameterRecord>& parameters, int64_t param_bytes,
                            int64_t buffer_bytes, const std::string& optimizer, int data_parallel, ShardMode shard,
                            const std::string& file,
                            const OptimizerFlags& flags = {});

}  // namespace ckplan
