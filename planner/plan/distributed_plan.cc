#include "planner/plan/distributed_plan.h"

#include <algorithm>
#include <tuple>

#include "planner/base/error.h"
#include "planner/base/format.h"
#include "planner/cost/distributed_memory.h"
#include "planner/cost/gradients.h"
#include "planner/cost/optimizer_memory.h"
#include "planner/cost/simulator.h"
#include "planner/cost/wrappable_modules.h"
#include "planner/plan/plan_to_document.h"

namespace ckplan {

void CheckDistributedJob(const DistributedJob& job) {
  if (job.data_parallel < 1) throw BadInput(Format("invalid --data-parallel %d: must be at least 1", job.data_parallel));
  if (job.pipeline < 1) throw BadInput(Format("invalid --pipeline %d: must be at least 1", job.pipeline));
  if (job.microbatches < 1) throw BadInput(Format("invalid --microbatches %d: must be at least 1", job.microbatches));
}

namespace {

// How the plan's optimizer runs (always set in a fixed part).
OptimizerImpl ImplOf(const FixedMemory& fixed) { return fixed.optimizer.impl.value_or(OptimizerImpl::kForLoop); }

FixedMemory RankFor(const PlannerInput& in, const std::vector<ParameterRecord>& parameters, int64_t param_bytes,
                    const Chain& chain, const DistributedJob& job) {
  if (!in.from_profile) {
    FixedMemory m;  // no optimizer
    m.shard = ParseShardMode(job.shard);
    m.data_parallel = job.data_parallel;
    return m;
  }
  FixedMemory m = RankFixedMemory(chain, parameters, param_bytes, in.profile.totals.buffer_bytes, in.fixed.optimizer.name,
                                  job.data_parallel, ParseShardMode(job.shard), in.source.path, in.fixed.optimizer.flags);
  m.optimizer = in.fixed.optimizer;
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
  PipelineRanks(const DistributedJob& job, const PlannerInput& in)
      : job_(job), in_(in), chain_(WithoutParamGrads(in.chain)) {
    if (job.pipeline > chain_.length()) {
      throw BadInput(Format("invalid --pipeline %d: the %s has %d stages, so at most --pipeline %d", job.pipeline,
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
    FixedMemory m = RankFor(in_, mine, bytes, SubChain(chain_, first, last), job_);
    if (!in_.from_profile) m.grad_bytes = SubChain(in_.chain, first, last).ParamGradBytes();  // a chain's own
    if (first > 0) m.buffer_bytes = 0;  // buffers counted once, on the first stage (their module is not known)
    return m;
  }
  int64_t End(int first, int last) const {
    int64_t end = Rank(first, last).total();
    if (in_.from_profile) {
      end += UpdateTmpBytes(in_.fixed.optimizer, ImplOf(in_.fixed), Params(first, last));
    }
    return end;
  }
  PipelinePlan PlanStages(int64_t budget_bytes, int slots) const {
    return PlanPipeline(
        chain_, job_.pipeline, job_.microbatches, ParsePipelineSchedule(job_.schedule), budget_bytes, slots,
        [this](int first, int last) { return Rank(first, last).total(); },
        [this](int first, int last) { return End(first, last); });
  }

 private:
  const DistributedJob& job_;
  const PlannerInput& in_;
  Chain chain_;
  std::vector<int> owner_;
};

// A data-parallel rank's fixed part and the chain it runs: its gradients
// are held for the whole step, in its fixed part (DDP's buckets and ZeRO's
// partitions are allocated once; FSDP's shards appear in backward, which
// this counts conservatively), so the chain carries none; with the
// optimizer's state sharded, each rank updates its shards: the update's
// temporaries are theirs.
std::pair<FixedMemory, Chain> DataParallelRank(const DistributedJob& job, const PlannerInput& in) {
  const std::vector<ParameterRecord> none;
  const auto& params = in.from_profile ? in.profile.parameters : none;
  FixedMemory rank = RankFor(in, params, in.from_profile ? in.profile.totals.param_bytes : 0, in.chain, job);
  Chain chain = WithoutParamGrads(in.chain);
  if (!in.from_profile) rank.grad_bytes += in.chain.ParamGradBytes();  // a chain's own
  if (in.from_profile && ParseShardMode(job.shard) != ShardMode::kNone) {
    chain.update_tmp_bytes = UpdateTmpBytes(in.fixed.optimizer, ImplOf(in.fixed), ShardedParameters(params, job.data_parallel));
  }
  return {rank, chain};
}

// One data-parallel rank's plan at `budget` (`algorithm`): for the PyTorch
// target the modules each rank wraps (what apply_rank_plan applies, its
// figures those of eager PyTorch), else the nested schedule.
Plan RankPlan(const DistributedJob& job, const PlannerInput& in, const Chain& chain, const FixedMemory& rank,
              const ByteQuantity& budget, int slots, Algorithm algorithm = Algorithm::kOptimal) {
  PlanRequest request;
  request.budget = budget;
  request.slots = slots;
  request.algorithm = algorithm;
  std::vector<WrappableModule> modules;
  if (job.target == "pytorch" && in.from_profile) {
    modules = WrappableModules(chain, &in.profile);
    request.pytorch_modules = &modules;
  }
  return MakePlan(chain, rank, request);
}

}  // namespace

DataParallelPlan PlanDataParallel(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget,
                                  int slots) {
  CheckDistributedJob(job);
  DataParallelPlan out;
  std::tie(out.rank, out.chain) = DataParallelRank(job, in);
  out.plan = RankPlan(job, in, out.chain, out.rank, budget, slots);
  const Plan& plan = out.plan;
  if (!plan.feasible) {
    throw Error(ExitCode::kInfeasible,
                Format("budget %s is below the per-rank minimum %s for the %s target (--data-parallel %d --shard %s; "
                       "per-rank fixed part: %s)",
                       budget.text.c_str(), FormatLikeBudget(plan.min_budget_bytes, budget).c_str(), plan.target.c_str(),
                       job.data_parallel, job.shard.c_str(), DescribeRankFixed(out.rank, budget.style).c_str()));
  }
  PlanDocument& doc = out.document = MakePlanDocument(plan, out.chain, in.source);
  PlanDistributed distributed;
  distributed.data_parallel = job.data_parallel;
  distributed.shard = job.shard;
  for (const ShardUnit& u : out.rank.units) {
    if (!u.module.empty()) distributed.fsdp_units.push_back(u.module);
  }
  distributed.ranks.push_back({out.rank, plan.activation_budget_bytes, plan.peak_bytes, doc.pytorch.peak_bytes,
                               plan.pytorch.held_at_loss_bytes});
  doc.distributed = distributed;
  return out;
}

PipelineJobPlan PlanPipelineJob(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget,
                                int slots) {
  CheckDistributedJob(job);
  const PipelineRanks ranks(job, in);
  const Chain& chain = ranks.chain();
  PipelineJobPlan out;
  out.plan = ranks.PlanStages(budget.bytes, slots);
  const PipelinePlan& plan = out.plan;
  if (!plan.feasible) {
    std::string minimum = plan.min_budget_bytes > 0 ? FormatLikeBudget(plan.min_budget_bytes, budget) : "none";
    throw Error(ExitCode::kInfeasible,
                Format("budget %s is below the per-stage minimum %s (--pipeline %d --microbatches %d --schedule %s)",
                       budget.text.c_str(), minimum.c_str(), job.pipeline, job.microbatches, job.schedule.c_str()));
  }
  PlanDocument& top = out.document;
  top.algorithm = "optimal";
  top.source = in.source;
  top.budget_bytes = budget.bytes;
  top.unit_style = UnitStyleName(budget.style);
  PlanDistributed distributed;
  distributed.data_parallel = job.data_parallel;
  distributed.shard = job.shard;
  distributed.pipeline = job.pipeline;
  distributed.microbatches = job.microbatches;
  distributed.schedule = job.schedule;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const PipelineStagePlan& sp = plan.stages[s];
    Chain sub = SubChain(chain, sp.first, sp.last);
    const FixedMemory rank = ranks.Rank(sp.first, sp.last);
    Plan p = PlanForSchedule(sub, rank, sp.solution.schedule, budget);
    p.slots = slots;
    p.slot_bytes = sp.slot_bytes;
    p.peak_bytes = sp.peak_bytes;  // its microbatches in flight included
    p.solver.method = "in-flight";
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
                 ranks.End(sp.first, sp.last));
    for (const std::string& m : p.pytorch.checkpoint_modules) top.checkpoint_modules.push_back(m);
    distributed.stages.push_back(std::move(doc));
  }
  distributed.slowest_stage_ms = plan.slowest_stage_ms;
  top.distributed = std::move(distributed);
  return out;
}

BatchPlans DistributedPlanAtBatch(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget,
                                  int slots) {
  CheckDistributedJob(job);
  BatchPlans out;
  out.optimizer_ms = in.fixed.optimizer_step_ms;
  if (job.pipeline > 1) {
    // The profile's batch is one microbatch; a step runs `microbatches` of
    // them through the pipeline, (microbatches + stages - 1) slots of the
    // slowest stage (1F1B and GPipe alike), in time per microbatch counted
    // as the step's time / microbatches so that samples per second are the
    // batch over it.
    const PipelineRanks ranks(job, in);
    auto per_microbatch = [&](double slowest) {
      return slowest * (job.microbatches + job.pipeline - 1) / job.microbatches;
    };
    const PipelinePlan plan = ranks.PlanStages(budget.bytes, slots);
    // No checkpointing: the fastest split with every microbatch's activations kept.
    const PipelinePlan loose = ranks.PlanStages(int64_t{1} << 60, slots);
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
      out.plan_what = RecomputedStages(recomputed);
    }
    out.none_peak_bytes = loose_peak;
    out.none_ms = per_microbatch(loose.slowest_stage_ms);
    out.plan_overhead_pct = plan.feasible ? OverheadPct(out.plan_ms, out.none_ms) : 0;
    out.optimizer_ms = 0;
    return out;
  }
  // Data parallel: one rank (PlanDataParallel).
  const auto [rank, chain] = DataParallelRank(job, in);
  const Plan plan = RankPlan(job, in, chain, rank, budget, slots);
  out.plan_fits = plan.feasible;
  out.min_budget_bytes = plan.min_budget_bytes;
  if (out.plan_fits) {
    out.plan_peak_bytes = plan.peak_bytes;
    out.plan_ms = plan.time_ms;
    out.plan_overhead_pct = plan.overhead_pct();
    out.plan_what = RecomputedStages(plan.checkpointed_stages.size());
  }
  const Plan none = RankPlan(job, in, chain, rank, budget, slots, Algorithm::kNone);
  out.none_peak_bytes = none.peak_bytes;
  out.none_ms = none.time_ms;
  return out;
}

}  // namespace ckplan
