// `ckplan solve`: a checkpoint plan for a chain or a profile under a budget.

#include <cstdio>
#include <optional>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/cost/gpu_table.h"
#include "planner/cost/optimizer_memory.h"
#include "planner/plan/distributed_plan.h"
#include "planner/plan/plan_to_document.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/solve.h"
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
  DistributedJob distributed;  // --data-parallel, --shard, --pipeline, ... (cmd_distributed.cc)
  bool distributed_given = false;  // any of them on the command line
  std::string gpu;  ///< --gpu: what --budget gpu means
  BatchOptions batch;  ///< --batch and what goes with it (cli/batch_solve.h)
  double sac_dispatch_us = kDefaultSacDispatchUs;  ///< --sac-dispatch-us
  std::vector<std::string> wrap;                    ///< --wrap
};

// `--budget`, parsed once: its bytes, the unit style they were written in
// and the text (for messages); `gpu` is the --gpu device's memory, in MiB
// as the table holds it. Absent without --budget. An unknown --gpu is an
// error either way.
std::optional<ByteQuantity> ParseBudgetOption(const SolveOptions& o) {
  if (o.budget != "gpu") {
    if (!o.gpu.empty() && o.gpu != "cpu") FindGpu(o.gpu);  // cpu: the profiles' (--batch) measured peak
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

// The distributed job with the target a rank plans for: a profile's
// default is the PyTorch target (what apply_rank_plan applies), a chain's the
// schedule; sac is refused.
DistributedJob DistributedFor(const SolveOptions& o, const PlannerInput& in) {
  DistributedJob d = o.distributed;
  d.target = ResolveTarget(o.target, in.from_profile);
  if (d.target == "sac") {
    throw BadInput("--target sac is not available with --data-parallel, --shard or --pipeline: use --target pytorch "
                   "(modules each rank wraps) or schedule");
  }
  return d;
}

// What the planner is asked, from the options (Solve, PlanAtBatch).
SolveRequest RequestOf(const SolveOptions& o, const ByteQuantity& budget) {
  SolveRequest r;
  r.plan.algorithm = ParseAlgorithm(o.algorithm);
  if (o.every_n > 0 && o.algorithm == "optimal") r.plan.algorithm = Algorithm::kEveryN;
  if (r.plan.algorithm == Algorithm::kEveryN && o.every_n < 1) throw BadInput("--algo every-n needs --every N");
  r.plan.every_n = o.every_n;
  r.plan.budget = budget;
  r.plan.slots = o.slots;
  r.plan.threads = o.threads;
  r.plan.sweep = !o.sweep_path.empty();
  r.target = o.target;
  r.sac_dispatch_us = o.sac_dispatch_us;
  r.global_batch = o.batch.global_batch;
  r.wrap = o.wrap;
  return r;
}

// One batch's profile under the budget (--batch): the best plan of the
// target, and no checkpointing, priced as `solve` prices them.
BatchPlans SolveAtBudget(const SolveOptions& o, const PlannerInput& in, const ByteQuantity& budget) {
  if (o.distributed_given) return DistributedPlanAtBatch(DistributedFor(o, in), in, budget, o.slots);
  return PlanAtBatch(in, RequestOf(o, budget));
}

int RunSolve(const SolveOptions& o) {
  const std::optional<ByteQuantity> budget_option = ParseBudgetOption(o);
  // Options and output folders first, so that a typo fails before any work.
  if (o.every_given && o.every_n < 1) throw BadInput("invalid --every " + std::to_string(o.every_n) + ": must be at least 1");
  if (o.slots < 1 || o.slots > 100000) throw BadInput("invalid --slots " + std::to_string(o.slots) + ": use 1..100000");
  // Each solver thread is started up front: thousands would fail to start.
  if (o.threads < 1 || o.threads > 256) throw BadInput("invalid --threads " + std::to_string(o.threads) + ": use 1..256");
  for (const std::string* path : {&o.output, &o.sweep_path, &o.chain_out}) CheckOutputPath(*path);
  CheckDistributedJob(o.distributed);
  CheckBatchOptions(o.batch);
  if (!o.wrap.empty() && (o.batch.given() || o.distributed_given || !o.sweep_path.empty())) {
    throw BadInput("--wrap prices one set of modules at one budget: not with --batch, --seq, --data-parallel, "
                   "--shard, --pipeline or --sweep");
  }
  if (o.batch.given()) {
    if (!budget_option) throw BadInput("--batch needs --budget (for example --budget 24GB)");
    if (o.distributed_given && o.batch.global_batch > 0) {
      throw BadInput("--global-batch is not available with --data-parallel, --shard or --pipeline: give the "
                     "pipeline's --microbatches, or plan each rank's micro-batch");
    }
    if (o.algorithm != "optimal" || o.every_given || o.show_stages || !o.chain_out.empty()) {
      throw BadInput("--batch plans with the optimal solver: --algo, --every, --show-stages and --chain-out do not apply");
    }
  }
  const OptimizerChoice optimizer = ChosenOptimizer(o.optimizer, !o.gpu.empty() && o.gpu != "cpu");
  if (o.distributed_given && !optimizer.groups.empty()) {
    throw BadInput(
        "--optimizer-groups is not available with --data-parallel, --shard or --pipeline: a rank's "
        "state is priced for one group (give the options of the group that sets the most)");
  }
  BatchOptions batch = o.batch.Normalized();
  if (o.distributed_given) {
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
  if (o.distributed_given) {
    if (o.algorithm != "optimal" || o.every_given || !o.sweep_path.empty()) {
      throw BadInput("--algo, --every and --sweep are not available with --data-parallel, --shard or --pipeline");
    }
    return RunDistributedSolve(DistributedFor(o, in), in, budget, o.slots, o.output);
  }
  SolveRequest request = RequestOf(o, budget);
  const bool json_to_stdout = o.output == "-";
  FILE* human = json_to_stdout ? stderr : stdout;
  SolveResult solved;
  {
    ProgressBar bar(Format("solving %d stages", in.chain.length()), StderrIsTerminal(), ProgressDelaySeconds());
    request.plan.progress = [&bar](double fraction) { bar.Update(fraction); };
    solved = Solve(in, request);
  }
  const Plan& plan = solved.plan;

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
               o.wrap.empty() ? AlgorithmName(plan.algorithm) : "--wrap", FormatBytes(plan.peak_bytes, budget.style).c_str(),
               FormatMs(plan.time_ms).c_str(),
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
  if (plan.algorithm == Algorithm::kOptimal && !plan.solver.proven_optimal) {
    std::fprintf(human,
                 "banded solver (%d stages, band %d): within %.3f%% of the optimum (proven lower bound %s)\n",
                 in.chain.length(), plan.solver.band, plan.gap_bound_pct(), FormatMs(plan.solver.lower_bound_ms).c_str());
  } else if (plan.algorithm == Algorithm::kOptimal && plan.solver.band > 0) {
    std::fprintf(human, "banded solver (%d stages, band %d): proven optimal\n", in.chain.length(), plan.solver.band);
  }
  std::fprintf(human, "smallest feasible budget (%s): %s", AlgorithmName(plan.algorithm),
               FormatBytes(plan.min_budget_bytes, budget.style, true).c_str());
  if (plan.algorithm == Algorithm::kOptimal && plan.solver.min_budget_lower_bytes < plan.min_budget_bytes) {
    std::fprintf(human, " (banded solver; the exact one is at least %s)",
                 FormatBytes(plan.solver.min_budget_lower_bytes, budget.style, true).c_str());
  }
  std::fprintf(human, "\n");
  std::fprintf(human, "\n%s", StrategyTableText(solved.strategies, budget.style).c_str());

  if (solved.sweep) {
    EmitOutput(o.sweep_path, SweepToJson(*solved.sweep).dump(2) + "\n", human);
    // A readable digest: where the optimal step time changes, about 12 rows.
    std::vector<std::vector<std::string>> curve_rows = {{"budget", "step", "overhead"}};
    for (const SweepPoint& point : SweepDigest(*solved.sweep)) {
      curve_rows.push_back({FormatBytes(point.budget_bytes, budget.style), FormatMs(point.time_ms),
                            FormatPct(point.overhead_pct)});
    }
    std::fprintf(human, "\nmemory/time curve (%zu budgets%s):\n%s", solved.sweep->points.size(),
                 o.sweep_path == "-" ? "" : (", all in " + o.sweep_path).c_str(),
                 FormatTable(curve_rows, {true, true, true}).c_str());
  }
  EmitOutput(o.output, PlanToJson(solved.document).dump(2) + "\n", human);
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
  cmd->add_option("--wrap", options->wrap,
                  "--target pytorch: price wrapping exactly these modules (paths, comma-separated or repeated) "
                  "instead of solving: what a hand-picked plan, or another run's, costs here")
      ->delimiter(',');
  cmd->add_flag("--show-stages", options->show_stages, "print the chain's stages (--budget optional)");
  cmd->add_option("--chain-out", options->chain_out,
                  "write the chain the profile is cut into (ckplan.chain/1) to this file (--budget optional)");
  AddDistributedOptions(cmd, &options->distributed);
  AddBatchOptions(cmd, &options->batch);
  cmd->callback([options, action, every, cmd] {
    options->every_given = every->count() > 0;
    options->distributed_given = DistributedOptionsGiven(cmd);
    *action = [options] { return RunSolve(*options); };
  });
}

}  // namespace ckplan
