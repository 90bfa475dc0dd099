#include "planner/plan/solve.h"

#include <algorithm>

#include "planner/base/error.h"
#include "planner/base/format.h"
#include "planner/plan/plan_to_document.h"

namespace ckplan {

std::string ResolveTarget(const std::string& target, bool from_profile) {
  const std::string resolved = target.empty() ? (from_profile ? "pytorch" : "schedule") : target;
  if (resolved != "pytorch" && resolved != "schedule" && resolved != "sac") {
    throw BadInput("invalid --target '" + target + "': use pytorch, sac or schedule");
  }
  return resolved;
}

namespace {

// The minimum budget as the user would type it, rounded up and checked so
// that the printed value itself is feasible.
std::string PrintableMinimum(int64_t minimum, const ByteQuantity& budget, const std::function<bool(int64_t)>& feasible) {
  if (WrittenInBytes(budget)) return std::to_string(minimum);  // exact: the smallest feasible budget
  const UnitStyle style = budget.style;
  std::string text = FormatBytesCompact(minimum, style);
  for (int attempt = 0; attempt < 20; ++attempt) {
    int64_t value = ParseBytes(text).bytes;
    if (value >= minimum && feasible(value)) return text;
    minimum = value + std::max<int64_t>(1, value / 500);
    text = FormatBytesCompact(minimum, style);
  }
  return text;
}

// Throws Error(kInfeasible) for `plan`, infeasible as `request` asked it:
// the smallest budget that works, and why.
[[noreturn]] void ThrowInfeasible(const PlannerInput& in, const PlanRequest& request, const Plan& plan) {
  const ByteQuantity& budget = request.budget;
  const std::string what = in.from_profile ? "model" : "chain";
  if (plan.budget_below_fixed) {
    throw Error(ExitCode::kInfeasible,
                Format("budget %s is below the fixed part of the step (%s); the minimum for this %s is %s",
                       budget.text.c_str(), DescribeFixed(in.fixed, budget.style).c_str(), what.c_str(),
                       FormatLikeBudget(plan.min_budget_bytes, budget).c_str()));
  }
  std::string minimum = PrintableMinimum(plan.min_budget_bytes, budget, [&](int64_t value) {
    if (request.algorithm == Algorithm::kOptimal && request.pytorch_modules == nullptr) {
      return OptimalBudgetFeasible(in.chain, in.fixed, value, request.slots);
    }
    PlanRequest check = request;
    check.budget.bytes = value;
    check.sweep = false;
    return MakePlan(in.chain, in.fixed, check).feasible;
  });
  std::string algo = request.algorithm == Algorithm::kOptimal ? Format("optimal, %d slots", request.slots)
                                                              : AlgorithmName(request.algorithm);
  if (request.pytorch_modules != nullptr) {
    // Where wrapping modules cannot reach the budget but the nested schedule can, say how much each needs.
    const int64_t schedule_minimum = MinimumOptimalBudget(in.chain, in.fixed, request.slots);
    algo = Format("optimal, pytorch target: %zu wrappable modules; the nested schedule (--target schedule) needs %s",
                  request.pytorch_modules->size(), FormatBytes(schedule_minimum, budget.style, true).c_str());
  }
  std::string banded;
  if (request.algorithm == Algorithm::kOptimal && plan.solver.min_budget_lower_bytes < plan.min_budget_bytes) {
    banded = Format("; that is the banded solver's minimum (%d stages): the exact one is at least %s",
                    in.chain.length(), FormatBytes(plan.solver.min_budget_lower_bytes, budget.style, true).c_str());
  }
  throw Error(ExitCode::kInfeasible, Format("budget %s is below the minimum %s for this %s (%s)%s", budget.text.c_str(),
                                            minimum.c_str(), what.c_str(), algo.c_str(), banded.c_str()));
}

}  // namespace

SolveResult Solve(const PlannerInput& in, const SolveRequest& r) {
  PlanRequest request = r.plan;
  // Every algorithm for the PyTorch target is priced, applied and run as
  // that target: a baseline wraps the modules its stages are.
  const std::string target = ResolveTarget(r.target, in.from_profile);
  SolveResult out;
  out.modules = ModulesForTarget(in, target, false, r.sac_dispatch_us);
  if (target != "schedule") request.pytorch_modules = &out.modules.For(target);
  std::vector<WrappableModule> given;
  if (!r.wrap.empty()) {
    if (target != "pytorch") throw BadInput("--wrap gives the modules of --target pytorch, not " + target);
    for (const std::string& path : r.wrap) {
      const std::vector<WrappableModule>& modules = out.modules.For(target);
      auto it = std::find_if(modules.begin(), modules.end(), [&](const WrappableModule& m) { return m.path == path; });
      if (it == modules.end()) {
        throw BadInput("--wrap " + path + ": not a module this profile's plans can wrap (a plan's checkpoint_modules "
                       "names them)");
      }
      given.push_back(*it);
    }
    std::sort(given.begin(), given.end(),
              [](const WrappableModule& a, const WrappableModule& b) { return a.first_stage < b.first_stage; });
    for (size_t i = 1; i < given.size(); ++i) {
      if (given[i].first_stage <= given[i - 1].last_stage) {
        throw BadInput("--wrap " + given[i - 1].path + " and " + given[i].path + " overlap: give disjoint modules");
      }
    }
    request.wrap_exactly = &given;
  }
  out.plan = MakePlan(in.chain, in.fixed, request);
  request.progress = nullptr;
  if (!r.wrap.empty() && !out.plan.feasible) {
    throw Error(ExitCode::kInfeasible, "--wrap: wrapping these modules peaks at " +
                                           FormatBytes(out.plan.peak_bytes, request.budget.style) + ", above the budget " +
                                           request.budget.text);
  }
  if (!out.plan.feasible || out.plan.budget_below_fixed) ThrowInfeasible(in, request, out.plan);
  const Plan& plan = out.plan;

  std::string name;  // the plan's own row
  if (plan.algorithm == Algorithm::kEveryN) name = Format("every-n (n=%d)", plan.every_n);
  if (plan.algorithm == Algorithm::kOptimal) name = plan.target == "schedule" ? "optimal" : "optimal (" + plan.target + ")";
  if (!r.wrap.empty()) name = "wrap (given)";
  out.strategies = StrategyTable(in, out.modules, request, plan, name);
  if (request.sweep) out.sweep = MakeSweepDocument(plan, in.source);
  out.document = MakePlanDocument(plan, in.chain, in.source);
  out.document.strategies = out.strategies;
  if (r.global_batch > 0 && out.document.batch) {
    out.document.global_batch = r.global_batch;
    out.document.accumulation_steps = r.global_batch / *out.document.batch;
  }
  return out;
}

std::vector<SweepPoint> SweepDigest(const SweepDocument& sweep, size_t rows) {
  std::vector<SweepPoint> out;
  double last_time = -1;
  const size_t stride = std::max<size_t>(1, sweep.points.size() / rows);
  for (size_t k = 0; k < sweep.points.size(); ++k) {
    const SweepPoint& point = sweep.points[k];
    const bool changes = point.time_ms != last_time;
    if ((k % stride == 0 && changes) || k + 1 == sweep.points.size()) {
      out.push_back(point);
      last_time = point.time_ms;
    }
  }
  return out;
}

BatchPlans PlanAtBatch(const PlannerInput& in, const SolveRequest& r) {
  const std::string target = ResolveTarget(r.target, in.from_profile);
  PlanRequest request;
  request.algorithm = Algorithm::kOptimal;
  request.budget = r.plan.budget;
  request.slots = r.plan.slots;
  request.threads = r.plan.threads;
  const TargetModules modules = ModulesForTarget(in, target, false, r.sac_dispatch_us);
  if (target != "schedule") request.pytorch_modules = &modules.For(target);
  const Plan best = MakePlan(in.chain, in.fixed, request);
  request.algorithm = Algorithm::kNone;
  const Plan none = MakePlan(in.chain, in.fixed, request);
  BatchPlans out;
  out.plan_fits = best.feasible && !best.budget_below_fixed;
  out.plan_peak_bytes = best.peak_bytes;
  out.min_budget_bytes = best.min_budget_bytes;
  out.plan_ms = best.time_ms;
  out.plan_overhead_pct = best.overhead_pct();
  if (best.checkpointed_stages.empty()) {
    out.plan_what = "no checkpointing";
  } else if (target == "schedule") {
    out.plan_what = RecomputedStages(best.checkpointed_stages.size());
  } else {
    size_t saved = 0;
    for (const WrappableModule& m : best.pytorch.wrapped) saved += m.sac_saved.size();
    const size_t wrapped = best.pytorch.checkpoint_modules.size();
    out.plan_what = Format("wrap %zu module%s", wrapped, wrapped == 1 ? "" : "s");
    if (target == "sac") out.plan_what += Format(", save %zu ops", saved);
  }
  out.none_peak_bytes = none.peak_bytes;
  out.none_ms = none.time_ms;
  out.optimizer_ms = in.fixed.optimizer_step_ms;
  return out;
}

}  // namespace ckplan
