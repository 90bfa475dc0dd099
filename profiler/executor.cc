#include "ckplan/profiler/executor.h"

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <set>

#include "ckplan/planner/baselines.h"
#include "ckplan/planner/error.h"
#include "ckplan/planner/json_io.h"
#include "ckplan/planner/plan_document.h"
#include "ckplan/planner/run_report.h"
#include "ckplan/planner/plan.h"
#include "ckplan/planner/schedule.h"
#include "ckplan/planner/sha256.h"
#include "device.h"
#include "meta_device.h"
#include "optimizer_step.h"
#include "timing.h"
#include "torch_graph.h"
#include "tracking_allocator.h"

namespace ckplan {
namespace {

using torch::jit::Value;



std::vector<at::Tensor> Flatten(const std::vector<c10::IValue>& values) {
  std::vector<at::Tensor> out;
  for (const auto& v : values) CollectTensors(v, &out);
  return out;
}

// The forward graph cut into the plan's stages: node ranges and the values
// live at each cut.
class StagedProgram {
 public:
  StagedProgram(GraphProgram& program, const std::vector<std::pair<int, int>>& op_ranges) : program_(program) {
    const size_t stages = op_ranges.size();
    const size_t nodes = program.nodes().size();
    for (size_t s = 0; s < stages; ++s) {
      size_t begin = s == 0 ? 0 : program.OpNode(op_ranges[s - 1].second) + 1;
      size_t end = s + 1 == stages ? nodes - 1 : program.OpNode(op_ranges[s].second);
      begin_.push_back(begin);
      end_.push_back(end);
    }
    // boundary[k]: values made before stage k starts and read from it on.
    std::unordered_map<const Value*, size_t> defined_at;
    for (size_t n = 0; n < nodes; ++n) {
      for (const Value* out : program.nodes()[n].node->outputs()) defined_at[out] = n;
    }
    boundary_.resize(stages + 1);
    for (size_t k = 0; k <= stages; ++k) {
      size_t cut = k < stages ? begin_[k] : nodes;
      for (size_t n = 0; n < cut; ++n) {
        for (const Value* out : program.nodes()[n].node->outputs()) {
          size_t last = program.LastUse(out);
          if (last >= cut && (last > n || k == stages)) boundary_[k].push_back(out);
        }
      }
    }
    for (size_t s = 0; s < stages; ++s) written_.push_back(WrittenInputs(s));
  }

  /// Whether stage s writes in place into its input k (`dropout_` on a
  /// `flatten` of it): such an input is copied when the stage starts, or a
  /// recomputation would read the written values, and autograd refuses to
  /// write into a view of the leaf that collects the input's gradient.
  bool Writes(size_t s, size_t k) const { return written_[s][k]; }

  size_t stages() const { return begin_.size(); }
  const std::vector<const Value*>& boundary(size_t k) const { return boundary_[k]; }
  size_t begin(size_t s) const { return begin_[s]; }
  size_t end(size_t s) const { return end_[s]; }
  GraphProgram& program() { return program_; }

 private:
  // From the ops' schemas: outputs that alias an input (views, unpacked
  // lists) carry its index; an argument marked as written (`Tensor(a!)`)
  // that carries one marks that input written.
  std::vector<bool> WrittenInputs(size_t s) const {
    const std::vector<const Value*>& in = boundary_[s];
    std::vector<bool> written(in.size(), false);
    std::unordered_map<const Value*, size_t> alias_of;
    for (size_t k = 0; k < in.size(); ++k) alias_of[in[k]] = k;
    for (size_t n = begin_[s]; n <= end_[s]; ++n) {
      const torch::jit::Node* node = program_.nodes()[n].node;
      std::optional<size_t> source;
      bool aliasing_outputs = node->kind() == c10::prim::ListUnpack || node->kind() == c10::prim::TupleUnpack;
      const c10::FunctionSchema* schema = node->maybeSchema();
      for (size_t i = 0; i < node->inputs().size(); ++i) {
        auto it = alias_of.find(node->inputs()[i]);
        if (it == alias_of.end()) continue;
        const c10::AliasInfo* info =
            schema && i < schema->arguments().size() ? schema->arguments()[i].alias_info() : nullptr;
        if (info && info->isWrite()) written[it->second] = true;
        if (info || aliasing_outputs) source = it->second;
      }
      if (!source) continue;
      for (size_t j = 0; j < node->outputs().size(); ++j) {
        const bool aliases = aliasing_outputs || (schema && j < schema->returns().size() &&
                                                  schema->returns()[j].alias_info() != nullptr);
        if (aliases) alias_of[node->outputs()[j]] = *source;
      }
    }
    return written;
  }

  GraphProgram& program_;
  std::vector<size_t> begin_, end_;
  std::vector<std::vector<const Value*>> boundary_;
  std::vector<std::vector<bool>> written_;
};

struct SavedStage {
  std::vector<at::Tensor> leaves;    // per boundary value of the input (undefined when none)
  std::vector<size_t> tensor_counts; // per boundary value of the input: tensors inside it
  std::vector<c10::IValue> outputs;  // boundary values of the output, with their autograd graph
};

struct Measure {
  int64_t other_bytes = 0;  // live at the step's start that is not the model's state or inputs
  int64_t peak_bytes = 0;
  int64_t live_after_forward_bytes = 0;
  double ms = 0;
  int64_t device_base = -1;  // bytes allocated on the GPU at the reset
  int64_t ledger_kept = 0;   // the ledger's live bytes at the reset that are the model's
};

class Executor {
 public:
  Executor(const RunOptions& options, const nlohmann::json& plan)
      : options_(options), plan_(plan), tracker_(TrackingAllocator::Instance()) {}

  RunReport Run() {
    if (options_.steps < 1) throw BadInput("invalid --steps " + std::to_string(options_.steps) + ": must be at least 1");
    if (options_.loss != "sum" && options_.loss != "mean" && options_.loss != "mse") {
      throw BadInput("invalid --loss '" + options_.loss + "': use sum, mean or mse");
    }
    at::set_num_threads(options_.threads);
    device_ = OpenDevice(options_.device);
    TrackDeviceMemory(device_);
    ReadPlan();
    torch::jit::Module module = LoadModel(options_.model_path);
    if (HasMetaWeights(module)) {
      throw BadInput(options_.model_path + ": a shapes-only archive (exported from a model on the meta device): it "
                                           "has no weights to run; ckplan profile --device meta reads it");
    }
    if (device_.cuda()) module.to(device_.device);
    CheckIdentity();
    GraphProgram program(module);
    if (program.num_ops() != num_ops_) {
      throw BadInput(options_.plan_path + ": the plan's stages cover " + std::to_string(num_ops_) +
                     " ops but the model has " + std::to_string(program.num_ops()) + ": it was made for another model");
    }
    CheckModules(program);
    StagedProgram staged(program, op_ranges_);
    std::vector<at::Tensor> inputs = MakeInputs(input_specs_, 0);
    if (device_.cuda()) {
      for (at::Tensor& t : inputs) t = t.to(device_.device);
    }
    // Tied weights (GPT-2's lm_head and wte) are one parameter listed twice:
    // one gradient, one optimizer update, counted once.
    std::set<const void*> seen;
    for (const auto& p : module.parameters()) {
      if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) params_.push_back(p);
    }
    for (const auto& b : module.buffers()) {
      if (seen.insert(b.unsafeGetTensorImpl()).second) buffers_.push_back(b);
    }

    // Correctness: the same step with and without the plan, from the same
    // parameters and random state, gives the same gradients.
    Progress("checking gradients", 0);
    RunPlainStep(staged, inputs, /*record=*/true);
    std::vector<at::Tensor> expected;
    for (const auto& p : params_) expected.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    ZeroGrads();
    RunPlannedStep(staged, inputs);
    CompareGrads(expected);
    expected.clear();
    for (auto& p : params_) p.mutable_grad() = at::Tensor();

    // Measurement: each mode with its own optimizer state, a warm-up, then steps.
    RunReport report;
    MeasureModes(staged, inputs, &report);
    Progress("", 1 + 2 * (options_.steps + 1));
    return Finish(report);
  }

 private:
  // `done` of the run's steps: the gradient check (one), then each mode's
  // warm-up and measured steps.
  void Progress(const std::string& what, int done) {
    if (options_.progress) options_.progress(what, done / (1.0 + 2.0 * (options_.steps + 1)));
  }

  // The plan through its contract (plan_document.h); what a run needs
  // beyond it (a profile's source, op ranges, a schedule) is checked here.
  void ReadPlan() {
    const PlanDocument doc = PlanFromJson(plan_, options_.plan_path);
    JsonReader root(plan_, options_.plan_path);  // names the fields in this function's errors
    if (doc.is_pipeline) {
      root.Field("distributed").Fail("a pipeline plan has no schedule of its own: each of distributed.stages is the "
                                     "plan of one pipeline stage");
    }
    JsonReader source = root.Field("source");
    if (source.Field("kind").String() != "profile") {
      source.Field("kind").Fail("the plan was made from a chain file; `ckplan run` needs a plan made from a profile of the model");
    }
    sha256_ = source.Field("model_sha256").String();
    JsonReader inputs = source.Field("inputs");
    for (size_t i = 0; i < inputs.ArraySize(); ++i) {
      input_specs_.push_back(ParseInputSpec(inputs.Item(i).Field("text").String()));
    }
    int next = 0;
    for (size_t s = 0; s < doc.stages.size(); ++s) {
      const PlanStage& stage = doc.stages[s];
      JsonReader field = root.Field("stages").Item(s);
      if (stage.first_op < 0) field.Field("first_op");  // throws: missing
      if (stage.last_op < 0) field.Field("last_op");
      if (stage.first_op != next || stage.last_op < stage.first_op) field.Fail("op ranges must follow one another from op 0");
      op_ranges_.push_back({stage.first_op, stage.last_op});
      stage_modules_.push_back(stage.modules);
      stage_names_.push_back(stage.name);
      next = stage.last_op + 1;
    }
    if (op_ranges_.empty()) root.Field("stages").Fail("no stages");
    num_ops_ = next;
    schedule_ = doc.schedule;
    if (schedule_.empty()) root.Field("schedule").Fail("empty: the plan has no schedule");
    for (const ScheduleStep& op : schedule_) {
      int max_stage = static_cast<int>(op_ranges_.size()) - (op.kind == StepKind::kLoss ? 0 : 1);
      if (op.stage > max_stage) root.Field("schedule").Fail("names stage " + std::to_string(op.stage) + ", out of range");
    }
    optimizer_ = doc.fixed.optimizer;
    algorithm_ = doc.algorithm;
    budget_bytes_ = doc.budget_bytes;
    predicted_peak_ = doc.predicted.peak_bytes;
    predicted_ms_ = doc.predicted.time_ms;
    predicted_overhead_ = doc.predicted.overhead_pct;
  }

  void CheckIdentity() {
    std::string actual = Sha256File(options_.model_path);
    if (actual != sha256_ && !options_.force) {
      throw BadInput(options_.plan_path + ": made for another model (sha256 " + sha256_.substr(0, 12) + ", " +
                     options_.model_path + " is " + actual.substr(0, 12) + "); use --force to run it anyway");
    }
  }

  void CheckModules(GraphProgram& program) {
    for (size_t s = 0; s < op_ranges_.size(); ++s) {
      for (const std::string& module : stage_modules_[s]) {
        bool found = false;
        for (int op = op_ranges_[s].first; op <= op_ranges_[s].second && !found; ++op) {
          const std::string& path = program.nodes()[program.OpNode(op)].module_path;
          found = path == module || path.rfind(module + ".", 0) == 0;
        }
        if (!found) {
          throw BadInput(options_.plan_path + ": stage " + std::to_string(s) + " (" + stage_names_[s] +
                         ") names module '" + module + "', which its ops in the model do not belong to");
        }
      }
    }
  }

  // Memory the process holds that is no part of the training step (the loaded
  // archive's records, copies kept for the gradient check): not counted.
  int64_t OtherBytes(const std::vector<at::Tensor>& inputs) {
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
      for (const auto& t : optimizer_step_->first()) add(t);
      for (const auto& t : optimizer_step_->second()) add(t);
    }
    for (const auto& t : targets_) add(t);
    for (const auto& t : inputs) add(t);
    return tracker_.live_bytes() - step;
  }

  // As `optimizer.zero_grad()` (set_to_none, PyTorch's default): gradients
  // appear during the backward, as the plan counts them.
  void ZeroGrads() {
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }

  void Seed() {
    for (at::Generator gen : {at::detail::getDefaultCPUGenerator(), DefaultGenerator(device_)}) {
      std::lock_guard<std::mutex> lock(gen.mutex());
      gen.set_current_seed(12345);
    }
  }

  at::Tensor Loss(const std::vector<at::Tensor>& outputs) {
    at::Tensor loss;
    size_t index = 0;
    for (const at::Tensor& t : outputs) {
      if (!t.defined() || !t.is_floating_point() || !t.requires_grad()) continue;
      at::Tensor term;
      if (options_.loss == "sum") {
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

  // A step without checkpointing, node by node (eager semantics).
  // The reference the gradients are checked against; it also records which
  // values require gradients.
  Measure RunPlainStep(StagedProgram& staged, const std::vector<at::Tensor>& inputs, bool record) {
    GraphProgram& program = staged.program();
    Seed();
    Measure m;
    m.other_bytes = OtherBytes(inputs);
    tracker_.ResetPeak();
    m.ledger_kept = tracker_.live_bytes() - m.other_bytes;
    m.device_base = ResetDevicePeak(device_);
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
    std::vector<at::Tensor> outputs = Flatten(program.Outputs(env));
    m.live_after_forward_bytes = tracker_.live_bytes() - m.other_bytes;
    at::Tensor loss = Loss(outputs);
    env.clear();
    outputs.clear();
    torch::autograd::backward({loss});
    loss = at::Tensor();
    Step();
    SynchronizeDevice(device_);  // kernels run after their launch returns
    m.ms = timer.Ms();
    m.peak_bytes = StepPeak(m);
    return m;
  }

  // The step's peak: the CUDA caching allocator's statistics on a GPU, the
  // tracking ledger on the CPU.
  int64_t StepPeak(const Measure& m) const {
    return StepPeakBytes(device_, m.device_base, m.ledger_kept, tracker_.peak_bytes() - m.other_bytes);
  }

  // Runs stage s from the values at its input cut; returns those at its output cut.
  std::vector<c10::IValue> RunStage(StagedProgram& staged, size_t s, const std::vector<c10::IValue>& in,
                                    const std::vector<at::Tensor>& inputs, bool with_grad,
                                    std::vector<at::Tensor>* leaves, bool first_time,
                                    std::vector<size_t>* tensor_counts = nullptr) {
    GraphProgram& program = staged.program();
    // Recomputation: the same random numbers, and buffers (batch norm
    // statistics) left as the first run left them.
    at::Generator gen = DefaultGenerator(device_);
    std::vector<int64_t> versions;
    at::Tensor rng_before;
    // Whether the stage draws random numbers is learnt on its first run (the
    // gradient check's step); later steps copy the generator's state only
    // for the stages that do (a copy and a comparison per stage cost about
    // as much as a small stage).
    if (draws_random_.size() < staged.stages()) draws_random_.resize(staged.stages(), -1);
    const bool keep_rng = draws_random_[s] != 0;
    // Which buffers a stage writes is learnt on its first run too (the
    // graph writes the same ones each step).
    if (mutated_buffers_.size() < staged.stages()) mutated_buffers_.resize(staged.stages());
    if (mutated_known_.size() < staged.stages()) mutated_known_.resize(staged.stages(), false);
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
    const auto& boundary_in = staged.boundary(s);
    for (size_t k = 0; k < boundary_in.size(); ++k) {
      const c10::IValue& v = in[k];
      if (tensor_counts) {
        std::vector<at::Tensor> inside;
        CollectTensors(v, &inside);
        tensor_counts->push_back(inside.size());
      }
      const bool written = v.isTensor() && staged.Writes(s, k);
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
    for (size_t n = staged.begin(s); n <= staged.end(s); ++n) {
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
    for (const Value* v : staged.boundary(s + 1)) out.push_back(env.at(v));
    if (learn_mutated) {
      for (size_t b = 0; b < buffers_.size(); ++b) {
        if (buffers_[b]._version() != versions[b]) mutated_buffers_[s].push_back(b);
      }
      mutated_known_[s] = true;
    }
    if (first_time) {
      // Keep the random state only for stages that drew random numbers.
      std::lock_guard<std::mutex> lock(gen.mutex());
      if (keep_rng && draws_random_[s] < 0) draws_random_[s] = at::equal(rng_before, gen.get_state()) ? 0 : 1;
      if (keep_rng && draws_random_[s] == 1) rng_state_[s] = rng_before;
    } else {
      torch::NoGradGuard guard;
      for (size_t b : mutated_buffers_[s]) buffers_[b].copy_(buffer_snapshots_[b]);
    }
    return out;
  }

  // The kept copy of buffer b (made on first use, outside the step's memory
  // from then on, like the buffer itself).
  at::Tensor& BufferSnapshot(size_t b) {
    if (buffer_snapshots_.size() < buffers_.size()) buffer_snapshots_.resize(buffers_.size());
    if (!buffer_snapshots_[b].defined()) buffer_snapshots_[b] = at::empty_like(buffers_[b]);
    return buffer_snapshots_[b];
  }

  // A step under the plan: its schedule, operation by operation.
  Measure RunPlannedStep(StagedProgram& staged, const std::vector<at::Tensor>& inputs) {
    return RunSchedule(staged, inputs, schedule_);
  }

  // A step running `schedule` (the plan's, or the one without recomputation).
  Measure RunSchedule(StagedProgram& staged, const std::vector<at::Tensor>& inputs, const Schedule& schedule) {
    const size_t stages = staged.stages();
    Seed();
    Measure m;
    m.other_bytes = OtherBytes(inputs);
    tracker_.ResetPeak();
    m.ledger_kept = tracker_.live_bytes() - m.other_bytes;
    m.device_base = ResetDevicePeak(device_);
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
        for (const auto& t : optimizer_step_->first()) state += t.numel() * t.element_size();
        for (const auto& t : optimizer_step_->second()) state += t.numel() * t.element_size();
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
          act[i + 1] = RunStage(staged, i, input_of(i), inputs, false, nullptr, !ran[i]);
          ran[i] = true;
          if (op.kind == StepKind::kForwardNoGrad && i > 0) act[i].reset();
          break;
        }
        case StepKind::kForwardGrad: {
          SavedStage s;
          s.outputs = RunStage(staged, i, input_of(i), inputs, true, &s.leaves, !ran[i], &s.tensor_counts);
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

  // The optimizer step the plan was solved for, with its state kept across
  // steps (each mode has its own); none during the gradient check.
  void Step() {
    if (optimizer_step_ != nullptr) optimizer_step_->Apply(params_);
  }

  void CompareGrads(const std::vector<at::Tensor>& expected) {
    for (size_t k = 0; k < params_.size(); ++k) {
      const at::Tensor& a = params_[k].grad();
      const at::Tensor& b = expected[k];
      if (!a.defined() && !b.defined()) continue;
      if (a.defined() != b.defined()) {
        max_abs_ = std::max(max_abs_, 1.0);
        max_rel_ = std::max(max_rel_, 1.0);
        continue;
      }
      double diff = (a - b).abs().max().item<double>();
      double scale = b.abs().max().item<double>();
      max_abs_ = std::max(max_abs_, diff);
      max_rel_ = std::max(max_rel_, scale > 0 ? diff / scale : diff);
    }
  }

  // Both modes, a warm-up step each, then measured steps taken in turn (the
  // order alternating), each mode with its own optimizer state: a machine
  // that slows down or speeds up during the run shifts both alike. The
  // baseline is measured the same way as the plan: the schedule without
  // recomputation, run stage by stage (the plain step, which the gradients
  // are checked against, does not pay for the cuts: its difference is no
  // cost of recomputation).
  void MeasureModes(StagedProgram& staged, const std::vector<at::Tensor>& inputs, RunReport* report) {
    OptimizerStep plain(optimizer_, options_.lr), planned(optimizer_, options_.lr);
    const Schedule no_recompute = NoCheckpointSchedule(static_cast<int>(staged.stages()));
    std::vector<double> ms[2];
    std::vector<Measure> all[2];
    const int total = options_.steps + 1;
    for (int step = 0; step < total; ++step) {
      for (int turn = 0; turn < 2; ++turn) {
        const bool is_planned = (turn == 1) != (step % 2 == 1);
        Progress(std::string("step ") + std::to_string(step + 1) + "/" + std::to_string(total) +
                     (is_planned ? " under the plan" : " without checkpointing"),
                 1 + 2 * step + turn);
        optimizer_step_ = is_planned ? &planned : &plain;
        ZeroGrads();
        Measure m = RunSchedule(staged, inputs, is_planned ? schedule_ : no_recompute);
        if (step > 0) {
          all[is_planned].push_back(m);
          ms[is_planned].push_back(m.ms);
        }
      }
    }
    optimizer_step_ = nullptr;
    StepMeasure* results[2] = {&report->baseline, &report->measured};
    for (int mode = 0; mode < 2; ++mode) {
      StepMeasure& result = *results[mode];
      for (const Measure& m : all[mode]) {
        result.peak_bytes = std::max(result.peak_bytes, m.peak_bytes);
        result.live_after_forward_bytes = std::max(result.live_after_forward_bytes, m.live_after_forward_bytes);
      }
      result.step_ms = Median(ms[mode]);
    }
    for (auto& p : params_) p.mutable_grad() = at::Tensor();
  }

  RunReport Finish(RunReport r) {
    r.model_path = options_.model_path;
    r.plan_path = options_.plan_path;
    r.algorithm = algorithm_;
    r.optimizer = optimizer_;
    r.budget_bytes = budget_bytes_;
    r.steps = options_.steps;
    r.predicted_peak_bytes = predicted_peak_;
    r.predicted_time_ms = predicted_ms_;
    r.predicted_overhead_pct = predicted_overhead_;
    r.measured_overhead_pct = OverheadPct(r.measured.step_ms, r.baseline.step_ms);
    r.max_abs_grad_diff = max_abs_;
    r.max_rel_grad_diff = max_rel_;
    r.peak_error_pct = PeakErrorPct(predicted_peak_, r.measured.peak_bytes);
    r.verdict = RunVerdict(r.measured.peak_bytes, budget_bytes_, max_rel_, r.peak_error_pct);
    return r;
  }

  const RunOptions& options_;
  const nlohmann::json& plan_;
  TrackingAllocator& tracker_;
  DeviceInfo device_;
  std::string sha256_, optimizer_, algorithm_;
  std::vector<InputSpec> input_specs_;
  std::vector<std::pair<int, int>> op_ranges_;
  std::vector<std::vector<std::string>> stage_modules_;
  std::vector<std::string> stage_names_;
  int num_ops_ = 0;
  Schedule schedule_;
  int64_t budget_bytes_ = 0, predicted_peak_ = 0;
  double predicted_ms_ = 0, predicted_overhead_ = 0;
  std::vector<at::Tensor> params_, buffers_;
  std::unordered_map<const Value*, bool> requires_grad_;
  std::vector<at::Tensor> rng_state_;
  std::vector<int> draws_random_;  // per stage: -1 not known yet, 0 no, 1 yes
  std::vector<std::vector<size_t>> mutated_buffers_;  // per stage: the buffers its forward writes
  std::vector<bool> mutated_known_;                    // per stage: mutated_buffers_ learnt
  std::vector<at::Tensor> buffer_snapshots_;           // per buffer: its values before a recomputation
  std::vector<at::Tensor> targets_;
  OptimizerStep* optimizer_step_ = nullptr;  // the measured mode's; none in the gradient check
  double max_abs_ = 0, max_rel_ = 0;
};

}  // namespace

RunReport RunPlan(const RunOptions& options, const nlohmann::json& plan) { return Executor(options, plan).Run(); }

}  // namespace ckplan
