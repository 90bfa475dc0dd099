#include "cli/report/report.h"

#include <algorithm>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "cli/terminal.h"
#include "planner/plan/strategies.h"

namespace ckplan {
namespace {

// One `ckplan.run/1` file (from `ckplan run -o`).
RunPoint ReadRunPoint(const std::string& file) { return {file, RunReportFromJson(ReadJsonFile(file), file)}; }

}  // namespace

Report MakeReport(const PlannerInput& input, const std::string& source, int64_t budget_bytes, UnitStyle style,
                  int slots, const std::vector<int>& every_n, const std::vector<std::string>& run_files,
                  const std::function<void(double)>& progress) {
  Report r;
  r.source = source;
  r.title = input.from_profile && input.profile.model.path ? *input.profile.model.path : source;
  // The run reports first: a bad one fails before the long work.
  for (const std::string& file : run_files) r.runs.push_back(ReadRunPoint(file));
  r.style = style;
  r.fixed = input.fixed;
  r.chain = input.chain;
  const int64_t huge = int64_t{1} << 60;
  // A profile's plans are for the PyTorch target, as `ckplan solve` makes
  // them by default (the modules apply_plan wraps, priced as PyTorch runs
  // them), compared with selective checkpointing; the nested schedule
  // (`ckplan run`'s) is shown beside, labelled. A chain has the schedule only.
  const bool pytorch = input.from_profile;
  r.target = pytorch ? "pytorch" : "schedule";
  const TargetModules modules = ModulesForTarget(input, r.target, /*with_selective=*/true);
  PlanRequest none_request;
  none_request.algorithm = Algorithm::kNone;
  none_request.budget.bytes = huge;
  if (pytorch) none_request.pytorch_modules = &modules.plain;
  const Plan none = MakePlan(input.chain, input.fixed, none_request);
  r.no_recompute_ms = none.no_recompute_ms;  // the optimizer's update included
  // One DP at the largest budget of interest gives the whole optimal curve,
  // and its plan says the smallest feasible budget.
  PlanRequest sweep;
  sweep.budget.bytes = std::max(none.peak_bytes, budget_bytes);
  sweep.slots = slots;
  sweep.sweep = true;
  // The sweep is the first half of the work, the chosen plan the second.
  if (progress) sweep.progress = [&progress](double f) { progress(0.5 * f); };
  Plan top = MakePlan(input.chain, input.fixed, sweep);
  PlanRequest loose;
  loose.budget.bytes = huge;
  loose.pytorch_modules = &modules.plain;
  const int64_t minimum = pytorch ? MakePlan(input.chain, input.fixed, loose).min_budget_bytes : top.min_budget_bytes;
  // Without a budget: halfway between the smallest feasible one and no
  // checkpointing, and never below the smallest.
  const bool chosen_here = budget_bytes <= 0;
  r.budget_bytes = chosen_here ? minimum + std::max<int64_t>(0, none.peak_bytes - minimum) / 2 : budget_bytes;
  if (r.budget_bytes < minimum) {
    throw Error(ExitCode::kInfeasible, Format("budget %s is below the minimum %s", FormatBytes(r.budget_bytes, style).c_str(),
                                              FormatBytes(minimum, style, true).c_str()));
  }
  for (const CurvePoint& p : top.curve) {
    if (p.budget_bytes >= top.min_budget_bytes) r.optimal_curve.push_back(p);
  }
  PlanRequest chosen;
  chosen.budget.bytes = r.budget_bytes;
  chosen.slots = slots;
  if (pytorch) chosen.pytorch_modules = &modules.plain;
  if (progress) chosen.progress = [&progress](double f) { progress(0.5 + 0.5 * f); };
  r.chosen = MakePlan(input.chain, input.fixed, chosen);
  // Sizes round up to slots of budget/slots: a budget the report chose may
  // miss by a slot; it then takes a little more.
  for (int attempt = 0; chosen_here && !r.chosen.feasible && attempt < 20; ++attempt) {
    r.budget_bytes += std::max<int64_t>(1, r.budget_bytes / 500);
    chosen.budget.bytes = r.budget_bytes;
    r.chosen = MakePlan(input.chain, input.fixed, chosen);
  }
  if (!r.chosen.feasible) {
    throw Error(ExitCode::kInfeasible, Format("no optimal plan at the budget %s with %d slots; try a larger budget or more --slots",
                                              FormatBytes(r.budget_bytes, style).c_str(), slots));
  }
  r.strategies = StrategyTable(input, modules, chosen, r.chosen, "optimal", every_n);
  return r;
}

}  // namespace ckplan
