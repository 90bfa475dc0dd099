// `ckplan solve --data-parallel N --shard MODE` and `--pipeline P
// --microbatches M --schedule 1f1b|gpipe`: per-rank and per-stage plans
// (planner/plan/distributed_plan.h), printed.

#include <cstdio>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/plan/distributed_plan.h"
#include "cli/distributed_solve.h"
#include "cli/terminal.h"

namespace ckplan {

void AddDistributedOptions(CLI::App* cmd, DistributedJob* o) {
  cmd->add_option("--data-parallel", o->data_parallel, "data-parallel ranks: the budget is per rank (default 1)");
  cmd->add_option("--shard", o->shard,
                  "what data parallelism shards: none (DDP), optimizer (ZeRO-1), grad (ZeRO-2), full (FSDP2, ZeRO-3)")
      ->check(CLI::IsMember({"none", "optimizer", "grad", "full"}));
  cmd->add_option("--pipeline", o->pipeline, "pipeline stages: a plan per stage (default 1)");
  cmd->add_option("--microbatches", o->microbatches, "microbatches per step with --pipeline (default 1)");
  cmd->add_option("--schedule", o->schedule, "pipeline schedule: 1f1b (default) or gpipe")
      ->check(CLI::IsMember({"1f1b", "gpipe"}));
}

bool DistributedOptionsGiven(CLI::App* cmd) {
  for (const char* name : {"--data-parallel", "--shard", "--pipeline", "--microbatches", "--schedule"}) {
    if (cmd->count(name) > 0) return true;
  }
  return false;
}

namespace {

int RunDataParallel(const DistributedJob& o, const PlannerInput& in, const ByteQuantity& budget, int slots,
                    const std::string& output) {
  const DataParallelPlan dp = PlanDataParallel(o, in, budget, slots);
  const Plan& plan = dp.plan;
  FILE* human = output == "-" ? stderr : stdout;
  std::fprintf(human, "%s: %d data-parallel rank(s), --shard %s, budget %s per rank (the profile's batch is one rank's)\n",
               in.source.path.c_str(), o.data_parallel, o.shard.c_str(),
               FormatBytes(budget.bytes, budget.style).c_str());
  std::fprintf(human, "per-rank fixed part: %s\nactivation budget: %s\n", DescribeRankFixed(dp.rank, budget.style).c_str(),
               FormatBytes(plan.activation_budget_bytes, budget.style).c_str());
  if (plan.target == "pytorch") {
    std::fprintf(human, "pytorch target plan per rank: peak %s, step %s (%s over no checkpointing), wrap %zu modules "
                        "with torch.utils.checkpoint (apply_rank_plan)\n",
                 FormatBytes(plan.peak_bytes, budget.style).c_str(), FormatMs(plan.time_ms).c_str(),
                 FormatPct(plan.overhead_pct()).c_str(), plan.pytorch.checkpoint_modules.size());
  } else {
    std::fprintf(human, "optimal plan per rank: peak %s, step %s (%s over no checkpointing), %zu of %d stages recomputed\n",
                 FormatBytes(plan.peak_bytes, budget.style).c_str(), FormatMs(plan.time_ms).c_str(),
                 FormatPct(plan.overhead_pct()).c_str(), plan.checkpointed_stages.size(), dp.chain.length());
  }
  std::fprintf(human, "smallest per-rank budget (%s target): %s\n", plan.target.c_str(),
               FormatBytes(plan.min_budget_bytes, budget.style, true).c_str());
  if (!output.empty()) EmitOutput(output, PlanToJson(dp.document).dump(2) + "\n", human);
  return 0;
}

int RunPipeline(const DistributedJob& o, const PlannerInput& in, const ByteQuantity& budget, int slots,
                const std::string& output) {
  const PipelineJobPlan pipeline = PlanPipelineJob(o, in, budget, slots);
  FILE* human = output == "-" ? stderr : stdout;
  std::fprintf(human, "%s: %d pipeline stages, %d microbatches, %s, budget %s per stage rank\n",
               in.source.path.c_str(), o.pipeline, o.microbatches, o.schedule.c_str(),
               FormatBytes(budget.bytes, budget.style).c_str());
  std::vector<std::vector<std::string>> rows = {
      {"stage", "chain stages", "in flight", "fixed", "stored/microbatch", "peak", "peak (apply_rank_plan)",
       "time/microbatch", "recomputed"}};
  const std::vector<PlanDocument>& stages = pipeline.document.distributed->stages;
  for (size_t s = 0; s < pipeline.plan.stages.size(); ++s) {
    const PipelineStagePlan& sp = pipeline.plan.stages[s];
    const PlanDocument& doc = stages[s];
    rows.push_back({std::to_string(s), Format("%d-%d", sp.first, sp.last - 1), std::to_string(sp.in_flight),
                    FormatBytes(sp.fixed_bytes, budget.style), FormatBytes(sp.stored_after_forward_bytes, budget.style),
                    FormatBytes(sp.peak_bytes, budget.style), FormatBytes(doc.pipeline_stage->pytorch_peak_bytes, budget.style),
                    FormatMs(sp.time_ms), Format("%zu of %zu", doc.checkpointed_stages.size(), doc.stages.size())});
  }
  std::fprintf(human, "%s", FormatTable(rows, {true, true, true, true, true, true, true, true, true}).c_str());
  std::fprintf(human, "peak: the nested schedule `ckplan run` executes per stage; peak (apply_rank_plan): each stage's "
                      "modules wrapped in eager PyTorch\n");
  std::fprintf(human, "slowest stage: %s per microbatch\n", FormatMs(pipeline.plan.slowest_stage_ms).c_str());
  if (!output.empty()) EmitOutput(output, PlanToJson(pipeline.document).dump(2) + "\n", human);
  return 0;
}

}  // namespace

int RunDistributedSolve(const DistributedJob& job, const PlannerInput& in, const ByteQuantity& budget, int slots,
                        const std::string& output) {
  if (job.pipeline > 1) return RunPipeline(job, in, budget, slots, output);
  return RunDataParallel(job, in, budget, slots, output);
}

}  // namespace ckplan
