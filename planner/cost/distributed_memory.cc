#include "planner/cost/distributed_memory.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "planner/base/error.h"
#include "planner/cost/optimizer_memory.h"

namespace ckplan {

int64_t ShardBytes(const ParameterRecord& p, int data_parallel) {
  if (p.shape.empty() || p.shape[0] == 0) return p.shape.empty() ? p.bytes : 0;
  const int64_t rows = p.shape[0];
  const int64_t row_bytes = p.bytes / rows;
  return (rows + data_parallel - 1) / data_parallel * row_bytes;
}

namespace {

int64_t CeilDiv(int64_t bytes, int parts) { return (bytes + parts - 1) / parts; }

bool Prefixes(const std::string& module, const std::string& name) {
  return name.size() > module.size() && name.compare(0, module.size(), module) == 0 && name[module.size()] == '.';
}

}  // namespace

std::vector<int> ParameterStages(const Chain& chain, const std::vector<ParameterRecord>& parameters) {
  std::vector<int> owner;
  for (const ParameterRecord& p : parameters) {
    int best = 0;
    size_t best_length = 0;
    for (int i = 0; i < chain.length(); ++i) {
      for (const std::string& m : chain.stages[static_cast<size_t>(i)].modules) {
        if (Prefixes(m, p.name) && m.size() >= best_length) {
          best = i;
          best_length = m.size();
        }
      }
    }
    owner.push_back(best);
  }
  return owner;
}

std::vector<ParameterRecord> ShardedParameters(const std::vector<ParameterRecord>& parameters, int data_parallel) {
  std::vector<ParameterRecord> out;
  for (ParameterRecord p : parameters) {
    int64_t elements = 1;
    for (int64_t d : p.shape) elements *= d;
    if (elements > 0 && !p.shape.empty() && data_parallel > 1) {
      const int64_t element = p.bytes / elements;
      p.shape[0] = (p.shape[0] + data_parallel - 1) / data_parallel;
      int64_t shard = 1;
      for (int64_t d : p.shape) shard *= d;
      p.bytes = shard * element;
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<ShardUnit> DefaultShardUnits(const Chain& chain, const std::vector<ParameterRecord>& parameters,
                                         int data_parallel) {
  std::vector<ShardUnit> units(1);  // the root first
  for (const Stage& stage : chain.stages) {
    for (const std::string& module : stage.modules) {
      if (!module.empty()) units.push_back({module, 0, 0});
    }
  }
  for (const ParameterRecord& p : parameters) {
    size_t best = 0, best_length = 0;
    for (size_t u = 1; u < units.size(); ++u) {
      if (Prefixes(units[u].module, p.name) && units[u].module.size() >= best_length) {
        best = u;
        best_length = units[u].module.size();
      }
    }
    units[best].param_bytes += p.bytes;
    units[best].shard_bytes += ShardBytes(p, data_parallel);
  }
  std::vector<ShardUnit> owning;
  for (size_t u = 0; u < units.size(); ++u) {
    if (u == 0 || units[u].param_bytes > 0) owning.push_back(units[u]);
  }
  return owning;
}

FixedMemory RankFixedMemory(const Chain& chain, const std::vector<ParameterRecord>& parameters, int64_t param_bytes,
                           int64_t buffer_bytes, const std::string& optimizer, int data_parallel, ShardMode shard,
                           const std::string& file, const OptimizerFlags& flags) {
  if (data_parallel < 1) {
    throw BadInput("invalid --data-parallel " + std::to_string(data_parallel) + ": must be at least 1");
  }
  FixedMemory m;
  m.shard = shard;
  m.data_parallel = data_parallel;
  m.optimizer.name = optimizer;
  m.buffer_bytes = buffer_bytes;
  // ZeRO-1/2 (DeepSpeed) partition flat buffers evenly; FSDP2 shards each
  // parameter on dim 0, padded to a multiple of the ranks.
  const int64_t even_shard = CeilDiv(param_bytes, data_parallel);
  // amsgrad's max_exp_avg_sq: one more tensor the size of the rank's parameters.
  const bool amsgrad = flags.amsgrad && (optimizer == "adam" || optimizer == "adamw");
  auto state_of = [&optimizer, amsgrad](int64_t bytes) {
    return FixedMemoryFor(bytes, 0, optimizer).optimizer_bytes + (amsgrad ? bytes : 0);
  };
  switch (shard) {
    case ShardMode::kNone:
      m.param_bytes = m.grad_bytes = param_bytes;
      m.optimizer_bytes = state_of(param_bytes);
      break;
    case ShardMode::kOptimizer:
      m.param_bytes = m.grad_bytes = param_bytes;
      m.optimizer_bytes = state_of(even_shard);
      break;
    case ShardMode::kGrad: {
      m.param_bytes = param_bytes;
      m.grad_bytes = even_shard;
      m.optimizer_bytes = state_of(even_shard);
      int64_t largest = 0;
      for (const ShardUnit& u : DefaultShardUnits(chain, parameters, data_parallel)) largest = std::max(largest, u.param_bytes);
      m.reduce_bytes = data_parallel > 1 ? (parameters.empty() ? param_bytes : largest) : 0;
      break;
    }
    case ShardMode::kFull: {
      if (parameters.empty()) {
        throw BadInput(file + ": the profile has no 'parameters' list, which --shard full needs (FSDP units): "
                              "profile the model again with this ckplan");
      }
      m.units = DefaultShardUnits(chain, parameters, data_parallel);
      int64_t shard_bytes = 0;
      for (const ParameterRecord& p : parameters) shard_bytes += ShardBytes(p, data_parallel);
      m.param_bytes = m.grad_bytes = shard_bytes;
      m.optimizer_bytes = state_of(shard_bytes);
      if (data_parallel > 1) {
        // The root stays gathered from its forward to its backward; of the
        // other units, the one running and the next one (prefetched: the
        // following unit in forward, the previous one in backward).
        int64_t pair = 0, largest = 0;
        for (size_t u = 1; u < m.units.size(); ++u) {
          largest = std::max(largest, m.units[u].param_bytes);
          int64_t next = u + 1 < m.units.size() ? m.units[u + 1].param_bytes : 0;
          pair = std::max(pair, m.units[u].param_bytes + next);
        }
        m.gathered_bytes = m.units[0].param_bytes + pair;
        m.reduce_bytes = std::max(largest, m.units[0].param_bytes);
      }
      break;
    }
  }
  if (data_parallel == 1) m.reduce_bytes = 0;
  return m;
}

}  // namespace ckplan
