#pragma once
/// The plan contract, `ckplan.plan/1`, as one value: what `ckplan solve`
/// writes (PlanToJson) and `ckplan run` reads (PlanFromJson). Torch-free.
/// docs/contracts.md ("Plan") documents every field.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/contracts/chain.h"
#include "planner/contracts/fixed_memory.h"
#include "planner/contracts/plan_solver.h"  // `solver`: written for optimal plans, its band fields where band > 0
#include "planner/contracts/schedule.h"

namespace ckplan {

class JsonReader;  // planner/base/json_io.h

/// `source`: where the chain came from (ProfileSource in planner/plan/planner_input.h makes it
/// for a profile). Also the sweep's `source` (sweep_document.h).
struct PlanSource {
  std::string kind;                         ///< `chain` or `profile`
  std::string path;                         ///< the chain or profile file
  std::optional<std::string> model_sha256;  ///< a profile's `model.sha256`: `ckplan run` refuses another model
  std::optional<std::string> model_path;    ///< a profile's `model.path`
  /// A profile's `model.inputs` ([{shape, dtype, text, lo, hi}]), kept as
  /// written: a pass-through of the profile contract, which keeps its
  /// `model` object as written (profile.h); `ckplan run` parses each
  /// input's `text` (ParseInputSpec).
  std::optional<nlohmann::json> inputs;
  /// The model's parameters as the profile lists them (each tensor once):
  /// how many and their bytes. apply_plan checks the model it is given
  /// against them, as `ckplan run` checks model_sha256.
  std::optional<int64_t> param_count;
  std::optional<int64_t> param_bytes;
  /// Of them, those that train (requires_grad), where some are frozen (a
  /// fine-tuning job): apply_plan warns when the job trains another set.
  /// Absent: every parameter trains.
  std::optional<int64_t> trainable_count;
  std::optional<int64_t> trainable_bytes;
  /// The autocast the profile ran its forward and loss under (`bfloat16`,
  /// `float16`; the profile's `environment.autocast`); absent: none.
  /// apply_plan warns when the job's forward runs otherwise.
  std::optional<std::string> autocast;
  bool operator==(const PlanSource& o) const;
};

/// The `source` object.
nlohmann::json PlanSourceToJson(const PlanSource& source);
/// Reads a `source` object at `path` of `file` (JSON path, for messages).
/// Required: kind, path; model_sha256 and model_path strings and inputs an
/// array when present. Throws BadInput naming `file` and the field.
PlanSource PlanSourceFromJson(const nlohmann::json& node, const std::string& file, const std::string& path);

/// One stage of the plan (`stages[]`).
struct PlanStage {
  int index = 0;
  std::string name;
  bool checkpointed = false;
  std::vector<std::string> modules;  ///< empty: not written (a plain chain)
  std::optional<OpRange> ops;        ///< `first_op`, `last_op`; unset: not written (a plain chain)
  bool operator==(const PlanStage& o) const;
};

/// `predicted`: the whole step as the planner predicts it.
struct PlanPredicted {
  int64_t peak_bytes = 0;
  double time_ms = 0;
  double overhead_pct = 0;
  double no_recompute_ms = 0;
  int64_t live_after_forward_bytes = 0;
  std::optional<double> optimizer_step_ms;  ///< written when the profile timed the optimizer
  bool operator==(const PlanPredicted& o) const;
};

/// `pytorch.sac[].save[]`: an op a selective-checkpointing policy saves
/// (CheckpointPolicy.MUST_SAVE): the `occurrence`-th op of `family` the
/// policy sees in the module's forward (planner/cost/sac_candidates.h), with
/// the profile's op, kind and output shape to check it by.
struct PlanSacOp {
  std::string family;
  int occurrence = 0;
  int op = 0;
  std::string kind;
  std::vector<int64_t> shape;
  int64_t bytes = 0;  ///< what saving it holds
  bool operator==(const PlanSacOp& o) const;
};

/// `pytorch.sac[]` (`--target sac`): a wrapped module's policy. Every op the
/// policy sees that is not in `save` is recomputed; `family_counts` is how
/// many ops of each family the module's forward runs (apply_plan checks).
struct PlanSacModule {
  std::string module;
  std::map<std::string, int> family_counts;
  std::vector<PlanSacOp> save;
  /// Optional (`dispatched_ops`, `dispatch_ms`): the ops its forward
  /// dispatches, as estimated from the profile, and what the policy's
  /// dispatch mode adds to the step, in the plan's time (absent where it
  /// saves nothing: apply_plan wraps it plainly).
  int dispatched_ops = 0;
  double dispatch_ms = 0;
  bool operator==(const PlanSacModule& o) const;
};

/// `pytorch`: what wrapping the modules predicts (the modules themselves
/// are the document's checkpoint_modules, written in both places).
struct PlanPyTorch {
  std::vector<std::string> skipped_stages;
  bool use_reentrant = false;
  bool preserve_rng_state = true;
  int64_t peak_bytes = 0;
  int64_t held_at_loss_bytes = 0;
  double time_ms = 0;
  double overhead_pct = 0;
  bool fits_budget = false;
  /// What a torch.compile'd job should expect of the prediction (made for eager PyTorch).
  std::string under_torch_compile;
  /// `--target sac`: one policy per wrapped module, in checkpoint_modules'
  /// order; absent for plain checkpointing.
  std::optional<std::vector<PlanSacModule>> sac;
  /// `--target sac`: each family the policies name, with the dispatcher's ops
  /// that count as it (planner/cost/sac_candidates.h SacFamilies): the policy
  /// applied counts by this list, so plan and policy agree by construction.
  std::optional<std::map<std::string, std::vector<std::string>>> sac_families;
  bool operator==(const PlanPyTorch& o) const;
};

struct PlanDocument;

/// `distributed.ranks[]` (data parallel).
struct PlanRank {
  FixedMemory fixed;                     ///< the rank's, sharding included
  int64_t activation_budget_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t pytorch_peak_bytes = 0;
  int64_t saved_bytes = 0;
  bool operator==(const PlanRank& o) const;
};

/// A pipeline stage's document's `pipeline_stage`.
struct PlanPipelineStage {
  int index = 0;
  int first_chain_stage = 0;
  int last_chain_stage = 0;
  int in_flight = 1;
  int64_t stored_after_forward_bytes = 0;
  FixedMemory fixed;                     ///< the stage rank's
  int64_t activation_budget_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t pytorch_saved_bytes = 0;
  int64_t pytorch_peak_bytes = 0;
  bool operator==(const PlanPipelineStage& o) const;
};

/// `distributed` (written by cmd_distributed.cc): a data-parallel plan's
/// (`fsdp_units`, `ranks`) or a pipeline plan's (`microbatches`,
/// `schedule`, `slowest_stage_ms`, `stages`: one plan per pipeline stage).
struct PlanDistributed {
  int data_parallel = 1;
  std::string shard = "none";
  int pipeline = 1;
  std::vector<std::string> fsdp_units;   ///< data parallel
  std::vector<PlanRank> ranks;           ///< data parallel
  int microbatches = 1;                  ///< pipeline
  std::string schedule;                  ///< pipeline: 1f1b or gpipe
  double slowest_stage_ms = 0;           ///< pipeline
  std::vector<PlanDocument> stages;      ///< pipeline: non-empty
  bool operator==(const PlanDistributed& o) const;
};

/// One strategy at a budget: a row of the strategy table (`ckplan solve`
/// prints it and writes it in the plan's `strategies`; `ckplan report` too).
struct StrategyPoint {
  std::string name;       ///< `none`, `every`, `sqrt (n=4)`, `optimal (pytorch)`, `optimal (schedule)`
  int64_t peak_bytes = 0;
  double time_ms = 0;
  double overhead_pct = 0;
  bool fits = false;
  bool operator==(const StrategyPoint& o) const;
};

/// `{"name", "peak_bytes", "time_ms", "overhead_pct", "fits"}`.
nlohmann::json StrategyPointToJson(const StrategyPoint& point);
/// Reads a list of strategy points (every field required); throws BadInput
/// naming the file and the field.
std::vector<StrategyPoint> StrategyPointsFromJson(const JsonReader& list);

/// An optimizer's param groups (`fixed.optimizer_groups`, and the groups of
/// a `--optimizer-groups` file): `[{"optimizer", "optimizer_impl",
/// "optimizer_options", "params": [names]}]`, each key as the fixed part
/// writes it for the whole optimizer; `optimizer_impl` where set,
/// `optimizer_options` where some.
nlohmann::json OptimizerGroupsToJson(const std::vector<OptimizerGroup>& groups);
/// Reads them: `params` required, the others optional (a group without
/// `optimizer` has an empty name; without `optimizer_options`, none).
/// Throws BadInput naming the file and the field.
std::vector<OptimizerGroup> OptimizerGroupsFromJson(const JsonReader& list);

/// The schema of a `--optimizer-groups` file: `{"schema":
/// "ckplan.optimizer_groups/1", "groups": [...]}` (OptimizerGroupsFromJson's).
inline constexpr const char* kOptimizerGroupsSchema = "ckplan.optimizer_groups/1";
/// Reads a `--optimizer-groups` file's document; throws BadInput naming `file`.
std::vector<OptimizerGroup> OptimizerGroupsFileFromJson(const nlohmann::json& doc, const std::string& file);

struct PlanDocument {
  /// A pipeline plan's top level (`--pipeline`), told by its
  /// `distributed.stages`: schema, algorithm, source, budget_bytes,
  /// checkpoint_modules and `distributed` only; each pipeline stage's
  /// document (in distributed.stages) is a plan. No schedule.
  bool is_pipeline() const { return distributed && !distributed->stages.empty(); }
  std::string algorithm;                ///< optimal, none, every, every-n, sqrt
  std::string target = "schedule";      ///< schedule, pytorch or sac
  PlanSource source;
  int64_t budget_bytes = 0;
  /// Written in its plain form: parameters, buffers, gradients (with a
  /// rank's gathered parameters and reduce-scatter buffer counted in them),
  /// optimizer state, the total, and backward_grad_bytes where some.
  FixedMemory fixed;
  int64_t activation_budget_bytes = 0;
  std::vector<PlanStage> stages;
  std::vector<int> checkpointed_stages;
  Schedule schedule;
  PlanPredicted predicted;
  std::optional<int64_t> min_budget_bytes;  ///< absent in a pipeline stage's document
  std::vector<int64_t> timeline_peak_during_bytes;  ///< `timeline`, per schedule operation, fixed part included
  std::vector<int64_t> timeline_stored_after_bytes;
  /// The modules apply_plan wraps: `checkpoint_modules`, and again as
  /// `pytorch.checkpoint_modules` (a pipeline plan's top level: every
  /// stage's, and no `pytorch`).
  std::vector<std::string> checkpoint_modules;
  PlanPyTorch pytorch;
  std::optional<int> slots;                 ///< optimal plans
  std::optional<int64_t> slot_bytes;
  std::optional<PlanSolver> solver;
  std::optional<int> every_n;               ///< every-n and sqrt plans
  std::optional<std::string> unit_style;    ///< decimal or binary; binary when absent
  /// Written by the distributed commands (cmd_distributed.cc):
  /// `distributed`, and a pipeline stage's `pipeline_stage`.
  std::optional<PlanDistributed> distributed;
  std::optional<PlanPipelineStage> pipeline_stage;
  /// `ckplan solve`'s strategy table at the plan's budget (optional; written
  /// for a profile or chain solve, not by the distributed commands).
  std::vector<StrategyPoint> strategies;
  /// The batch the plan is for: the first dimension of the profile's first
  /// input (absent for a chain). With gradient accumulation (`--global-batch`)
  /// the micro-batch, and `global_batch` = batch x accumulation_steps.
  std::optional<int> batch;
  std::optional<int> global_batch;
  std::optional<int> accumulation_steps;
  bool operator==(const PlanDocument& o) const;
};

/// The `ckplan.plan/1` document, keys as `ckplan solve` writes them.
nlohmann::json PlanToJson(const PlanDocument& plan);

/// Reads a `ckplan.plan/1` document. Required: schema, algorithm, source
/// (an object), budget_bytes; unless it is a pipeline plan's top level
/// (`distributed.stages`) also fixed.optimizer, stages[].name, schedule and
/// predicted (peak_bytes, time_ms, overhead_pct). Every other field is read,
/// and checked, when present. Throws BadInput naming `file` and the field.
PlanDocument PlanFromJson(const nlohmann::json& doc, const std::string& file);

}  // namespace ckplan
