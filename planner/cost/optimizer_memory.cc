#include "planner/cost/optimizer_memory.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "planner/base/error.h"

namespace ckplan {

const std::vector<std::string>& OptimizerNames() {
  static const std::vector<std::string> names = {"none", "sgd", "momentum", "adam", "adamw"};
  return names;
}

OptimizerChoice ChooseOptimizer(const OptimizerChoice& named, double momentum, const std::string& impl, bool on_gpu) {
  const std::string& name = named.name;
  if (momentum < 0) throw BadInput("invalid --momentum " + std::to_string(momentum) + ": must be 0 or more");
  if (momentum > 0 && name != "sgd" && name != "momentum") {
    throw BadInput("--momentum is for --optimizer sgd (adam and adamw keep their moments anyway)");
  }
  if (!(named.flags.weight_decay >= 0) || !std::isfinite(named.flags.weight_decay)) {
    throw BadInput("invalid --weight-decay " + std::to_string(named.flags.weight_decay) + ": must be 0 or more");
  }
  if (named.flags.amsgrad && name != "adam" && name != "adamw") throw BadInput("--amsgrad is for --optimizer adam or adamw");
  if (named.flags.nesterov && !(name == "momentum" || (name == "sgd" && momentum > 0))) {
    throw BadInput("--nesterov needs SGD with momentum: --optimizer sgd --momentum 0.9 --nesterov");
  }
  OptimizerChoice choice(name == "sgd" && momentum > 0 ? "momentum" : name);
  choice.flags = named.flags;
  if (impl != "auto") {
    choice.impl = ParseOptimizerImpl(impl);
  } else if (on_gpu) {
    choice.impl = OptimizerImpl::kForeach;
  }
  return choice;
}

namespace {

// The optimizers whose groups may differ in name: SGD's momentum is a group option.
std::string Family(const std::string& name) { return name == "momentum" ? "sgd" : name; }

}  // namespace

OptimizerChoice WithOptimizerGroups(OptimizerChoice chosen, std::vector<OptimizerGroup> groups,
                                    const std::string& file) {
  const std::string where = file + ": --optimizer-groups: ";
  if (groups.empty()) throw BadInput(where + "no group: give one or more (each its parameters and options)");
  if (chosen.name == "none") throw BadInput(where + "--optimizer none updates nothing and has no param groups");
  std::set<std::string> seen;
  for (size_t k = 0; k < groups.size(); ++k) {
    OptimizerGroup& group = groups[k];
    const std::string which = where + "group " + std::to_string(k) + ": ";
    if (group.name.empty()) group.name = chosen.name;
    if (Family(group.name) != Family(chosen.name)) {
      throw BadInput(which + "optimizer '" + group.name + "', and --optimizer is " + chosen.name +
                     ": the groups of one optimizer are of its kind (sgd and momentum: SGD with or without momentum)");
    }
    const OptimizerFlags& flags = group.flags;
    if (!(flags.weight_decay >= 0) || !std::isfinite(flags.weight_decay)) {
      throw BadInput(which + "invalid weight_decay " + std::to_string(flags.weight_decay) + ": must be 0 or more");
    }
    if (flags.amsgrad && group.name != "adam" && group.name != "adamw")
      throw BadInput(which + "amsgrad is for adam or adamw");
    if (flags.nesterov && group.name != "momentum")
      throw BadInput(which + "nesterov needs SGD with momentum (momentum)");
    for (const std::string& name : group.params) {
      if (!seen.insert(name).second) {
        throw BadInput(which + "parameter '" + name + "' is in another group too (torch.optim refuses that)");
      }
    }
  }
  chosen.groups = std::move(groups);
  return chosen;
}

void CheckOptimizerGroups(const OptimizerChoice& optimizer, const Profile& profile, const std::string& profile_path) {
  if (optimizer.groups.empty()) return;
  if (profile.parameters.empty()) {
    throw BadInput(profile_path + ": lists no parameters, which --optimizer-groups names: profile the model again");
  }
  std::set<std::string> names;
  for (const ParameterRecord& p : profile.parameters) names.insert(p.name);
  for (size_t k = 0; k < optimizer.groups.size(); ++k) {
    for (const std::string& name : optimizer.groups[k].params) {
      if (names.count(name) == 0) {
        throw BadInput("--optimizer-groups: group " + std::to_string(k) + " names parameter '" + name + "', which " +
                       profile_path + " does not list: name the model's parameters as named_parameters() does");
      }
    }
  }
}

FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer) {
  FixedMemory fixed;
  fixed.param_bytes = param_bytes;
  fixed.buffer_bytes = buffer_bytes;
  fixed.optimizer.name = optimizer;
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

OptimizerFlags EffectiveFlags(const OptimizerChoice& optimizer) {
  OptimizerFlags flags;
  const bool adam = optimizer.name == "adam" || optimizer.name == "adamw";
  if (optimizer.name == "adam" || optimizer.name == "sgd" || optimizer.name == "momentum") {
    flags.weight_decay = optimizer.flags.weight_decay;
  }
  flags.amsgrad = adam && optimizer.flags.amsgrad;
  flags.nesterov = optimizer.name == "momentum" && optimizer.flags.nesterov;
  return flags;
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

// For-loop Adam: each parameter's denominator, `sqrt(v) / bc2` (two of its
// size while the division runs), made while the previous parameter's is
// still held; with a coupled weight decay, `grad + wd * param` (one more of
// its size) held through it.
int64_t AdamForLoopTmpBytes(const std::vector<ParameterRecord>& parameters, bool coupled_decay) {
  int64_t most = 0, previous = 0;
  for (const ParameterRecord& p : parameters) {
    const int64_t element = ElementSize(p);
    if (element == 0) continue;
    most = std::max(most, (coupled_decay ? 3 : 2) * p.bytes + previous + ScalarBytes(element));
    previous = p.bytes;
  }
  return most;
}

// Parameters grouped by dtype (by element size here), in order of first
// appearance: (element size, bytes of the group).
std::vector<std::pair<int64_t, int64_t>> DtypeGroups(const std::vector<ParameterRecord>& parameters) {
  std::vector<std::pair<int64_t, int64_t>> groups;
  for (const ParameterRecord& p : parameters) {
    const int64_t element = ElementSize(p);
    if (element == 0) continue;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == element; });
    if (it == groups.end()) {
      groups.push_back({element, p.bytes});
    } else {
      it->second += p.bytes;
    }
  }
  return groups;
}

// Foreach Adam: the square roots of a whole dtype group, made while the
// previous group's are still held (a coupled decay's `grad + wd * param`
// for the group is dropped before they are made).
int64_t AdamForeachTmpBytes(const std::vector<ParameterRecord>& parameters) {
  int64_t most = 0, previous = 0;
  for (const auto& [element, bytes] : DtypeGroups(parameters)) {
    most = std::max(most, bytes + previous + ScalarBytes(element));
    previous = bytes;
  }
  return most;
}

// SGD, with or without momentum: `grad + wd * param` (coupled decay) and,
// with nesterov, `grad + momentum * buf`, each a new tensor of the
// parameter's size, one parameter at a time (for-loop) or a dtype group at
// once (foreach); the momentum update's scalars alive with the first.
int64_t SgdTmpBytes(const std::vector<ParameterRecord>& parameters, OptimizerImpl impl, bool momentum,
                    const OptimizerFlags& flags) {
  const bool decay = flags.weight_decay != 0, nesterov = flags.nesterov;
  std::vector<std::pair<int64_t, int64_t>> units;  // (element size, bytes made at once)
  if (impl == OptimizerImpl::kForLoop) {
    for (const ParameterRecord& p : parameters) {
      if (ElementSize(p) > 0) units.push_back({ElementSize(p), p.bytes});
    }
  } else {
    units = DtypeGroups(parameters);
  }
  int64_t most = 0;
  for (const auto& [element, bytes] : units) {
    const int64_t scalars = momentum ? ScalarBytes(element) : 0;
    // While the momentum buffer is updated: the decayed gradient (if any) and the scalars.
    most = std::max(most, (decay ? bytes : 0) + scalars);
    // Nesterov's look-ahead: a new tensor in the for-loop, in place on
    // the (decayed) gradients in foreach.
    if (nesterov && impl == OptimizerImpl::kForLoop) most = std::max(most, (decay ? 2 : 1) * bytes);
  }
  return most;
}

}  // namespace

namespace {

// Those of `parameters` that `group` names, in its order.
std::vector<ParameterRecord> GroupParameters(const OptimizerGroup& group,
                                             const std::vector<ParameterRecord>& parameters) {
  std::map<std::string, const ParameterRecord*> by_name;
  for (const ParameterRecord& p : parameters) by_name.emplace(p.name, &p);
  std::vector<ParameterRecord> mine;
  for (const std::string& name : group.params) {
    auto it = by_name.find(name);
    if (it != by_name.end()) mine.push_back(*it->second);
  }
  return mine;
}

// Beyond the moments adam's and adamw's state holds: each parameter's
// `step`, a float32 scalar tensor; with amsgrad, the largest second moment
// so far (max_exp_avg_sq), `bytes` of `parameters`. 0 for the others.
int64_t StepCounterBytes(const OptimizerChoice& optimizer, const std::vector<ParameterRecord>& parameters,
                         int64_t bytes) {
  if (optimizer.name != "adam" && optimizer.name != "adamw") return 0;
  int64_t total = 0;
  for (const ParameterRecord& p : parameters) total += ElementSize(p) > 0 ? 4 : 0;
  return total + (EffectiveFlags(optimizer).amsgrad ? bytes : 0);
}

}  // namespace

int64_t UpdateTmpBytes(const OptimizerChoice& optimizer, OptimizerImpl impl,
                       const std::vector<ParameterRecord>& parameters) {
  if (!optimizer.groups.empty()) {
    // One group at a time, each freeing its temporaries before the next.
    int64_t most = 0;
    for (const OptimizerGroup& group : optimizer.groups) {
      const OptimizerChoice one = GroupOptimizer(optimizer, group);
      most = std::max(most, UpdateTmpBytes(one, one.impl.value_or(impl), GroupParameters(group, parameters)));
    }
    return most;
  }
  int64_t element = 0;
  for (const ParameterRecord& p : parameters) element = std::max(element, ElementSize(p));
  if (element == 0) return 0;  // nothing to update
  if (impl == OptimizerImpl::kFused) {
    return optimizer.name == "adam" || optimizer.name == "adamw" ? 12 : 0;  // adam's scalars, whatever the dtype
  }
  // Only the options that change this optimizer's memory (AdamW's decay does not).
  const OptimizerFlags flags = EffectiveFlags(optimizer);
  if (optimizer.name == "adam" || optimizer.name == "adamw") {
    if (impl == OptimizerImpl::kForeach) return AdamForeachTmpBytes(parameters);
    return AdamForLoopTmpBytes(parameters, flags.weight_decay != 0);
  }
  if (optimizer.name == "sgd" || optimizer.name == "momentum") {
    return SgdTmpBytes(parameters, impl, optimizer.name == "momentum", flags);
  }
  return 0;
}

FixedMemory FixedMemoryOf(const Profile& profile, const Chain& chain, const OptimizerChoice& optimizer) {
  // Gradients, optimizer state and the update are the trainable parameters'
  // (a frozen one has none); every parameter is held. A profile without its
  // parameters' list: all of them train.
  const int64_t trainable = profile.parameters.empty() ? profile.totals.param_bytes : TrainableBytes(profile.parameters);
  FixedMemory fixed = FixedMemoryFor(trainable, profile.totals.buffer_bytes, optimizer.name);
  fixed.param_bytes = profile.totals.param_bytes;
  fixed.optimizer.impl = ResolvedImpl(optimizer, profile);
  fixed.optimizer.groups = optimizer.groups;
  fixed.optimizer.flags = EffectiveFlags(optimizer);
  if (optimizer.groups.empty()) {
    fixed.optimizer_bytes += StepCounterBytes(optimizer, TrainableParameters(profile.parameters), trainable);
  } else {
    // Each group's state, with its own options; a parameter in no group has none.
    fixed.optimizer_bytes = 0;
    const std::vector<ParameterRecord> trained = TrainableParameters(profile.parameters);
    for (OptimizerGroup& group : fixed.optimizer.groups) {
      const OptimizerChoice one = GroupOptimizer(fixed.optimizer, group);
      group.impl = one.impl;  // resolved: the group's, else the optimizer's
      group.flags = EffectiveFlags(one);
      const std::vector<ParameterRecord> mine = GroupParameters(group, trained);
      int64_t bytes = 0;
      for (const ParameterRecord& p : mine) bytes += p.bytes;
      fixed.optimizer_bytes += FixedMemoryFor(bytes, 0, one.name).optimizer_bytes + StepCounterBytes(one, mine, bytes);
    }
  }
  // fp16 autocast trains with torch.amp.GradScaler: its scale, growth
  // tracker and found-inf flag (float32, int32, float32 scalars) are held
  // through the optimizer's step, counted with the optimizer's state.
  if (profile.environment.autocast == std::optional<std::string>("float16")) fixed.optimizer_bytes += kGradScalerBytes;
  fixed.update_tmp_bytes = chain.update_tmp_bytes;
  // Those the chain carries appear during backward, stage by stage.
  fixed.backward_grad_bytes = std::min(chain.ParamGradBytes(), fixed.grad_bytes);
  // adamw's update is timed as adam's: the same memory traffic.
  auto step = profile.totals.optimizer_step_ms.find(optimizer.name == "adamw" ? "adam" : optimizer.name);
  if (step != profile.totals.optimizer_step_ms.end()) fixed.optimizer_step_ms = step->second;
  return fixed;
}

}  // namespace ckplan
