#include "planner/plan/strategies.h"

#include "planner/base/error.h"
#include "planner/base/format.h"

namespace ckplan {

TargetModules ModulesForTarget(const PlannerInput& in, const std::string& target, bool with_selective,
                               double sac_dispatch_us) {
  TargetModules t;
  if (target != "pytorch" && target != "sac") return t;
  t.plain = WrappableModules(in.chain, in.from_profile ? &in.profile : nullptr);
  if (!in.from_profile && t.plain.empty()) {
    throw BadInput(in.source.path +
                   ": --target pytorch needs module paths (a profile, or a chain whose stages name modules)");
  }
  if (target == "sac" && !in.from_profile) {
    throw BadInput(in.source.path + ": --target sac needs a profile (it saves ops inside modules)");
  }
  if (target == "sac" || (with_selective && in.from_profile)) {
    t.selective = t.plain;
    AddSacCandidates(in.profile, in.chain, &t.selective, sac_dispatch_us);
  }
  return t;
}

StrategyPoint StrategyPointOf(const std::string& name, const Plan& plan, int64_t budget_bytes) {
  return {name, plan.peak_bytes, plan.time_ms, plan.overhead_pct(), plan.peak_bytes <= budget_bytes};
}

std::vector<std::pair<std::string, Plan>> SacComparisons(const PlannerInput& in,
                                                         const std::vector<WrappableModule>& selective,
                                                         const std::vector<WrappableModule>& plain,
                                                         const PlanRequest& request, bool whole_modules) {
  std::vector<std::pair<std::string, Plan>> out;
  PlanRequest whole = request;
  whole.pytorch_modules = &plain;
  whole.wrap_exactly = nullptr;
  whole.sweep = false;
  whole.progress = nullptr;
  if (whole_modules) out.emplace_back("optimal (pytorch)", MakePlan(in.chain, in.fixed, whole));
  for (const HandWrittenSacPolicy& policy : HandWrittenSacPolicies()) {
    const std::vector<WrappableModule> layers = LayersSaving(selective, in.profile, policy.families);
    if (layers.empty()) continue;
    PlanRequest hand = whole;
    hand.pytorch_modules = &selective;
    hand.wrap_exactly = &layers;
    out.emplace_back(policy.name, MakePlan(in.chain, in.fixed, hand));
  }
  return out;
}

std::vector<StrategyPoint> StrategyTable(const PlannerInput& in, const TargetModules& modules,
                                         const PlanRequest& request, const Plan& chosen,
                                         const std::string& chosen_name, const std::vector<int>& every_n) {
  const int64_t budget_bytes = request.budget.bytes;
  std::vector<StrategyPoint> rows;
  auto add = [&](const std::string& name, const Plan& p) { rows.push_back(StrategyPointOf(name, p, budget_bytes)); };
  PlanRequest fixed = request;  // the table's own plans: no curve, no progress
  fixed.sweep = false;
  fixed.progress = nullptr;
  auto baseline = [&](Algorithm a, int n) {
    PlanRequest r = fixed;
    r.algorithm = a;
    r.every_n = n;
    return MakePlan(in.chain, in.fixed, r);
  };
  add("none", baseline(Algorithm::kNone, 0));
  add("every", baseline(Algorithm::kEvery, 1));
  for (int n : every_n) {
    if (n > 1 && n < in.chain.length()) add(Format("every-%d", n), baseline(Algorithm::kEveryN, n));
  }
  const Plan sqrt_plan = baseline(Algorithm::kSqrt, 0);
  add(Format("sqrt (n=%d)", sqrt_plan.every_n), sqrt_plan);
  if (!chosen_name.empty()) add(chosen_name, chosen);
  if (chosen.algorithm != Algorithm::kOptimal || chosen.target == "schedule") return rows;
  if (!modules.selective.empty()) {
    // A pytorch plan is the whole-modules plan itself: it is not solved again.
    const bool sac = chosen.target == "sac";
    const std::vector<std::pair<std::string, Plan>> compared =
        SacComparisons(in, modules.selective, modules.plain, fixed, /*whole_modules=*/sac);
    size_t hand_written = 0;
    if (sac) {
      // Wrapping whole modules, where that fits the budget at all (an infeasible plan has no peak to show).
      if (compared.front().second.feasible) add(compared.front().first, compared.front().second);
      hand_written = 1;
    } else {
      PlanRequest sac = fixed;
      sac.pytorch_modules = &modules.selective;
      const Plan best = MakePlan(in.chain, in.fixed, sac);
      if (best.feasible) add("optimal (sac)", best);
    }
    for (size_t k = hand_written; k < compared.size(); ++k) add(compared[k].first, compared[k].second);
  }
  PlanRequest schedule = fixed;
  schedule.pytorch_modules = nullptr;
  const Plan nested = MakePlan(in.chain, in.fixed, schedule);
  if (nested.feasible) add("optimal (schedule)", nested);
  return rows;
}

}  // namespace ckplan
