#include "cli/strategy_table.h"

#include "cli/terminal.h"
#include "planner/cost/sac_candidates.h"

namespace ckplan {

StrategyPoint StrategyPointOf(const std::string& name, const Plan& plan, int64_t budget_bytes) {
  return {name, plan.peak_bytes, plan.time_ms, plan.overhead_pct(), plan.peak_bytes <= budget_bytes};
}

std::vector<std::vector<std::string>> StrategyTableRows(const std::vector<StrategyPoint>& points, UnitStyle style) {
  std::vector<std::vector<std::string>> rows = {{"strategy", "peak", "step", "overhead", "fits"}};
  for (const StrategyPoint& p : points) {
    rows.push_back({p.name, FormatBytes(p.peak_bytes, style), FormatMs(p.time_ms), FormatPct(p.overhead_pct),
                    p.fits ? "yes" : "no"});
  }
  return rows;
}

std::string StrategyTableText(const std::vector<StrategyPoint>& points, UnitStyle style) {
  return FormatTable(StrategyTableRows(points, style), {false, true, true, true, false});
}

std::vector<std::pair<std::string, Plan>> SacComparisons(const PlannerInput& in,
                                                         const std::vector<WrappableModule>& selective,
                                                         const std::vector<WrappableModule>& plain,
                                                         const PlanRequest& request) {
  std::vector<std::pair<std::string, Plan>> out;
  PlanRequest whole = request;
  whole.pytorch_modules = &plain;
  whole.wrap_exactly = nullptr;
  whole.sweep = false;
  whole.progress = nullptr;
  out.emplace_back("optimal (pytorch)", MakePlan(in.chain, in.fixed, whole));
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

}  // namespace ckplan
