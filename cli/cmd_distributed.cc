// `ckplan solve --data-parallel N --shard MODE` and `--pipeline P
// --microbatches M --schedule 1f1b|gpipe`: per-rank and per-stage plans.

#include <algorithm>
#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/cost/distributed_memory.h"
#include "planner/base/error.h"
#include "planner/cost/gradients.h"
#include "planner/cost/optimizer_memory.h"
#include "planner/solvers/pipeline.h"
#include "planner/plan/plan.h"
#include "planner/plan/plan_to_document.h"
#include "planner/cost/simulator.h"
#include "planner/cost/wrappable_modules.h"
#include "cli/distributed_solve.h"
#include "cli/terminal.h"

namespace ckplan {

void AddDistributedOptions(CLI::App* cmd, DistributedOptions* o) {
  cmd->add_option("--data-parallel", o->data_parallel, "data-parallel ranks: the budget is per rank (default 1)");
  cmd->add_option("--shard", o->shard,
                  "what data parallelism shards: none (DDP), optimizer (ZeRO-1), grad (ZeRO-2), full (FSDP2, ZeRO-3)")
      ->check(CLI::IsMember({"none", "optimizer", "grad", "full"}));
  cmd->add_option("--pipeline", o->pipeline, "pipeline stages: a plan per stage (default 1)");
  cmd->add_option("--microbatches", o->microbatches, "microbatches per step with --pipeline (default 1)");
  cmd->add_option("--schedule", o->schedule, "pipeline schedule: 1f1b (default) or gpipe")
      ->check(CLI::IsMember({"1f1b", "gpipe"}));
}

void FinishDistributedOptions(CLI::App* cmd, DistributedOptions* o) {
  for (const char* name : {"--data-parallel", "--shard", "--pipeline", "--microbatches", "--schedule"}) {
    if (cmd->count(name) > 0) o->given = true;
  }
}

void CheckDistributedOptions(const DistributedOptions& o) {
  if (o.data_parallel < 1) throw BadInput(Format("invalid --data-parallel %d: must be at least 1", o.data_parallel));
  if (o.pipeline < 1) throw BadInput(Format("invalid --pipeline %d: must be at least 1", o.pipeline));
  if (o.microbatches < 1) throw BadInput(Format("invalid --microbatches %d: must be at least 1", o.microbatches));
}

namespace {

std::string DescribeRank(const FixedMemory& m, UnitStyle style) {
  auto b = [style](int64_t v) { return FormatBytes(v, style); };
  std::string text = Format("parameters %s + buffers %s + gradients %s + %s state %s", b(m.param_bytes).c_str(),
                            b(m.buffer_bytes).c_str(), b(m.grad_bytes).c_str(), m.optimizer.c_str(),
                            b(m.optimizer_bytes).c_str());
  if (m.gathered_bytes > 0) text += " + gathered " + b(m.gathered_bytes);
  if (m.reduce_bytes > 0) text += " + reduce-scatter " + b(m.reduce_bytes);
  return text + " = " + b(m.total());
}

FixedMemory RankFor(const PlannerInput& in, const std::vector<ParameterRecord>& parameters, int64_t param_bytes,
                    const Chain& chain, const DistributedOptions& o, const std::string& optimizer) {
  if (!in.from_profile) {
    FixedMemory m;
    m.shard = ParseShardMode(o.shard);
    m.data_parallel = o.data_parallel;
    m.optimizer = "none";
    return m;
  }
  FixedMemory m = RankFixedMemory(chain, parameters, param_bytes, in.profile.totals.buffer_bytes, optimizer,
                                  o.data_parallel, ParseShardMode(o.shard), in.source.path, in.fixed.optimizer_flags);
  m.optimizer_impl = in.fixed.optimizer_impl;
  m.optimizer_flags = in.fixed.optimizer_flags;
  return m;
}

// What each rank of a pipeline holds, a stage over chain stages [first,
// last): its parameters, its fixed part, and at the step's end the
// optimizer's update of its own parameters on top. With several microbatches
// in flight a stage's gradients are held from its first backward on (while
// later microbatches run forward): for the whole step, in each stage's fixed
// part, so the chain carries none.
class PipelineRanks {
 public:
  PipelineRanks(const DistributedOptions& o, const PlannerInput& in, std::string optimizer)
      : o_(o), in_(in), optimizer_(std::move(optimizer)), chain_(WithoutParamGrads(in.chain)) {
    if (o.pipeline > chain_.length()) {
      throw BadInput(Format("invalid --pipeline %d: the %s has %d stages, so at most --pipeline %d", o.pipeline,
                            in.from_profile ? "model" : "chain", chain_.length(), chain_.length()));
    }
    if (in.from_profile && in.profile.parameters.empty() && in.profile.totals.param_bytes > 0) {
      throw BadInput(in.source.path +
                     ": the profile has no 'parameters' list, which --pipeline needs (each stage's parameters): "
                     "profile the model again with this ckplan");
    }
    owner_ = ParameterStages(chain_, in.profile.parameters);
  }
  const Chain& chain() const { return chain_; }
  std::vector<ParameterRecord> Params(int first, int last) const {
    std::vector<ParameterRecord> mine;
    for (size_t k = 0; k < in_.profile.parameters.size(); ++k) {
      if (owner_[k] >= first && owner_[k] < last) mine.push_back(in_.profile.parameters[k]);
    }
    return mine;
  }
  FixedMemory Rank(int first, int last) const {
    const std::vector<ParameterRecord> mine = Params(first, last);
    int64_t bytes = 0;
    for (const ParameterRecord& p : mine) bytes += p.bytes;
    FixedMemory m = RankFor(in_, mine, bytes, SubChain(chain_, first, last), o_, optimizer_);
    if (!in_.from_profile) m.grad_bytes = SubChain(in_.chain, first, last).ParamGradBytes();  // a chain's own
    if (first > 0) m.buffer_bytes = 0;  // buffers counted once, on the first stage (their module is not known)
    return m;
  }
  int64_t End(int first, int last) const {
    int64_t end = Rank(first, last).total();
    if (in_.from_profile) {
      OptimizerChoice choice(optimizer_);
      choice.flags = in_.fixed.optimizer_flags;
      end += UpdateTmpBytes(choice, in_.fixed.optimizer_impl, Params(first, last));
    }
    return end;
  }

 private:
  const DistributedOptions& o_;
  const PlannerInput& in_;
  std::string optimizer_;
  Chain chain_;
  std::vector<int> owner_;
};

// A data-parallel rank's fixed part and the chain it runs: its gradients
// are held for the whole step, in its fixed part (DDP's buckets and ZeRO's
// partitions are allocated once; FSDP's shards appear in backward, which
// this counts conservatively), so the chain carries none; with the
// optimizer's state sharded, each rank updates its shards: the update's
// temporaries are theirs.
std::pair<FixedMemory, Chain> DataParallelRank(const DistributedOptions& o, const PlannerInput& in,
                                               const std::string& optimizer) {
  const std::vector<ParameterRecord> none;
  const auto& params = in.from_profile ? in.profile.parameters : none;
  FixedMemory rank = RankFor(in, params, in.from_profile ? in.profile.totals.param_bytes : 0, in.chain, o, optimizer);
  Chain chain = WithoutParamGrads(in.chain);
  if (!in.from_profile) rank.grad_bytes += in.chain.ParamGradBytes();  // a chain's own
  if (in.from_profile && ParseShardMode(o.shard) != ShardMode::kNone) {
    OptimizerChoice choice(optimizer);
    choice.flags = in.fixed.optimizer_flags;
    chain.update_tmp_bytes = UpdateTmpBytes(choice, in.fixed.optimizer_impl, ShardedParameters(params, o.data_parallel));
  }
  return {rank, chain};
}

// One data-parallel rank's plan at `budget` (`algorithm`): for the PyTorch
// target the modules each rank wraps (what apply_rank_plan applies, its
// figures those of eager PyTorch), else the nested schedule.
Plan RankPlan(const DistributedOptions& o, const PlannerInput& in, const Chain& chain, const FixedMemory& rank,
              const ByteQuantity& budget, int slots, Algorithm algorithm = Algorithm::kOptimal) {
  PlanRequest request;
  request.budget = budget;
  request.slots = slots;
  request.algorithm = algorithm;
  std::vector<WrappableModule> modules;
  if (o.target == "pytorch" && in.from_profile) {
    modules = WrappableModules(chain, &in.profile);
    request.pytorch_modules = &modules;
  }
  return MakePlan(chain, rank, request);
}

int RunDataParallel(const DistributedOptions& o, const PlannerInput& in, const ByteQuantity& budget, int slots,
                    const std::string& optimizer, const std::string& output) {
  const auto [rank, chain] = DataParallelRank(o, in, optimizer);
  FILE* human = output == "-" ? stderr : stdout;
  Plan plan = RankPlan(o, in, chain, rank, budget, slots);
  if (!plan.feasible) {
    throw Error(ExitCode::kInfeasible,
                Format("budget %s is below the per-rank minimum %s for the %s target (--data-parallel %d --shard %s; "
                       "per-rank fixed part: %s)",
                       budget.text.c_str(), FormatLikeBudget(plan.min_budget_bytes, budget).c_str(), plan.target.c_str(),
                       o.data_parallel, o.shard.c_str(), DescribeRank(rank, budget.style).c_str()));
  }
  std::fprintf(human, "%s: %d data-parallel rank(s), --shard %s, budget %s per rank (the profile's batch is one rank's)\n",
               in.source.path.c_str(), o.data_parallel, o.shard.c_str(),
               FormatBytes(budget.bytes, budget.style).c_str());
  std::fprintf(human, "per-rank fixed part: %s\nactivation budget: %s\n", DescribeRank(rank, budget.style).c_str(),
               FormatBytes(plan.activation_budget_bytes, budget.style).c_str());
  if (plan.target == "pytorch") {
    std::fprintf(human, "pytorch target plan per rank: peak %s, step %s (%s over no checkpointing), wrap %zu modules "
                        "with torch.utils.checkpoint (apply_rank_plan)\n",
                 FormatBytes(plan.peak_bytes, budget.style).c_str(), FormatMs(plan.time_ms).c_str(),
                 FormatPct(plan.overhead_pct()).c_str(), plan.pytorch.checkpoint_modules.size());
  } else {
    std::fprintf(human, "optimal plan per rank: peak %s, step %s (%s over no checkpointing), %zu of %d stages recomputed\n",
                 FormatBytes(plan.peak_bytes, budget.style).c_str(), FormatMs(plan.time_ms).c_str(),
                 FormatPct(plan.overhead_pct()).c_str(), plan.checkpointed_stages.size(), chain.length());
  }
  std::fprintf(human, "smallest per-rank budget (%s target): %s\n", plan.target.c_str(),
               FormatBytes(plan.min_budget_bytes, budget.style, true).c_str());
  PlanDocument doc = MakePlanDocument(plan, chain, in.source);
  PlanDistributed distributed;
  distributed.data_parallel = o.data_parallel;
  distributed.shard = o.shard;
  for (const ShardUnit& u : rank.units) {
    if (!u.module.empty()) distributed.fsdp_units.push_back(u.module);
  }
  distributed.ranks.push_back({rank, plan.activation_budget_bytes, plan.peak_bytes, doc.pytorch.peak_bytes,
                               plan.pytorch.held_at_loss_bytes});
  doc.distributed = distributed;
  if (!output.empty()) EmitOutput(output, PlanToJson(doc).dump(2) + "\n", human);
  return 0;
}

int RunPipeline(const DistributedOptions& o, const PlannerInput& in, const ByteQuantity& budget, int slots,
                const std::string& optimizer, const std::string& output) {
  const PipelineRanks ranks(o, in, optimizer);
  const Chain& chain = ranks.chain();
  auto stage_rank = [&](int first, int last) { return ranks.Rank(first, last); };
  auto stage_end = [&](int first, int last) { return ranks.End(first, last); };
  const PipelineSchedule schedule = ParsePipelineSchedule(o.schedule);
  PipelinePlan plan = PlanPipeline(
      chain, o.pipeline, o.microbatches, schedule, budget.bytes, slots,
      [&](int first, int last) { return stage_rank(first, last).total(); }, stage_end);
  if (!plan.feasible) {
    std::string minimum = plan.min_budget_bytes > 0 ? FormatLikeBudget(plan.min_budget_bytes, budget) : "none";
    throw Error(ExitCode::kInfeasible,
                Format("budget %s is below the per-stage minimum %s (--pipeline %d --microbatches %d --schedule %s)",
                       budget.text.c_str(), minimum.c_str(), o.pipeline, o.microbatches, o.schedule.c_str()));
  }
  FILE* human = output == "-" ? stderr : stdout;
  std::fprintf(human, "%s: %d pipeline stages, %d microbatches, %s, budget %s per stage rank\n",
               in.source.path.c_str(), o.pipeline, o.microbatches, o.schedule.c_str(),
               FormatBytes(budget.bytes, budget.style).c_str());
  std::vector<std::vector<std::string>> rows = {
      {"stage", "chain stages", "in flight", "fixed", "stored/microbatch", "peak", "peak (apply_rank_plan)",
       "time/microbatch", "recomputed"}};
  PlanDocument top;
  top.is_pipeline = true;
  top.algorithm = "optimal";
  top.source = in.source;
  top.budget_bytes = budget.bytes;
  top.unit_style = UnitStyleName(budget.style);
  PlanDistributed distributed;
  distributed.data_parallel = o.data_parallel;
  distributed.shard = o.shard;
  distributed.pipeline = o.pipeline;
  distributed.microbatches = o.microbatches;
  distributed.schedule = o.schedule;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PipelineStagePlan& sp = plan.stages[s];
    Chain sub = SubChain(chain, sp.first, sp.last);
    const FixedMemory rank = stage_rank(sp.first, sp.last);
    Plan p = PlanForSchedule(sub, rank, sp.solution.schedule, budget);
    p.slots = slots;
    p.slot_bytes = sp.slot_bytes;
    p.peak_bytes = sp.peak_bytes;  // its microbatches in flight included
    p.solver = "in-flight";
    PlanDocument doc = MakePlanDocument(p, sub, in.source);
    doc.min_budget_bytes.reset();
      PlanPipelineStage& stage = doc.pipeline_stage.emplace();
    stage.index = static_cast<int>(s);
    stage.first_chain_stage = sp.first;
    stage.last_chain_stage = sp.last - 1;
    stage.in_flight = sp.in_flight;
    stage.stored_after_forward_bytes = sp.stored_after_forward_bytes;
    stage.fixed = rank;
    stage.activation_budget_bytes = sp.activation_budget_bytes;
    stage.peak_bytes = sp.peak_bytes;
    // What PyTorch keeps per microbatch: a later stage's input is an
    // activation it receives and holds (the first stage's is the model input).
    stage.pytorch_saved_bytes = p.pytorch.held_at_loss_bytes + (s > 0 ? sub.input_bytes : 0);
    stage.pytorch_peak_bytes =
        std::max(rank.total() + (sp.in_flight - 1) * p.pytorch.simulation.live_after_forward_bytes + p.pytorch.peak_bytes,
                 stage_end(sp.first, sp.last));
    const int64_t applied = stage.pytorch_peak_bytes;
    for (const std::string& m : p.pytorch.checkpoint_modules) top.checkpoint_modules.push_back(m);
    distributed.stages.push_back(std::move(doc));
    rows.push_back({std::to_string(s), Format("%d-%d", sp.first, sp.last - 1), std::to_string(sp.in_flight),
                    FormatBytes(sp.fixed_bytes, budget.style), FormatBytes(sp.stored_after_forward_bytes, budget.style),
                    FormatBytes(sp.peak_bytes, budget.style), FormatBytes(applied, budget.style),
                    FormatMs(sp.time_ms), Format("%zu of %d", p.checkpointed_stages.size(), sub.length())});
  }
  std::fprintf(human, "%s", FormatTable(rows, {true, true, true, true, true, true, true, true, true}).c_str());
  std::fprintf(human, "peak: the nested schedule `ckplan run` executes per stage; peak (apply_rank_plan): each stage's "
                      "modules wrapped in eager PyTorch\n");
  std::fprintf(human, "slowest stage: %s per microbatch\n", FormatMs(plan.slowest_stage_ms).c_str());
  distributed.slowest_stage_ms = plan.slowest_stage_ms;
  top.distributed = std::move(distributed);
  if (!output.empty()) EmitOutput(output, PlanToJson(top).dump(2) + "\n", human);
  return 0;
}

}  // namespace

BatchPlans DistributedBatchPlans(const DistributedOptions& o, const PlannerInput& in, const ByteQuantity& budget,
                                 int slots, const std::string& optimizer) {
  CheckDistributedOptions(o);
  BatchPlans out;
  out.optimizer_ms = in.fixed.optimizer_step_ms;
  if (o.pipeline > 1) {
    // The profile's batch is one microbatch; a step runs `microbatches` of
    // them through the pipeline, (microbatches + stages - 1) slots of the
    // slowest stage (1F1B and GPipe alike), in time per microbatch counted
    // as the step's time / microbatches so that samples per second are the
    // batch over it.
    const PipelineSchedule schedule = ParsePipelineSchedule(o.schedule);
    const PipelineRanks ranks(o, in, optimizer);
    const Chain& chain = ranks.chain();
    auto stage_fixed = [&](int first, int last) { return ranks.Rank(first, last).total(); };
    auto stage_end = [&](int first, int last) { return ranks.End(first, last); };
    auto per_microbatch = [&](double slowest) {
      return slowest * (o.microbatches + o.pipeline - 1) / o.microbatches;
    };
    const PipelinePlan plan = PlanPipeline(chain, o.pipeline, o.microbatches, schedule, budget.bytes, slots, stage_fixed,
                                           stage_end);
    // No checkpointing: the fastest split with every microbatch's activations kept.
    const PipelinePlan loose = PlanPipeline(chain, o.pipeline, o.microbatches, schedule, int64_t{1} << 60, slots,
                                            stage_fixed, stage_end);
    out.plan_fits = plan.feasible;
    out.min_budget_bytes = plan.feasible ? 0 : plan.min_budget_bytes;
    int64_t peak = 0, loose_peak = 0;
    size_t recomputed = 0;
    for (const PipelineStagePlan& sp : plan.stages) {
      peak = std::max(peak, sp.peak_bytes);
      recomputed += CheckpointedStages(sp.solution.schedule, sp.last - sp.first).size();
    }
    for (const PipelineStagePlan& sp : loose.stages) loose_peak = std::max(loose_peak, sp.peak_bytes);
    if (plan.feasible) {
      out.plan_peak_bytes = peak;
      out.plan_ms = per_microbatch(plan.slowest_stage_ms);
      out.min_budget_bytes = peak;  // at least what this plan holds; the exact minimum is searched only when infeasible
      out.plan_what = recomputed == 0 ? "no checkpointing" : Format("recompute %zu stage%s", recomputed, recomputed == 1 ? "" : "s");
    }
    out.none_peak_bytes = loose_peak;
    out.none_ms = per_microbatch(loose.slowest_stage_ms);
    out.plan_overhead_pct = plan.feasible ? OverheadPct(out.plan_ms, out.none_ms) : 0;
    out.optimizer_ms = 0;
    return out;
  }
  // Data parallel: one rank (RunDataParallel).
  const auto [rank, chain] = DataParallelRank(o, in, optimizer);
  const Plan plan = RankPlan(o, in, chain, rank, budget, slots);
  out.plan_fits = plan.feasible;
  out.min_budget_bytes = plan.min_budget_bytes;
  if (out.plan_fits) {
    out.plan_peak_bytes = plan.peak_bytes;
    out.plan_ms = plan.time_ms;
    out.plan_overhead_pct = plan.overhead_pct();
    out.plan_what = plan.checkpointed_stages.empty() ? "no checkpointing"
                                                     : Format("recompute %zu stage%s", plan.checkpointed_stages.size(), plan.checkpointed_stages.size() == 1 ? "" : "s");
  }
  const Plan none = RankPlan(o, in, chain, rank, budget, slots, Algorithm::kNone);
  out.none_peak_bytes = none.peak_bytes;
  out.none_ms = none.time_ms;
  return out;
}

int RunDistributedSolve(const DistributedOptions& o, const PlannerInput& in, const ByteQuantity& budget, int slots,
                        const std::string& optimizer, const std::string& output) {
  CheckDistributedOptions(o);
  if (o.pipeline > 1) return RunPipeline(o, in, budget, slots, optimizer, output);
  return RunDataParallel(o, in, budget, slots, optimizer, output);
}

}  // namespace ckplan
