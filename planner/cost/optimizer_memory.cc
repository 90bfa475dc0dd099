#include "planner/cost/optimizer_memory.h"

#include <algorithm>
#include <map>

#include "planner/base/error.h"

namespace ckplan {

const std::vector<std::string>& OptimizerNames() {
  static const std::vector<std::string> names = {"none", "sgd", "momentum", "adam", "adamw"};
  return names;
}

FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer) {
  FixedMemory fixed;
  fixed.param_bytes = param_bytes;
  fixed.buffer_bytes = buffer_bytes;
  fixed.optimizer = optimizer;
  fixed.grad_bytes = param_bytes;
  if (optimizer == "none" || optimizer == "sgd") {
    fixed.optimizer_bytes = 0;
  } else if (optimizer == "momentum") {
    fixed.optimizer_bytes = param_bytes;
  } else if (optimizer == "adam" || optimizer == "adamw") {
    fixed.optimizer_bytes = 2 * param_bytes;
  } else {
    throw BadInput("unknown optimizer '" + optimizer + "' (use none, sgd, momentum, adam or adamw)");
  }
  return fixed;
}

OptimizerImpl DefaultOptimizerImpl(const Profile& profile) {
  const bool cuda = profile.environment.DeviceName().rfind("cuda", 0) == 0 || !profile.environment.time_model.is_null();
  return cuda ? OptimizerImpl::kForeach : OptimizerImpl::kForLoop;
}

OptimizerImpl ResolvedImpl(const OptimizerChoice& optimizer, const Profile& profile) {
  return optimizer.impl.value_or(DefaultOptimizerImpl(profile));
}

namespace {

// The scalars an update wraps as tensors while its temporaries are alive: a
// double and one of the parameter's dtype (12 B in float32, 10 in bf16).
int64_t ScalarBytes(int64_t element_size) { return 8 + element_size; }

// A parameter's element size; 0 for an empty one (skipped).
int64_t ElementSize(const ParameterRecord& p) {
  int64_t elements = 1;
  for (int64_t d : p.shape) elements *= d;
  return elements > 0 ? p.bytes / elements : 0;
}

int64_t AdamForLoopTmpBytes(const std::vector<ParameterRecord>& parameters) {
  int64_t most = 0, previous = 0;
  for (const ParameterRecord& p : parameters) {
    const int64_t element = ElementSize(p);
    if (element == 0) continue;
    most = std::max(most, 2 * p.bytes + previous + ScalarBytes(element));
    previous = p.bytes;
  }
  return most;
}

int64_t AdamForeachTmpBytes(const std::vector<ParameterRecord>& parameters) {
  // Groups by dtype (by element size here), in order of first appearance.
  std::vector<int64_t> order;
  std::map<int64_t, int64_t> group_bytes;
  for (const ParameterRecord& p : parameters) {
    const int64_t element = ElementSize(p);
    if (element == 0) continue;
    if (group_bytes.count(element) == 0) order.push_back(element);
    group_bytes[element] += p.bytes;
  }
  int64_t most = 0, previous = 0;
  for (int64_t element : order) {
    most = std::max(most, group_bytes[element] + previous + ScalarBytes(element));
    previous = group_bytes[element];
  }
  return most;
}

}  // namespace

int64_t UpdateTmpBytes(const std::string& optimizer, OptimizerImpl impl, const std::vector<ParameterRecord>& parameters) {
  int64_t element = 0;
  for (const ParameterRecord& p : parameters) element = std::max(element, ElementSize(p));
  if (element == 0) return 0;  // nothing to update
  if (optimizer == "adam" || optimizer == "adamw") {
    switch (impl) {
      case OptimizerImpl::kForLoop: return AdamForLoopTmpBytes(parameters);
      case OptimizerImpl::kForeach: return AdamForeachTmpBytes(parameters);
      case OptimizerImpl::kFused: return 12;  // its scalars, whatever the dtype
    }
  }
  if (optimizer == "momentum" && impl != OptimizerImpl::kFused) return ScalarBytes(element);
  return 0;
}

FixedMemory FixedMemoryOf(const Profile& profile, const Chain& chain, const OptimizerChoice& optimizer) {
  FixedMemory fixed = FixedMemoryFor(profile.totals.param_bytes, profile.totals.buffer_bytes, optimizer.name);
  fixed.optimizer_impl = ResolvedImpl(optimizer, profile);
  if (optimizer.name == "adam" || optimizer.name == "adamw") {
    // Each parameter's `step`: a float32 scalar tensor.
    for (const ParameterRecord& p : profile.parameters) fixed.optimizer_bytes += ElementSize(p) > 0 ? 4 : 0;
  }
  fixed.update_tmp_bytes = chain.update_tmp_bytes;
  // Those the chain carries appear during backward, stage by stage.
  fixed.backward_grad_bytes = std::min(chain.ParamGradBytes(), fixed.grad_bytes);
  // adamw's update is timed as adam's: the same memory traffic.
  auto step = profile.totals.optimizer_step_ms.find(optimizer.name == "adamw" ? "adam" : optimizer.name);
  if (step != profile.totals.optimizer_step_ms.end()) fixed.optimizer_step_ms = step->second;
  return fixed;
}

}  // namespace ckplan
