#include "planner/contracts/fixed_memory.h"

#include "planner/base/error.h"

namespace ckplan {

const char* ShardModeName(ShardMode mode) {
  switch (mode) {
    case ShardMode::kNone: return "none";
    case ShardMode::kOptimizer: return "optimizer";
    case ShardMode::kGrad: return "grad";
    case ShardMode::kFull: return "full";
  }
  return "none";
}

ShardMode ParseShardMode(const std::string& name) {
  for (ShardMode m : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGrad, ShardMode::kFull}) {
    if (name == ShardModeName(m)) return m;
  }
  throw BadInput("unknown --shard '" + name + "' (use none, optimizer, grad or full)");
}

const char* OptimizerImplName(OptimizerImpl impl) {
  switch (impl) {
    case OptimizerImpl::kForLoop: return "for-loop";
    case OptimizerImpl::kForeach: return "foreach";
    case OptimizerImpl::kFused: return "fused";
  }
  return "for-loop";
}

OptimizerImpl ParseOptimizerImpl(const std::string& name) {
  for (OptimizerImpl i : {OptimizerImpl::kForLoop, OptimizerImpl::kForeach, OptimizerImpl::kFused}) {
    if (name == OptimizerImplName(i)) return i;
  }
  throw BadInput("unknown optimizer implementation '" + name + "' (use for-loop, foreach or fused)");
}

bool ShardUnit::operator==(const ShardUnit& o) const {
  return module == o.module && param_bytes == o.param_bytes && shard_bytes == o.shard_bytes;
}

bool FixedMemory::operator==(const FixedMemory& o) const {
  return param_bytes == o.param_bytes && buffer_bytes == o.buffer_bytes && grad_bytes == o.grad_bytes &&
         optimizer_bytes == o.optimizer_bytes && optimizer == o.optimizer &&
         optimizer_impl == o.optimizer_impl && optimizer_flags == o.optimizer_flags && update_tmp_bytes == o.update_tmp_bytes &&
         optimizer_step_ms == o.optimizer_step_ms && backward_grad_bytes == o.backward_grad_bytes &&
         shard == o.shard && data_parallel == o.data_parallel && gathered_bytes == o.gathered_bytes &&
         reduce_bytes == o.reduce_bytes && units == o.units;
}

}  // namespace ckplan
