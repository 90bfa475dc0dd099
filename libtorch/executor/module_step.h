#pragma once
// The forward of a PyTorch-target plan's step as PyTorch runs it
// (ScheduleRunner::RunModules): node by node with eager semantics, each
// wrapped module run as torch.utils.checkpoint runs one. Part of the
// executor (LibTorch).

#include <torch/script.h>

#include <memory>
#include <unordered_set>
#include <utility>
#include <vector>

#include "libtorch/executor/staged_program.h"

namespace ckplan {

struct WrappedRun;  // one wrapped module's run (module_step.cc)

/// The forward node by node with eager semantics (each value freed at its
/// last use, one autograd graph), the stages first..last of each wrapped
/// module run as torch.utils.checkpoint runs a module: without autograd,
/// holding its inputs and the random state; in backward, when the gradient
/// reaches it, run again with autograd from its inputs and back-propagated
/// at once. The object holds what the recomputations read: keep it until
/// the step's backward is over.
class CheckpointedForward {
 public:
  /// `params`: the trainable parameters, passed to each wrapped module's
  /// autograd function (so that it has a node when no input requires
  /// gradients); `static_tensors`: the tensors that outlive every step
  /// (GraphProgram::StaticTensors); `generator`: the device's, whose state
  /// a recomputation restores.
  CheckpointedForward(StagedProgram& staged, const std::vector<at::Tensor>& params,
                      const std::unordered_set<const c10::TensorImpl*>& static_tensors, at::Generator generator);
  ~CheckpointedForward();
  CheckpointedForward(const CheckpointedForward&) = delete;
  CheckpointedForward& operator=(const CheckpointedForward&) = delete;

  /// Runs the forward on `inputs` (kept alive by the caller to the step's
  /// end), `wrapped` the (first, last) stages of each wrapped module; the
  /// values live after it are left in `env`.
  void Run(const std::vector<at::Tensor>& inputs, const std::vector<std::pair<size_t, size_t>>& wrapped,
           Environment& env);

 private:
  StagedProgram& staged_;
  const std::vector<at::Tensor>& params_;
  const std::unordered_set<const c10::TensorImpl*>& static_tensors_;
  at::Generator generator_;
  std::vector<std::unique_ptr<WrappedRun>> runs_;
};

}  // namespace ckplan
