#include "planner/cost/optimizer_memory.h"

#include <algorithm>

#include "planner/base/error.h"

namespace ckplan {

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
  } else if (optimizer == "adam") {
    fixed.optimizer_bytes = 2 * param_bytes;
  } else {
    throw BadInput("unknown optimizer '" + optimizer + "' (use none, sgd, momentum or adam)");
  }
  return fixed;
}

namespace {

// The scalars adam's update wraps as tensors (a double and a float, 0-dim).
constexpr int64_t kAdamScalarBytes = 12;

int64_t AdamUpdateTmpBytes(const std::vector<ParameterRecord>& parameters) {
  int64_t most = 0;
  for (const ParameterRecord& p : parameters) {
    int64_t elements = 1;
    for (int64_t d : p.shape) elements *= d;
    if (elements <= 0) continue;
    most = std::max(most, std::min<int64_t>(elements, int64_t{1} << 16) * (p.bytes / elements));
  }
  // And the scalars the update wraps as tensors while a slice's temporary is
  // alive (measured: 12 B on the CPU, `ckplan run` of mlp_chain).
  return most > 0 ? most + kAdamScalarBytes : 0;
}

}  // namespace

int64_t UpdateTmpBytes(const std::string& optimizer, const std::vector<ParameterRecord>& parameters) {
  return optimizer == "adam" ? AdamUpdateTmpBytes(parameters) : 0;
}

FixedMemory FixedMemoryOf(const Profile& profile, const Chain& chain, const std::string& optimizer) {
  FixedMemory fixed = FixedMemoryFor(profile.totals.param_bytes, profile.totals.buffer_bytes, optimizer);
  // Those the chain carries appear during backward, stage by stage.
  fixed.backward_grad_bytes = std::min(chain.ParamGradBytes(), fixed.grad_bytes);
  auto step = profile.totals.optimizer_step_ms.find(optimizer);
  if (step != profile.totals.optimizer_step_ms.end()) fixed.optimizer_step_ms = step->second;
  return fixed;
}

}  // namespace ckplan
