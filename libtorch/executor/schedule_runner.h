#pragma once
// The schedule runner (the executor, torch): one training step of a
// staged program, node by node or under a schedule, its peak and time
// measured.

#include <torch/script.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "planner/contracts/schedule.h"
#include "libtorch/executor/executor.h"
#include "libtorch/runtime/device.h"
#include "libtorch/executor/staged_program.h"

namespace ckplan {

class OptimizerStep;
class TrackingAllocator;

struct Measure {
  int64_t other_bytes = 0;  // live at the step's start that is not the model's state or inputs
  int64_t peak_bytes = 0;
  int64_t live_after_forward_bytes = 0;
  double ms = 0;
  std::optional<int64_t> device_base;  // bytes allocated on the GPU at the reset; none on the CPU
  int64_t ledger_kept = 0;   // the ledger's live bytes at the reset that are the model's
};

// Runs the steps of one `ckplan run`: the state it keeps across steps is
// what a recomputation must reproduce (random state, buffers) and what
// the step's memory must not count.
class ScheduleRunner {
 public:
  /// `params`: the trainable parameters, each once; `buffers`: the model's
  /// buffers; `stage_names` for messages; `tracker`: the ledger installed
  /// before the model was loaded.
  ScheduleRunner(const RunOptions& options, StagedProgram& staged, const DeviceInfo& device,
                 TrackingAllocator& tracker, std::vector<at::Tensor> params, std::vector<at::Tensor> buffers,
                 std::vector<std::string> stage_names);

  // A step without checkpointing, node by node (eager semantics).
  // The reference the gradients are checked against; it also records which
  // values require gradients.
  Measure RunPlainStep(const std::vector<at::Tensor>& inputs, bool record);

  // A step running `schedule` (the plan's, or the one without recomputation).
  Measure RunSchedule(const std::vector<at::Tensor>& inputs, const Schedule& schedule);

  // A step of a PyTorch-target plan as PyTorch runs it (CheckpointedForward,
  // module_step.h): node by node with eager semantics, the stages
  // first..last of each of `wrapped` run as torch.utils.checkpoint runs a
  // wrapped module. With nothing wrapped, the plain step.
  Measure RunModules(const std::vector<at::Tensor>& inputs, const std::vector<std::pair<size_t, size_t>>& wrapped);

  // As `optimizer.zero_grad()` (set_to_none, PyTorch's default): gradients
  // appear during the backward, as the plan counts them.
  void ZeroGrads();

  /// The forward run stage by stage without autograd, as a schedule's
  /// forward without autograd runs (`recompute`: as a recomputation, the
  /// random state and the buffers restored around each stage; else as a
  /// stage's first run, which must come first): its time in ms (thread CPU
  /// time on the CPU). For the profile's stage_run_ms (libtorch/profiler/calibration.h).
  double TimeNoGradForward(const std::vector<at::Tensor>& inputs, bool recompute);

  /// The optimizer step of the mode measured (nullptr: none, as in the gradient check).
  void set_optimizer_step(OptimizerStep* step) { optimizer_step_ = step; }
  const std::vector<at::Tensor>& params() const { return params_; }

 private:
  // Memory the process holds that is no part of the training step (the loaded
  // archive's records, copies kept for the gradient check): not counted.
  int64_t OtherBytes(const std::vector<at::Tensor>& inputs);

  void Seed();

  at::Tensor Loss(const std::vector<at::Tensor>& outputs);
  // Loss() under the program's autocast (the loss inside the job's region).
  at::Tensor AutocastLoss(const std::vector<at::Tensor>& outputs);

  // The step's peak: the CUDA caching allocator's statistics on a GPU, the
  // tracking ledger on the CPU.
  int64_t StepPeak(const Measure& m) const;
  // Seeds the random state, counts what is live besides the model, resets the peaks.
  Measure BeginStep(const std::vector<at::Tensor>& inputs);
  // The end of a step run node by node (the plain step, a PyTorch-target
  // plan's): what is live after the forward into m, the loss of the
  // program's outputs and its backward, `after_backward` (what had to
  // outlive the backward released), the optimizer's update, the device
  // synchronized. The caller reads its timer and the peak after it.
  void EndNodeStep(Environment& env, Measure& m, const std::function<void()>& after_backward);

  // Runs stage s from the values at its input cut; returns those at its output cut.
  std::vector<c10::IValue> RunStage(size_t s, const std::vector<c10::IValue>& in, const std::vector<at::Tensor>& inputs,
                                    bool with_grad, std::vector<at::Tensor>* leaves, bool first_time,
                                    std::vector<size_t>* tensor_counts = nullptr);

  // The kept copy of buffer b (made on first use, outside the step's memory
  // from then on, like the buffer itself).
  at::Tensor& BufferSnapshot(size_t b);

  // The optimizer step the plan was solved for, with its state kept across
  // steps (each mode has its own); none during the gradient check.
  void Step();

  const RunOptions& options_;
  StagedProgram& staged_;
  TrackingAllocator& tracker_;
  DeviceInfo device_;
  std::vector<std::string> stage_names_;
  std::vector<at::Tensor> params_, buffers_;
  std::unordered_map<const torch::jit::Value*, bool> requires_grad_;
  std::vector<at::Tensor> rng_state_;
  std::vector<std::optional<bool>> draws_random_;  // per stage: whether it draws random numbers (unset: not known yet)
  std::vector<std::vector<size_t>> mutated_buffers_;  // per stage: the buffers its forward writes
  std::vector<bool> mutated_known_;                    // per stage: mutated_buffers_ learnt
  std::vector<at::Tensor> buffer_snapshots_;           // per buffer: its values before a recomputation
  std::vector<at::Tensor> targets_;
  // The tensors that outlive every step (GraphProgram::StaticTensors), for
  // RunModules: listed on its first call with a module wrapped.
  std::unordered_set<const c10::TensorImpl*> static_tensors_;
  bool static_tensors_known_ = false;
  OptimizerStep* optimizer_step_ = nullptr;  // the measured mode's; none in the gradient check
};

}  // namespace ckplan
