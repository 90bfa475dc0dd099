#include "planner/contracts/fixed_memory.h"

#include "planner/base/error.h"
#include "planner/base/format.h"

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

OptimizerChoice GroupOptimizer(const OptimizerChoice& optimizer, const OptimizerGroup& group) {
  OptimizerChoice one(group.name, group.impl ? group.impl : optimizer.impl);
  one.flags = group.flags;
  return one;
}

bool ShardUnit::operator==(const ShardUnit& o) const {
  return module == o.module && param_bytes == o.param_bytes && shard_bytes == o.shard_bytes;
}

bool FixedMemory::operator==(const FixedMemory& o) const {
  return param_bytes == o.param_bytes && buffer_bytes == o.buffer_bytes && grad_bytes == o.grad_bytes &&
         optimizer_bytes == o.optimizer_bytes && optimizer == o.optimizer && update_tmp_bytes == o.update_tmp_bytes &&
         optimizer_step_ms == o.optimizer_step_ms && backward_grad_bytes == o.backward_grad_bytes &&
         shard == o.shard && data_parallel == o.data_parallel && gathered_bytes == o.gathered_bytes &&
         reduce_bytes == o.reduce_bytes && units == o.units;
}

std::string DescribeFixed(const FixedMemory& fixed, UnitStyle style) {
  auto bytes = [style](int64_t value) { return FormatBytes(value, style); };
  const int64_t whole_step_grads = fixed.grad_bytes - fixed.backward_grad_bytes;
  std::string text = Format("parameters %s + buffers %s + ", bytes(fixed.param_bytes).c_str(), bytes(fixed.buffer_bytes).c_str());
  if (whole_step_grads > 0 || fixed.backward_grad_bytes == 0) text += "gradients " + bytes(whole_step_grads) + " + ";
  text += Format("%s state %s", fixed.optimizer.name.c_str(), bytes(fixed.optimizer_bytes).c_str());
  if (!fixed.optimizer.groups.empty()) text += Format(" (%zu param groups)", fixed.optimizer.groups.size());
  text += " = " + bytes(fixed.total());
  // One memory model: gradients appear during backward, stage by stage.
  if (fixed.backward_grad_bytes > 0) text += "; gradients " + bytes(fixed.backward_grad_bytes) + " counted as they appear in backward";
  return text;
}

std::string DescribeRankFixed(const FixedMemory& m, UnitStyle style) {
  auto b = [style](int64_t v) { return FormatBytes(v, style); };
  std::string text = Format("parameters %s + buffers %s + gradients %s + %s state %s", b(m.param_bytes).c_str(),
                            b(m.buffer_bytes).c_str(), b(m.grad_bytes).c_str(), m.optimizer.name.c_str(),
                            b(m.optimizer_bytes).c_str());
  if (m.gathered_bytes > 0) text += " + gathered " + b(m.gathered_bytes);
  if (m.reduce_bytes > 0) text += " + reduce-scatter " + b(m.reduce_bytes);
  return text + " = " + b(m.total());
}

}  // namespace ckplan
