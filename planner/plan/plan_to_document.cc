#include "planner/plan/plan_to_document.h"

#include <nlohmann/json.hpp>

#include "planner/cost/sac_candidates.h"

namespace ckplan {

const std::string& UnderTorchCompile() {
  // Measured on the test models (docs/measurements.md, "Under torch.compile").
  static const std::string text =
      "not predicted (the prediction is for eager PyTorch): torch.compile's partitioner re-decides what each "
      "wrapped module saves; compiled steps measured from 23% below to 20% above it on the test models, so leave "
      "a margin";
  return text;
}

PlanDocument MakePlanDocument(const Plan& plan, const Chain& chain, const PlanSource& source) {
  PlanDocument doc;
  std::vector<bool> checkpointed(static_cast<size_t>(chain.length()), false);
  for (int i : plan.checkpointed_stages) checkpointed[static_cast<size_t>(i)] = true;
  for (int i = 0; i < chain.length(); ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    doc.stages.push_back({i, s.name, checkpointed[static_cast<size_t>(i)], s.modules, s.ops});
  }
  doc.algorithm = AlgorithmName(plan.algorithm);
  doc.target = plan.target;
  doc.source = source;
  doc.budget_bytes = plan.budget.bytes;
  doc.unit_style = UnitStyleName(plan.budget.style);  // `ckplan run` prints bytes the way the user wrote them
  doc.fixed = plan.fixed;
  doc.activation_budget_bytes = plan.activation_budget_bytes;
  doc.checkpointed_stages = plan.checkpointed_stages;
  doc.schedule = plan.schedule;
  doc.predicted.peak_bytes = plan.peak_bytes;
  doc.predicted.time_ms = plan.time_ms;
  doc.predicted.overhead_pct = plan.overhead_pct();
  doc.predicted.no_recompute_ms = plan.no_recompute_ms;
  doc.predicted.live_after_forward_bytes = plan.live_after_forward_bytes;
  if (plan.fixed.optimizer_step_ms > 0) doc.predicted.optimizer_step_ms = plan.fixed.optimizer_step_ms;
  doc.min_budget_bytes = plan.min_budget_bytes;
  // The batch: the first dimension of the first input (a profile's inputs are
  // exported with a dynamic batch, ckplan_torch.export).
  if (source.inputs && source.inputs->is_array() && !source.inputs->empty()) {
    const nlohmann::json& shape = source.inputs->front().value("shape", nlohmann::json());
    if (shape.is_array() && !shape.empty() && shape.front().is_number_integer() && shape.front().get<int64_t>() >= 1 &&
        shape.front().get<int64_t>() <= (1 << 30)) {
      doc.batch = shape.front().get<int>();
    }
  }
  doc.timeline_peak_during_bytes = plan.timeline_peak_during_bytes;
  doc.timeline_stored_after_bytes = plan.timeline_stored_after_bytes;
  // For PyTorch training jobs: the modules to wrap, and what that predicts.
  const ModuleExport& e = plan.pytorch;
  doc.checkpoint_modules = e.checkpoint_modules;
  doc.pytorch.skipped_stages = e.skipped_stages;
  doc.pytorch.use_reentrant = false;
  doc.pytorch.preserve_rng_state = true;
  doc.pytorch.peak_bytes = plan.pytorch_peak_bytes;
  // Kept for backward when the loss starts, model inputs excluded: what
  // saved_tensors_hooks see, plus the checkpointed modules' inputs.
  doc.pytorch.held_at_loss_bytes = e.held_at_loss_bytes;
  doc.pytorch.time_ms = plan.pytorch_time_ms;
  doc.pytorch.overhead_pct = OverheadPct(plan.pytorch_time_ms, plan.pytorch_no_recompute_ms);
  doc.pytorch.fits_budget = plan.pytorch_peak_bytes <= plan.budget.bytes;
  doc.pytorch.under_torch_compile = UnderTorchCompile();
  if (plan.target == "sac") {
    std::vector<PlanSacModule> policies;
    for (const WrappableModule& m : e.wrapped) {
      PlanSacModule policy;
      policy.module = m.path;
      policy.family_counts = m.sac_family_counts;
      for (int i : m.sac_saved) {
        const SacCandidate& c = m.sac_candidates[static_cast<size_t>(i)];
        policy.save.push_back({c.family, c.occurrence, c.op, c.kind, c.shape, c.bytes()});
      }
      if (!m.sac_saved.empty()) {
        policy.dispatched_ops = m.sac_dispatched_ops;
        policy.dispatch_ms = m.sac_dispatch_ms;
      }
      policies.push_back(std::move(policy));
    }
    doc.pytorch.sac = std::move(policies);
    std::map<std::string, std::vector<std::string>> families;
    for (const SacFamily& family : SacFamilies()) families[family.name] = family.dispatched;
    doc.pytorch.sac_families = std::move(families);
  }
  if (plan.algorithm == Algorithm::kOptimal) {
    doc.slots = plan.slots;
    doc.slot_bytes = plan.slot_bytes;
    // The band's fields are written for the banded solver only.
    const bool banded = plan.solver.band > 0;
    PlanSolver& solver = doc.solver.emplace(banded ? plan.solver : PlanSolver());
    solver.method = plan.solver.method;
    solver.proven_optimal = plan.solver.proven_optimal;
    if (banded) solver.gap_bound_pct = plan.gap_bound_pct();
    solver.time_noise_pct = plan.solver.time_noise_pct;
    solver.tie_ms = plan.solver.tie_ms;
    solver.tied_plans = plan.solver.tied_plans;
  }
  if (plan.every_n > 0) doc.every_n = plan.every_n;
  return doc;
}

SweepDocument MakeSweepDocument(const Plan& plan, const PlanSource& source) {
  SweepDocument sweep;
  sweep.source = source;
  sweep.slots = plan.slots;
  sweep.slot_bytes = plan.slot_bytes;
  sweep.fixed_bytes = plan.fixed.total();
  sweep.no_recompute_ms = plan.no_recompute_ms;
  for (const CurvePoint& point : plan.curve) {
    sweep.points.push_back({point.budget_bytes, point.time_ms, OverheadPct(point.time_ms, plan.no_recompute_ms)});
  }
  return sweep;
}

nlohmann::json PlanToJson(const Plan& plan, const Chain& chain, const PlanSource& source) {
  return PlanToJson(MakePlanDocument(plan, chain, source));
}

}  // namespace ckplan
