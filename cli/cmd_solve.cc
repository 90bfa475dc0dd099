// `ckplan solve`: a checkpoint plan for a chain or a profile under a budget.

#include <cmath>
#include <cstdio>
#include <iostream>
#include <optional>
#include <set>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/base/error.h"
#include "planner/cost/gpu_table.h"
#include "planner/plan/planner_input.h"
#include "planner/base/json_io.h"
#include "planner/plan/plan.h"
#include "planner/plan/plan_to_document.h"
#include "planner/solvers/recurrence.h"
#include "planner/solvers/modules.h"
#include "planner/cost/sac_candidates.h"
#include "planner/contracts/sweep_document.h"
#include "cli/batch_solve.h"
#include "cli/commands.h"
#include "cli/distributed_solve.h"
#include "cli/optimizer_options.h"
#include "cli/strategy_table.h"
#include "cli/terminal.h"

namespace ckplan {
namespace {

struct SolveOptions {
  std::string input;
  std::string budget;
  std::string output;
  std::string algorithm = "optimal";
  int every_n = 0;
  bool every_given = false;
  int slots = 500;
  OptimizerOptions optimizer;
  std::string sweep_path;
  int threads = 1;
  bool show_stages = false;
  std::string chain_out;
  std::string target;  // "pytorch" (default for a profile) or "schedule"
  DistributedOptions distributed;  // --data-parallel, --shard, --pipeline, ... (cmd_distributed.cc)
  std::string gpu;  ///< --gpu: what --budget gpu means
  BatchOptions batch;  ///< --batch and what goes with it (cli/batch_solve.h)
  double sac_dispatch_us = kDefaultSacDispatchUs;  ///< --sac-dispatch-us
};

// `--budget`, parsed once: its bytes, the unit style they were written in
// and the text (for messages); `gpu` is the --gpu device's memory, in MiB
// as the table holds it. Absent without --budget. An unknown --gpu is an
// error either way.
std::optional<ByteQuantity> ParseBudgetOption(const SolveOptions& o) {
  if (o.budget != "gpu") {
    if (!o.gpu.empty()) FindGpu(o.gpu);
    if (o.budget.empty()) return std::nullopt;
    return ParseBytes(o.budget);
  }
  if (o.gpu.empty() || o.gpu == "cpu") {
    throw BadInput("--budget gpu needs --gpu NAME: one of " + KnownGpuNames().substr(0, KnownGpuNames().size() - 5));
  }
  return ParseBytes(std::to_string(FindGpu(o.gpu).memory_bytes >> 20) + "MiB");
}

void PrintStages(const PlannerInput& in, UnitStyle style) {
  const Chain& c = in.chain;
  auto bytes = [style](int64_t value) { return FormatBytes(value, style); };
  std::vector<std::vector<std::string>> rows = {
      {"#", "stage", "ops", "fwd", "bwd", "out", "saved", "fwd tmp", "bwd tmp"}};
  for (int i = 0; i < c.length(); ++i) {
    const Stage& s = c.stages[static_cast<size_t>(i)];
    std::string ops = s.ops ? Format("%d-%d", s.ops->first, s.ops->last) : "";
    rows.push_back({std::to_string(i), s.name, ops, FormatMs(s.fwd_ms), FormatMs(s.bwd_ms), bytes(s.out_bytes),
                    bytes(s.saved_bytes), bytes(s.fwd_tmp_bytes), bytes(s.bwd_tmp_bytes)});
  }
  std::printf("%d stages, input %s\n%s", c.length(), bytes(c.input_bytes).c_str(),
              FormatTable(rows, {true, false, true, true, true, true, true, true, true}).c_str());
}

std::string DescribeFixed(const FixedMemory& fixed, UnitStyle style) {
  auto bytes = [style](int64_t value) { return FormatBytes(value, style); };
  const int64_t whole_step_grads = fixed.grad_bytes - fixed.backward_grad_bytes;
  std::string text = Format("parameters %s + buffers %s + ", bytes(fixed.param_bytes).c_str(), bytes(fixed.buffer_bytes).c_str());
  if (whole_step_grads > 0 || fixed.backward_grad_bytes == 0) text += "gradients " + bytes(whole_step_grads) + " + ";
  text += Format("%s state %s = %s", fixed.optimizer.c_str(), bytes(fixed.optimizer_bytes).c_str(), bytes(fixed.total()).c_str());
  // One memory model: gradients appear during backward, stage by stage.
  if (fixed.backward_grad_bytes > 0) text += "; gradients " + bytes(fixed.backward_grad_bytes) + " counted as they appear in backward";
  return text;
}

// The minimum budget as the user would type it, rounded up and checked so
// that the printed value itself is feasible.
std::string PrintableMinimum(int64_t minimum, const ByteQuantity& budget, const std::function<bool(int64_t)>& feasible) {
  if (WrittenInBytes(budget)) return std::to_string(minimum);  // exact: the smallest feasible budget
  const UnitStyle style = budget.style;
  std::string text = FormatBytesCompact(minimum, style);
  for (int attempt = 0; attempt < 20; ++attempt) {
    int64_t value = ParseBytes(text).bytes;
    if (value >= minimum && feasible(value)) return text;
    minimum = value + std::max<int64_t>(1, value / 500);
    text = FormatBytesCompact(minimum, style);
  }
  return text;
}

// The target a solve plans for: --target, else pytorch for a profile and
// schedule for a chain.
std::string TargetOf(const SolveOptions& o, bool from_profile) {
  const std::string target = o.target.empty() ? (from_profile ? "pytorch" : "schedule") : o.target;
  if (target != "pytorch" && target != "schedule" && target != "sac") {
    throw BadInput("invalid --target '" + o.target + "': use pytorch, sac or schedule");
  }
  return target;
}

// The distributed options with the target a rank plans for: a profile's
// default is the PyTorch target (what apply_rank_plan applies), a chain's the
// schedule; sac is refused.
DistributedOptions DistributedFor(const SolveOptions& o, const PlannerInput& in) {
  DistributedOptions d = o.distributed;
  d.target = TargetOf(o, in.from_profile);
  if (d.target == "sac") {
    throw BadInput("--target sac is not available with --data-parallel, --shard or --pipeline: use --target pytorch "
                   "(modules each rank wraps) or schedule");
  }
  return d;
}

// The modules the pytorch and sac targets choose among (empty for the
// schedule target): `modules` with the sac target's save sets, `plain`
// without them (the hand-written policies' rows start from those).
struct TargetModules {
  std::vector<WrappableModule> modules, plain;
};
TargetModules ModulesFor(const SolveOptions& o, const PlannerInput& in, const std::string& target) {
  TargetModules t;
  if (target != "pytorch" && target != "sac") return t;
  t.modules = WrappableModules(in.chain, in.from_profile ? &in.profile : nullptr);
  if (!in.from_profile && t.modules.empty()) {
    throw BadInput(o.input + ": --target pytorch needs module paths (a profile, or a chain whose stages name modules)");
  }
  if (target == "sac") {
    if (!in.from_profile) throw BadInput(o.input + ": --target sac needs a profile (it saves ops inside modules)");
    t.plain = t.modules;
    AddSacCandidates(in.profile, in.chain, &t.modules, o.sac_dispatch_us);
  }
  return t;
}

// One batch's profile under the budget (--batch): the best plan of the
// target, and no checkpointing, priced as `solve` prices them.
BatchPlans SolveAtBudget(const SolveOptions& o, const PlannerInput& in, const ByteQuantity& budget) {
  if (o.distributed.given) return DistributedBatchPlans(DistributedFor(o, in), in, budget, o.slots, in.fixed.optimizer);
  const std::string target = TargetOf(o, in.from_profile);
  PlanRequest request;
  request.algorithm = Algorithm::kOptimal;
  request.budget = budget;
  request.slots = o.slots;
  request.threads = o.threads;
  TargetModules modules = ModulesFor(o, in, target);
  if (target != "schedule") request.pytorch_modules = &modules.modules;
  const Plan best = MakePlan(in.chain, in.fixed, request);
  request.algorithm = Algorithm::kNone;
  const Plan none = MakePlan(in.chain, in.fixed, request);
  BatchPlans out;
  out.plan_fits = best.feasible && !best.budget_below_fixed;
  out.plan_peak_bytes = best.peak_bytes;
  out.min_budget_bytes = best.min_budget_bytes;
  out.plan_ms = best.time_ms;
  out.plan_overhead_pct = best.overhead_pct();
  if (best.checkpointed_stages.empty()) {
    out.plan_what = "no checkpointing";
  } else if (target == "schedule") {
    out.plan_what = Format("recompute %zu stage%s", best.checkpointed_stages.size(), best.checkpointed_stages.size() == 1 ? "" : "s");
  } else {
    size_t saved = 0;
    for (const WrappableModule& m : best.pytorch.wrapped) saved += m.sac_saved.size();
    const size_t wrapped = best.pytorch.checkpoint_modules.size();
    out.plan_what = Format("wrap %zu module%s", wrapped, wrapped == 1 ? "" : "s");
    if (target == "sac") out.plan_what += Format(", save %zu ops", saved);
  }
  out.none_peak_bytes = none.peak_bytes;
  out.none_ms = none.time_ms;
  out.optimizer_ms = in.fixed.optimizer_step_ms;
  return out;
}

int RunSolve(const SolveOptions& o) {
  const std::optional<ByteQuantity> budget_option = ParseBudgetOption(o);
  // Options and output folders first, so that a typo fails before any work.
  if (o.every_given && o.every_n < 1) throw BadInput("invalid --every " + std::to_string(o.every_n) + ": must be at least 1");
  if (o.slots < 1 || o.slots > 100000) throw BadInput("invalid --slots " + std::to_string(o.slots) + ": use 1..100000");
  // Each solver thread is started up front: thousands would fail to start.
  if (o.threads < 1 || o.threads > 256) throw BadInput("invalid --threads " + std::to_string(o.threads) + ": use 1..256");
  for (const std::string* path : {&o.output, &o.sweep_path, &o.chain_out}) CheckOutputPath(*path);
  CheckDistributedOptions(o.distributed);
  CheckBatchOptions(o.batch);
  if (o.batch.given()) {
    if (!budget_option) throw BadInput("--batch needs --budget (for example --budget 24GB)");
    if (o.distributed.given && o.batch.global_batch > 0) {
      throw BadInput("--global-batch is not available with --data-parallel, --shard or --pipeline: give the "
                     "pipeline's --microbatches, or plan each rank's micro-batch");
    }
    if (o.algorithm != "optimal" || o.every_given || o.show_stages || !o.chain_out.empty()) {
      throw BadInput("--batch plans with the optimal solver: --algo, --every, --show-stages and --chain-out do not apply");
    }
  }
  const OptimizerChoice optimizer = OptimizerChoiceOf(o.optimizer, o.gpu);
  BatchOptions batch = o.batch.Normalized();
  if (o.distributed.given) {
    batch.scope = o.distributed.pipeline > 1
                      ? Format("per pipeline (%d stages, %d microbatches of the batch)", o.distributed.pipeline,
                               o.distributed.microbatches)
                      : Format("per rank (of %d, --shard %s)", o.distributed.data_parallel, o.distributed.shard.c_str());
  }
  PlannerInput in = o.batch.given() ? SolveBatches(batch, o.input, o.gpu, *budget_option, optimizer,
                                                   [&](const PlannerInput& at) { return SolveAtBudget(o, at, *budget_option); },
                                                   o.output == "-" ? stderr : stdout)
                                    : LoadPlannerInput(o.input, optimizer);
  const std::string what = in.from_profile ? "model" : "chain";
  if (!o.chain_out.empty()) {
    WriteFileAtomic(o.chain_out, ChainToJson(in.chain).dump(2) + "\n");
    std::fprintf(stderr, "wrote the chain to %s\n", o.chain_out.c_str());
  }
  if (o.show_stages || !o.chain_out.empty()) {
    // In the budget's unit style when one is given: one style per output.
    if (o.show_stages) PrintStages(in, budget_option ? budget_option->style : UnitStyle::kBinary);
    if (!budget_option) return 0;
  }
  if (!budget_option) throw BadInput("--budget is required (for example --budget 24GB)");
  const ByteQuantity& budget = *budget_option;
  if (o.distributed.given) {
    if (o.algorithm != "optimal" || o.every_given || !o.sweep_path.empty()) {
      throw BadInput("--algo, --every and --sweep are not available with --data-parallel, --shard or --pipeline");
    }
    return RunDistributedSolve(DistributedFor(o, in), in, budget, o.slots, in.fixed.optimizer, o.output);
  }
  PlanRequest request;
  request.algorithm = ParseAlgorithm(o.algorithm);
  if (o.every_n > 0 && o.algorithm == "optimal") request.algorithm = Algorithm::kEveryN;
  if (request.algorithm == Algorithm::kEveryN && o.every_n < 1) throw BadInput("--algo every-n needs --every N");
  request.budget = budget;
  request.slots = o.slots;
  request.every_n = o.every_n;
  request.threads = o.threads;
  request.sweep = !o.sweep_path.empty();
  // The PyTorch target: optimal over the sets of modules apply_plan can wrap.
  const std::string target = TargetOf(o, in.from_profile);
  // Every algorithm for the PyTorch target is priced, applied and run as
  // that target: a baseline wraps the modules its stages are.
  TargetModules target_modules = ModulesFor(o, in, target);
  std::vector<WrappableModule>& modules = target_modules.modules;
  const std::vector<WrappableModule>& plain_modules = target_modules.plain;
  // Gradients: the chain's, as every target counts them.
  if (target == "pytorch" || target == "sac") request.pytorch_modules = &modules;

  const bool json_to_stdout = o.output == "-";
  FILE* human = json_to_stdout ? stderr : stdout;
  Plan plan;
  {
    ProgressBar bar(Format("solving %d stages", in.chain.length()), StderrIsTerminal(), ProgressDelaySeconds());
    request.progress = [&bar](double fraction) { bar.Update(fraction); };
    plan = MakePlan(in.chain, in.fixed, request);
    request.progress = nullptr;
  }
  if (plan.budget_below_fixed) {
    throw Error(ExitCode::kInfeasible,
                Format("budget %s is below the fixed part of the step (%s); the minimum for this %s is %s",
                       budget.text.c_str(), DescribeFixed(in.fixed, budget.style).c_str(), what.c_str(),
                       FormatLikeBudget(plan.min_budget_bytes, budget).c_str()));
  }
  if (!plan.feasible) {
    std::string minimum = PrintableMinimum(plan.min_budget_bytes, budget, [&](int64_t value) {
      if (request.algorithm == Algorithm::kOptimal && request.pytorch_modules == nullptr) {
        return OptimalBudgetFeasible(in.chain, in.fixed, value, o.slots);
      }
      PlanRequest check = request;
      check.budget.bytes = value;
      check.sweep = false;
      return MakePlan(in.chain, in.fixed, check).feasible;
    });
    std::string algo = request.algorithm == Algorithm::kOptimal ? Format("optimal, %d slots", o.slots)
                                                                : AlgorithmName(request.algorithm);
    if (request.pytorch_modules != nullptr) {
      // Where wrapping modules cannot reach the budget but the nested schedule can, say how much each needs.
      const int64_t schedule_minimum = MinimumOptimalBudget(in.chain, in.fixed, o.slots);
      algo = Format("optimal, pytorch target: %zu wrappable modules; the nested schedule (--target schedule) needs %s",
                    modules.size(), FormatBytes(schedule_minimum, budget.style, true).c_str());
    }
    std::string banded;
    if (request.algorithm == Algorithm::kOptimal && plan.min_budget_lower_bytes < plan.min_budget_bytes) {
      banded = Format("; that is the banded solver's minimum (%d stages): the exact one is at least %s",
                      in.chain.length(), FormatBytes(plan.min_budget_lower_bytes, budget.style, true).c_str());
    }
    throw Error(ExitCode::kInfeasible, Format("budget %s is below the minimum %s for this %s (%s)%s", budget.text.c_str(),
                                              minimum.c_str(), what.c_str(), algo.c_str(), banded.c_str()));
  }

  // What a person reads.
  std::fprintf(human, "%s: %s with %d stages, budget %s\n", o.input.c_str(), what.c_str(), in.chain.length(),
               FormatBytes(budget.bytes, budget.style).c_str());
  if (in.from_profile) {
    std::fprintf(human, "fixed part: %s\nactivation budget: %s\n", DescribeFixed(in.fixed, budget.style).c_str(),
                 FormatBytes(plan.activation_budget_bytes, budget.style).c_str());
    // The job as profiled: what trains, and the autocast its forward ran under.
    if (in.source.trainable_bytes) {
      std::fprintf(human, "trains %s of %s of parameters (%lld of %lld tensors; the frozen ones have no gradient or "
                          "optimizer state)\n",
                   FormatBytes(*in.source.trainable_bytes, budget.style).c_str(),
                   FormatBytes(in.source.param_bytes.value_or(0), budget.style).c_str(),
                   static_cast<long long>(in.source.trainable_count.value_or(0)),
                   static_cast<long long>(in.source.param_count.value_or(0)));
    }
    if (in.source.autocast) {
      std::fprintf(human, "forward and loss under torch.autocast(dtype=torch.%s), weights in their own dtype%s\n",
                   in.source.autocast->c_str(),
                   *in.source.autocast == "float16" ? " (GradScaler's 12 B with the optimizer's state)" : "");
    }
  }
  std::fprintf(human, "%s plan: peak %s, step %s (%s over no checkpointing), %zu of %d stages recomputed\n",
               AlgorithmName(plan.algorithm), FormatBytes(plan.peak_bytes, budget.style).c_str(), FormatMs(plan.time_ms).c_str(),
               FormatPct(plan.overhead_pct()).c_str(), plan.checkpointed_stages.size(), in.chain.length());
  if (plan.target == "pytorch") {
    std::fprintf(human, "pytorch target: wrap %zu modules with torch.utils.checkpoint (apply_plan)\n",
                 plan.pytorch.checkpoint_modules.size());
    std::fprintf(human, "under torch.compile: %s\n", UnderTorchCompile().c_str());
  } else if (plan.target == "sac") {
    size_t saved = 0;
    for (const WrappableModule& m : plan.pytorch.wrapped) saved += m.sac_saved.size();
    std::fprintf(human,
                 "sac target: wrap %zu modules with torch.utils.checkpoint, saving %zu ops' outputs in them "
                 "(a selective-checkpointing policy; apply_plan)\n",
                 plan.pytorch.checkpoint_modules.size(), saved);
    int dispatched = 0;
    double dispatch_ms = 0;
    for (const WrappableModule& m : plan.pytorch.wrapped) {
      if (m.sac_saved.empty()) continue;
      dispatched += m.sac_dispatched_ops;
      dispatch_ms += m.sac_dispatch_ms;
    }
    if (dispatched > 0) {
      std::fprintf(human, "the policies' dispatch mode: %s of the step (about %d ops at %s us each; --sac-dispatch-us)\n",
                   FormatMs(dispatch_ms).c_str(), dispatched, Format("%g", o.sac_dispatch_us).c_str());
    }
    std::fprintf(human, "under torch.compile: %s\n", UnderTorchCompile().c_str());
  }
  if (plan.algorithm == Algorithm::kOptimal && !plan.proven_optimal) {
    std::fprintf(human,
                 "banded solver (%d stages, band %d): within %.3f%% of the optimum (proven lower bound %s)\n",
                 in.chain.length(), plan.band, plan.gap_bound_pct(), FormatMs(plan.lower_bound_ms).c_str());
  } else if (plan.algorithm == Algorithm::kOptimal && plan.band > 0) {
    std::fprintf(human, "banded solver (%d stages, band %d): proven optimal\n", in.chain.length(), plan.band);
  }
  std::fprintf(human, "smallest feasible budget (%s): %s", AlgorithmName(plan.algorithm),
               FormatBytes(plan.min_budget_bytes, budget.style, true).c_str());
  if (plan.algorithm == Algorithm::kOptimal && plan.min_budget_lower_bytes < plan.min_budget_bytes) {
    std::fprintf(human, " (banded solver; the exact one is at least %s)",
                 FormatBytes(plan.min_budget_lower_bytes, budget.style, true).c_str());
  }
  std::fprintf(human, "\n");

  std::vector<StrategyPoint> rows;
  auto add_row = [&](const std::string& name, const Plan& p) { rows.push_back(StrategyPointOf(name, p, budget.bytes)); };
  for (Algorithm a : {Algorithm::kNone, Algorithm::kEvery, Algorithm::kSqrt}) {
    PlanRequest r = request;
    r.algorithm = a;
    r.sweep = false;
    Plan p = MakePlan(in.chain, in.fixed, r);
    std::string name = a == Algorithm::kSqrt ? Format("sqrt (n=%d)", p.every_n) : AlgorithmName(a);
    add_row(name, p);
  }
  if (request.algorithm == Algorithm::kEveryN) add_row(Format("every-n (n=%d)", plan.every_n), plan);
  if (request.algorithm == Algorithm::kOptimal) {
    add_row(plan.target == "schedule" ? "optimal" : "optimal (" + plan.target + ")", plan);
  }
  if (request.algorithm == Algorithm::kOptimal && plan.target == "sac") {
    for (const auto& [name, p] : SacComparisons(in, modules, plain_modules, request)) add_row(name, p);
  }
  if (request.algorithm == Algorithm::kOptimal && plan.target != "schedule") {
    PlanRequest r = request;
    r.pytorch_modules = nullptr;
    r.sweep = false;
    Plan nested = MakePlan(in.chain, in.fixed, r);
    if (nested.feasible) add_row("optimal (schedule)", nested);
  }
  std::fprintf(human, "\n%s", StrategyTableText(rows, budget.style).c_str());

  if (!o.sweep_path.empty()) {
    const SweepDocument sweep = MakeSweepDocument(plan, in.source);
    EmitOutput(o.sweep_path, SweepToJson(sweep).dump(2) + "\n", human);
    // A readable digest: where the optimal step time changes, about 12 rows.
    std::vector<std::vector<std::string>> curve_rows = {{"budget", "step", "overhead"}};
    double last_time = -1;
    size_t stride = std::max<size_t>(1, sweep.points.size() / 12);
    for (size_t k = 0; k < sweep.points.size(); ++k) {
      const SweepPoint& point = sweep.points[k];
      bool changes = point.time_ms != last_time;
      if ((k % stride == 0 && changes) || k + 1 == sweep.points.size()) {
        curve_rows.push_back({FormatBytes(point.budget_bytes, budget.style), FormatMs(point.time_ms),
                              FormatPct(point.overhead_pct)});
        last_time = point.time_ms;
      }
    }
    std::fprintf(human, "\nmemory/time curve (%zu budgets%s):\n%s", sweep.points.size(),
                 o.sweep_path == "-" ? "" : (", all in " + o.sweep_path).c_str(),
                 FormatTable(curve_rows, {true, true, true}).c_str());
  }

  PlanDocument document = MakePlanDocument(plan, in.chain, in.source);
  document.strategies = rows;
  if (o.batch.global_batch > 0 && document.batch) {
    document.global_batch = o.batch.global_batch;
    document.accumulation_steps = o.batch.global_batch / *document.batch;
  }
  EmitOutput(o.output, PlanToJson(document).dump(2) + "\n", human);
  return 0;
}

}  // namespace

void AddSolveCommand(CLI::App& app, Action* action) {
  auto options = std::make_shared<SolveOptions>();
  CLI::App* cmd = app.add_subcommand(
      "solve",
      "Find where to checkpoint so that a training step fits a memory budget.\n"
      "INPUT is a profile (from `ckplan profile`) or a chain file (`ckplan.chain/1`); with --batch, the\n"
      "model itself, profiled at the batches needed to find the largest and the fastest batch that fit.\n"
      "For a profile the budget is the whole step: parameters, buffers, gradients,\n"
      "optimizer state, inputs and activations. For a chain it covers the chain alone.\n"
      "Exit code 3 when the budget is below the minimum; the message gives it.");
  cmd->add_option("input", options->input, "profile or chain JSON; with --batch, the model (.pt2 or TorchScript)")->required();
  cmd->add_option("-b,--budget", options->budget,
                  "memory budget: 24GB (10^9), 24GiB (2^30), 512MiB, 1.5e9, bytes, or gpu (the --gpu device's memory)");
  cmd->add_option("--gpu", options->gpu, "with --budget gpu: the device whose memory is the budget (" +
                                             KnownGpuNames().substr(0, KnownGpuNames().size() - 5) +
                                             "); with --batch also the cost model the profiles take their times from");
  cmd->add_option("-o,--output", options->output, "write the plan JSON here (ckplan.plan/1); - for stdout");
  cmd->add_option("--algo", options->algorithm, "optimal (default), none, every, every-n, sqrt")
      ->check(CLI::IsMember({"optimal", "none", "every", "every-n", "sqrt"}));
  CLI::Option* every = cmd->add_option("--every", options->every_n, "segment length N for every-n (implies --algo every-n)");
  cmd->add_option("--slots", options->slots, "memory slots of the dynamic program (default 500); sizes round up to slots, "
                  "and slots are halved where that would cost over 0.5% of the budget")
      ->capture_default_str();
  AddOptimizerOptions(cmd, &options->optimizer);
  cmd->add_option("--sweep", options->sweep_path,
                  "write the optimal memory/time curve for every budget up to this one (ckplan.sweep/1); - for stdout");
  cmd->add_option("--threads", options->threads, "solver threads, 1..256 (default 1)");
  cmd->add_option("--target", options->target,
                  "pytorch (default for a profile): the best set of modules to wrap with torch.utils.checkpoint, "
                  "what apply_plan does; sac: the same, and in each wrapped module the ops whose outputs are "
                  "saved, not recomputed (selective activation checkpointing; apply_plan builds the policy); "
                  "schedule (default for a chain): the nested optimal schedule, for ckplan run");
  cmd->add_option("--sac-dispatch-us", options->sac_dispatch_us,
                  "--target sac: what a policy adds per op of a wrapped module's forward, in microseconds (its "
                  "dispatch modes call Python for every op, forward and recomputation; ckplan_torch.plan "
                  "measures the job's own)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  cmd->add_flag("--show-stages", options->show_stages, "print the chain's stages (--budget optional)");
  cmd->add_option("--chain-out", options->chain_out,
                  "write the chain the profile is cut into (ckplan.chain/1) to this file (--budget optional)");
  AddDistributedOptions(cmd, &options->distributed);
  AddBatchOptions(cmd, &options->batch);
  cmd->callback([options, action, every, cmd] {
    options->every_given = every->count() > 0;
    FinishDistributedOptions(cmd, &options->distributed);
    *action = [options] { return RunSolve(*options); };
  });
}

}  // namespace ckplan
