#include "ckplan/planner/solver_modules.h"

#include <algorithm>
#include <random>

#include <doctest/doctest.h>

#include "../tests/test_chains.h"
#include "ckplan/planner/baselines.h"
#include "ckplan/planner/simulator.h"

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

// Every set of disjoint modules, simulated.
Best BruteForce(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget) {
  Best best;
  const size_t n = modules.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<WrappableModule> set;
    std::vector<bool> used(static_cast<size_t>(chain.length()), false);
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
  for (int k = 0; k <= length; ++k) cuts[static_cast<size_t>(k)].push_back({k, chain.InputBytes(k)});
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
    stage.saved_bytes = stage.private_saved_bytes + total;
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
