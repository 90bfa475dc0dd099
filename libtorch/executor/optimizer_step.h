#pragma once
// The optimizer update `ckplan run` applies after each step, and that the
// profiler times for the plan's prediction: one implementation for both.
// Part of the executor (includes ATen).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

#include "planner/contracts/fixed_memory.h"

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace ckplan {

// A module's trainable parameters and its buffers, each tensor once: tied
// weights (GPT-2's lm_head and wte) are one parameter listed twice, with one
// gradient and one optimizer update. Frozen parameters (requires_grad false)
// are listed with the buffers: held, never updated.
struct ModuleTensors {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
};
ModuleTensors UniqueModuleTensors(const torch::jit::Module& module);

/// Optimizers the planner knows (besides `none`): their update is timed in
/// the profile (adamw as adam).
inline const std::vector<std::string>& TimedOptimizers() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adam"};
  return names;
}

/// torch.optim's update, with its defaults (SGD momentum 0.9; Adam and
/// AdamW betas (0.9, 0.999), eps 1e-8; AdamW weight decay 0.01) and the
/// plan's options (a coupled weight decay for adam and SGD, amsgrad,
/// nesterov: OptimizerFlags, making the tensors torch.optim makes), run the way
/// `impl` says torch.optim runs it, so that its temporaries are the ones a
/// training job's are (planner/cost/optimizer_memory.h): for-loop
/// (`_single_tensor_adam`: each parameter's denominator made while the
/// previous one's is held), foreach (`_multi_tensor_adam`: the square roots
/// of a dtype group at once), fused (ATen's `_fused_adam_`). `none` does
/// nothing. Parameters without a gradient are skipped.
class OptimizerStep {
 public:
  OptimizerStep(std::string name, double lr, OptimizerImpl impl = OptimizerImpl::kForLoop, OptimizerFlags flags = {})
      : name_(std::move(name)), lr_(lr), impl_(impl), flags_(flags) {}
  /// One update of `params` from their gradients (under no-grad).
  void Apply(const std::vector<at::Tensor>& params);
  /// Makes the state (zeros) without an update, so that the next Apply costs
  /// what every later one does (the profiler times it; momentum's first
  /// update from zeros equals the one that copies the gradient).
  void Prepare(const std::vector<at::Tensor>& params);
  /// Drops the state (the next Apply starts over).
  void Reset();
  /// Every state tensor: momentum buffers; adam's moments and `step` counters.
  std::vector<at::Tensor> state() const;
  const std::string& name() const { return name_; }

 private:
  bool adam() const { return name_ == "adam" || name_ == "adamw"; }
  void ApplyAdam(const std::vector<at::Tensor>& params);
  void MakeState(const std::vector<at::Tensor>& params);
  std::string name_;
  double lr_;
  OptimizerImpl impl_;
  OptimizerFlags flags_;  // weight_decay (coupled: adam, sgd, momentum), amsgrad, nesterov
  std::vector<at::Tensor> first_, second_, steps_, max_second_;
};

}  // namespace ckplan
