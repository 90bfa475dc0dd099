#include "planner/solvers/modules.h"

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/test_chains.h"
#include "tests/test_profiles.h"
#include "planner/contracts/profile.h"
#include "planner/cost/chain_from_profile.h"
#include "planner/solvers/baselines.h"
#include "planner/solvers/chain_solver.h"
#include "planner/plan/plan.h"
#include "planner/plan/plan_to_document.h"
#include "planner/plan/pytorch_export.h"
#include "planner/cost/gradients.h"
#include "planner/cost/simulator.h"

using namespace ckplan;

namespace {

// Module ranges as a module tree gives them: every stage, and random
// nested spans over several stages.
std::vector<WrappableModule> RandomModules(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<WrappableModule> modules;
  for (int i = 0; i < length; ++i) modules.push_back({"s" + std::to_string(i), i, i});
  std::uniform_int_distribution<int> stage(0, length - 1);
  for (int k = 0; k < 4; ++k) {
    int a = stage(rng), b = stage(rng);
    if (a > b) std::swap(a, b);
    if (a == b) continue;
    modules.push_back({"m" + std::to_string(a) + "_" + std::to_string(b), a, b});
  }
  return modules;
}

struct Best {
  double time_ms = 1e300;
  int64_t smallest_peak = INT64_MAX;
};

// Every set of pairwise disjoint modules, each ordered by its first stage.
std::vector<std::vector<WrappableModule>> DisjointSets(const std::vector<WrappableModule>& modules, int length) {
  std::vector<std::vector<WrappableModule>> sets;
  const size_t n = modules.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<WrappableModule> set;
    std::vector<bool> used(static_cast<size_t>(length), false);
    bool disjoint = true;
    for (size_t m = 0; m < n && disjoint; ++m) {
      if (!(mask & (1u << m))) continue;
      for (int k = modules[m].first_stage; k <= modules[m].last_stage; ++k) {
        if (used[static_cast<size_t>(k)]) disjoint = false;
        used[static_cast<size_t>(k)] = true;
      }
      set.push_back(modules[m]);
    }
    if (!disjoint) continue;
    std::sort(set.begin(), set.end(), [](const auto& p, const auto& q) { return p.first_stage < q.first_stage; });
    sets.push_back(std::move(set));
  }
  return sets;
}

// Every set of disjoint modules, simulated.
Best BruteForce(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget) {
  Best best;
  for (const auto& set : DisjointSets(modules, chain.length())) {
    SimulationResult r = Simulate(chain, ModuleSchedule(chain.length(), set));
    best.smallest_peak = std::min(best.smallest_peak, r.peak_bytes);
    if (r.peak_bytes <= budget) best.time_ms = std::min(best.time_ms, r.time_ms);
  }
  return best;
}

}  // namespace

TEST_CASE("the module solver equals brute force over every set of disjoint modules, in bytes") {
  int compared = 0, feasible = 0;
  for (int length = 1; length <= 7; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 500 * length + seed);
      std::vector<WrappableModule> modules = RandomModules(length, seed);
      const Best all = BruteForce(chain, modules, INT64_MAX);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      CAPTURE(length);
      CAPTURE(seed);
      CHECK(minimum == all.smallest_peak);
      for (int64_t budget = minimum - 2; budget <= minimum + 30; ++budget) {
        CAPTURE(budget);
        const Best brute = BruteForce(chain, modules, budget);
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        CHECK(solution.feasible == (brute.time_ms < 1e300));
        if (solution.feasible) {
          ++feasible;
          CHECK(solution.time_ms == doctest::Approx(brute.time_ms).epsilon(1e-12));
          SimulationResult r = Simulate(chain, solution.schedule);
          CHECK(r.peak_bytes <= budget);
          CHECK(r.time_ms == doctest::Approx(solution.time_ms).epsilon(1e-12));
        }
        ++compared;
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(feasible > 800);
}

// A chain whose cuts share storages: each cut its own value, plus skip
// connections live across several cuts (each counted once by the simulator).
Chain SharedStorageChain(int length, uint32_t seed) {
  Chain chain = testing::SmallIntegerChain(length, seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> cut(0, length), size(1, 5);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cuts(static_cast<size_t>(length) + 1);
  for (int k = 0; k <= length; ++k) cuts[static_cast<size_t>(k)].push_back({k, chain.StageInputBytes(k)});
  for (int s = 0; s < 2; ++s) {
    int from = cut(rng), to = cut(rng);
    if (from > to) std::swap(from, to);
    const int64_t bytes = size(rng);
    for (int k = from; k <= to; ++k) cuts[static_cast<size_t>(k)].push_back({100 + s, bytes});
  }
  chain.input_storages = cuts[0];
  for (int i = 0; i < length; ++i) {
    Stage& stage = chain.stages[static_cast<size_t>(i)];
    stage.out_storages = cuts[static_cast<size_t>(i) + 1];
    int64_t total = 0;
    for (const auto& entry : stage.out_storages) total += entry.second;
    stage.private_saved_bytes = stage.saved_bytes - stage.out_bytes + 1;
    stage.out_bytes = total;
    stage.saved_bytes = *stage.private_saved_bytes + total;
  }
  return chain;
}

TEST_CASE("with shared storages (skip connections), the module solver still equals brute force by the simulator") {
  int compared = 0;
  for (int length = 2; length <= 7; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Chain chain = SharedStorageChain(length, 900 * length + seed);
      REQUIRE(chain.has_storages());
      std::vector<WrappableModule> modules = RandomModules(length, seed + 17);
      const Best all = BruteForce(chain, modules, INT64_MAX);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      CAPTURE(length);
      CAPTURE(seed);
      CHECK(minimum == all.smallest_peak);
      for (int64_t budget = minimum; budget <= minimum + 30; ++budget) {
        CAPTURE(budget);
        const Best brute = BruteForce(chain, modules, budget);
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        REQUIRE(solution.feasible);
        CHECK(solution.time_ms == doctest::Approx(brute.time_ms).epsilon(1e-12));
        CHECK(Simulate(chain, solution.schedule).peak_bytes <= budget);
        ++compared;
      }
    }
  }
  CHECK(compared > 500);
}

TEST_CASE("a wrapped module holds the tensors it is called with that cross no cut, once however many take them") {
  // A tensor every module is called with and none of their ops reads (a
  // decoder layer's position ids): no cut carries it.
  constexpr int64_t kCalledWith = 37;
  int compared = 0;
  for (int length = 2; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      const Chain chain = SharedStorageChain(length, 1300 * length + seed);
      const std::vector<WrappableModule> modules = RandomModules(length, seed + 29);
      Chain called = chain;
      for (const WrappableModule& m : modules) called.pytorch.module_call_storages[m.path] = {{4242, kCalledWith}};
      CAPTURE(length);
      CAPTURE(seed);
      int64_t smallest = INT64_MAX;
      for (const auto& set : DisjointSets(modules, length)) {
        const ModuleSolution without = EvaluateModules(chain, set, ModuleAccounting::kPyTorch);
        const ModuleSolution with = EvaluateModules(called, set, ModuleAccounting::kPyTorch);
        smallest = std::min(smallest, with.peak_bytes);
        // Nothing wrapped holds it for no module; any wrapped module holds
        // it once, to the loss and on through its backward.
        const int64_t held = set.empty() ? 0 : kCalledWith;
        CHECK(with.kept_bytes == without.kept_bytes + held);
        CHECK(with.peak_bytes >= without.peak_bytes);
        CHECK(with.peak_bytes <= without.peak_bytes + held);
        CHECK(ExportForModules(called, set).held_at_loss_bytes == ExportForModules(chain, set).held_at_loss_bytes + held);
        // The simulator's accounting (ckplan run's executor) is unchanged.
        CHECK(EvaluateModules(called, set).peak_bytes == EvaluateModules(chain, set).peak_bytes);
        ++compared;
      }
      // The solver's frontier counts it as the walk along one set does.
      CHECK(MinimumModulesMemory(called, modules, ModuleAccounting::kPyTorch) == smallest);
    }
  }
  CHECK(compared > 200);
}

TEST_CASE("a wrapped module holds what its ops keep that checkpoint cannot drop, each module its own") {
  // The Python numbers mul and div keep (8 B each), a different count per module.
  int compared = 0;
  for (int length = 2; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      const Chain chain = SharedStorageChain(length, 1700 * length + seed);
      const std::vector<WrappableModule> modules = RandomModules(length, seed + 31);
      Chain scaled = chain;
      std::map<std::string, int64_t> held_by;
      for (size_t m = 0; m < modules.size(); ++m) {
        held_by[modules[m].path] = 8 * static_cast<int64_t>(m + 1);
        scaled.pytorch.module_held_bytes[modules[m].path] = held_by[modules[m].path];
      }
      CAPTURE(length);
      CAPTURE(seed);
      int64_t smallest = INT64_MAX;
      for (const auto& set : DisjointSets(modules, length)) {
        int64_t held = 0;
        for (const WrappableModule& m : set) held += held_by[m.path];
        const ModuleSolution without = EvaluateModules(chain, set, ModuleAccounting::kPyTorch);
        const ModuleSolution with = EvaluateModules(scaled, set, ModuleAccounting::kPyTorch);
        smallest = std::min(smallest, with.peak_bytes);
        CHECK(with.kept_bytes == without.kept_bytes + held);
        CHECK(with.peak_bytes >= without.peak_bytes);
        CHECK(with.peak_bytes <= without.peak_bytes + held);
        CHECK(ExportForModules(scaled, set).held_at_loss_bytes == ExportForModules(chain, set).held_at_loss_bytes + held);
        CHECK(EvaluateModules(scaled, set).peak_bytes == EvaluateModules(chain, set).peak_bytes);
        ++compared;
      }
      CHECK(MinimumModulesMemory(scaled, modules, ModuleAccounting::kPyTorch) == smallest);
    }
  }
  CHECK(compared > 200);
}

TEST_CASE("a wrapped module's recomputation holds at least what its eager forward held") {
  // Eager PyTorch's own peak inside a module (a Python local kept to the
  // module's return): below the graph's recomputation it changes nothing;
  // above, the recomputation holds it, and nothing else moves.
  int compared = 0;
  for (int length = 2; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      const Chain chain = SharedStorageChain(length, 1900 * length + seed);
      const std::vector<WrappableModule> modules = RandomModules(length, seed + 37);
      Chain low = chain, high = chain, higher = chain;
      for (const WrappableModule& m : modules) {
        low.pytorch.module_eager_peak_bytes[m.path] = 1;
        high.pytorch.module_eager_peak_bytes[m.path] = int64_t{1} << 40;
        higher.pytorch.module_eager_peak_bytes[m.path] = (int64_t{1} << 40) + 1000;
      }
      CAPTURE(length);
      CAPTURE(seed);
      int64_t smallest = INT64_MAX;
      for (const auto& set : DisjointSets(modules, length)) {
        const ModuleSolution without = EvaluateModules(chain, set, ModuleAccounting::kPyTorch);
        CHECK(EvaluateModules(low, set, ModuleAccounting::kPyTorch).peak_bytes == without.peak_bytes);
        const ModuleSolution with = EvaluateModules(high, set, ModuleAccounting::kPyTorch);
        smallest = std::min(smallest, with.peak_bytes);
        CHECK(with.kept_bytes == without.kept_bytes);
        if (set.empty()) {
          CHECK(with.peak_bytes == without.peak_bytes);
        } else {
          CHECK(with.peak_bytes > (int64_t{1} << 40));
          CHECK(EvaluateModules(higher, set, ModuleAccounting::kPyTorch).peak_bytes == with.peak_bytes + 1000);
        }
        // The simulator's accounting (ckplan run's executor) is unchanged.
        CHECK(EvaluateModules(high, set).peak_bytes == EvaluateModules(chain, set).peak_bytes);
        ++compared;
      }
      CHECK(MinimumModulesMemory(high, modules, ModuleAccounting::kPyTorch) == smallest);
    }
  }
  CHECK(compared > 200);
}

TEST_CASE("wrapping every stage on its own is every's schedule, and wrapping nothing is none's") {
  Chain chain = testing::RandomChain(12, 41);
  std::vector<WrappableModule> each;
  for (int i = 0; i < 12; ++i) each.push_back({"s" + std::to_string(i), i, i});
  CHECK(ModuleSchedule(12, each) == EveryNSchedule(12, 1));
  CHECK(ModuleSchedule(12, {}) == NoCheckpointSchedule(12));
  // With every stage wrappable, the solver is never slower than every or none where they fit.
  const int64_t every_peak = Simulate(chain, EveryNSchedule(12, 1)).peak_bytes;
  const int64_t none_peak = Simulate(chain, NoCheckpointSchedule(12)).peak_bytes;
  CHECK(MinimumModulesMemory(chain, each) <= every_peak);
  for (int64_t budget : {every_peak, (every_peak + none_peak) / 2, none_peak}) {
    ModuleSolution s = SolveModules(chain, each, budget);
    REQUIRE(s.feasible);
    CHECK(s.time_ms <= Simulate(chain, EveryNSchedule(12, 1)).time_ms + 1e-9);
    if (budget == none_peak) CHECK(s.wrapped.empty());
  }
}

namespace {

// The simulator's peak of a schedule with the chain's parameter gradients
// as PyTorch allocates them, the chain simulated without them: none before
// the loss, those of stages k.. from stage k's backward on (its own: those
// held on top of its bwd_tmp_bytes, Chain::GradsAtBackwardPeakBytes), and those after a
// wrapped module while it is recomputed).
int64_t PeakWithGradients(const Chain& chain, const Schedule& schedule) {
  const SimulationResult r = Simulate(WithoutParamGrads(chain), schedule);
  const size_t length = chain.stages.size();
  std::vector<int64_t> from(length + 1, 0);
  for (size_t k = length; k-- > 0;) from[k] = from[k + 1] + chain.stages[k].param_grad_bytes;
  int64_t peak = 0;
  bool backward = false;
  size_t done = length;
  for (size_t j = 0; j < schedule.size(); ++j) {
    const ScheduleStep& op = schedule[j];
    if (op.kind == StepKind::kLoss) backward = true;
    int64_t alive = 0;
    if (op.kind == StepKind::kBackward) {
      done = static_cast<size_t>(op.stage);
      alive = from[done + 1] + chain.GradsAtBackwardPeakBytes(op.stage);
    } else if (backward) {
      alive = from[done];
    }
    peak = std::max(peak, r.peak_during_bytes[j] + alive);
  }
  return peak;
}

}  // namespace

TEST_CASE("gradients allocated in backward: the module solver equals brute force over every set, in bytes") {
  int compared = 0, below = 0;
  for (int length = 1; length <= 7; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      const Chain plain = testing::SmallIntegerChain(length, 700 * length + seed);
      std::vector<WrappableModule> modules = RandomModules(length, seed + 3);
      std::mt19937 rng(seed);
      Chain chain = plain;
      int64_t total = 0;
      for (Stage& stage : chain.stages) {
        stage.param_grad_bytes = std::uniform_int_distribution<int64_t>(0, 6)(rng);
        stage.param_grad_bwd_bytes = std::uniform_int_distribution<int64_t>(0, stage.param_grad_bytes)(rng);
        total += stage.param_grad_bytes;
      }
      // Every disjoint set: its peak with gradients, and its time.
      std::vector<std::pair<int64_t, double>> sets;
      for (const auto& set : DisjointSets(modules, length)) {
        const Schedule s = ModuleSchedule(length, set);
        sets.push_back({PeakWithGradients(chain, s), Simulate(plain, s).time_ms});
      }
      int64_t smallest = INT64_MAX;
      for (const auto& entry : sets) smallest = std::min(smallest, entry.first);
      CAPTURE(length);
      CAPTURE(seed);
      const int64_t minimum = MinimumModulesMemory(chain, modules, ModuleAccounting::kPyTorch);
      CHECK(minimum == smallest);
      // Counting them for the whole step instead needs more, never less.
      CHECK(MinimumModulesMemory(plain, modules) + total >= minimum);
      if (MinimumModulesMemory(plain, modules) + total > minimum) ++below;
      for (int64_t budget = minimum - 2; budget <= minimum + 30; ++budget) {
        CAPTURE(budget);
        double best = 1e300;
        for (const auto& entry : sets) {
          if (entry.first <= budget) best = std::min(best, entry.second);
        }
        const ModuleSolution solution = SolveModules(chain, modules, budget, ModuleAccounting::kPyTorch);
        CHECK(solution.feasible == (best < 1e300));
        if (solution.feasible) {
          CHECK(solution.time_ms == doctest::Approx(best).epsilon(1e-12));
          CHECK(solution.peak_bytes == PeakWithGradients(chain, solution.schedule));
          CHECK(solution.peak_bytes <= budget);
        }
        ++compared;
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(below > 10);
}

TEST_CASE("the PyTorch target prices a wrapped module at its stages' forward inside it plus one fixed cost") {
  const int length = 6;
  Chain chain = testing::WithNoGradForwards(testing::RandomChain(length, 77), 78);
  const WrappableModule middle{"m1_3", 1, 3};
  std::vector<WrappableModule> singles;
  for (int i = 1; i <= 3; ++i) singles.push_back({"s" + std::to_string(i), i, i});
  double nograd = 0;
  for (int i = 1; i <= 3; ++i) nograd += chain.stages[static_cast<size_t>(i)].NoGradFwdMs();
  // Without the PyTorch target's own fields: its stages' fwd_nograd_ms, no
  // fixed cost, the schedule's loss, as before.
  CHECK(chain.ModuleNoRecomputeTimeMs() == chain.NoRecomputeTimeMs());
  CHECK(EvaluateModules(chain, {}).time_ms == doctest::Approx(chain.NoRecomputeTimeMs()).epsilon(1e-12));
  CHECK(EvaluateModules(chain, {middle}).time_ms == doctest::Approx(chain.NoRecomputeTimeMs() + nograd).epsilon(1e-12));
  CHECK(EvaluateModules(chain, singles).time_ms == doctest::Approx(chain.NoRecomputeTimeMs() + nograd).epsilon(1e-12));
  // With them: the forward inside a wrapped module, a fixed cost per wrapped
  // module (one wrap over three stages is cheaper than three), its own loss.
  Chain priced = chain;
  double module_nograd = 0;
  for (int i = 0; i < length; ++i) {
    Stage& s = priced.stages[static_cast<size_t>(i)];
    s.module_fwd_nograd_ms = 1.3 * s.NoGradFwdMs() + 0.01 * i;
    if (i >= 1 && i <= 3) module_nograd += s.ModuleNoGradFwdMs();
  }
  priced.pytorch.checkpoint_call_ms = 0.25;
  priced.module_loss_bwd_ms = chain.loss_bwd_ms + 1.5;
  const double base = priced.ModuleNoRecomputeTimeMs();
  CHECK(base == doctest::Approx(chain.NoRecomputeTimeMs() + 1.5).epsilon(1e-12));
  CHECK(priced.NoRecomputeTimeMs() == chain.NoRecomputeTimeMs());  // the schedule target's: unchanged
  CHECK(EvaluateModules(priced, {}).time_ms == doctest::Approx(base).epsilon(1e-12));
  CHECK(EvaluateModules(priced, {middle}).time_ms == doctest::Approx(base + module_nograd + 0.25).epsilon(1e-12));
  CHECK(EvaluateModules(priced, singles).time_ms == doctest::Approx(base + module_nograd + 3 * 0.25).epsilon(1e-12));
  // The plan: time, step without recomputation and overhead of the
  // PyTorch target by its prices; the schedule target's exactly as before.
  std::vector<WrappableModule> modules = singles;
  modules.push_back(middle);
  PlanRequest request;
  request.budget.bytes = int64_t{1} << 50;
  request.algorithm = Algorithm::kEvery;
  request.pytorch_modules = &modules;
  FixedMemory fixed;
  fixed.optimizer_step_ms = 0.75;
  const Plan every = MakePlan(priced, fixed, request);
  CHECK(every.no_recompute_ms == doctest::Approx(base + 0.75).epsilon(1e-12));
  double all_nograd = 0;
  for (int i = 1; i <= 3; ++i) all_nograd += priced.stages[static_cast<size_t>(i)].ModuleNoGradFwdMs();
  CHECK(every.time_ms == doctest::Approx(base + 0.75 + all_nograd + 3 * 0.25).epsilon(1e-12));
  const nlohmann::json doc = PlanToJson(every, priced, PlanSource{});
  CHECK(doc["pytorch"]["predicted"]["time_ms"].get<double>() == doctest::Approx(every.time_ms).epsilon(1e-12));
  CHECK(doc["predicted"]["overhead_pct"].get<double>() == doctest::Approx(OverheadPct(every.time_ms, base + 0.75)));
  for (Algorithm algorithm : {Algorithm::kNone, Algorithm::kEvery, Algorithm::kOptimal}) {
    PlanRequest schedule;
    schedule.algorithm = algorithm;
    schedule.budget.bytes = request.budget.bytes;
    const Plan before = MakePlan(chain, fixed, schedule), after = MakePlan(priced, fixed, schedule);
    CHECK(after.time_ms == before.time_ms);
    CHECK(after.no_recompute_ms == before.no_recompute_ms);
  }
}

TEST_CASE("with a fixed cost per wrapped module, the module solver still equals brute force over every set") {
  int compared = 0, feasible = 0;
  for (int length = 2; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 700 * length + seed);
      for (Stage& s : chain.stages) s.module_fwd_nograd_ms = 0.5 * s.fwd_ms;
      chain.pytorch.checkpoint_call_ms = 1.75;
      chain.module_loss_bwd_ms = 2;
      std::vector<WrappableModule> modules = RandomModules(length, seed);
      CAPTURE(length);
      CAPTURE(seed);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      for (int64_t budget = minimum; budget <= minimum + 20; ++budget) {
        CAPTURE(budget);
        double best = 1e300;
        for (const auto& set : DisjointSets(modules, length)) {
          const ModuleSolution r = EvaluateModules(chain, set);
          if (r.peak_bytes <= budget) best = std::min(best, r.time_ms);
        }
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        CHECK(solution.feasible == (best < 1e300));
        if (!solution.feasible) continue;
        ++feasible;
        CHECK(solution.time_ms == doctest::Approx(best).epsilon(1e-12));
        CHECK(EvaluateModules(chain, solution.wrapped).time_ms == doctest::Approx(solution.time_ms).epsilon(1e-12));
        ++compared;
      }
    }
  }
  CHECK(compared > 200);
  CHECK(feasible == compared);
}

TEST_CASE("the PyTorch target: the loop holds the output an op saved once that op's stage released it") {
  // TwoBlockProfile returning (loss, t3, t4) as held outputs: tanh saves t4,
  // so stage b counts it until its backward; the loop holds it on, through
  // the update (made the step's peak here).
  nlohmann::json doc = ckplan::testing::TwoBlockProfile();
  doc["held_outputs"] = {3, 4};
  Chain held = ChainFromProfile(ProfileFromJson(doc, "held.json"));
  REQUIRE(held.output_kept_bytes == 800);
  held.update_tmp_bytes = 1 << 20;
  Chain none = held;
  none.output_kept_bytes = 0;
  none.output_kept_stage.reset();
  CHECK(EvaluateModules(held, {}, ModuleAccounting::kPyTorch).peak_bytes ==
        EvaluateModules(none, {}, ModuleAccounting::kPyTorch).peak_bytes + 800);
  // The simulator's accounting (ckplan's executor frees it with the stage) is unchanged.
  CHECK(EvaluateModules(held, {}, ModuleAccounting::kSimulator).peak_bytes ==
        EvaluateModules(none, {}, ModuleAccounting::kSimulator).peak_bytes);
  // The backward of a stage before b holds it too: with the update small, a
  // stage-a backward larger than the rest shows it.
  held.update_tmp_bytes = none.update_tmp_bytes = 0;
  held.stages[0].bwd_tmp_bytes = none.stages[0].bwd_tmp_bytes = 1 << 20;
  held.stages[0].pytorch_bwd_peak_bytes.reset();
  none.stages[0].pytorch_bwd_peak_bytes.reset();
  CHECK(EvaluateModules(held, {}, ModuleAccounting::kPyTorch).peak_bytes ==
        EvaluateModules(none, {}, ModuleAccounting::kPyTorch).peak_bytes + 800);
}

namespace {

// Layers that do the same work, their times measured with noise (each
// stage's times scaled by its own draw within +-`noise`).
Chain NoisyIdenticalLayers(int length, double noise, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> draw(1 - noise, 1 + noise);
  Chain chain;
  chain.input_bytes = 4;
  for (int i = 0; i < length; ++i) {
    Stage s;
    s.name = "layer" + std::to_string(i);
    s.out_bytes = 4;
    s.saved_bytes = 20;
    s.fwd_ms = 1.0 * draw(rng);
    s.bwd_ms = 2.0 * draw(rng);
    s.fwd_nograd_ms = 0.8 * draw(rng);
    chain.stages.push_back(s);
  }
  return chain;
}

}  // namespace

TEST_CASE("layers that do the same work: the same plan however the noise fell, within the noise the profile states") {
  const int length = 6;
  std::vector<WrappableModule> modules;
  for (int i = 0; i < length; ++i) modules.push_back({"layer" + std::to_string(i), i, i});
  const int64_t budget = MinimumModulesMemory(NoisyIdenticalLayers(length, 0, 0), modules) + 40;  // some wrapped
  std::set<std::vector<std::string>> chosen, fastest;
  for (uint32_t seed = 0; seed < 20; ++seed) {
    CAPTURE(seed);
    Chain chain = NoisyIdenticalLayers(length, 0.02, seed);
    const ModuleSolution exact = SolveModules(chain, modules, budget);  // no noise stated: the fastest
    chain.pytorch.time_noise_pct = 5;
    const ModuleSolution tied = SolveModules(chain, modules, budget);
    REQUIRE(exact.feasible);
    REQUIRE(tied.feasible);
    std::vector<std::string> a, b;
    for (const WrappableModule& m : exact.wrapped) a.push_back(m.path);
    for (const WrappableModule& m : tied.wrapped) b.push_back(m.path);
    fastest.insert(a);
    chosen.insert(b);
    CHECK(!b.empty());
    CHECK(tied.peak_bytes <= budget);
    // Within the band: no slower than the fastest by more than tie_ms.
    CHECK(tied.time_ms <= exact.time_ms + tied.tie_ms + 1e-9);
    CHECK(tied.tie_ms > 0);
  }
  CHECK(fastest.size() > 1);  // the noise decides the fastest...
  CHECK(chosen.size() == 1);  // ...and not the plan chosen
  // The earliest layers, of the sets with the largest peak within the budget.
  CHECK((*chosen.begin()).front() == "layer0");
}

TEST_CASE("with a time noise stated, the module solver's plan is within its band of brute force's fastest") {
  int compared = 0;
  for (int length = 2; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 700 * length + seed);
      chain.pytorch.time_noise_pct = 10;
      std::vector<WrappableModule> modules = RandomModules(length, seed);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      for (int64_t budget = minimum; budget <= minimum + 20; ++budget) {
        CAPTURE(length);
        CAPTURE(seed);
        CAPTURE(budget);
        const Best brute = BruteForce(chain, modules, budget);
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        REQUIRE(solution.feasible);
        CHECK(solution.time_ms <= brute.time_ms + solution.tie_ms + 1e-9);
        CHECK(EvaluateModules(chain, solution.wrapped).peak_bytes <= budget);
        ++compared;
      }
    }
  }
  CHECK(compared > 400);
}

TEST_CASE("with a wide time noise, the modules solver is still never slower than a module baseline that fits") {
  int compared = 0;
  for (int length = 3; length <= 9; ++length) {
    for (uint32_t seed = 0; seed < 6; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 900 * length + seed);
      chain.pytorch.time_noise_pct = 60;
      std::vector<WrappableModule> modules;
      for (int i = 0; i < length; ++i) modules.push_back({"s" + std::to_string(i), i, i});
      const int64_t minimum = MinimumModulesMemory(chain, modules, ModuleAccounting::kPyTorch);
      for (int64_t budget = minimum; budget <= minimum + 12; ++budget) {
        CAPTURE(length);
        CAPTURE(seed);
        CAPTURE(budget);
        const ChainSolution optimal = ModulesSolver(modules)->Solve(chain, budget);
        REQUIRE(optimal.feasible);
        for (int n : {0, 1, 2, 4, 8, SqrtSegmentLength(length)}) {
          const ChainSolution baseline = ModuleBaselineSolver(modules, n)->Solve(chain, budget);
          if (baseline.feasible) CHECK(optimal.time_ms <= baseline.time_ms * (1 + 1e-12));
          ++compared;
        }
      }
    }
  }
  CHECK(compared > 1000);
}
