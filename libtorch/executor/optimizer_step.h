#pragma once
// The optimizer update `ckplan run` applies after each step, and that the
// profiler times for the plan's prediction: one implementation for both.
// Part of the executor (includes ATen).

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace torch::jit {
struct Module;
}  // namespace torch::jit

namespace ckplan {

// A module's trainable parameters and its buffers, each tensor once: tied
// weights (GPT-2's lm_head and wte) are one parameter listed twice, with one
// gradient and one optimizer update.
struct ModuleTensors {
  std::vector<at::Tensor> params;
  std::vector<at::Tensor> buffers;
};
ModuleTensors UniqueModuleTensors(const torch::jit::Module& module);

/// Optimizers the planner knows (besides `none`): their update is timed in
/// the profile.
inline const std::vector<std::string>& TimedOptimizers() {
  static const std::vector<std::string> names = {"sgd", "momentum", "adam"};
  return names;
}

/// sgd, momentum (0.9) or adam (0.9, 0.999, eps 1e-8) with its state kept
/// across steps; `none` does nothing. Parameters without a gradient are skipped.
class OptimizerStep {
 public:
  OptimizerStep(std::string name, double lr) : name_(std::move(name)), lr_(lr) {}
  /// One update of `params` from their gradients (under no-grad).
  void Apply(const std::vector<at::Tensor>& params);
  /// Makes the state (zeros) without an update, so that the next Apply costs
  /// what every later one does (the profiler times it; momentum's first
  /// update from zeros equals the one that copies the gradient).
  void Prepare(const std::vector<at::Tensor>& params);
  /// Drops the state (the next Apply starts over).
  void Reset();
  /// The state tensors (momentum: first moments; adam: both moments).
  const std::vector<at::Tensor>& first() const { return first_; }
  const std::vector<at::Tensor>& second() const { return second_; }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  double lr_;
  int steps_ = 0;
  std::vector<at::Tensor> first_, second_;
};

}  // namespace ckplan
