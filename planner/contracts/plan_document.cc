#include "planner/contracts/plan_document.h"

#include <climits>

#include "planner/base/error.h"
#include "planner/base/json_io.h"

namespace ckplan {

bool PlanSource::operator==(const PlanSource& o) const {
  return kind == o.kind && path == o.path && model_sha256 == o.model_sha256 && model_path == o.model_path &&
         inputs == o.inputs && param_count == o.param_count && param_bytes == o.param_bytes &&
         trainable_count == o.trainable_count && trainable_bytes == o.trainable_bytes && autocast == o.autocast;
}

nlohmann::json PlanSourceToJson(const PlanSource& s) {
  nlohmann::json doc = {{"kind", s.kind}, {"path", s.path}};
  if (s.model_sha256) doc["model_sha256"] = *s.model_sha256;
  if (s.model_path) doc["model_path"] = *s.model_path;
  if (s.inputs) doc["inputs"] = *s.inputs;
  if (s.param_count) doc["param_count"] = *s.param_count;
  if (s.param_bytes) doc["param_bytes"] = *s.param_bytes;
  if (s.trainable_count) doc["trainable_count"] = *s.trainable_count;
  if (s.trainable_bytes) doc["trainable_bytes"] = *s.trainable_bytes;
  if (s.autocast) doc["autocast"] = *s.autocast;
  return doc;
}

PlanSource PlanSourceFromJson(const nlohmann::json& node, const std::string& file, const std::string& path) {
  JsonReader source(node, file, path);
  source.ExpectObject();
  PlanSource s;
  s.kind = source.Field("kind").String();
  s.path = source.Field("path").String();
  if (source.Has("model_sha256")) s.model_sha256 = source.Field("model_sha256").String();
  if (source.Has("model_path")) s.model_path = source.Field("model_path").String();
  if (source.Has("inputs")) {
    source.Field("inputs").ArraySize();  // throws unless an array
    s.inputs = source.Field("inputs").node();
  }
  if (source.Has("param_count")) s.param_count = source.Field("param_count").NonNegativeBytes();
  if (source.Has("param_bytes")) s.param_bytes = source.Field("param_bytes").NonNegativeBytes();
  if (source.Has("trainable_count")) s.trainable_count = source.Field("trainable_count").NonNegativeBytes();
  if (source.Has("trainable_bytes")) s.trainable_bytes = source.Field("trainable_bytes").NonNegativeBytes();
  if (source.Has("autocast")) s.autocast = source.Field("autocast").String();
  return s;
}

bool PlanStage::operator==(const PlanStage& o) const {
  return index == o.index && name == o.name && checkpointed == o.checkpointed && modules == o.modules &&
         ops.has_value() == o.ops.has_value() && (!ops || (ops->first == o.ops->first && ops->last == o.ops->last));
}

bool PlanPredicted::operator==(const PlanPredicted& o) const {
  return peak_bytes == o.peak_bytes && time_ms == o.time_ms && overhead_pct == o.overhead_pct &&
         no_recompute_ms == o.no_recompute_ms && live_after_forward_bytes == o.live_after_forward_bytes &&
         optimizer_step_ms == o.optimizer_step_ms;
}

bool PlanPyTorch::operator==(const PlanPyTorch& o) const {
  return skipped_stages == o.skipped_stages && use_reentrant == o.use_reentrant && preserve_rng_state == o.preserve_rng_state && peak_bytes == o.peak_bytes &&
         held_at_loss_bytes == o.held_at_loss_bytes && time_ms == o.time_ms && overhead_pct == o.overhead_pct &&
         fits_budget == o.fits_budget && under_torch_compile == o.under_torch_compile && sac == o.sac &&
         sac_families == o.sac_families;
}

bool PlanSacOp::operator==(const PlanSacOp& o) const {
  return family == o.family && occurrence == o.occurrence && op == o.op && kind == o.kind && shape == o.shape &&
         bytes == o.bytes;
}

bool PlanSacModule::operator==(const PlanSacModule& o) const {
  return module == o.module && family_counts == o.family_counts && save == o.save && dispatched_ops == o.dispatched_ops &&
         dispatch_ms == o.dispatch_ms;
}


bool PlanRank::operator==(const PlanRank& o) const {
  return fixed == o.fixed && activation_budget_bytes == o.activation_budget_bytes && peak_bytes == o.peak_bytes &&
         pytorch_peak_bytes == o.pytorch_peak_bytes && saved_bytes == o.saved_bytes;
}

bool PlanPipelineStage::operator==(const PlanPipelineStage& o) const {
  return index == o.index && first_chain_stage == o.first_chain_stage && last_chain_stage == o.last_chain_stage &&
         in_flight == o.in_flight && stored_after_forward_bytes == o.stored_after_forward_bytes && fixed == o.fixed &&
         activation_budget_bytes == o.activation_budget_bytes && peak_bytes == o.peak_bytes &&
         pytorch_saved_bytes == o.pytorch_saved_bytes && pytorch_peak_bytes == o.pytorch_peak_bytes;
}

bool PlanDistributed::operator==(const PlanDistributed& o) const {
  return data_parallel == o.data_parallel && shard == o.shard && pipeline == o.pipeline &&
         fsdp_units == o.fsdp_units && ranks == o.ranks && microbatches == o.microbatches && schedule == o.schedule &&
         slowest_stage_ms == o.slowest_stage_ms && stages == o.stages;
}

bool PlanDocument::operator==(const PlanDocument& o) const {
  return algorithm == o.algorithm && target == o.target && source == o.source &&
         budget_bytes == o.budget_bytes && fixed == o.fixed && activation_budget_bytes == o.activation_budget_bytes &&
         stages == o.stages && checkpointed_stages == o.checkpointed_stages && schedule == o.schedule &&
         predicted == o.predicted && min_budget_bytes == o.min_budget_bytes &&
         timeline_peak_during_bytes == o.timeline_peak_during_bytes &&
         timeline_stored_after_bytes == o.timeline_stored_after_bytes && checkpoint_modules == o.checkpoint_modules &&
         pytorch == o.pytorch && slots == o.slots && slot_bytes == o.slot_bytes && solver == o.solver &&
         every_n == o.every_n && unit_style == o.unit_style && distributed == o.distributed &&
         pipeline_stage == o.pipeline_stage && strategies == o.strategies && batch == o.batch &&
         global_batch == o.global_batch && accumulation_steps == o.accumulation_steps;
}

bool StrategyPoint::operator==(const StrategyPoint& o) const {
  return name == o.name && peak_bytes == o.peak_bytes && time_ms == o.time_ms && overhead_pct == o.overhead_pct &&
         fits == o.fits;
}

nlohmann::json StrategyPointToJson(const StrategyPoint& p) {
  return {{"name", p.name}, {"peak_bytes", p.peak_bytes}, {"time_ms", p.time_ms}, {"overhead_pct", p.overhead_pct},
          {"fits", p.fits}};
}

std::vector<StrategyPoint> StrategyPointsFromJson(const JsonReader& list) {
  std::vector<StrategyPoint> points;
  for (size_t k = 0; k < list.ArraySize(); ++k) {
    const JsonReader p = list.Item(k);
    points.push_back({p.Field("name").String(), p.Field("peak_bytes").NonNegativeBytes(),
                      p.Field("time_ms").NonNegativeNumber(), p.Field("overhead_pct").FiniteNumber(),
                      p.Field("fits").Bool()});
  }
  return points;
}

namespace {

// `optimizer_impl`: a fixed part's is always set (for-loop where not).
const char* ImplName(const OptimizerChoice& optimizer) {
  return OptimizerImplName(optimizer.impl.value_or(OptimizerImpl::kForLoop));
}

// `optimizer_options`: the options set, each only where it is not torch.optim's default.
void WriteOptimizerFlags(const OptimizerFlags& flags, nlohmann::json* doc) {
  if (!flags.any()) return;
  nlohmann::json options = nlohmann::json::object();
  if (flags.weight_decay != 0) options["weight_decay"] = flags.weight_decay;
  if (flags.amsgrad) options["amsgrad"] = true;
  if (flags.nesterov) options["nesterov"] = true;
  (*doc)["optimizer_options"] = options;
}

OptimizerFlags ReadOptimizerFlags(const JsonReader& fixed) {
  OptimizerFlags flags;
  if (!fixed.Has("optimizer_options")) return flags;
  const JsonReader options = fixed.Field("optimizer_options");
  options.ExpectObject();
  if (options.Has("weight_decay")) flags.weight_decay = options.Field("weight_decay").NonNegativeNumber();
  if (options.Has("amsgrad")) flags.amsgrad = options.Field("amsgrad").Bool();
  if (options.Has("nesterov")) flags.nesterov = options.Field("nesterov").Bool();
  return flags;
}

// The rank form (`distributed.ranks[].fixed`, `pipeline_stage.fixed`).
nlohmann::json RankFixedToJson(const FixedMemory& f) {
  nlohmann::json doc = {{"shard", ShardModeName(f.shard)}, {"data_parallel", f.data_parallel},
                        {"param_bytes", f.param_bytes}, {"buffer_bytes", f.buffer_bytes},
                        {"grad_bytes", f.grad_bytes}, {"optimizer_bytes", f.optimizer_bytes},
                        {"optimizer", f.optimizer.name}, {"optimizer_impl", ImplName(f.optimizer)},
                        {"gathered_bytes", f.gathered_bytes},
                        {"reduce_bytes", f.reduce_bytes}, {"total_bytes", f.total()}};
  WriteOptimizerFlags(f.optimizer.flags, &doc);
  if (f.shard == ShardMode::kFull) {
    nlohmann::json units = nlohmann::json::array();
    for (const ShardUnit& u : f.units) {
      units.push_back({{"module", u.module}, {"param_bytes", u.param_bytes}, {"shard_bytes", u.shard_bytes}});
    }
    doc["units"] = units;
  }
  return doc;
}

// The plain form (the plan's `fixed`): a rank's gathered parameters and
// reduce-scatter buffer counted with its parameters and gradients.
nlohmann::json FixedToJson(const FixedMemory& f) {
  nlohmann::json doc = {{"param_bytes", f.param_bytes + f.gathered_bytes},
                        {"buffer_bytes", f.buffer_bytes},
                        {"grad_bytes", f.grad_bytes + f.reduce_bytes},
                        {"optimizer_bytes", f.optimizer_bytes},
                        {"optimizer", f.optimizer.name},
                        {"optimizer_impl", ImplName(f.optimizer)},
                        {"total_bytes", f.total()}};
  WriteOptimizerFlags(f.optimizer.flags, &doc);
  if (!f.optimizer.groups.empty()) doc["optimizer_groups"] = OptimizerGroupsToJson(f.optimizer.groups);
  // The update's temporary at the step's end: counted with the chain, not in total_bytes.
  if (f.update_tmp_bytes > 0) doc["update_tmp_bytes"] = f.update_tmp_bytes;
  // Gradients counted as they appear in backward: not in total_bytes.
  if (f.backward_grad_bytes > 0) doc["backward_grad_bytes"] = f.backward_grad_bytes;
  return doc;
}

nlohmann::json DistributedToJson(const PlanDistributed& d) {
  nlohmann::json doc = {{"data_parallel", d.data_parallel}, {"shard", d.shard}, {"pipeline", d.pipeline}};
  if (!d.stages.empty()) {
    nlohmann::json stages = nlohmann::json::array();
    for (const PlanDocument& stage : d.stages) stages.push_back(PlanToJson(stage));
    doc["microbatches"] = d.microbatches;
    doc["schedule"] = d.schedule;
    doc["slowest_stage_ms"] = d.slowest_stage_ms;
    doc["stages"] = stages;
    return doc;
  }
  nlohmann::json ranks = nlohmann::json::array();
  for (const PlanRank& r : d.ranks) {
    ranks.push_back({{"fixed", RankFixedToJson(r.fixed)},
                     {"activation_budget_bytes", r.activation_budget_bytes},
                     {"peak_bytes", r.peak_bytes},
                     {"pytorch_peak_bytes", r.pytorch_peak_bytes},
                     {"saved_bytes", r.saved_bytes}});
  }
  doc["fsdp_units"] = d.fsdp_units;
  doc["ranks"] = ranks;
  return doc;
}

nlohmann::json PipelineStageToJson(const PlanPipelineStage& s) {
  return {{"index", s.index}, {"first_chain_stage", s.first_chain_stage}, {"last_chain_stage", s.last_chain_stage},
          {"in_flight", s.in_flight}, {"stored_after_forward_bytes", s.stored_after_forward_bytes},
          {"fixed", RankFixedToJson(s.fixed)}, {"activation_budget_bytes", s.activation_budget_bytes},
          {"peak_bytes", s.peak_bytes}, {"pytorch_saved_bytes", s.pytorch_saved_bytes},
          {"pytorch_peak_bytes", s.pytorch_peak_bytes}};
}

}  // namespace

nlohmann::json PlanToJson(const PlanDocument& p) {
  nlohmann::json doc = {{"schema", "ckplan.plan/1"},
                        {"algorithm", p.algorithm},
                        {"source", PlanSourceToJson(p.source)},
                        {"budget_bytes", p.budget_bytes},
                        {"checkpoint_modules", p.checkpoint_modules}};
  if (p.distributed) doc["distributed"] = DistributedToJson(*p.distributed);
  if (p.unit_style) doc["unit_style"] = *p.unit_style;
  if (!p.strategies.empty()) {
    nlohmann::json strategies = nlohmann::json::array();
    for (const StrategyPoint& point : p.strategies) strategies.push_back(StrategyPointToJson(point));
    doc["strategies"] = strategies;
  }
  if (p.batch) doc["batch"] = *p.batch;
  if (p.global_batch) doc["global_batch"] = *p.global_batch;
  if (p.accumulation_steps) doc["accumulation_steps"] = *p.accumulation_steps;
  if (p.is_pipeline()) return doc;  // each stage's document (in distributed.stages) is a plan
  nlohmann::json stages = nlohmann::json::array();
  for (const PlanStage& s : p.stages) {
    nlohmann::json stage = {{"index", s.index}, {"name", s.name}, {"checkpointed", s.checkpointed}};
    if (!s.modules.empty()) stage["modules"] = s.modules;
    if (s.ops) {
      stage["first_op"] = s.ops->first;
      stage["last_op"] = s.ops->last;
    }
    stages.push_back(std::move(stage));
  }
  doc["target"] = p.target;
  doc["fixed"] = FixedToJson(p.fixed);
  doc["activation_budget_bytes"] = p.activation_budget_bytes;
  doc["stages"] = std::move(stages);
  doc["checkpointed_stages"] = p.checkpointed_stages;
  doc["schedule"] = ScheduleToJson(p.schedule);
  doc["predicted"] = {{"peak_bytes", p.predicted.peak_bytes},
                      {"time_ms", p.predicted.time_ms},
                      {"overhead_pct", p.predicted.overhead_pct},
                      {"no_recompute_ms", p.predicted.no_recompute_ms},
                      {"live_after_forward_bytes", p.predicted.live_after_forward_bytes}};
  if (p.predicted.optimizer_step_ms) doc["predicted"]["optimizer_step_ms"] = *p.predicted.optimizer_step_ms;
  if (p.min_budget_bytes) doc["min_budget_bytes"] = *p.min_budget_bytes;
  doc["timeline"] = {{"peak_during_bytes", p.timeline_peak_during_bytes},
                     {"stored_after_bytes", p.timeline_stored_after_bytes}};
  const PlanPyTorch& e = p.pytorch;
  doc["pytorch"] = {{"checkpoint_modules", p.checkpoint_modules},
                    {"skipped_stages", e.skipped_stages},
                    {"settings", {{"use_reentrant", e.use_reentrant}, {"preserve_rng_state", e.preserve_rng_state}}},
                    {"predicted",
                     {{"peak_bytes", e.peak_bytes},
                      {"saved_bytes", e.held_at_loss_bytes},
                      {"time_ms", e.time_ms},
                      {"overhead_pct", e.overhead_pct},
                      {"fits_budget", e.fits_budget}}}};
  if (!e.under_torch_compile.empty()) doc["pytorch"]["under_torch_compile"] = e.under_torch_compile;
  if (e.sac) {
    nlohmann::json list = nlohmann::json::array();
    for (const PlanSacModule& m : *e.sac) {
      nlohmann::json save = nlohmann::json::array();
      for (const PlanSacOp& op : m.save) {
        save.push_back({{"family", op.family}, {"occurrence", op.occurrence}, {"op", op.op}, {"kind", op.kind},
                        {"shape", op.shape}, {"bytes", op.bytes}});
      }
      list.push_back({{"module", m.module}, {"family_counts", m.family_counts}, {"save", save}});
      if (m.dispatched_ops > 0) {
        list.back()["dispatched_ops"] = m.dispatched_ops;
        list.back()["dispatch_ms"] = m.dispatch_ms;
      }
    }
    doc["pytorch"]["sac"] = list;
  }
  if (e.sac_families) doc["pytorch"]["sac_families"] = *e.sac_families;
  if (p.slots) doc["slots"] = *p.slots;
  if (p.slot_bytes) doc["slot_bytes"] = *p.slot_bytes;
  if (p.solver) {
    nlohmann::json solver = {{"method", p.solver->method}, {"proven_optimal", p.solver->proven_optimal}};
    if (p.solver->band > 0) {
      solver["band"] = p.solver->band;
      solver["lower_bound_ms"] = p.solver->lower_bound_ms;
      solver["gap_bound_pct"] = p.solver->gap_bound_pct;
      solver["min_budget_lower_bytes"] = p.solver->min_budget_lower_bytes;
    }
    if (p.solver->time_noise_pct > 0) {
      solver["time_noise_pct"] = p.solver->time_noise_pct;
      solver["tie_ms"] = p.solver->tie_ms;
      solver["tied_plans"] = p.solver->tied_plans;
    }
    doc["solver"] = solver;
  }
  if (p.every_n) doc["every_n"] = *p.every_n;
  if (p.pipeline_stage) doc["pipeline_stage"] = PipelineStageToJson(*p.pipeline_stage);
  return doc;
}

namespace {

std::vector<std::string> Strings(const JsonReader& list) {
  std::vector<std::string> out;
  for (size_t k = 0; k < list.ArraySize(); ++k) out.push_back(list.Item(k).String());
  return out;
}

std::vector<int64_t> Bytes(const JsonReader& list) {
  std::vector<int64_t> out;
  for (size_t k = 0; k < list.ArraySize(); ++k) out.push_back(list.Item(k).NonNegativeBytes());
  return out;
}

// `total_bytes`, where present, must be the sum of the parts read.
void CheckFixedTotal(const JsonReader& f, const FixedMemory& fixed) {
  if (!f.Has("total_bytes")) return;
  const int64_t total = f.Field("total_bytes").NonNegativeBytes();
  if (total != fixed.total()) {
    f.Field("total_bytes").Fail(std::to_string(total) + " B is not the sum of the fixed part's fields, " +
                                std::to_string(fixed.total()) + " B");
  }
}

OptimizerImpl ImplFromJson(const JsonReader& node) {
  const std::string name = node.String();
  for (OptimizerImpl i : {OptimizerImpl::kForLoop, OptimizerImpl::kForeach, OptimizerImpl::kFused}) {
    if (name == OptimizerImplName(i)) return i;
  }
  node.Fail("expected \"for-loop\", \"foreach\" or \"fused\"");
}

FixedMemory RankFixedFromJson(const JsonReader& f) {
  FixedMemory out;
  out.shard = ParseShardMode(f.Field("shard").String());
  out.data_parallel = f.Field("data_parallel").IntegerIn(1, 1 << 30);
  out.param_bytes = f.Field("param_bytes").NonNegativeBytes();
  out.buffer_bytes = f.Field("buffer_bytes").NonNegativeBytes();
  out.grad_bytes = f.Field("grad_bytes").NonNegativeBytes();
  out.optimizer_bytes = f.Field("optimizer_bytes").NonNegativeBytes();
  out.optimizer.name = f.Field("optimizer").String();
  if (f.Has("optimizer_impl")) out.optimizer.impl = ImplFromJson(f.Field("optimizer_impl"));
  out.optimizer.flags = ReadOptimizerFlags(f);
  out.gathered_bytes = f.Field("gathered_bytes").NonNegativeBytes();
  out.reduce_bytes = f.Field("reduce_bytes").NonNegativeBytes();
  f.Field("total_bytes");  // required in this form
  CheckFixedTotal(f, out);
  if (f.Has("units")) {
    const JsonReader units = f.Field("units");
    for (size_t k = 0; k < units.ArraySize(); ++k) {
      const JsonReader u = units.Item(k);
      out.units.push_back(
          {u.Field("module").String(), u.Field("param_bytes").NonNegativeBytes(), u.Field("shard_bytes").NonNegativeBytes()});
    }
  }
  return out;
}

PlanPipelineStage PipelineStageFromJson(const JsonReader& s) {
  PlanPipelineStage out;
  out.index = s.Field("index").IntegerIn(0, INT_MAX);
  out.first_chain_stage = s.Field("first_chain_stage").IntegerIn(0, INT_MAX);
  out.last_chain_stage = s.Field("last_chain_stage").IntegerIn(0, INT_MAX);
  out.in_flight = s.Field("in_flight").IntegerIn(1, 1 << 30);
  out.stored_after_forward_bytes = s.Field("stored_after_forward_bytes").NonNegativeBytes();
  out.fixed = RankFixedFromJson(s.Field("fixed"));
  out.activation_budget_bytes = s.Field("activation_budget_bytes").Integer();
  out.peak_bytes = s.Field("peak_bytes").NonNegativeBytes();
  out.pytorch_saved_bytes = s.Field("pytorch_saved_bytes").NonNegativeBytes();
  out.pytorch_peak_bytes = s.Field("pytorch_peak_bytes").NonNegativeBytes();
  return out;
}

PlanDocument ReadPlan(const JsonReader& root);

PlanDistributed DistributedFromJson(const JsonReader& d) {
  d.ExpectObject();
  PlanDistributed out;
  out.data_parallel = d.Field("data_parallel").IntegerIn(1, 1 << 30);
  out.shard = d.Field("shard").String();
  out.pipeline = d.Field("pipeline").IntegerIn(1, 1 << 30);
  if (d.Has("stages")) {
    out.microbatches = d.Field("microbatches").IntegerIn(1, 1 << 30);
    out.schedule = d.Field("schedule").String();
    out.slowest_stage_ms = d.Field("slowest_stage_ms").NonNegativeNumber();
    const JsonReader stages = d.Field("stages");
    if (stages.ArraySize() == 0) stages.Fail("no stages");
    for (size_t k = 0; k < stages.ArraySize(); ++k) out.stages.push_back(ReadPlan(stages.Item(k)));
    return out;
  }
  if (d.Has("fsdp_units")) out.fsdp_units = Strings(d.Field("fsdp_units"));
  const JsonReader ranks = d.Field("ranks");
  if (ranks.ArraySize() == 0) ranks.Fail("no ranks");
  for (size_t k = 0; k < ranks.ArraySize(); ++k) {
    const JsonReader r = ranks.Item(k);
    out.ranks.push_back({RankFixedFromJson(r.Field("fixed")), r.Field("activation_budget_bytes").Integer(),
                         r.Field("peak_bytes").NonNegativeBytes(), r.Field("pytorch_peak_bytes").NonNegativeBytes(),
                         r.Field("saved_bytes").NonNegativeBytes()});
  }
  return out;
}

// A plan document at `root` (the file's top level, or a pipeline stage's
// document inside it: messages name the field's whole path).
PlanDocument ReadPlan(const JsonReader& root) {
  root.ExpectObject();
  root.ExpectSchema("plan");
  PlanDocument p;
  const JsonReader source = root.Field("source");
  p.source = PlanSourceFromJson(source.node(), source.file(), source.path());
  p.algorithm = root.Field("algorithm").String();
  p.budget_bytes = root.Field("budget_bytes").NonNegativeBytes();
  if (root.Has("checkpoint_modules")) p.checkpoint_modules = Strings(root.Field("checkpoint_modules"));
  if (root.Has("distributed")) p.distributed = DistributedFromJson(root.Field("distributed"));
  if (root.Has("unit_style")) {
    JsonReader style = root.Field("unit_style");
    p.unit_style = style.String();
    if (*p.unit_style != "decimal" && *p.unit_style != "binary") style.Fail("expected \"decimal\" or \"binary\"");
  }
  if (root.Has("strategies")) p.strategies = StrategyPointsFromJson(root.Field("strategies"));
  if (root.Has("batch")) p.batch = root.Field("batch").IntegerIn(1, 1 << 30);
  if (root.Has("global_batch")) p.global_batch = root.Field("global_batch").IntegerIn(1, 1 << 30);
  if (root.Has("accumulation_steps")) p.accumulation_steps = root.Field("accumulation_steps").IntegerIn(1, 1 << 30);
  if (p.global_batch.has_value() != p.accumulation_steps.has_value() ||
      (p.global_batch && (!p.batch || *p.batch * int64_t{*p.accumulation_steps} != *p.global_batch))) {
    root.Field(p.global_batch ? "global_batch" : "accumulation_steps")
        .Fail("global_batch must be batch x accumulation_steps, and both given or neither");
  }
  if (p.is_pipeline()) return p;

  if (root.Has("target")) p.target = root.Field("target").String();
  JsonReader fixed = root.Field("fixed");
  p.fixed.optimizer.name = fixed.Field("optimizer").String();
  if (fixed.Has("optimizer_impl")) p.fixed.optimizer.impl = ImplFromJson(fixed.Field("optimizer_impl"));
  p.fixed.optimizer.flags = ReadOptimizerFlags(fixed);
  if (fixed.Has("optimizer_groups"))
    p.fixed.optimizer.groups = OptimizerGroupsFromJson(fixed.Field("optimizer_groups"));
  if (fixed.Has("update_tmp_bytes")) p.fixed.update_tmp_bytes = fixed.Field("update_tmp_bytes").NonNegativeBytes();
  if (fixed.Has("param_bytes")) p.fixed.param_bytes = fixed.Field("param_bytes").NonNegativeBytes();
  if (fixed.Has("buffer_bytes")) p.fixed.buffer_bytes = fixed.Field("buffer_bytes").NonNegativeBytes();
  if (fixed.Has("grad_bytes")) p.fixed.grad_bytes = fixed.Field("grad_bytes").NonNegativeBytes();
  if (fixed.Has("optimizer_bytes")) p.fixed.optimizer_bytes = fixed.Field("optimizer_bytes").NonNegativeBytes();
  if (fixed.Has("backward_grad_bytes")) p.fixed.backward_grad_bytes = fixed.Field("backward_grad_bytes").NonNegativeBytes();
  CheckFixedTotal(fixed, p.fixed);
  if (root.Has("activation_budget_bytes")) p.activation_budget_bytes = root.Field("activation_budget_bytes").Integer();

  JsonReader stages = root.Field("stages");
  for (size_t s = 0; s < stages.ArraySize(); ++s) {
    JsonReader stage = stages.Item(s);
    PlanStage out;
    out.index = stage.Has("index") ? stage.Field("index").IntegerIn(0, INT_MAX) : static_cast<int>(s);
    out.name = stage.Field("name").String();
    if (stage.Has("checkpointed")) out.checkpointed = stage.Field("checkpointed").Bool();
    if (stage.Has("modules")) out.modules = Strings(stage.Field("modules"));
    if (stage.Has("first_op") || stage.Has("last_op")) {
      out.ops = OpRange{stage.Field("first_op").IntegerIn(0, INT_MAX), stage.Field("last_op").IntegerIn(0, INT_MAX)};
    }
    p.stages.push_back(std::move(out));
  }
  if (root.Has("checkpointed_stages")) {
    JsonReader list = root.Field("checkpointed_stages");
    for (size_t k = 0; k < list.ArraySize(); ++k) p.checkpointed_stages.push_back(list.Item(k).IntegerIn(0, INT_MAX));
  }
  const JsonReader schedule = root.Field("schedule");
  p.schedule = ScheduleFromJson(schedule.node(), schedule.file(), schedule.path());

  JsonReader predicted = root.Field("predicted");
  p.predicted.peak_bytes = predicted.Field("peak_bytes").NonNegativeBytes();
  p.predicted.time_ms = predicted.Field("time_ms").NonNegativeNumber();
  p.predicted.overhead_pct = predicted.Field("overhead_pct").FiniteNumber();
  if (predicted.Has("no_recompute_ms")) p.predicted.no_recompute_ms = predicted.Field("no_recompute_ms").NonNegativeNumber();
  if (predicted.Has("live_after_forward_bytes")) {
    p.predicted.live_after_forward_bytes = predicted.Field("live_after_forward_bytes").NonNegativeBytes();
  }
  if (predicted.Has("optimizer_step_ms")) p.predicted.optimizer_step_ms = predicted.Field("optimizer_step_ms").NonNegativeNumber();
  if (root.Has("min_budget_bytes")) p.min_budget_bytes = root.Field("min_budget_bytes").NonNegativeBytes();
  if (root.Has("timeline")) {
    JsonReader timeline = root.Field("timeline");
    p.timeline_peak_during_bytes = Bytes(timeline.Field("peak_during_bytes"));
    p.timeline_stored_after_bytes = Bytes(timeline.Field("stored_after_bytes"));
  }
  if (root.Has("pytorch")) {
    JsonReader e = root.Field("pytorch");
    // Written in both places: the top level's, where present, is the one.
    const std::vector<std::string> modules = Strings(e.Field("checkpoint_modules"));
    if (!root.Has("checkpoint_modules")) p.checkpoint_modules = modules;
    if (e.Has("skipped_stages")) p.pytorch.skipped_stages = Strings(e.Field("skipped_stages"));
    if (e.Has("settings")) {
      JsonReader settings = e.Field("settings");
      p.pytorch.use_reentrant = settings.Field("use_reentrant").Bool();
      p.pytorch.preserve_rng_state = settings.Field("preserve_rng_state").Bool();
    }
    if (e.Has("predicted")) {
      JsonReader ep = e.Field("predicted");
      p.pytorch.peak_bytes = ep.Field("peak_bytes").NonNegativeBytes();
      p.pytorch.held_at_loss_bytes = ep.Field("saved_bytes").NonNegativeBytes();
      p.pytorch.time_ms = ep.Field("time_ms").NonNegativeNumber();
      p.pytorch.overhead_pct = ep.Field("overhead_pct").FiniteNumber();
      p.pytorch.fits_budget = ep.Field("fits_budget").Bool();
    }
    if (e.Has("under_torch_compile")) p.pytorch.under_torch_compile = e.Field("under_torch_compile").String();
    if (e.Has("sac")) {
      JsonReader list = e.Field("sac");
      std::vector<PlanSacModule> modules;
      for (size_t i = 0; i < list.ArraySize(); ++i) {
        JsonReader m = list.Item(i);
        PlanSacModule module;
        module.module = m.Field("module").String();
        JsonReader counts = m.Field("family_counts");
        counts.ExpectObject();
        for (const auto& item : counts.node().items()) {
          module.family_counts[item.key()] = counts.Field(item.key()).IntegerIn(0, INT_MAX);
        }
        JsonReader save = m.Field("save");
        for (size_t k = 0; k < save.ArraySize(); ++k) {
          JsonReader op = save.Item(k);
          PlanSacOp saved;
          saved.family = op.Field("family").String();
          saved.occurrence = op.Field("occurrence").IntegerIn(0, INT_MAX);
          saved.op = op.Field("op").IntegerIn(0, INT_MAX);
          saved.kind = op.Field("kind").String();
          JsonReader shape = op.Field("shape");
          for (size_t d = 0; d < shape.ArraySize(); ++d) saved.shape.push_back(shape.Item(d).NonNegativeBytes());
          saved.bytes = op.Field("bytes").NonNegativeBytes();
          auto count = module.family_counts.find(saved.family);
          if (count == module.family_counts.end() || saved.occurrence >= count->second) {
            op.Field("occurrence").Fail("is not below the module's family_counts." + saved.family);
          }
          module.save.push_back(std::move(saved));
        }
        if (m.Has("dispatched_ops")) {
          module.dispatched_ops = m.Field("dispatched_ops").IntegerIn(0, INT_MAX);
          module.dispatch_ms = m.Field("dispatch_ms").NonNegativeNumber();
        }
        modules.push_back(std::move(module));
      }
      p.pytorch.sac = std::move(modules);
    }
    if (e.Has("sac_families")) {
      JsonReader families = e.Field("sac_families");
      families.ExpectObject();
      std::map<std::string, std::vector<std::string>> read;
      for (const auto& item : families.node().items()) {
        JsonReader ops = families.Field(item.key());
        std::vector<std::string>& names = read[item.key()];
        for (size_t i = 0; i < ops.ArraySize(); ++i) names.push_back(ops.Item(i).String());
      }
      for (const PlanSacModule& m : p.pytorch.sac.value_or(std::vector<PlanSacModule>{})) {
        for (const PlanSacOp& op : m.save) {
          if (read.count(op.family) == 0) families.Fail("has no family '" + op.family + "' that module '" + m.module + "' saves");
        }
      }
      p.pytorch.sac_families = std::move(read);
    }
  }
  if (root.Has("slots")) p.slots = root.Field("slots").IntegerIn(0, INT_MAX);
  if (root.Has("slot_bytes")) p.slot_bytes = root.Field("slot_bytes").NonNegativeBytes();
  if (root.Has("solver")) {
    JsonReader solver = root.Field("solver");
    PlanSolver out;
    out.method = solver.Field("method").String();
    out.proven_optimal = solver.Field("proven_optimal").Bool();
    if (solver.Has("band")) {
      out.band = solver.Field("band").IntegerIn(1, INT_MAX);
      out.lower_bound_ms = solver.Field("lower_bound_ms").NonNegativeNumber();
      out.gap_bound_pct = solver.Field("gap_bound_pct").NonNegativeNumber();
      out.min_budget_lower_bytes = solver.Field("min_budget_lower_bytes").NonNegativeBytes();
    }
    if (solver.Has("time_noise_pct")) {
      out.time_noise_pct = solver.Field("time_noise_pct").NonNegativeNumber();
      out.tie_ms = solver.Field("tie_ms").NonNegativeNumber();
      out.tied_plans = solver.Field("tied_plans").IntegerIn(0, INT_MAX);
    }
    p.solver = out;
  }
  if (root.Has("every_n")) p.every_n = root.Field("every_n").IntegerIn(1, INT_MAX);
  if (root.Has("pipeline_stage")) p.pipeline_stage = PipelineStageFromJson(root.Field("pipeline_stage"));
  return p;
}

}  // namespace

nlohmann::json OptimizerGroupsToJson(const std::vector<OptimizerGroup>& groups) {
  nlohmann::json list = nlohmann::json::array();
  for (const OptimizerGroup& g : groups) {
    nlohmann::json doc = nlohmann::json::object();
    if (!g.name.empty()) doc["optimizer"] = g.name;
    if (g.impl) doc["optimizer_impl"] = OptimizerImplName(*g.impl);
    WriteOptimizerFlags(g.flags, &doc);
    doc["params"] = g.params;
    list.push_back(doc);
  }
  return list;
}

std::vector<OptimizerGroup> OptimizerGroupsFromJson(const JsonReader& list) {
  std::vector<OptimizerGroup> groups;
  for (size_t k = 0; k < list.ArraySize(); ++k) {
    const JsonReader g = list.Item(k);
    g.ExpectObject();
    OptimizerGroup group;
    if (g.Has("optimizer")) group.name = g.Field("optimizer").String();
    if (g.Has("optimizer_impl")) group.impl = ImplFromJson(g.Field("optimizer_impl"));
    group.flags = ReadOptimizerFlags(g);
    group.params = Strings(g.Field("params"));
    groups.push_back(std::move(group));
  }
  return groups;
}

std::vector<OptimizerGroup> OptimizerGroupsFileFromJson(const nlohmann::json& doc, const std::string& file) {
  const JsonReader root(doc, file);
  root.ExpectObject();
  const std::string schema = root.Field("schema").String();
  if (schema != kOptimizerGroupsSchema) {
    root.Field("schema").Fail(std::string("expected \"") + kOptimizerGroupsSchema + "\", got \"" + schema + "\"");
  }
  return OptimizerGroupsFromJson(root.Field("groups"));
}

PlanDocument PlanFromJson(const nlohmann::json& json, const std::string& file) { return ReadPlan(JsonReader(json, file)); }

}  // namespace ckplan
