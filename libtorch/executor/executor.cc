#include "libtorch/executor/executor.h"

#include <ATen/Parallel.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "planner/solvers/baselines.h"
#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/contracts/plan_document.h"
#include "planner/contracts/run_report.h"
#include "planner/plan/plan.h"
#include "planner/contracts/schedule.h"
#include "libtorch/runtime/file_hash.h"
#include "planner/solvers/modules.h"
#include "libtorch/runtime/device.h"
#include "libtorch/runtime/meta_device.h"
#include "libtorch/executor/optimizer_step.h"
#include "libtorch/executor/schedule_runner.h"
#include "libtorch/executor/staged_program.h"
#include "libtorch/runtime/timing.h"
#include "libtorch/runtime/graph_program.h"
#include "libtorch/runtime/tracking_allocator.h"

namespace ckplan {
namespace {

// The wrapped modules of a PyTorch-target plan, from its schedule (what
// ModuleSchedule makes of them: each module's stages run without autograd,
// the first keeping its input, then recomputed before their backwards).
// False for any other schedule.
bool WrappedModules(const Schedule& schedule, int stages, std::vector<std::pair<size_t, size_t>>* wrapped) {
  std::vector<WrappableModule> modules;
  for (const ScheduleStep& op : schedule) {
    if (op.kind == StepKind::kLoss) break;
    if (op.kind == StepKind::kForwardNoGradKeep) {
      modules.push_back({"", op.stage, op.stage});
    } else if (op.kind == StepKind::kForwardNoGrad) {
      if (modules.empty() || modules.back().last_stage + 1 != op.stage) return false;
      modules.back().last_stage = op.stage;
    }
  }
  if (!(ModuleSchedule(stages, modules) == schedule)) return false;
  wrapped->clear();
  for (const WrappableModule& m : modules) {
    wrapped->push_back({static_cast<size_t>(m.first_stage), static_cast<size_t>(m.last_stage)});
  }
  return true;
}

// Each of `params`' name in `module` (a tied weight's first).
std::vector<std::string> ParameterNames(const torch::jit::Module& module, const std::vector<at::Tensor>& params) {
  std::map<const void*, std::string> names;
  for (const auto& p : module.named_parameters()) names.emplace(p.value.unsafeGetTensorImpl(), p.name);
  std::vector<std::string> out;
  for (const at::Tensor& p : params) {
    auto it = names.find(p.unsafeGetTensorImpl());
    out.push_back(it != names.end() ? it->second : "parameter " + std::to_string(out.size()));
  }
  return out;
}

class Executor {
 public:
  Executor(const RunOptions& options, const PlanDocument& plan)
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
    program.SetAutocast(ResolveAutocast(options_.autocast, autocast_), device_.device.type());
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
    auto [params, buffers] = UniqueModuleTensors(module);
    param_names_ = ParameterNames(module, params);
    ScheduleRunner runner(options_, staged, device_, tracker_, std::move(params), std::move(buffers), stage_names_);

    // Correctness: the same step with and without the plan, from the same
    // parameters and random state, gives the same gradients.
    Progress("checking gradients", 0);
    runner.RunPlainStep(inputs, /*record=*/true);
    std::vector<at::Tensor> expected;
    for (const auto& p : runner.params()) expected.push_back(p.grad().defined() ? p.grad().clone() : at::Tensor());
    runner.ZeroGrads();
    if (modules_) {
      runner.RunModules(inputs, wrapped_);
    } else {
      runner.RunSchedule(inputs, schedule_);
    }
    CompareGrads(runner.params(), expected);
    expected.clear();
    runner.ZeroGrads();

    // Measurement: each mode with its own optimizer state, a warm-up, then steps.
    RunReport report;
    MeasureModes(runner, static_cast<int>(staged.stages()), inputs, &report);
    Progress("", 1 + 2 * (options_.steps + 1));
    return Finish(report);
  }

 private:
  // `done` of the run's steps: the gradient check (one), then each mode's
  // warm-up and measured steps.
  void Progress(const std::string& what, int done) {
    if (options_.progress) options_.progress(what, done / (1.0 + 2.0 * (options_.steps + 1)));
  }

  // An error naming a field of the plan file, as PlanFromJson's do.
  [[noreturn]] void FailField(const std::string& field, const std::string& why) const {
    throw BadInput(options_.plan_path + ": field '" + field + "': " + why);
  }

  // The plan as its contract read it (plan_document.h); what a run needs
  // beyond it (a profile's source, op ranges, a schedule) is checked here.
  void ReadPlan() {
    const PlanDocument& doc = plan_;
    if (doc.is_pipeline()) {
      FailField("distributed", "a pipeline plan has no schedule of its own: each of distributed.stages is the plan of "
                               "one pipeline stage");
    }
    if (doc.source.kind != "profile") {
      FailField("source.kind", "the plan was made from a chain file; `ckplan run` needs a plan made from a profile of "
                               "the model");
    }
    if (!doc.source.model_sha256) FailField("source.model_sha256", "missing");
    sha256_ = *doc.source.model_sha256;
    autocast_ = doc.source.autocast;  // what the profile ran under; none when absent
    // The profile's model.inputs, passed through (plan_document.h): each input's text.
    if (!doc.source.inputs) FailField("source.inputs", "missing");
    JsonReader inputs(*doc.source.inputs, options_.plan_path, "source.inputs");
    for (size_t i = 0; i < inputs.ArraySize(); ++i) {
      input_specs_.push_back(ParseInputSpec(inputs.Item(i).Field("text").String()));
    }
    int next = 0;
    for (size_t s = 0; s < doc.stages.size(); ++s) {
      const PlanStage& stage = doc.stages[s];
      const std::string field = "stages[" + std::to_string(s) + "]";
      if (!stage.ops) FailField(field + ".first_op", "missing");
      if (stage.ops->first != next || stage.ops->last < stage.ops->first) {
        FailField(field, "op ranges must follow one another from op 0");
      }
      op_ranges_.push_back({stage.ops->first, stage.ops->last});
      stage_modules_.push_back(stage.modules);
      stage_names_.push_back(stage.name);
      next = stage.ops->last + 1;
    }
    if (op_ranges_.empty()) FailField("stages", "no stages");
    num_ops_ = next;
    schedule_ = doc.schedule;
    if (schedule_.empty()) FailField("schedule", "empty: the plan has no schedule");
    for (const ScheduleStep& op : schedule_) {
      int max_stage = static_cast<int>(op_ranges_.size()) - (op.kind == StepKind::kLoss ? 0 : 1);
      if (op.stage > max_stage) FailField("schedule", "names stage " + std::to_string(op.stage) + ", out of range");
    }
    modules_ = doc.target == "pytorch" && WrappedModules(schedule_, static_cast<int>(op_ranges_.size()), &wrapped_);
    optimizer_ = doc.fixed.optimizer.name;
    optimizer_impl_ = doc.fixed.optimizer.impl.value_or(OptimizerImpl::kForLoop);
    optimizer_flags_ = doc.fixed.optimizer.flags;
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

  // The gradients under the plan against the plain step's (`expected`),
  // element by element as CompareGradient does (run_report.h): each
  // dtype's default tolerances, the atol scaled to the plain step's largest
  // gradient of any parameter.
  void CompareGrads(const std::vector<at::Tensor>& params, const std::vector<at::Tensor>& expected) {
    for (const at::Tensor& b : expected) {
      if (b.defined() && b.numel() > 0) max_abs_gradient_ = std::max(max_abs_gradient_, b.abs().max().item<double>());
    }
    for (size_t k = 0; k < params.size(); ++k) {
      const at::Tensor& a = params[k].grad();
      const at::Tensor& b = expected[k];
      if (!a.defined() && !b.defined()) continue;
      GradientDiff diff{param_names_[k], 0, 0};
      if (a.defined() != b.defined()) {
        diff.max_abs_diff = diff.tolerance_ratio = std::numeric_limits<double>::infinity();  // in one step only
      } else if (b.numel() > 0) {
        const GradientTolerance tolerance = DefaultGradientTolerance(std::string(c10::toString(b.scalar_type())));
        // In float32 at least: bfloat16 rounds the tolerance itself.
        const at::ScalarType type = at::promote_types(b.scalar_type(), at::kFloat);
        const at::Tensor got = a.to(type), want = b.to(type);
        at::Tensor d = (got - want).abs().masked_fill_(got == want, 0);  // equal infinities are equal
        diff.max_abs_diff = d.max().item<double>();
        const double atol = ScaledGradientAtol(tolerance.atol, max_abs_gradient_);
        diff.tolerance_ratio = (d / (want.abs() * tolerance.rtol + atol)).max().item<double>();
      }
      check_.Add(diff);
    }
  }

  // Both modes, a warm-up step each, then measured steps taken in turn (the
  // order alternating), each mode with its own optimizer state: a machine
  // that slows down or speeds up during the run shifts both alike. The
  // baseline is measured the same way as the plan: the schedule without
  // recomputation, run stage by stage (the plain step, which the gradients
  // are checked against, does not pay for the cuts: its difference is no
  // cost of recomputation).
  void MeasureModes(ScheduleRunner& runner, int stages, const std::vector<at::Tensor>& inputs, RunReport* report) {
    OptimizerStep plain(optimizer_, options_.lr, optimizer_impl_, optimizer_flags_),
        planned(optimizer_, options_.lr, optimizer_impl_, optimizer_flags_);
    const Schedule no_recompute = NoCheckpointSchedule(stages);
    std::vector<double> ms[2];
    std::vector<Measure> all[2];
    const int total = options_.steps + 1;
    for (int step = 0; step < total; ++step) {
      for (int turn = 0; turn < 2; ++turn) {
        const bool is_planned = (turn == 1) != (step % 2 == 1);
        Progress(std::string("step ") + std::to_string(step + 1) + "/" + std::to_string(total) +
                     (is_planned ? " under the plan" : " without checkpointing"),
                 1 + 2 * step + turn);
        runner.set_optimizer_step(is_planned ? &planned : &plain);
        runner.ZeroGrads();
        // A PyTorch-target plan: its modules wrapped against the plain step
        // (both as PyTorch runs them); a schedule against the schedule
        // without recomputation (both stage by stage).
        static const std::vector<std::pair<size_t, size_t>> kNothingWrapped;
        Measure m = modules_ ? runner.RunModules(inputs, is_planned ? wrapped_ : kNothingWrapped)
                             : runner.RunSchedule(inputs, is_planned ? schedule_ : no_recompute);
        if (step > 0) {
          all[is_planned].push_back(m);
          ms[is_planned].push_back(m.ms);
        }
      }
    }
    runner.set_optimizer_step(nullptr);
    StepMeasure* results[2] = {&report->baseline, &report->measured};
    for (int mode = 0; mode < 2; ++mode) {
      StepMeasure& result = *results[mode];
      for (const Measure& m : all[mode]) {
        result.peak_bytes = std::max(result.peak_bytes, m.peak_bytes);
        result.live_after_forward_bytes = std::max(result.live_after_forward_bytes, m.live_after_forward_bytes);
      }
      result.step_ms = Median(ms[mode]);
    }
    runner.ZeroGrads();
  }

  RunReport Finish(RunReport r) {
    r.model_path = options_.model_path;
    r.plan_path = options_.plan_path;
    r.algorithm = algorithm_;
    // With how it runs and its options (its temporaries differ): "adam (for-loop)",
    // "sgd (foreach, weight_decay 0.0001)".
    std::string how = OptimizerImplName(optimizer_impl_);
    if (optimizer_flags_.weight_decay != 0) {
      std::ostringstream decay;
      decay << optimizer_flags_.weight_decay;
      how += ", weight_decay " + decay.str();
    }
    if (optimizer_flags_.amsgrad) how += ", amsgrad";
    if (optimizer_flags_.nesterov) how += ", nesterov";
    r.optimizer = optimizer_ == "none" ? optimizer_ : optimizer_ + " (" + how + ")";
    r.budget_bytes = budget_bytes_;
    r.steps = options_.steps;
    r.predicted_peak_bytes = predicted_peak_;
    r.predicted_time_ms = predicted_ms_;
    r.predicted_overhead_pct = predicted_overhead_;
    r.measured_overhead_pct = OverheadPct(r.measured.step_ms, r.baseline.step_ms);
    r.max_abs_grad_diff = check_.max_abs_diff;
    r.max_rel_grad_diff = max_abs_gradient_ > 0 ? check_.max_abs_diff / max_abs_gradient_ : check_.max_abs_diff;
    r.worst_grad_parameter = check_.worst.parameter;
    r.worst_grad_abs_diff = check_.worst.max_abs_diff;
    r.grad_tolerance_ratio = check_.worst.tolerance_ratio;
    r.peak_error_pct = PeakErrorPct(predicted_peak_, r.measured.peak_bytes);
    r.failed_checks = FailedRunChecks(r.measured.peak_bytes, budget_bytes_, r.grad_tolerance_ratio, r.peak_error_pct);
    r.verdict = RunVerdict(r.measured.peak_bytes, budget_bytes_, r.grad_tolerance_ratio, r.peak_error_pct);
    return r;
  }

  const RunOptions& options_;
  const PlanDocument& plan_;
  TrackingAllocator& tracker_;
  DeviceInfo device_;
  std::string sha256_, optimizer_, algorithm_;
  std::optional<std::string> autocast_;  // the plan's source.autocast
  OptimizerImpl optimizer_impl_ = OptimizerImpl::kForLoop;
  OptimizerFlags optimizer_flags_;
  std::vector<InputSpec> input_specs_;
  std::vector<std::pair<int, int>> op_ranges_;
  std::vector<std::vector<std::string>> stage_modules_;
  std::vector<std::string> stage_names_;
  int num_ops_ = 0;
  Schedule schedule_;
  bool modules_ = false;  // a PyTorch-target plan: run as PyTorch runs its wrapped modules
  std::vector<std::pair<size_t, size_t>> wrapped_;  // their first and last stages
  int64_t budget_bytes_ = 0, predicted_peak_ = 0;
  double predicted_ms_ = 0, predicted_overhead_ = 0;
  std::vector<std::string> param_names_;  // per parameter of the runner's
  double max_abs_gradient_ = 0;            // the plain step's largest |gradient|
  GradientCheck check_;
};

}  // namespace

RunReport RunPlan(const RunOptions& options, const PlanDocument& plan) { return Executor(options, plan).Run(); }

}  // namespace ckplan
