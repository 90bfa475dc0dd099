#include "ckplan/planner/plan.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include <nlohmann/json.hpp>

#include "ckplan/planner/baselines.h"
#include "ckplan/planner/error.h"
#include "ckplan/planner/param_grads.h"
#include "ckplan/planner/solver.h"
#include "ckplan/planner/units.h"

namespace ckplan {

const char* AlgorithmName(Algorithm algorithm) {
  switch (algorithm) {
    case Algorithm::kOptimal: return "optimal";
    case Algorithm::kNone: return "none";
    case Algorithm::kEvery: return "every";
    case Algorithm::kEveryN: return "every-n";
    case Algorithm::kSqrt: return "sqrt";
  }
  return "?";
}

Algorithm ParseAlgorithm(const std::string& name) {
  for (Algorithm a : {Algorithm::kOptimal, Algorithm::kNone, Algorithm::kEvery,
                      Algorithm::kEveryN, Algorithm::kSqrt}) {
    if (name == AlgorithmName(a)) return a;
  }
  throw BadInput("unknown algorithm '" + name + "' (use optimal, none, every, every-n or sqrt)");
}

FixedMemory FixedMemoryFor(int64_t param_bytes, int64_t buffer_bytes, const std::string& optimizer) {
  FixedMemory fixed;
  fixed.param_bytes = param_bytes;
  fixed.buffer_bytes = buffer_bytes;
  fixed.optimizer = optimizer;
  fixed.grad_bytes = param_bytes;
  if (optimizer == "none" || optimizer == "sgd") {
    fixed.optimizer_bytes = 0;
  } else if (optimizer == "momentum") {
    fixed.optimizer_bytes = param_bytes;
  } else if (optimizer == "adam") {
    fixed.optimizer_bytes = 2 * param_bytes;
  } else {
    throw BadInput("unknown optimizer '" + optimizer + "' (use none, sgd, momentum or adam)");
  }
  return fixed;
}

double Plan::gap_bound_pct() const {
  if (proven_optimal || lower_bound_ms <= 0) return 0;
  return (time_ms - lower_bound_ms) / lower_bound_ms * 100.0;
}

double OverheadPct(double time_ms, double baseline_ms) {
  if (!(baseline_ms > 0)) return 0;
  const double pct = (time_ms - baseline_ms) / baseline_ms * 100.0;
  return std::fabs(pct) < 1e-9 ? 0.0 : pct;  // the same sum in another order is no overhead
}

double Plan::overhead_pct() const { return OverheadPct(time_ms, no_recompute_ms); }

namespace {

// The slot size and slot count used for an activation budget.
struct SlotGrid {
  int64_t slot_bytes;
  int64_t memory_slots;
};

SlotGrid GridFor(int64_t chain_budget_bytes, int slots) {
  if (chain_budget_bytes <= 0) return {1, -1};
  if (chain_budget_bytes < slots) return {1, chain_budget_bytes};
  // Every whole slot of the budget: the remainder of a division by `slots`
  // would be up to `slots` - 1 slot sizes' worth of budget lost.
  const int64_t slot_bytes = chain_budget_bytes / slots;
  return {slot_bytes, chain_budget_bytes / slot_bytes};
}

std::vector<SlotGrid> RefinedGrids(const Chain& chain, int64_t chain_budget, int slots);

// Feasibility with the solver the request's slot count picks (exact or
// banded: their smallest memories differ).
bool OptimalFeasible(const Chain& chain, int64_t chain_budget_bytes, int slots) {
  SlotGrid grid = GridFor(chain_budget_bytes, slots);
  if (grid.memory_slots < 0) return false;
  const SolverMethod method = ChooseSolver(chain.length(), slots);
  if (SolverMinimumMemory(Discretize(chain, grid.slot_bytes), method) <= grid.memory_slots) return true;
  // The finer grids MakePlan refines to where the request's is infeasible.
  const std::vector<SlotGrid> grids = RefinedGrids(chain, chain_budget_bytes, slots);
  for (size_t k = 1; k < grids.size(); ++k) {
    const SlotGrid& finer = grids[k];
    if (MinimumMemory(Discretize(chain, finer.slot_bytes)) <= finer.memory_slots) return true;
  }
  return false;
}

// The baselines, simulated in bytes. An optimal plan is never slower than a
// baseline that fits: the solver rounds sizes up to whole slots, and the
// banded solver searches a band; either can miss a baseline that fits.
struct Baseline {
  Schedule schedule;
  SimulationResult simulation;
};

std::vector<Baseline> Baselines(const Chain& chain) {
  const int length = chain.length();
  std::vector<Baseline> baselines;
  auto add = [&](Schedule schedule) {
    SimulationResult simulation = Simulate(chain, schedule);
    baselines.push_back({std::move(schedule), std::move(simulation)});
  };
  add(NoCheckpointSchedule(length));
  add(SqrtSchedule(length));
  for (int n : {1, 2, 4, 8}) {
    if (n <= length) add(EveryNSchedule(length, n));
  }
  return baselines;
}

std::optional<Baseline> FastestFitting(const Chain& chain, int64_t chain_budget_bytes) {
  std::optional<Baseline> best;
  for (Baseline& b : Baselines(chain)) {
    if (b.simulation.peak_bytes <= chain_budget_bytes && (!best || b.simulation.time_ms < best->simulation.time_ms)) {
      best = std::move(b);
    }
  }
  return best;
}

int64_t SmallestBaselinePeak(const Chain& chain) {
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const Baseline& b : Baselines(chain)) smallest = std::min(smallest, b.simulation.peak_bytes);
  return smallest;
}

void CheckStageCount(const Chain& chain) {
  if (chain.length() > kMaxStages) {
    throw BadInput("the chain has " + std::to_string(chain.length()) + " stages; at most " +
                   std::to_string(kMaxStages) + " are supported");
  }
}

}  // namespace

namespace {

// The export for a given set of wrapped modules (disjoint stage ranges).
ModuleExport ExportFor(const Chain& chain, const std::vector<WrappableModule>& wrapped) {
  ModuleExport out;
  const int length = chain.length();
  std::vector<bool> wrap(static_cast<size_t>(length), false), holds_input(static_cast<size_t>(length), false);
  for (const WrappableModule& m : wrapped) {
    holds_input[static_cast<size_t>(m.first_stage)] = true;
    for (int k = m.first_stage; k <= m.last_stage; ++k) wrap[static_cast<size_t>(k)] = true;
  }
  out.schedule = ModuleSchedule(length, wrapped);
  out.simulation = Simulate(chain, out.schedule);
  out.saved_bytes = out.simulation.live_after_forward_bytes - chain.input_bytes;
  if (chain.has_storages()) {
    // What PyTorch keeps: the own saved tensors of stages run normally, the
    // stage outputs some op saves, the inputs of wrapped modules (held for
    // their recompute) and the model's outputs, each storage once.
    std::map<int64_t, int64_t> bytes_of;
    for (const Stage& s : chain.stages) {
      for (const auto& [id, bytes] : s.out_storages) bytes_of[id] = bytes;
    }
    std::set<int64_t> held;
    int64_t own = 0;
    for (int i = 0; i < length; ++i) {
      const Stage& s = chain.stages[static_cast<size_t>(i)];
      if (!wrap[static_cast<size_t>(i)]) own += s.private_saved_bytes;
      held.insert(s.kept_out_storages.begin(), s.kept_out_storages.end());
      if (holds_input[static_cast<size_t>(i)] && i > 0) {
        for (const auto& entry : chain.stages[static_cast<size_t>(i) - 1].out_storages) held.insert(entry.first);
      }
    }
    for (const auto& entry : chain.stages.back().out_storages) held.insert(entry.first);
    int64_t shared = 0;
    for (int64_t id : held) shared += bytes_of[id];
    out.saved_bytes = own + shared;
  }
  for (const WrappableModule& m : wrapped) out.checkpoint_modules.push_back(m.path);
  return out;
}

// The single-stage modules of `wrap`.
std::vector<WrappableModule> StageModules(const Chain& chain, const std::vector<bool>& wrap) {
  std::vector<WrappableModule> out;
  for (int i = 0; i < chain.length(); ++i) {
    if (wrap[static_cast<size_t>(i)]) out.push_back({chain.stages[static_cast<size_t>(i)].modules[0], i, i});
  }
  return out;
}

}  // namespace

ModuleExport ExportForModules(const Chain& chain, const std::vector<WrappableModule>& wrapped) {
  return ExportFor(chain, wrapped);
}

ModuleExport ExportForPyTorch(const Chain& chain, const std::vector<int>& checkpointed) {
  const int length = chain.length();
  std::vector<bool> wrap(static_cast<size_t>(length), false);
  std::vector<std::string> skipped;
  for (int i : checkpointed) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    if (s.modules.size() == 1) {
      wrap[static_cast<size_t>(i)] = true;
    } else {
      skipped.push_back(s.name);
    }
  }
  // Wrapping a module only pays when it keeps less than it would without
  // (its input is held instead of what it saves): drop the ones that don't.
  ModuleExport best = ExportFor(chain, StageModules(chain, wrap));
  for (int i = 0; i < length; ++i) {
    if (!wrap[static_cast<size_t>(i)]) continue;
    wrap[static_cast<size_t>(i)] = false;
    ModuleExport without = ExportFor(chain, StageModules(chain, wrap));
    if (without.saved_bytes <= best.saved_bytes) {
      best = std::move(without);
      skipped.push_back(chain.stages[static_cast<size_t>(i)].name + " (keeps no less)");
    } else {
      wrap[static_cast<size_t>(i)] = true;
    }
  }
  best.skipped_stages = skipped;
  return best;
}

bool OptimalBudgetFeasible(const Chain& chain, const FixedMemory& fixed, int64_t budget_bytes, int slots) {
  CheckStageCount(chain);
  return OptimalFeasible(chain, budget_bytes - fixed.total(), slots) ||
         SmallestBaselinePeak(chain) <= budget_bytes - fixed.total();
}

int64_t MinimumOptimalBudget(const Chain& chain, const FixedMemory& fixed, int slots) {
  // Exact sizes give a lower bound; rounding to slots only adds. Search up
  // from it for the first feasible budget (to 0.01%).
  CheckStageCount(chain);
  // Sizes round up to whole slots: with too few slots no budget works.
  const int64_t largest = int64_t{1} << 61;
  if (!OptimalFeasible(chain, largest, slots)) {
    throw BadInput("no budget is feasible with --slots " + std::to_string(slots) +
                   ": every value takes at least one slot; use more slots (default 500)");
  }
  const int64_t baseline = SmallestBaselinePeak(chain);
  int64_t lower = SolverMinimumMemory(Discretize(chain, 1), ChooseSolver(chain.length(), slots));
  if (lower >= baseline) return fixed.total() + baseline;
  if (OptimalFeasible(chain, lower, slots)) return fixed.total() + lower;
  int64_t upper = lower;
  int64_t step = std::max<int64_t>(lower / 64, 1);
  while (!OptimalFeasible(chain, upper, slots)) {
    if (upper >= baseline) return fixed.total() + baseline;  // a baseline fits where the solver does not
    lower = upper;
    upper = std::min(upper + step, baseline);
    step *= 2;
  }
  while (upper - lower > std::max<int64_t>(upper / 10000, 1)) {
    int64_t middle = lower + (upper - lower) / 2;
    if (OptimalFeasible(chain, middle, slots)) {
      upper = middle;
    } else {
      lower = middle;
    }
  }
  return fixed.total() + upper;
}

namespace {

// Rounding sizes up to slots makes the solver's plan safe but can cost
// time. Certify that it costs at most kRoundingShare of the activation
// budget: the plan is no slower than the optimum in bytes at
// (1 - kRoundingShare) of the budget, which the optimum over sizes rounded
// DOWN bounds from below. Where that fails, halve the slot and solve again
// (exact solver only, the table within kRefineTableBytes); the fastest plan
// found is kept. Every plan is re-checked in bytes by the simulator.
constexpr double kRoundingShare = 0.005;
constexpr size_t kRefineTableBytes = size_t{256} << 20;

bool RoundingCertified(const Chain& chain, int64_t chain_budget, const SlotGrid& grid, const OptimalSolution& solution) {
  const int64_t relaxed_slots =
      static_cast<int64_t>(std::floor(static_cast<double>(chain_budget) * (1 - kRoundingShare))) / grid.slot_bytes;
  const DiscreteChain down = Discretize(chain, grid.slot_bytes, false);
  if (SolverTableBytes(down, relaxed_slots) > kRefineTableBytes) return true;  // nothing finer is affordable
  const OptimalSolution lower = SolveOptimal(down, relaxed_slots);
  if (!lower.feasible) return true;
  return solution.feasible && solution.time_ms <= lower.time_ms * (1 + 1e-12);
}

// The grids RefineSlots may use at this budget: the request's, then halved
// slots while the exact solver's table stays within kRefineTableBytes.
std::vector<SlotGrid> RefinedGrids(const Chain& chain, int64_t chain_budget, int slots) {
  std::vector<SlotGrid> grids = {GridFor(chain_budget, slots)};
  for (int round = 0; round < 16; ++round) {
    const SlotGrid& last = grids.back();
    if (last.memory_slots < 0 || last.slot_bytes <= 1 || last.memory_slots > (1 << 29)) break;
    const SlotGrid finer = GridFor(chain_budget, static_cast<int>(last.memory_slots * 2));
    if (ChooseSolver(chain.length(), finer.memory_slots) != SolverMethod::kExact ||
        ChooseSolver(chain.length(), slots) != SolverMethod::kExact ||
        SolverTableBytes(Discretize(chain, finer.slot_bytes), finer.memory_slots) > kRefineTableBytes) {
      break;
    }
    grids.push_back(finer);
  }
  return grids;
}

void RefineSlots(const Chain& chain, int64_t chain_budget, const PlanRequest& request, SlotGrid* grid,
                 OptimalSolution* solution) {
  const std::vector<SlotGrid> grids = RefinedGrids(chain, chain_budget, request.slots);
  for (size_t k = 1; k < grids.size(); ++k) {
    if (solution->feasible && RoundingCertified(chain, chain_budget, grids[k - 1], *solution)) return;
    const SlotGrid& finer = grids[k];
    SolverOptions options;
    options.threads = request.threads;
    OptimalSolution next = SolveChain(Discretize(chain, finer.slot_bytes), finer.memory_slots, options);
    if (next.feasible && (!solution->feasible || next.time_ms < solution->time_ms)) {
      *solution = std::move(next);
      *grid = finer;
    }
  }
}

}  // namespace

namespace {

// The PyTorch target: exact in bytes, no slots.
Plan MakeModulePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request, Plan plan) {
  CheckStageCount(chain);
  const std::vector<WrappableModule>& modules = *request.pytorch_modules;
  // One memory model: the gradients the chain carries appear during backward
  // (those in the fixed part are held for the whole step).
  const StageGradients grads = StageGradientsOf(chain);
  const int64_t fixed_bytes = fixed.total();
  const int64_t chain_budget = request.budget_bytes - fixed_bytes;
  plan.target = "pytorch";
  plan.solver = "modules";
  plan.min_budget_bytes = fixed_bytes + MinimumModulesMemory(chain, modules, ModuleAccounting::kPyTorch, grads);
  plan.min_budget_lower_bytes = plan.min_budget_bytes;
  if (chain_budget <= 0) return plan;
  ModuleSolution solution = SolveModules(chain, modules, chain_budget, ModuleAccounting::kPyTorch, grads);
  if (!solution.feasible) return plan;
  plan.feasible = true;
  plan.schedule = solution.schedule;
  plan.time_ms = solution.time_ms + fixed.optimizer_step_ms;  // as every plan: the optimizer's update included
  // Predicted as PyTorch runs it (apply_plan): the solver's own accounting.
  // The simulation (what `ckplan run`'s executor holds) gives the timeline.
  plan.simulation = Simulate(chain, plan.schedule);
  plan.peak_bytes = fixed_bytes + solution.peak_bytes;
  plan.checkpointed_stages = CheckpointedStages(plan.schedule, chain.length());
  plan.pytorch = ExportForModules(chain, solution.wrapped);
  // pytorch.predicted.peak_bytes is written as fixed.total() + this.
  plan.pytorch.simulation.peak_bytes = solution.peak_bytes;
  plan.pytorch.saved_bytes = solution.kept_bytes;
  if (solution.peak_bytes > chain_budget) {
    throw Error(ExitCode::kVerifyFailed, "internal check failed: the module plan peaks at " +
                                             std::to_string(solution.peak_bytes) +
                                             " B, above the activation budget " + std::to_string(chain_budget) + " B");
  }
  return plan;
}

// A baseline for the PyTorch target: its segments as apply_plan can wrap
// them (a module covering a whole segment, else each stage of it that is a
// module), counted as the PyTorch target counts (EvaluateModules): the
// optimum over sets of modules is then never slower than it, and `none`
// (nothing wrapped) peaks where that optimum with nothing wrapped does.
void ModuleBaseline(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request, Plan* plan) {
  const std::vector<WrappableModule>& modules = *request.pytorch_modules;
  const int length = chain.length();
  std::vector<WrappableModule> wrapped;
  const int n = plan->every_n;
  for (int begin = 0; n > 0 && begin < length; begin += n) {
    const int end = std::min(length, begin + n) - 1;
    auto whole = std::find_if(modules.begin(), modules.end(),
                              [&](const WrappableModule& m) { return m.first_stage == begin && m.last_stage == end; });
    if (whole != modules.end()) {
      wrapped.push_back(*whole);
      continue;
    }
    for (int k = begin; k <= end; ++k) {
      auto single = std::find_if(modules.begin(), modules.end(),
                                 [&](const WrappableModule& m) { return m.first_stage == k && m.last_stage == k; });
      if (single != modules.end()) wrapped.push_back(*single);
    }
  }
  const ModuleSolution solution = EvaluateModules(chain, wrapped, ModuleAccounting::kPyTorch, StageGradientsOf(chain));
  plan->target = "pytorch";
  plan->schedule = solution.schedule;
  plan->simulation = Simulate(chain, plan->schedule);
  plan->time_ms = solution.time_ms + fixed.optimizer_step_ms;
  plan->peak_bytes = fixed.total() + solution.peak_bytes;
  plan->min_budget_bytes = plan->min_budget_lower_bytes = plan->peak_bytes;
  plan->feasible = plan->peak_bytes <= request.budget_bytes;
  plan->checkpointed_stages = CheckpointedStages(plan->schedule, length);
  plan->pytorch = ExportForModules(chain, solution.wrapped);
  plan->pytorch.simulation.peak_bytes = solution.peak_bytes;
  plan->pytorch.saved_bytes = solution.kept_bytes;
}

}  // namespace

Plan MakePlan(const Chain& chain, const FixedMemory& fixed, const PlanRequest& request) {
  if (request.slots < 1) throw BadInput("invalid --slots " + std::to_string(request.slots) + ": must be at least 1");
  Plan plan;
  plan.algorithm = request.algorithm;
  plan.budget_bytes = request.budget_bytes;
  plan.fixed = fixed;
  // Every predicted step time includes the optimizer's update (chain times
  // plus `step`); the solver and the simulator work on the chain alone.
  const double step = fixed.optimizer_step_ms;
  plan.no_recompute_ms = chain.NoRecomputeTimeMs() + step;
  const int length = chain.length();
  const int64_t chain_budget = request.budget_bytes - fixed.total();

  if (request.algorithm != Algorithm::kOptimal) {
    switch (request.algorithm) {
      case Algorithm::kNone: plan.schedule = NoCheckpointSchedule(length); break;
      case Algorithm::kEvery:
        plan.every_n = 1;
        plan.schedule = EveryNSchedule(length, 1);
        break;
      case Algorithm::kEveryN:
        if (request.every_n < 1) throw BadInput("invalid --every " + std::to_string(request.every_n) + ": must be at least 1");
        plan.every_n = request.every_n;
        plan.schedule = EveryNSchedule(length, request.every_n);
        break;
      case Algorithm::kSqrt:
        plan.every_n = SqrtSegmentLength(length);
        plan.schedule = SqrtSchedule(length);
        break;
      default: break;
    }
    if (request.pytorch_modules != nullptr) {
      ModuleBaseline(chain, fixed, request, &plan);
      return plan;
    }
    plan.simulation = Simulate(chain, plan.schedule);
    plan.time_ms = plan.simulation.time_ms + step;
    plan.peak_bytes = fixed.total() + plan.simulation.peak_bytes;
    plan.min_budget_bytes = plan.peak_bytes;
    plan.min_budget_lower_bytes = plan.min_budget_bytes;
    plan.feasible = plan.peak_bytes <= request.budget_bytes;
    plan.checkpointed_stages = CheckpointedStages(plan.schedule, length);
    plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
    return plan;
  }

  if (request.pytorch_modules != nullptr) return MakeModulePlan(chain, fixed, request, std::move(plan));
  plan.slots = request.slots;
  CheckStageCount(chain);
  SlotGrid grid = GridFor(chain_budget, request.slots);
  plan.slot_bytes = grid.slot_bytes;
  DiscreteChain discrete = Discretize(chain, std::max<int64_t>(grid.slot_bytes, 1));
  // Refuse a table that cannot fit before any other work (throws BadInput).
  if (grid.memory_slots >= 0) CheckSolverFits(discrete, grid.memory_slots);
  plan.min_budget_bytes = MinimumOptimalBudget(chain, fixed, request.slots);
  plan.min_budget_lower_bytes = plan.min_budget_bytes;
  if (ChooseSolver(chain.length(), request.slots) == SolverMethod::kBanded) {
    // Sizes in bytes: rounding to slots only adds.
    plan.min_budget_lower_bytes =
        std::min(plan.min_budget_bytes, fixed.total() + MinimumMemoryLowerBound(Discretize(chain, 1)));
  }
  if (grid.memory_slots < 0) return plan;
  SolverOptions options;
  options.threads = request.threads;
  options.progress = request.progress;
  OptimalSolution solution = SolveChain(discrete, grid.memory_slots, options);
  RefineSlots(chain, chain_budget, request, &grid, &solution);
  plan.slots = static_cast<int>(grid.memory_slots);
  plan.slot_bytes = grid.slot_bytes;
  plan.solver = solution.band > 0 ? "banded" : "exact";
  plan.band = solution.band;
  plan.proven_optimal = solution.proven_optimal;
  plan.lower_bound_ms = solution.lower_bound_ms + step;
  if (request.sweep) {
    for (size_t m = 0; m < solution.curve_ms.size(); ++m) {
      if (solution.curve_ms[m] < kInfinity) {
        plan.curve.push_back({fixed.total() + static_cast<int64_t>(m) * grid.slot_bytes, solution.curve_ms[m] + step});
      }
    }
  }
  // A baseline that fits and is faster (or fits where the rounded sizes do
  // not) is the plan: the solver's figures would not be optimal.
  std::optional<Baseline> baseline = FastestFitting(chain, chain_budget);
  const bool take_baseline =
      baseline && (!solution.feasible || baseline->simulation.time_ms < solution.time_ms * (1 - 1e-12));
  if (!solution.feasible && !take_baseline) return plan;
  plan.feasible = true;
  double chain_ms = 0;  // the schedule's time over the chain, without the optimizer's update
  if (take_baseline) {
    plan.schedule = std::move(baseline->schedule);
    chain_ms = baseline->simulation.time_ms;
    if (plan.band > 0) plan.proven_optimal = solution.lower_bound_ms >= chain_ms * (1 - 1e-12);
  } else {
    plan.schedule = std::move(solution.schedule);
    chain_ms = solution.time_ms;
  }
  plan.time_ms = chain_ms + step;
  plan.simulation = Simulate(chain, plan.schedule);
  plan.peak_bytes = fixed.total() + plan.simulation.peak_bytes;
  plan.checkpointed_stages = CheckpointedStages(plan.schedule, length);
  plan.pytorch = ExportForPyTorch(chain, plan.checkpointed_stages);
  if (plan.simulation.peak_bytes > chain_budget) {
    throw Error(ExitCode::kVerifyFailed,
                "internal check failed: the optimal schedule simulates to " +
                    std::to_string(plan.simulation.peak_bytes) + " B, above the activation budget " +
                    std::to_string(chain_budget) + " B");
  }
  const double tolerance = 1e-9 * std::max(1.0, std::fabs(chain_ms));
  if (std::fabs(plan.simulation.time_ms - chain_ms) > tolerance) {
    throw Error(ExitCode::kVerifyFailed, "internal check failed: simulated time differs from the solver's");
  }
  return plan;
}

nlohmann::json PlanToJson(const Plan& plan, const Chain& chain, const nlohmann::json& source) {
  nlohmann::json stages = nlohmann::json::array();
  std::vector<bool> checkpointed(static_cast<size_t>(chain.length()), false);
  for (int i : plan.checkpointed_stages) checkpointed[static_cast<size_t>(i)] = true;
  for (int i = 0; i < chain.length(); ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    nlohmann::json stage = {{"index", i}, {"name", s.name}, {"checkpointed", checkpointed[static_cast<size_t>(i)]}};
    if (!s.modules.empty()) stage["modules"] = s.modules;
    if (s.first_op >= 0) {
      stage["first_op"] = s.first_op;
      stage["last_op"] = s.last_op;
    }
    stages.push_back(std::move(stage));
  }
  nlohmann::json doc = {
      {"schema", "ckplan.plan/1"},
      {"algorithm", AlgorithmName(plan.algorithm)},
      {"target", plan.target},
      {"source", source},
      {"budget_bytes", plan.budget_bytes},
      {"fixed", {{"param_bytes", plan.fixed.param_bytes},
                 {"buffer_bytes", plan.fixed.buffer_bytes},
                 {"grad_bytes", plan.fixed.grad_bytes},
                 {"optimizer_bytes", plan.fixed.optimizer_bytes},
                 {"optimizer", plan.fixed.optimizer},
                 {"total_bytes", plan.fixed.total()}}},
      {"activation_budget_bytes", plan.budget_bytes - plan.fixed.total()},
      {"stages", std::move(stages)},
      {"checkpointed_stages", plan.checkpointed_stages},
      {"schedule", ScheduleToJson(plan.schedule)},
      {"predicted", {{"peak_bytes", plan.peak_bytes},
                     {"time_ms", plan.time_ms},
                     {"overhead_pct", plan.overhead_pct()},
                     {"no_recompute_ms", plan.no_recompute_ms},
                     {"live_after_forward_bytes", plan.fixed.total() + plan.simulation.live_after_forward_bytes}}},
      {"min_budget_bytes", plan.min_budget_bytes},
  };
  // The simulated memory over the schedule, fixed part included: per
  // operation, the peak during it and what stays stored after it.
  nlohmann::json peaks = nlohmann::json::array(), stored = nlohmann::json::array();
  for (size_t k = 0; k < plan.simulation.peak_during_bytes.size(); ++k) {
    peaks.push_back(plan.fixed.total() + plan.simulation.peak_during_bytes[k]);
    stored.push_back(plan.fixed.total() + plan.simulation.stored_after_bytes[k]);
  }
  doc["timeline"] = {{"peak_during_bytes", peaks}, {"stored_after_bytes", stored}};
  // Gradients counted as they appear in backward: not in total_bytes.
  if (plan.fixed.backward_grad_bytes > 0) doc["fixed"]["backward_grad_bytes"] = plan.fixed.backward_grad_bytes;
  if (plan.fixed.optimizer_step_ms > 0) doc["predicted"]["optimizer_step_ms"] = plan.fixed.optimizer_step_ms;
  // For PyTorch training jobs: the modules to wrap, and what that predicts.
  const ModuleExport& e = plan.pytorch;
  const double export_ms = e.simulation.time_ms + plan.fixed.optimizer_step_ms;
  const double export_overhead = OverheadPct(export_ms, plan.no_recompute_ms);
  doc["checkpoint_modules"] = e.checkpoint_modules;
  doc["pytorch"] = {
      {"checkpoint_modules", e.checkpoint_modules},
      {"skipped_stages", e.skipped_stages},
      {"settings", {{"use_reentrant", false}, {"preserve_rng_state", true}}},
      {"predicted",
       {{"peak_bytes", plan.fixed.total() + e.simulation.peak_bytes},
        // Kept for backward when the loss starts, model inputs excluded:
        // what saved_tensors_hooks see, plus the checkpointed modules' inputs.
        {"saved_bytes", e.saved_bytes},
        {"time_ms", export_ms},
        {"overhead_pct", export_overhead},
        {"fits_budget", plan.fixed.total() + e.simulation.peak_bytes <= plan.budget_bytes}}}};
  if (plan.algorithm == Algorithm::kOptimal) {
    doc["slots"] = plan.slots;
    doc["slot_bytes"] = plan.slot_bytes;
    nlohmann::json solver = {{"method", plan.solver}, {"proven_optimal", plan.proven_optimal}};
    if (plan.band > 0) {
      solver["band"] = plan.band;
      solver["lower_bound_ms"] = plan.lower_bound_ms;
      solver["gap_bound_pct"] = plan.gap_bound_pct();
      solver["min_budget_lower_bytes"] = plan.min_budget_lower_bytes;
    }
    doc["solver"] = solver;
  }
  if (plan.every_n > 0) doc["every_n"] = plan.every_n;
  return doc;
}

}  // namespace ckplan
