// `ckplan profile` and `ckplan run`: the commands that need LibTorch. This
// file itself includes no torch header; the work is in ckplan_profiler.

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/contracts/plan_document.h"
#include "planner/cost/chain_from_profile.h"
#include "planner/base/units.h"
#include "planner/cost/cost_model.h"
#include "planner/cost/gpu_table.h"
#include "libtorch/profiler/cpu_peak.h"
#include "libtorch/executor/executor.h"
#include "libtorch/profiler/profiler.h"
#include "cli/commands.h"
#include "cli/terminal.h"

namespace ckplan {
namespace {

// `ckplan profile`'s options: the profiler's own, with their defaults
// (profiler.h), and what the command adds around them.
struct ProfileCommandOptions {
  ProfileOptions profile;           ///< MODEL, --reps, --threads, --device, --dtype, --autocast
  std::vector<std::string> inputs;  ///< --input as written, parsed into profile.inputs
  std::string output;
  std::string gpu;
  int top = 10;
};

void PrintProfileSummary(const Profile& p, FILE* out, int top) {
  const ProfileTotals& t = p.totals;
  // The profiler wrote this profile: every field it writes is there.
  const ModelRecord& model = p.model;
  const EnvironmentRecord& environment = p.environment;
  std::string inputs;
  for (const InputSpec& in : model.inputs.value_or(std::vector<InputSpec>{})) {
    inputs += (inputs.empty() ? "" : ", ") + in.text;
  }
  std::fprintf(out, "profiled %s (sha256 %.12s) with --input %s; LibTorch %s, %d thread(s), median of %d reps\n",
               model.path.value_or("").c_str(), model.sha256.value_or("").c_str(), inputs.c_str(),
               environment.libtorch.value_or("").c_str(), environment.threads.value_or(0), environment.reps.value_or(0));
  std::fprintf(out, "parameters %s, buffers %s, inputs %s\n", FormatBytes(t.param_bytes).c_str(),
               FormatBytes(t.buffer_bytes).c_str(), FormatBytes(t.input_bytes).c_str());
  std::fprintf(out, "kept for backward %s, outputs %s, peak of the step %s\n", FormatBytes(t.saved_bytes).c_str(),
               FormatBytes(t.output_bytes).c_str(), FormatBytes(t.peak_bytes).c_str());
  std::fprintf(out, "forward %.2f ms, backward %.2f ms\n", t.fwd_ms, t.bwd_ms);
  const std::string device = environment.DeviceName();
  if (device != "cpu") {
    std::fprintf(out, "device %s; %s; memory: %s\n", device.c_str(), environment.timer.value_or("").c_str(),
                 environment.memory.value_or("").c_str());
  }

  if (environment.time_model.is_object()) {
    const auto& m = environment.time_model;
    std::fprintf(out, "times: cost model for %s (%s), not measured\n", m.value("gpu", "").c_str(),
                 m.value("description", "").c_str());
  }

  Chain chain = ChainFromProfile(p, model.path.value_or("profile"));
  std::vector<std::vector<std::string>> rows = {{"#", "stage", "ops", "fwd", "bwd", "out", "saved"}};
  for (int i = 0; i < chain.length(); ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    rows.push_back({std::to_string(i), s.name, Format("%d-%d", s.ops->first, s.ops->last), FormatMs(s.fwd_ms),
                    FormatMs(s.bwd_ms), FormatBytes(s.out_bytes), FormatBytes(s.saved_bytes)});
  }
  std::fprintf(out, "\n%zu ops in %d stages:\n%s", p.ops.size(), chain.length(),
               FormatTable(rows, {true, false, true, true, true, true, true}).c_str());

  std::vector<const OpRecord*> ops;
  for (const OpRecord& op : p.ops) ops.push_back(&op);
  std::stable_sort(ops.begin(), ops.end(), [](const OpRecord* a, const OpRecord* b) { return a->saved_bytes > b->saved_bytes; });
  std::vector<std::vector<std::string>> top_rows = {{"op", "kind", "module", "kept", "fwd", "bwd"}};
  for (int k = 0; k < top && k < static_cast<int>(ops.size()) && ops[static_cast<size_t>(k)]->saved_bytes > 0; ++k) {
    const OpRecord* op = ops[static_cast<size_t>(k)];
    top_rows.push_back({std::to_string(op->id), op->kind, op->module.empty() ? "<top>" : op->module,
                        FormatBytes(op->saved_bytes), Format("%.3f ms", op->fwd_ms), Format("%.3f ms", op->bwd_ms)});
  }
  std::fprintf(out, "\nops that keep the most for backward:\n%s",
               FormatTable(top_rows, {true, false, false, true, true, true}).c_str());
}

int RunProfile(const ProfileCommandOptions& o) {
  CheckOutputPath(o.output);  // a missing folder is said before the work, not after
  ProfileOptions options = o.profile;
  for (const std::string& text : o.inputs) options.inputs.push_back(ParseInputSpec(text));
  if (options.threads < 1) throw BadInput("invalid --threads " + std::to_string(options.threads) + ": must be at least 1");
  const bool json_to_stdout = o.output == "-";
  FILE* human = json_to_stdout ? stderr : stdout;
  std::optional<GpuSpec> gpu;
  if (!o.gpu.empty() && o.gpu != "cpu") gpu = FindGpu(o.gpu);  // an unknown name fails before any work
  if (options.device == "meta" && o.gpu.empty()) {
    throw BadInput("--device meta measures no time: give --gpu NAME for the cost model's times (" + KnownGpuNames() +
                   ")");
  }
  if (options.device == "meta") options.reps = 1;  // nothing to time: one warm-up, one recorded step
  std::vector<std::string> warnings;
  Profile profile;
  {
    // On a terminal only; erased before the summary prints.
    ProgressBar bar("profiling " + options.model_path, StderrIsTerminal(), ProgressDelaySeconds());
    options.progress = [&bar](int done, int total) { bar.Update(static_cast<double>(done) / total); };
    profile = ProfileModel(options, &warnings);
  }
  double calibration_s = 0, calibration_cpu_s = 0;
  if (o.gpu == "cpu") {
    const auto start = std::chrono::steady_clock::now();
    const std::clock_t cpu_start = std::clock();
    gpu = MeasureCpuPeak(options.threads);
    MeasureCpuOpCosts(profile, &*gpu);
    calibration_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    calibration_cpu_s = static_cast<double>(std::clock() - cpu_start) / CLOCKS_PER_SEC;
  }
  if (gpu) ApplyCostModel(&profile, *gpu);
  if (o.gpu == "cpu") {  // what measuring this machine took: wall and the process's CPU time
    profile.environment.time_model["calibration_s"] = calibration_s;
    profile.environment.time_model["calibration_cpu_s"] = calibration_cpu_s;
  }
  for (const std::string& w : warnings) std::fprintf(stderr, "ckplan: warning: %s\n", w.c_str());
  if (profile.model.output_choice) {
    std::fprintf(stderr, "ckplan: %s\n", profile.model.output_choice->c_str());
  }
  PrintProfileSummary(profile, human, o.top);
  EmitOutput(o.output, ProfileToJson(profile).dump(1) + "\n", human);
  return 0;
}

}  // namespace

void AddProfileCommand(CLI::App& app, Action* action) {
  auto o = std::make_shared<ProfileCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "profile",
      "Measure a model: for every op of the forward graph, its module path, tensors,\n"
      "the bytes it keeps for backward and its forward/backward time, from real passes on the CPU\n"
      "(or a GPU with --device cuda).\n"
      "MODEL is a .pt2 from torch.export (ckplan_torch.export(model, inputs, \"model.pt2\"): train mode,\n"
      "dynamic batch) or a TorchScript file from torch.jit.trace(model, example).save(path) in train mode.");
  cmd->add_option("model", o->profile.model_path, "model file: .pt2 (torch.export) or TorchScript")->required();
  cmd->add_option("-i,--input", o->inputs,
                  "one per model input, in order: SHAPE[:DTYPE[:LO..HI]], e.g. 8x3x224x224 or 4x1024:int64:0..50257\n"
                  "(float inputs ~ normal(0,1); integers uniform in [LO, HI), default: an embedding's vocabulary\n"
                  "for the ids it indexes, else 0..2; fixed seed). Default: the example inputs' shapes, dtypes\n"
                  "and integer ranges a .pt2 from ckplan_torch.export records (keyword inputs such as labels after\n"
                  "the positional ones, in the order given)");
  cmd->add_option("-o,--output", o->output, "write the profile JSON here (ckplan.profile/1); - for stdout");
  cmd->add_option("--reps", o->profile.reps, "measured repetitions after one warm-up; times are medians")->capture_default_str();
  cmd->add_option("--calibrate", o->profile.calibrate,
                  "time recomputation as it runs, for: all (every target), pytorch (apply's wrapped modules:\n"
                  "--target pytorch and sac; the schedule target's recomputation priced at the ops' own\n"
                  "forward without autograd) or none (the profile is quicker; every target priced so)")
      ->capture_default_str();
  cmd->add_option("--threads", o->profile.threads, "LibTorch threads")->capture_default_str();
  cmd->add_option("--device", o->profile.device,
                  "cpu, or cuda[:N]: GPU memory from the CUDA caching allocator, kernel time from CUPTI\n"
                  "(needs a build whose LibTorch has CUDA, as the torch wheel's has, and a GPU),\n"
                  "or meta: the same graph and autograd on meta tensors (shapes only, no data, no time:\n"
                  "exact bytes for models bigger than this machine; times from --gpu's cost model)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->profile.dtype, "bf16, fp16 or fp32: cast the parameters and float inputs for the profile");
  cmd->add_option("--autocast", o->profile.autocast,
                  "bf16, fp16 or off: the forward and the loss under torch.autocast with that dtype, the weights\n"
                  "in their own (mixed precision as Trainer(bf16=True) runs it; --dtype casts the weights: another\n"
                  "job). Default: as the .pt2 was exported (ckplan_torch.export(..., autocast=torch.bfloat16)),\n"
                  "else off");
  cmd->add_option("--gpu", o->gpu,
                  "op times from the cost model for this device instead of measured ones (FLOPs and bytes per op,\n"
                  "roofline): " + KnownGpuNames() + " (cpu: this machine's measured peak)");
  cmd->add_option("--top", o->top, "how many ops to list by memory kept")->capture_default_str();
  cmd->callback([o, action] { *action = [o] { return RunProfile(*o); }; });
}

// `ckplan run`'s options: the executor's own, with their defaults
// (executor.h), and where the report goes.
struct RunCommandOptions {
  RunOptions run;  ///< MODEL, --plan, --steps, --loss, --force, --threads, --device, --autocast
  std::string output;
};

int RunRunCommand(const RunCommandOptions& o) {
  CheckOutputPath(o.output);
  const std::string& model = o.run.model_path;
  const std::string& plan = o.run.plan_path;
  // The plan through its one reader, for the executor and for the summary:
  // bytes print in the unit style its budget was written in (binary when absent).
  const PlanDocument document = PlanFromJson(ReadJsonFile(plan), plan);
  if (document.target == "sac") {
    throw BadInput(plan + ": a selective-checkpointing plan (--target sac) runs in PyTorch only: apply it with "
                   "ckplan_torch.apply_plan(model, plan) in the training job (ckplan run checks --target pytorch "
                   "and schedule plans)");
  }
  const UnitStyle style = *UnitStyleFromName(document.unit_style.value_or("binary"));
  auto bytes = [style](int64_t value) { return FormatBytes(value, style); };
  RunOptions options = o.run;
  RunReport r;
  {
    // On a terminal only; erased before the results print.
    ProgressBar bar("running " + model + " under " + plan, StderrIsTerminal(), ProgressDelaySeconds());
    options.progress = [&bar](const std::string&, double fraction) { bar.Update(fraction); };
    r = RunPlan(options, document);
  }
  const bool json_to_stdout = o.output == "-";
  FILE* out = json_to_stdout ? stderr : stdout;
  std::fprintf(out, "%s under %s (%s, budget %s, %s optimizer): median of %d steps after a warm-up\n",
               model.c_str(), plan.c_str(), r.algorithm.c_str(), bytes(r.budget_bytes).c_str(),
               r.optimizer.c_str(), r.steps);
  std::vector<std::vector<std::string>> rows = {{"", "peak", "live after forward", "step", "overhead"}};
  rows.push_back({"predicted", bytes(r.predicted_peak_bytes), "", FormatMs(r.predicted_time_ms),
                  FormatPct(r.predicted_overhead_pct)});
  rows.push_back({"under the plan", bytes(r.measured.peak_bytes), bytes(r.measured.live_after_forward_bytes),
                  FormatMs(r.measured.step_ms), FormatPct(r.measured_overhead_pct)});
  rows.push_back({"no checkpointing", bytes(r.baseline.peak_bytes),
                  bytes(r.baseline.live_after_forward_bytes), FormatMs(r.baseline.step_ms), ""});
  std::fprintf(out, "%s", FormatTable(rows, {false, true, true, true, true}).c_str());
  std::fprintf(out, "predicted peak %s against measured; gradients: max abs diff %.3g, max rel diff %.3g\n",
               FormatPct(r.peak_error_pct).c_str(), r.max_abs_grad_diff, r.max_rel_grad_diff);
  if (std::find(r.failed_checks.begin(), r.failed_checks.end(), "grads_differ") != r.failed_checks.end()) {
    std::fprintf(out, "gradients differ most at %s: max abs diff %.3g, %.3g times its tolerance\n",
                 r.worst_grad_parameter.c_str(), r.worst_grad_abs_diff, r.grad_tolerance_ratio);
  }
  std::string also;
  for (size_t i = 1; i < r.failed_checks.size(); ++i) also += (i > 1 ? ", " : "") + r.failed_checks[i];
  std::fprintf(out, "verdict: %s%s\n", r.verdict.c_str(), also.empty() ? "" : ("; also failed: " + also).c_str());
  if (document.target == "pytorch") {
    std::fprintf(out,
                 "run as PyTorch runs it: eager, its %zu wrapped modules recomputed as torch.utils.checkpoint does "
                 "(no checkpointing: the plain eager step)\n",
                 document.checkpoint_modules.size());
  }
  EmitOutput(o.output, RunReportToJson(r).dump(2) + "\n", out);
  return r.verdict == "ok" ? 0 : static_cast<int>(ExitCode::kVerifyFailed);
}

void AddRunCommand(CLI::App& app, Action* action) {
  auto o = std::make_shared<RunCommandOptions>();
  CLI::App* cmd = app.add_subcommand(
      "run",
      "Check a plan with real training steps: run the model under the plan's schedule (checkpointed\n"
      "stages recomputed in backward) and without checkpointing, with the plan's optimizer, and compare\n"
      "measured peak memory, time and gradients with the prediction. Exit code 4 unless the verdict is ok\n"
      "(peak within budget, gradients equal, predicted peak within 5%).");
  cmd->add_option("model", o->run.model_path, "the model (.pt2 or TorchScript) the plan was made for")->required();
  cmd->add_option("-p,--plan", o->run.plan_path, "plan JSON from `ckplan solve` on this model's profile")->required();
  cmd->add_option("-o,--output", o->output, "write the run report JSON here; - for stdout");
  cmd->add_option("--steps", o->run.steps, "measured steps per mode, after a warm-up")->capture_default_str();
  cmd->add_option("--loss", o->run.loss, "sum, mean, or mse against a fixed random target")
      ->check(CLI::IsMember({"sum", "mean", "mse"}))
      ->capture_default_str();
  cmd->add_flag("--force", o->run.force, "run a plan made for another model file");
  cmd->add_option("--threads", o->run.threads, "LibTorch threads")->capture_default_str();
  cmd->add_option("--device", o->run.device,
                  "cpu, or cuda[:N]: GPU memory from the CUDA caching allocator, kernel time from CUPTI\n"
                  "(needs a build whose LibTorch has CUDA, as the torch wheel's has, and a GPU)")
      ->capture_default_str();
  cmd->add_option("--autocast", o->run.autocast,
                  "bf16, fp16 or off: the forward and the loss under torch.autocast; default: as the plan's\n"
                  "profile ran them (its source.autocast)");
  cmd->callback([o, action] { *action = [o] { return RunRunCommand(*o); }; });
}

}  // namespace ckplan
