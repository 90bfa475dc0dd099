#include "libtorch/executor/schedule_runner.h"

#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <set>

#include "planner/base/error.h"
#include "libtorch/executor/module_step.h"
#include "libtorch/executor/optimizer_step.h"
#include "libtorch/runtime/timing.h"
#include "libtorch/runtime/tracking_allocator.h"

namespace ckplan {
namespace {

using torch::jit::Value;

struct SavedStage {
  std::vector<at::Tensor> leaves;    // per boundary value of the input (undefined when none)
  std::vector<size_t> tensor_counts; // per boundary value of the input: tensors inside it
  std::vector<c10::IValue> outputs;  // boundary values of the output, with their autograd graph
};

}  // namespace

ScheduleRunner::ScheduleRunner(const RunOptions& options, StagedProgram& staged, const DeviceInfo& device,
                               TrackingAllocator& tracker, std::vector<at::Tensor> params,
                               std::vector<at::Tensor> buffers, std::vector<std::string> stage_names)
    : options_(options),
      staged_(staged),
      tracker_(tracker),
      device_(device),
      stage_names_(std::move(stage_names)),
      params_(std::move(params)),
      buffers_(std::move(buffers)) {}

// Memory the process holds that is no part of the training step (the loaded
// archive's records, copies kept for the gradient check): not counted.
int64_t ScheduleRunner::OtherBytes(const std::vector<at::Tensor>& inputs) {
  std::set<const void*> seen;
  int64_t step = 0;
  auto add = [&](const at::Tensor& t) {
    if (t.defined() && t.has_storage() && seen.insert(t.storage().data_ptr().get()).second) {
      step += static_cast<int64_t>(t.storage().nbytes());
    }
  };
  for (const auto& p : params_) {
    add(p);
    add(p.grad());
  }
  for (const auto& b : buffers_) add(b);
  // The optimizer state of the mode being measured is the step's; the
  // other mode's (measured in turn with this one) is not.
  if (optimizer_step_ != nullptr) {
    for (const auto& t : optimizer_step_->state()) add(t);
  }
  for (const auto& t : targets_) add(t);
  for (const auto& t : inputs) add(t);
  return tracker_.live_bytes() - step;
}

// As `optimizer.zero_grad()` (set_to_none, PyTorch's default): gradients
// appear during the backward, as the plan counts them.
void ScheduleRunner::ZeroGrads() {
  for (auto& p : params_) p.mutable_grad() = at::Tensor();
}

void ScheduleRunner::Seed() {
  for (at::Generator gen : {at::detail::getDefaultCPUGenerator(), DefaultGenerator(device_)}) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(12345);
  }
}

at::Tensor ScheduleRunner::Loss(const std::vector<at::Tensor>& outputs) {
  at::Tensor loss = AutocastLoss(outputs);
  // torch.autocast's region ends after the loss: the weights' casts it
  // cached go (what autograd saved of them stays).
  staged_.program().EndAutocast();
  return loss;
}

at::Tensor ScheduleRunner::AutocastLoss(const std::vector<at::Tensor>& outputs) {
  const GraphProgram::AutocastScope autocast(staged_.program());  // the loss inside the job's autocast region
  at::Tensor loss;
  size_t index = 0;
  for (const at::Tensor& t : outputs) {
    if (!t.defined() || !t.is_floating_point() || !t.requires_grad()) continue;
    at::Tensor term;
    if (staged_.program().returns_loss()) {
      term = t;  // the model's own loss (its only output), as the user's training step back-propagates it
    } else if (options_.loss == "sum") {
      term = t.sum();
    } else if (options_.loss == "mean") {
      term = t.mean();
    } else {
      if (targets_.size() <= index) {
        at::Generator gen = at::detail::createCPUGenerator(777 + index);
        targets_.push_back(
            at::randn(t.sizes(), gen, t.options().device(at::kCPU).requires_grad(false)).to(t.device()));
      }
      term = (t - targets_[index]).pow(2).mean();
    }
    ++index;
    term = term.to(at::kFloat);
    loss = loss.defined() ? loss + term : term;
  }
  if (!loss.defined()) throw BadInput(options_.model_path + ": no output requires gradients");
  return loss;
}

// What every measured step does first: the random state seeded, what is
// live besides the model counted, the peaks reset.
Measure ScheduleRunner::BeginStep(const std::vector<at::Tensor>& inputs) {
  Seed();
  Measure m;
  m.other_bytes = OtherBytes(inputs);
  tracker_.ResetPeak();
  m.ledger_kept = tracker_.live_bytes() - m.other_bytes;
  m.device_base = ResetDevicePeak(device_);
  return m;
}

// A step without checkpointing, node by node (eager semantics).
// The reference the gradients are checked against; it also records which
// values require gradients.
Measure ScheduleRunner::RunPlainStep(const std::vector<at::Tensor>& inputs, bool record) {
  GraphProgram& program = staged_.program();
  Measure m = BeginStep(inputs);
  const StepTimer timer(device_.cuda());  // thread CPU time on the CPU (timing.h)
  Environment env;
  program.BindInputs(env, inputs);
  for (size_t n = 0; n < program.nodes().size(); ++n) {
    program.RunNode(n, env);
    if (record) {
      for (const Value* out : program.nodes()[n].node->outputs()) {
        const c10::IValue& v = env.at(out);
        if (v.isTensor()) requires_grad_[out] = v.toTensor().requires_grad();
      }
    }
    program.FreeDeadAfter(n, env);
  }
  EndNodeStep(env, m, [] {});
  m.ms = timer.Ms();
  m.peak_bytes = StepPeak(m);
  return m;
}

Measure ScheduleRunner::RunModules(const std::vector<at::Tensor>& inputs,
                                   const std::vector<std::pair<size_t, size_t>>& wrapped) {
  Measure m = BeginStep(inputs);
  const StepTimer timer(device_.cuda());  // thread CPU time on the CPU (timing.h)
  if (!wrapped.empty() && !static_tensors_known_) {
    staged_.program().StaticTensors(&static_tensors_);
    static_tensors_known_ = true;
  }
  // What the wrapped modules hold for their recomputations: alive until the step's backward is over.
  auto forward = std::make_unique<CheckpointedForward>(staged_, params_, static_tensors_, DefaultGenerator(device_));
  Environment env;
  forward->Run(inputs, wrapped, env);
  EndNodeStep(env, m, [&forward] { forward.reset(); });
  m.ms = timer.Ms();
  m.peak_bytes = StepPeak(m);
  return m;
}

// The step's peak: the CUDA caching allocator's statistics on a GPU, the
// tracking ledger on the CPU.
int64_t ScheduleRunner::StepPeak(const Measure& m) const {
  return StepPeakBytes(device_, m.device_base, m.ledger_kept, tracker_.peak_bytes() - m.other_bytes);
}

// Runs stage s from the values at its input cut; returns those at its output cut.
std::vector<c10::IValue> ScheduleRunner::RunStage(size_t s, const std::vector<c10::IValue>& in,
                                                  const std::vector<at::Tensor>& inputs, bool with_grad,
                                                  std::vector<at::Tensor>* leaves, bool first_time,
                                                  std::vector<size_t>* tensor_counts) {
  GraphProgram& program = staged_.program();
  // Recomputation: the same random numbers, and buffers (batch norm
  // statistics) left as the first run left them.
  at::Generator gen = DefaultGenerator(device_);
  std::vector<int64_t> versions;
  at::Tensor rng_before;
  // Whether the stage draws random numbers is learnt on its first run (the
  // gradient check's step); later steps copy the generator's state only
  // for the stages that do (a copy and a comparison per stage cost about
  // as much as a small stage).
  if (draws_random_.size() < staged_.stages()) draws_random_.resize(staged_.stages());
  const bool keep_rng = draws_random_[s].value_or(true);
  // Which buffers a stage writes is learnt on its first run too (the
  // graph writes the same ones each step).
  if (mutated_buffers_.size() < staged_.stages()) mutated_buffers_.resize(staged_.stages());
  if (mutated_known_.size() < staged_.stages()) mutated_known_.resize(staged_.stages(), false);
  const bool learn_mutated = first_time && !mutated_known_[s];
  if (first_time) {
    std::lock_guard<std::mutex> lock(gen.mutex());
    if (keep_rng) rng_before = gen.get_state();
    if (learn_mutated) {
      for (const auto& b : buffers_) versions.push_back(b._version());
    }
  } else {
    if (rng_state_[s].defined()) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_state(rng_state_[s]);
    }
    // Into copies made once and kept: a clone per buffer and recomputation
    // (an allocation, a copy, a free) cost a batch-norm stage tens of
    // microseconds per recomputation.
    torch::NoGradGuard guard;
    for (size_t b : mutated_buffers_[s]) BufferSnapshot(b).copy_(buffers_[b]);
  }
  std::optional<torch::NoGradGuard> no_grad;
  if (!with_grad) no_grad.emplace();
  Environment env;
  program.BindInputs(env, inputs);
  const auto& boundary_in = staged_.boundary(s);
  for (size_t k = 0; k < boundary_in.size(); ++k) {
    const c10::IValue& v = in[k];
    if (tensor_counts) {
      std::vector<at::Tensor> inside;
      CollectTensors(v, &inside);
      tensor_counts->push_back(inside.size());
    }
    const bool written = v.isTensor() && staged_.Writes(s, k);
    if (with_grad && v.isTensor() && requires_grad_[boundary_in[k]]) {
      at::Tensor leaf = v.toTensor().detach().requires_grad_(true);
      // A copy with a grad_fn: autograd lets the stage write into it.
      env[boundary_in[k]] = written ? leaf.clone() : leaf;
      leaves->push_back(leaf);
    } else {
      env[boundary_in[k]] = written ? c10::IValue(v.toTensor().clone()) : v;
      if (leaves) leaves->push_back(at::Tensor());
    }
  }
  for (size_t n = staged_.begin(s); n <= staged_.end(s); ++n) {
    try {
      program.RunNode(n, env);
    } catch (const c10::Error& e) {
      std::string what = e.what_without_backtrace();
      throw Error(ExitCode::kVerifyFailed,
                  "stage " + std::to_string(s) + " (" + stage_names_[s] + "): op " +
                      program.nodes()[n].node->kind().toQualString() + " failed" +
                      (first_time ? "" : " during recompute") + ": " + what.substr(0, what.find('\n')));
    }
    program.FreeDeadAfter(n, env);
  }
  std::vector<c10::IValue> out;
  for (const Value* v : staged_.boundary(s + 1)) out.push_back(env.at(v));
  if (learn_mutated) {
    for (size_t b = 0; b < buffers_.size(); ++b) {
      if (buffers_[b]._version() != versions[b]) mutated_buffers_[s].push_back(b);
    }
    mutated_known_[s] = true;
  }
  if (first_time) {
    // Keep the random state only for stages that drew random numbers.
    std::lock_guard<std::mutex> lock(gen.mutex());
    if (keep_rng && !draws_random_[s]) draws_random_[s] = !at::equal(rng_before, gen.get_state());
    if (keep_rng && *draws_random_[s]) rng_state_[s] = rng_before;
  } else {
    torch::NoGradGuard guard;
    for (size_t b : mutated_buffers_[s]) buffers_[b].copy_(buffer_snapshots_[b]);
  }
  return out;
}

// The kept copy of buffer b (made on first use, outside the step's memory
// from then on, like the buffer itself).
at::Tensor& ScheduleRunner::BufferSnapshot(size_t b) {
  if (buffer_snapshots_.size() < buffers_.size()) buffer_snapshots_.resize(buffers_.size());
  if (!buffer_snapshots_[b].defined()) buffer_snapshots_[b] = at::empty_like(buffers_[b]);
  return buffer_snapshots_[b];
}

// A step running `schedule` (the plan's, or the one without recomputation).
Measure ScheduleRunner::RunSchedule(const std::vector<at::Tensor>& inputs, const Schedule& schedule) {
  const size_t stages = staged_.stages();
  Measure m = BeginStep(inputs);
  const StepTimer timer(device_.cuda());  // thread CPU time on the CPU (timing.h)
  rng_state_.assign(stages, at::Tensor());
  std::vector<bool> ran(stages, false);
  std::vector<std::optional<std::vector<c10::IValue>>> act(stages + 1);
  std::vector<std::optional<SavedStage>> saved(stages);
  std::vector<std::optional<std::vector<at::Tensor>>> grad(stages + 1);
  act[0] = std::vector<c10::IValue>();
  auto input_of = [&](size_t i) -> const std::vector<c10::IValue>& {
    if (act[i]) return *act[i];
    if (i > 0 && saved[i - 1]) return saved[i - 1]->outputs;
    throw Error(ExitCode::kVerifyFailed, "the schedule reads the input of stage " + std::to_string(i) + ", which is not stored");
  };
  static const bool trace = std::getenv("CKPLAN_TRACE") != nullptr;
  if (trace) {
    int64_t params = 0, grads = 0, state = 0;
    for (const auto& p : params_) {
      params += p.numel() * p.element_size();
      if (p.grad().defined()) grads += p.grad().numel() * p.grad().element_size();
    }
    if (optimizer_step_ != nullptr) {
      for (const auto& t : optimizer_step_->state()) state += t.numel() * t.element_size();
    }
    std::fprintf(stderr, "trace start live %lld params %lld grads %lld optimizer %lld\n",
                 static_cast<long long>(tracker_.live_bytes()), static_cast<long long>(params),
                 static_cast<long long>(grads), static_cast<long long>(state));
  }
  for (const ScheduleStep& op : schedule) {
    const size_t i = static_cast<size_t>(op.stage);
    if (trace) tracker_.ResetWindowPeak();
    switch (op.kind) {
      case StepKind::kForwardNoGradKeep:
      case StepKind::kForwardNoGrad: {
        act[i + 1] = RunStage(i, input_of(i), inputs, false, nullptr, !ran[i]);
        ran[i] = true;
        if (op.kind == StepKind::kForwardNoGrad && i > 0) act[i].reset();
        break;
      }
      case StepKind::kForwardGrad: {
        SavedStage s;
        s.outputs = RunStage(i, input_of(i), inputs, true, &s.leaves, !ran[i], &s.tensor_counts);
        ran[i] = true;
        saved[i] = std::move(s);
        break;
      }
      case StepKind::kLoss: {
        m.live_after_forward_bytes = tracker_.live_bytes() - m.other_bytes;
        std::vector<at::Tensor> outputs = Flatten(input_of(i));
        std::vector<at::Tensor> leaves;
        for (const at::Tensor& t : outputs) {
          leaves.push_back(t.defined() && t.is_floating_point() ? t.detach().requires_grad_(true) : at::Tensor());
        }
        std::vector<at::Tensor> loss_inputs;
        for (size_t k = 0; k < outputs.size(); ++k) loss_inputs.push_back(leaves[k].defined() ? leaves[k] : outputs[k]);
        at::Tensor loss = Loss(loss_inputs);
        torch::autograd::backward({loss});
        std::vector<at::Tensor> g;
        for (const at::Tensor& leaf : leaves) g.push_back(leaf.defined() ? leaf.grad() : at::Tensor());
        grad[i] = std::move(g);
        act[i].reset();
        break;
      }
      case StepKind::kBackward: {
        // A recomputation's autocast region has ended (as torch.utils.checkpoint's does).
        staged_.program().EndAutocast();
        if (!saved[i] || !grad[i + 1]) {
          throw Error(ExitCode::kVerifyFailed, "the schedule runs the backward of stage " + std::to_string(i) +
                                                   " before its forward with autograd or its output gradient");
        }
        std::vector<at::Tensor> roots, root_grads;
        std::vector<at::Tensor> outputs = Flatten(saved[i]->outputs);
        std::vector<at::Tensor> g = std::move(*grad[i + 1]);
        grad[i + 1].reset();
        for (size_t k = 0; k < outputs.size() && k < g.size(); ++k) {
          if (!outputs[k].defined() || !outputs[k].requires_grad() || !g[k].defined()) continue;
          // An input the stage passes on unchanged (a tensor read by a later
          // stage too): its gradient from later stages becomes the leaf's
          // own, and the stage's backward adds into it in place. As a root,
          // autograd would clone it, holding its size twice.
          at::Tensor* leaf = nullptr;
          for (at::Tensor& l : saved[i]->leaves) {
            if (l.defined() && l.unsafeGetTensorImpl() == outputs[k].unsafeGetTensorImpl()) leaf = &l;
          }
          if (leaf != nullptr) {
            if (leaf->grad().defined()) {
              torch::NoGradGuard no_grad;
              leaf->mutable_grad().add_(g[k]);
            } else {
              leaf->mutable_grad() = std::move(g[k]);
            }
            continue;
          }
          roots.push_back(outputs[k]);
          root_grads.push_back(std::move(g[k]));
        }
        g.clear();
        outputs.clear();
        if (!roots.empty()) torch::autograd::backward(roots, root_grads);
        roots.clear();
        root_grads.clear();
        // Gradients of the input cut, one per tensor in it (as Flatten counts them).
        std::vector<at::Tensor> in_grads;
        for (size_t k = 0; k < saved[i]->leaves.size(); ++k) {
          const at::Tensor& leaf = saved[i]->leaves[k];
          if (leaf.defined()) {
            in_grads.push_back(leaf.grad());
          } else {
            for (size_t t = 0; t < saved[i]->tensor_counts[k]; ++t) in_grads.push_back(at::Tensor());
          }
        }
        grad[i] = std::move(in_grads);
        saved[i].reset();
        if (i > 0) act[i].reset();
        break;
      }
    }
    if (trace) {
      std::fprintf(stderr, "trace %-18s live %10lld peak %10lld\n", Describe(op).c_str(),
                   static_cast<long long>(tracker_.live_bytes() - m.other_bytes),
                   static_cast<long long>(tracker_.window_peak_bytes() - m.other_bytes));
    }
  }
  grad.clear();
  Step();
  SynchronizeDevice(device_);  // kernels run after their launch returns
  m.ms = timer.Ms();
  m.peak_bytes = StepPeak(m);
  return m;
}

void ScheduleRunner::EndNodeStep(Environment& env, Measure& m, const std::function<void()>& after_backward) {
  std::vector<at::Tensor> outputs = Flatten(staged_.program().Outputs(env));
  m.live_after_forward_bytes = tracker_.live_bytes() - m.other_bytes;
  at::Tensor loss = Loss(outputs);
  env.clear();
  // As a training loop holds them (`out = model(x)`, `loss`): the outputs
  // and the loss alive through the backward and the optimizer's step
  // (Chain::output_held_bytes).
  torch::autograd::backward({loss});
  after_backward();
  Step();
  loss = at::Tensor();
  outputs.clear();
  SynchronizeDevice(device_);  // kernels run after their launch returns
}

double ScheduleRunner::TimeNoGradForward(const std::vector<at::Tensor>& inputs, bool recompute) {
  const size_t stages = staged_.stages();
  if (rng_state_.size() != stages) rng_state_.assign(stages, at::Tensor());
  Seed();
  SynchronizeDevice(device_);
  const StepTimer timer(device_.cuda());
  std::vector<c10::IValue> act;
  for (size_t s = 0; s < stages; ++s) act = RunStage(s, act, inputs, /*with_grad=*/false, nullptr, !recompute);
  SynchronizeDevice(device_);
  const double ms = timer.Ms();
  act.clear();
  staged_.program().EndAutocast();
  return ms;
}

// The optimizer step the plan was solved for, with its state kept across
// steps (each mode has its own); none during the gradient check.
void ScheduleRunner::Step() {
  if (optimizer_step_ != nullptr) optimizer_step_->Apply(params_);
}

}  // namespace ckplan
