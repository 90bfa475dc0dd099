#include "planner/plan/plan.h"

#include <nlohmann/json.hpp>

namespace ckplan {

PlanDocument MakePlanDocument(const Plan& plan, const Chain& chain, const PlanSource& source) {
  PlanDocument doc;
  std::vector<bool> checkpointed(static_cast<size_t>(chain.length()), false);
  for (int i : plan.checkpointed_stages) checkpointed[static_cast<size_t>(i)] = true;
  for (int i = 0; i < chain.length(); ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    doc.stages.push_back({i, s.name, checkpointed[static_cast<size_t>(i)], s.modules, s.first_op,
                          s.first_op >= 0 ? s.last_op : -1});
  }
  doc.algorithm = AlgorithmName(plan.algorithm);
  doc.target = plan.target;
  doc.source = source;
  doc.budget_bytes = plan.budget_bytes;
  doc.fixed.param_bytes = plan.fixed.param_bytes;
  doc.fixed.buffer_bytes = plan.fixed.buffer_bytes;
  doc.fixed.grad_bytes = plan.fixed.grad_bytes;
  doc.fixed.optimizer_bytes = plan.fixed.optimizer_bytes;
  doc.fixed.optimizer = plan.fixed.optimizer;
  doc.fixed.total_bytes = plan.fixed.total();
  // Gradients counted as they appear in backward: not in total_bytes.
  if (plan.fixed.backward_grad_bytes > 0) doc.fixed.backward_grad_bytes = plan.fixed.backward_grad_bytes;
  doc.activation_budget_bytes = plan.budget_bytes - plan.fixed.total();
  doc.checkpointed_stages = plan.checkpointed_stages;
  doc.schedule = plan.schedule;
  doc.predicted.peak_bytes = plan.peak_bytes;
  doc.predicted.time_ms = plan.time_ms;
  doc.predicted.overhead_pct = plan.overhead_pct();
  doc.predicted.no_recompute_ms = plan.no_recompute_ms;
  doc.predicted.live_after_forward_bytes = plan.fixed.total() + plan.simulation.live_after_forward_bytes;
  if (plan.fixed.optimizer_step_ms > 0) doc.predicted.optimizer_step_ms = plan.fixed.optimizer_step_ms;
  doc.min_budget_bytes = plan.min_budget_bytes;
  // The simulated memory over the schedule, fixed part included: per
  // operation, the peak during it and what stays stored after it.
  for (size_t k = 0; k < plan.simulation.peak_during_bytes.size(); ++k) {
    doc.timeline_peak_during_bytes.push_back(plan.fixed.total() + plan.simulation.peak_during_bytes[k]);
    doc.timeline_stored_after_bytes.push_back(plan.fixed.total() + plan.simulation.stored_after_bytes[k]);
  }
  // For PyTorch training jobs: the modules to wrap, and what that predicts.
  const ModuleExport& e = plan.pytorch;
  // Priced as the PyTorch target prices it (module_fwd_nograd_ms, a fixed
  // checkpoint_call_ms per wrapped module), against its own step without
  // recomputation (run eagerly).
  const double export_ms = e.time_ms + plan.fixed.optimizer_step_ms;
  doc.checkpoint_modules = e.checkpoint_modules;
  doc.pytorch.checkpoint_modules = e.checkpoint_modules;
  doc.pytorch.skipped_stages = e.skipped_stages;
  doc.pytorch.use_reentrant = false;
  doc.pytorch.preserve_rng_state = true;
  doc.pytorch.peak_bytes = plan.fixed.total() + e.simulation.peak_bytes;
  // Kept for backward when the loss starts, model inputs excluded: what
  // saved_tensors_hooks see, plus the checkpointed modules' inputs.
  doc.pytorch.held_at_loss_bytes = e.held_at_loss_bytes;
  doc.pytorch.time_ms = export_ms;
  doc.pytorch.overhead_pct = OverheadPct(export_ms, chain.ModuleNoRecomputeTimeMs() + plan.fixed.optimizer_step_ms);
  doc.pytorch.fits_budget = plan.fixed.total() + e.simulation.peak_bytes <= plan.budget_bytes;
  if (plan.algorithm == Algorithm::kOptimal) {
    doc.slots = plan.slots;
    doc.slot_bytes = plan.slot_bytes;
    PlanSolver solver;
    solver.method = plan.solver;
    solver.proven_optimal = plan.proven_optimal;
    if (plan.band > 0) {
      solver.band = plan.band;
      solver.lower_bound_ms = plan.lower_bound_ms;
      solver.gap_bound_pct = plan.gap_bound_pct();
      solver.min_budget_lower_bytes = plan.min_budget_lower_bytes;
    }
    doc.solver = solver;
  }
  if (plan.every_n > 0) doc.every_n = plan.every_n;
  return doc;
}

nlohmann::json PlanToJson(const Plan& plan, const Chain& chain, const PlanSource& source) {
  return PlanToJson(MakePlanDocument(plan, chain, source));
}

}  // namespace ckplan
