// The module solver with selective checkpointing (`--target sac`) against
// brute force: every set of disjoint modules, and in each wrapped module
// every set of its candidates saved, counted by EvaluateModules.
#include <algorithm>
#include <random>
#include <string>

#include <doctest/doctest.h>

#include "planner/cost/sac_candidates.h"
#include "planner/solvers/modules.h"
#include "tests/test_chains.h"

using namespace ckplan;

namespace {

// Modules over every stage and a few spans, each with up to three
// candidates in its stages (storage ids apart from the cuts').
std::vector<WrappableModule> RandomSelectiveModules(const Chain& chain, uint32_t seed) {
  const int length = chain.length();
  std::mt19937 rng(seed);
  std::vector<WrappableModule> modules;
  for (int i = 0; i < length; ++i) modules.emplace_back("s" + std::to_string(i), i, i);
  std::uniform_int_distribution<int> stage(0, length - 1);
  for (int k = 0; k < 3; ++k) {
    int a = stage(rng), b = stage(rng);
    if (a > b) std::swap(a, b);
    if (a != b) modules.emplace_back("m" + std::to_string(a) + "_" + std::to_string(b), a, b);
  }
  int64_t next_id = 1000;
  for (WrappableModule& m : modules) {
    m.selective = true;
    const int n = std::uniform_int_distribution<int>(0, 3)(rng);
    for (int i = 0; i < n; ++i) {
      SacCandidate c;
      c.op = static_cast<int>(next_id);
      c.stage = std::uniform_int_distribution<int>(m.first_stage, m.last_stage)(rng);
      c.storages = {{next_id++, std::uniform_int_distribution<int64_t>(1, 6)(rng)}};
      c.recompute_ms = std::uniform_int_distribution<int>(0, 3)(rng) * 0.5;
      m.sac_candidates.push_back(c);
    }
    m.sac_variants = SacVariants(m);
    // The policy's dispatch mode, paid once the module saves anything.
    m.sac_dispatch_ms = std::uniform_int_distribution<int>(0, 2)(rng) * 0.25;
  }
  return modules;
}

struct Evaluated {
  int64_t peak;
  double time_ms;
};

// Every disjoint set, every save set in each of its modules.
std::vector<Evaluated> EveryChoice(const Chain& chain, const std::vector<WrappableModule>& modules) {
  std::vector<Evaluated> out;
  const size_t n = modules.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<WrappableModule> set;
    std::vector<bool> used(static_cast<size_t>(chain.length()), false);
    bool disjoint = true;
    for (size_t m = 0; m < n && disjoint; ++m) {
      if (!(mask & (1u << m))) continue;
      for (int k = modules[m].first_stage; k <= modules[m].last_stage; ++k) {
        disjoint = disjoint && !used[static_cast<size_t>(k)];
        used[static_cast<size_t>(k)] = true;
      }
      set.push_back(modules[m]);
    }
    if (!disjoint) continue;
    std::sort(set.begin(), set.end(), [](const auto& p, const auto& q) { return p.first_stage < q.first_stage; });
    // Save sets as one mixed-radix counter over the wrapped modules.
    size_t combos = 1;
    for (const WrappableModule& m : set) combos <<= m.sac_candidates.size();
    for (size_t code = 0; code < combos; ++code) {
      size_t rest = code;
      for (WrappableModule& m : set) {
        const size_t bits = m.sac_candidates.size();
        m.sac_saved.clear();
        for (size_t i = 0; i < bits; ++i) {
          if (rest & (size_t{1} << i)) m.sac_saved.push_back(static_cast<int>(i));
        }
        rest >>= bits;
      }
      const ModuleSolution s = EvaluateModules(chain, set, ModuleAccounting::kPyTorch);
      out.push_back({s.peak_bytes, s.time_ms});
    }
  }
  return out;
}

}  // namespace

TEST_CASE("sac: the module solver equals brute force over every module set and every save set, in bytes") {
  int compared = 0, feasible = 0, saving = 0;
  for (int length = 1; length <= 5; ++length) {
    for (uint32_t seed = 0; seed < 6; ++seed) {
      const Chain chain = testing::WithParamGrads(testing::SmallIntegerChain(length, 900 * length + seed), seed);
      const std::vector<WrappableModule> modules = RandomSelectiveModules(chain, seed);
      const std::vector<Evaluated> all = EveryChoice(chain, modules);
      int64_t smallest = INT64_MAX;
      for (const Evaluated& e : all) smallest = std::min(smallest, e.peak);
      CAPTURE(length);
      CAPTURE(seed);
      const int64_t minimum = MinimumModulesMemory(chain, modules, ModuleAccounting::kPyTorch);
      CHECK(minimum == smallest);
      for (int64_t budget = minimum - 1; budget <= minimum + 40; ++budget) {
        CAPTURE(budget);
        double best = 1e300;
        for (const Evaluated& e : all) {
          if (e.peak <= budget) best = std::min(best, e.time_ms);
        }
        const ModuleSolution solution = SolveModules(chain, modules, budget, ModuleAccounting::kPyTorch);
        CHECK(solution.feasible == (best < 1e300));
        if (!solution.feasible) continue;
        ++feasible;
        CHECK(solution.time_ms == doctest::Approx(best).epsilon(1e-12));
        CHECK(solution.peak_bytes <= budget);
        // Its own figures are those of evaluating what it chose.
        const ModuleSolution again = EvaluateModules(chain, solution.wrapped, ModuleAccounting::kPyTorch);
        CHECK(again.peak_bytes == solution.peak_bytes);
        CHECK(again.time_ms == doctest::Approx(solution.time_ms).epsilon(1e-12));
        for (const WrappableModule& m : solution.wrapped) saving += m.sac_saved.empty() ? 0 : 1;
        ++compared;
      }
    }
  }
  CHECK(compared > 500);
  CHECK(feasible > 500);
  CHECK(saving > 100);  // plans that save some ops are among the optima
}

TEST_CASE("sac: with nothing to save, the same plans as wrapping whole modules") {
  for (int length = 1; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      const Chain chain = testing::SmallIntegerChain(length, 300 * length + seed);
      std::vector<WrappableModule> plain, selective;
      for (int i = 0; i < length; ++i) plain.emplace_back("s" + std::to_string(i), i, i);
      if (length > 2) plain.emplace_back("m", 0, length - 2);
      selective = plain;
      for (WrappableModule& m : selective) {
        m.selective = true;
        m.sac_variants = SacVariants(m);
      }
      const int64_t minimum = MinimumModulesMemory(chain, plain, ModuleAccounting::kPyTorch);
      CHECK(MinimumModulesMemory(chain, selective, ModuleAccounting::kPyTorch) == minimum);
      for (int64_t budget = minimum; budget <= minimum + 20; budget += 4) {
        const ModuleSolution a = SolveModules(chain, plain, budget, ModuleAccounting::kPyTorch);
        const ModuleSolution b = SolveModules(chain, selective, budget, ModuleAccounting::kPyTorch);
        CHECK(a.time_ms == b.time_ms);
        CHECK(a.peak_bytes == b.peak_bytes);
        CHECK(a.kept_bytes == b.kept_bytes);
      }
    }
  }
}

TEST_CASE("sac: a module's policy costs its dispatch mode once it saves an op, and nothing when it saves none") {
  const Chain chain = testing::WithParamGrads(testing::SmallIntegerChain(3, 2701), 1);
  std::vector<WrappableModule> modules = RandomSelectiveModules(chain, 3);
  auto with_candidates = std::find_if(modules.begin(), modules.end(),
                                      [](const WrappableModule& m) { return !m.sac_candidates.empty(); });
  REQUIRE(with_candidates != modules.end());
  WrappableModule m = *with_candidates;
  auto time_of = [&](const std::vector<int>& saved, double dispatch_ms) {
    m.sac_saved = saved;
    m.sac_dispatch_ms = dispatch_ms;
    return EvaluateModules(chain, {m}, ModuleAccounting::kPyTorch).time_ms;
  };
  CHECK(time_of({0}, 0.7) - time_of({0}, 0) == doctest::Approx(0.7));
  CHECK(time_of({}, 0.7) == time_of({}, 0));
}
