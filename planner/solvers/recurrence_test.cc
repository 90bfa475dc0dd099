#include "planner/solvers/recurrence.h"
#include "planner/cost/optimizer_memory.h"

#include <algorithm>
#include <functional>

#include <doctest/doctest.h>

#include "tests/test_chains.h"
#include "planner/plan/plan.h"
#include "planner/cost/simulator.h"

using namespace ckplan;

namespace {

struct Candidate {
  double time_ms;
  Schedule schedule;
};

// Every persistent schedule of stages i..l (the recurrence's class), built
// without any table: leaf checkpoints at every j, or stage i kept with
// autograd, recursively.
std::vector<Schedule> AllSchedules(int i, int l, int length) {
  if (i == l) {
    if (i == length) return {{{StepKind::kLoss, i}}};
    return {{{StepKind::kForwardGrad, i}, {StepKind::kBackward, i}}};
  }
  std::vector<Schedule> out;
  for (int j = i + 1; j <= l; ++j) {
    Schedule head = {{StepKind::kForwardNoGradKeep, i}};
    for (int k = i + 1; k < j; ++k) head.push_back({StepKind::kForwardNoGrad, k});
    for (const Schedule& right : AllSchedules(j, l, length)) {
      for (const Schedule& left : AllSchedules(i, j - 1, length)) {
        Schedule s = head;
        s.insert(s.end(), right.begin(), right.end());
        s.insert(s.end(), left.begin(), left.end());
        out.push_back(std::move(s));
      }
    }
  }
  for (const Schedule& rest : AllSchedules(i + 1, l, length)) {
    Schedule s = {{StepKind::kForwardGrad, i}};
    s.insert(s.end(), rest.begin(), rest.end());
    s.push_back({StepKind::kBackward, i});
    out.push_back(std::move(s));
  }
  return out;
}

// The recurrence's own feasibility, checked node by node on a schedule tree
// enumerated in full: every tree the recurrence admits at memory m.
void EnumerateFeasible(const DiscreteChain& c, int64_t m, int i, int l, double forward_prefix,
                       const std::function<void(double)>& emit) {
  // Stage k's backward: its replay where the chain carries one, else both
  // boundary gradients, its transient and its gradients at their maxima.
  auto kept_need = [&](int k) {
    size_t u = static_cast<size_t>(k);
    if (c.executor_bwd[u] >= 0) return c.xbar[u + 1] + c.executor_bwd[u];
    return c.x[u] + c.x[u + 1] + c.xbar[u + 1] + c.bwd_tmp[u] + c.grads_at_bwd_peak[u];
  };
  auto base_need = [&](int k) {
    size_t u = static_cast<size_t>(k);
    return std::max(kept_need(k), c.x[u + 1] + std::max(c.xbar[u + 1], c.x[u + 1] + c.fwd_tmp[u]));
  };
  // Parameter gradients: stage k's backward holds its own (grads_at_bwd_peak) and
  // those of the stages back-propagated before it.
  auto grads = [&](int a, int b) {
    int64_t total = 0;
    for (int k = a; k <= b; ++k) total += c.grad[static_cast<size_t>(k)];
    return total;
  };
  if (i == l) {
    if (m >= base_need(i)) emit(forward_prefix + c.fwd[static_cast<size_t>(i)] + c.bwd[static_cast<size_t>(i)]);
    return;
  }
  int64_t floor = c.x[static_cast<size_t>(i) + 1] + c.fwd_tmp[static_cast<size_t>(i)];
  for (int k = i + 1; k < l; ++k) {
    size_t v = static_cast<size_t>(k);
    floor = std::max(floor, c.x[v] + c.x[v + 1] + c.fwd_tmp[v]);
  }
  if (m < c.x[static_cast<size_t>(l) + 1] + floor) return;
  double forward = 0;
  for (int j = i + 1; j <= l; ++j) {
    forward += c.fwd_nograd[static_cast<size_t>(j) - 1];
    const int64_t xj = c.x[static_cast<size_t>(j)];
    if (m < xj) continue;
    // The left part runs with the right part's gradients held.
    const int64_t held = grads(j, l);
    if (m < held) continue;
    EnumerateFeasible(c, m - xj, j, l, 0, [&](double right) {
      EnumerateFeasible(c, m - held, i, j - 1, 0, [&](double left) { emit(forward_prefix + forward + right + left); });
    });
  }
  const int64_t xbar = c.xbar[static_cast<size_t>(i) + 1];
  if (m >= xbar && m >= kept_need(i) + grads(i + 1, l)) {
    double own = c.fwd[static_cast<size_t>(i)] + c.bwd[static_cast<size_t>(i)];
    EnumerateFeasible(c, m - xbar, i + 1, l, 0, [&](double rest) { emit(forward_prefix + own + rest); });
  }
}

double BruteForceRecurrence(const DiscreteChain& c, int64_t memory) {
  double best = kInfinity;
  if (memory < c.x[0]) return best;
  EnumerateFeasible(c, memory - c.x[0], 0, c.length, 0, [&](double t) { best = std::min(best, t); });
  return best;
}

}  // namespace

TEST_CASE("the DP equals brute force over every schedule on random chains of up to 6 stages") {
  int compared = 0, feasible = 0;
  for (int length = 1; length <= 6; ++length) {
    // Seeds 6..17: the same kind of chains with parameter gradients, which
    // appear in each stage's backward and stay to the end of the step;
    // 12..17 with stage backwards replayed (as chains cut from a profile).
    for (uint32_t seed = 0; seed < 18; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 1000 * length + seed % 6);
      if (seed % 2 == 1) chain = testing::WithNoGradForwards(chain, seed);
      if (seed >= 6) chain = testing::WithParamGrads(chain, 77 * length + seed);
      if (seed % 6 >= 3) chain.update_tmp_bytes = seed % 6 - 2;  // an optimizer update's temporary at the end
      if (seed >= 12) chain = testing::WithBackwardReplays(chain, 31 * length + seed);
      DiscreteChain c = Discretize(chain, 1);
      std::vector<Schedule> all = AllSchedules(0, length, length);
      std::vector<SimulationResult> simulated;
      for (const Schedule& s : all) simulated.push_back(Simulate(chain, s));
      const int64_t low = MinimumMemory(c);
      for (int64_t memory = std::max<int64_t>(0, low - 3); memory <= low + 25; ++memory) {
        CAPTURE(length);
        CAPTURE(seed);
        CAPTURE(memory);
        OptimalSolution dp = SolveOptimalReference(c, memory);
        double brute = BruteForceRecurrence(c, memory);
        CHECK(dp.feasible == (memory >= low));
        CHECK(dp.feasible == (brute < kInfinity));
        if (dp.feasible) {
          ++feasible;
          CHECK(dp.time_ms == doctest::Approx(brute).epsilon(1e-12));
          // The read-back schedule is one of the enumerated ones, costs what
          // the DP says, and fits in the memory by the simulator.
          CHECK(std::find(all.begin(), all.end(), dp.schedule) != all.end());
          SimulationResult r = Simulate(chain, dp.schedule);
          CHECK(r.time_ms == doctest::Approx(dp.time_ms).epsilon(1e-12));
          CHECK(r.peak_bytes <= memory);
        }
        // One memory model: the fastest schedule of the class that the
        // simulator fits in this memory, in bytes, is the DP's optimum, and
        // the DP is feasible exactly when one fits.
        double best_simulated = kInfinity;
        for (size_t k = 0; k < all.size(); ++k) {
          if (simulated[k].peak_bytes <= memory) best_simulated = std::min(best_simulated, simulated[k].time_ms);
        }
        CHECK(dp.feasible == (best_simulated < kInfinity));
        if (dp.feasible) CHECK(best_simulated == doctest::Approx(dp.time_ms).epsilon(1e-12));
        ++compared;
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(feasible > 800);
}

TEST_CASE("more budget never gives a slower plan") {
  for (uint32_t seed = 0; seed < 8; ++seed) {
    Chain chain = testing::RandomChain(25, seed);
    DiscreteChain c = Discretize(chain, 1000000);
    const int64_t top = NoRecomputeMemory(c) + 5;
    OptimalSolution s = SolveOptimalReference(c, top);
    REQUIRE(s.feasible);
    double previous = kInfinity;
    for (double t : s.curve_ms) {
      CHECK(t <= previous);
      previous = t;
    }
    // Enough memory for no recomputation gives exactly one forward and
    // backward per stage.
    CHECK(s.time_ms == doctest::Approx(chain.NoRecomputeTimeMs()).epsilon(1e-12));
    CHECK(CheckpointedStages(s.schedule, chain.length()).empty());
    // The curve agrees with separate solves at smaller memories.
    for (int64_t m : {MinimumMemory(c), (MinimumMemory(c) + top) / 2}) {
      OptimalSolution at = SolveOptimalReference(c, m);
      CHECK(at.time_ms == s.curve_ms[static_cast<size_t>(m)]);
    }
  }
}

TEST_CASE("every optimal plan's simulated peak is within its budget") {
  int plans = 0;
  for (uint32_t seed = 0; seed < 12; ++seed) {
    Chain chain = testing::RandomChain(10 + static_cast<int>(seed) * 3, 100 + seed);
    FixedMemory none = FixedMemoryFor(0, 0, "none");
    int64_t minimum = MinimumOptimalBudget(chain, none, 200);
    Plan keep_all = MakePlan(chain, none, {Algorithm::kNone, 1 << 30});
    for (double fraction : {0.0, 0.1, 0.25, 0.5, 0.75, 1.0, 1.2}) {
      int64_t budget = minimum + static_cast<int64_t>(fraction * static_cast<double>(keep_all.peak_bytes - minimum));
      PlanRequest request;
      request.budget.bytes = budget;
      request.slots = 200;
      Plan plan = MakePlan(chain, none, request);
      CAPTURE(seed);
      CAPTURE(budget);
      REQUIRE(plan.feasible);
      CHECK(plan.peak_bytes <= budget);
      CHECK(Simulate(chain, plan.schedule).peak_bytes == plan.peak_bytes);
      CHECK(plan.time_ms >= chain.NoRecomputeTimeMs() - 1e-9);
      ++plans;
    }
    // Just below the minimum there is no plan.
    PlanRequest below;
    below.budget.bytes = minimum - std::max<int64_t>(1, minimum / 1000);
    below.slots = 200;
    CHECK_FALSE(MakePlan(chain, none, below).feasible);
  }
  CHECK(plans == 84);
}

TEST_CASE("the optimal plan is never slower than the baselines that fit the same budget") {
  for (uint32_t seed = 0; seed < 10; ++seed) {
    Chain chain = testing::RandomChain(16, 300 + seed);
    FixedMemory none = FixedMemoryFor(0, 0, "none");
    for (Algorithm baseline : {Algorithm::kEvery, Algorithm::kSqrt, Algorithm::kNone}) {
      PlanRequest request{baseline, 1LL << 40};
      Plan base = MakePlan(chain, none, request);
      PlanRequest optimal;
      // The DP needs a little more than the baseline's simulated peak: sizes
      // round up to slots, and its base case counts a stage's saved bytes
      // and forward transient together where the simulator takes the larger.
      optimal.budget.bytes = base.peak_bytes + base.peak_bytes / 10;
      optimal.slots = 1000;
      Plan best = MakePlan(chain, none, optimal);
      REQUIRE(best.feasible);
      CHECK(best.time_ms <= base.time_ms + 1e-9);
    }
  }
}

TEST_CASE("the fast solver gives the reference's optimum to the last digit, its schedule and its curve") {
  for (uint32_t seed = 0; seed < 24; ++seed) {
    const int length = 5 + static_cast<int>(seed % 6) * 7;
    Chain chain = testing::RandomChain(length, 900 + seed);
    if (seed % 3 == 1) chain = testing::WithNoGradForwards(chain, seed);
    if (seed % 2 == 0) chain = testing::WithParamGrads(chain, seed, 700000);
    if (seed % 4 == 3) {
      // Zero forward times make leaf and chain choices tie: no shortcut then.
      for (size_t k = 0; k < chain.stages.size(); k += 3) chain.stages[k].fwd_ms = 0;
    }
    if (seed % 5 == 4) chain.stages[0].fwd_tmp_bytes = 50000000;  // a tall floor
    if (seed % 4 == 1) chain = testing::WithBackwardReplays(chain, seed);
    const int64_t slot = 400000 + 37000 * seed;
    DiscreteChain c = Discretize(chain, slot);
    const int64_t low = MinimumMemory(c), high = NoRecomputeMemory(c);
    for (int64_t memory : {low - 1, low, (low + high) / 2, high, high + 17}) {
      CAPTURE(seed);
      CAPTURE(memory);
      OptimalSolution reference = SolveOptimalReference(c, memory);
      for (int threads : {1, 2}) {
        OptimalSolution fast = SolveOptimal(c, memory, threads);
        CHECK(fast.feasible == reference.feasible);
        CHECK(fast.time_ms == reference.time_ms);  // bitwise
        CHECK(fast.schedule == reference.schedule);
        REQUIRE(fast.curve_ms.size() == reference.curve_ms.size());
        for (size_t m = 0; m < fast.curve_ms.size(); ++m) CHECK(fast.curve_ms[m] == reference.curve_ms[m]);
      }
    }
  }
}

TEST_CASE("the banded solver brackets the exact optimum, its plan costs what it says, and is exact when the band covers the chain") {
  int proven = 0, cases = 0;
  for (uint32_t seed = 0; seed < 24; ++seed) {
    const int length = 12 + static_cast<int>(seed % 5) * 9;
    Chain chain = testing::RandomChain(length, 5000 + seed);
    if (seed % 3 == 1) chain = testing::WithNoGradForwards(chain, seed);
    if (seed % 2 == 0) chain = testing::WithParamGrads(chain, seed, 700000);
    if (seed % 6 == 5) {
      for (size_t k = 0; k < chain.stages.size(); k += 4) chain.stages[k].fwd_ms = 0;
    }
    if (seed % 4 == 1) chain = testing::WithBackwardReplays(chain, seed);
    const int64_t slot = 300000 + 41000 * seed;
    DiscreteChain c = Discretize(chain, slot);
    const int64_t low = MinimumMemory(c), high = NoRecomputeMemory(c);
    for (int64_t memory : {low, low + (high - low) / 8, (low + high) / 2, high + 3}) {
      OptimalSolution exact = SolveOptimal(c, memory, 1);
      for (int band : {2, 4, 8}) {
        CAPTURE(seed);
        CAPTURE(memory);
        CAPTURE(band);
        OptimalSolution banded = SolveBanded(c, memory, band);
        ++cases;
        CHECK(banded.band == band);
        // The lower bound is below the optimum, the plan above it.
        CHECK(banded.lower_bound_ms <= exact.time_ms * (1 + 1e-12));
        if (!banded.feasible) continue;
        REQUIRE(exact.feasible);
        CHECK(banded.time_ms >= exact.time_ms * (1 - 1e-12));
        CHECK(banded.lower_bound_ms <= banded.time_ms);
        if (banded.proven_optimal) {
          ++proven;
          CHECK(banded.time_ms == doctest::Approx(exact.time_ms).epsilon(1e-12));
        }
        // The plan is a schedule of the chain that fits the memory.
        SimulationResult r = Simulate(chain, banded.schedule);
        CHECK(r.time_ms == doctest::Approx(banded.time_ms).epsilon(1e-12));
        CHECK(r.peak_bytes <= memory * slot);
      }
      // A band longer than the chain is the exact solver.
      OptimalSolution wide = SolveBanded(c, memory, length + 1);
      CHECK(wide.band == 0);
      CHECK(wide.proven_optimal);
      CHECK(wide.time_ms == exact.time_ms);
      CHECK(wide.schedule == exact.schedule);
    }
  }
  CHECK(cases > 200);
  CHECK(proven > cases / 4);
}

TEST_CASE("on chains of a few hundred stages the CLI's solver is the reference, and the banded one brackets it") {
  struct Case {
    int length;
    int64_t slots;
  };
  for (const Case& test : {Case{150, 200}, Case{300, 60}}) {
    Chain chain = testing::RandomChain(test.length, 7000 + static_cast<uint32_t>(test.length));
    DiscreteChain bytes = Discretize(chain, 1);
    const int64_t budget = (MinimumMemory(bytes) + NoRecomputeMemory(bytes)) / 2;
    DiscreteChain c = Discretize(chain, budget / test.slots);
    CAPTURE(test.length);
    REQUIRE(ChooseSolver(test.length, test.slots) == SolverMethod::kExact);
    OptimalSolution reference = SolveOptimalReference(c, test.slots);
    REQUIRE(reference.feasible);
    OptimalSolution chosen = SolveChain(c, test.slots);
    CHECK(chosen.time_ms == reference.time_ms);  // bitwise
    CHECK(chosen.schedule == reference.schedule);
    CHECK(chosen.proven_optimal);
    OptimalSolution banded = SolveBanded(c, test.slots, kDefaultBand);
    REQUIRE(banded.feasible);
    CHECK(banded.lower_bound_ms <= reference.time_ms * (1 + 1e-12));
    CHECK(banded.time_ms >= reference.time_ms * (1 - 1e-12));
    if (banded.proven_optimal) CHECK(banded.time_ms == doctest::Approx(reference.time_ms).epsilon(1e-12));
    CHECK(Simulate(chain, banded.schedule).peak_bytes <= test.slots * (budget / test.slots));
  }
}

TEST_CASE("the banded lower program's smallest memory bounds the exact one from below") {
  for (uint32_t seed = 0; seed < 12; ++seed) {
    const int length = 20 + static_cast<int>(seed) * 13;
    Chain chain = testing::RandomChain(length, 8100 + seed);
    if (seed % 2 == 1) chain = testing::WithParamGrads(chain, seed, 700000);
    if (seed % 3 == 0) chain = testing::WithBackwardReplays(chain, seed);
    DiscreteChain c = Discretize(chain, 200000 + 30000 * seed);
    const int64_t exact = MinimumMemory(c);  // chain input included
    CAPTURE(seed);
    for (int band : {2, 8, kDefaultBand}) {
      const int64_t lower = MinimumMemoryLowerBound(c, band);
      CHECK(lower <= exact);
      CHECK(lower > 0);
    }
    // A band covering the chain is the exact recurrence; the banded
    // solver's own minimum is above the exact one.
    CHECK(MinimumMemoryLowerBound(c, length + 1) == exact);
    CHECK(SolverMinimumMemory(c, SolverMethod::kBanded) >= exact);
  }
}

TEST_CASE("an optimal plan is never slower than a baseline that fits the same budget, exact and banded") {
  // The exact solver rounds sizes up to slots; the banded one (over 400
  // stages) searches a band: both are checked against every baseline,
  // simulated in bytes, at budgets up to the no-checkpointing peak.
  FixedMemory none = FixedMemoryFor(0, 0, "none");
  for (int length : {30, 120, 600}) {
    Chain chain = testing::WithParamGrads(testing::RandomChain(length, 7 + static_cast<uint32_t>(length)), 3, 500000);
    if (length == 120) chain = testing::WithBackwardReplays(chain, 5);
    const int64_t minimum = MinimumOptimalBudget(chain, none, 200);
    const int64_t keep_all = MakePlan(chain, none, {Algorithm::kNone, 1 << 30}).peak_bytes;
    for (double fraction : {0.0, 0.3, 0.7, 1.0}) {
      PlanRequest request;
      request.budget.bytes = minimum + static_cast<int64_t>(fraction * static_cast<double>(keep_all - minimum));
      request.slots = 200;
      const Plan optimal = MakePlan(chain, none, request);
      CAPTURE(length);
      CAPTURE(fraction);
      REQUIRE(optimal.feasible);
      for (Algorithm baseline : {Algorithm::kNone, Algorithm::kEvery, Algorithm::kSqrt, Algorithm::kEveryN}) {
        for (int n : {2, 4, 8}) {
          PlanRequest b = request;
          b.algorithm = baseline;
          b.every_n = n;
          const Plan other = MakePlan(chain, none, b);
          if (other.feasible) CHECK(optimal.time_ms <= other.time_ms * (1 + 1e-12));
          if (baseline != Algorithm::kEveryN) break;
        }
      }
    }
  }
}

TEST_CASE("rounding sizes to slots costs at most 0.5% of the activation budget, against the optimum in bytes") {
  // Coarse grids (50 slots) on chains small enough to solve in bytes: the
  // plan is never slower than the exact optimum at 99.5% of the budget, and
  // exists whenever that optimum does; its peak is within the budget in bytes.
  int compared = 0;
  for (uint32_t seed = 0; seed < 6; ++seed) {
    Chain chain = testing::RandomChain(8 + static_cast<int>(seed), 700 + seed, 100);
    if (seed % 2 == 1) chain = testing::WithParamGrads(chain, seed, 40);
    if (seed >= 3) chain = testing::WithBackwardReplays(chain, seed);
    const DiscreteChain bytes = Discretize(chain, 1);
    const int64_t low = MinimumMemory(bytes);
    const int64_t high = NoRecomputeMemory(bytes);
    FixedMemory none = FixedMemoryFor(0, 0, "none");
    for (int step = 0; step <= 10; ++step) {
      const int64_t budget = low + (high - low) * step / 10 + 1;
      PlanRequest request;
      request.budget.bytes = budget;
      request.slots = 50;
      Plan plan = MakePlan(chain, none, request);
      OptimalSolution exact = SolveOptimal(bytes, static_cast<int64_t>(std::floor(budget * 0.995)));
      CAPTURE(seed);
      CAPTURE(budget);
      if (exact.feasible) {
        REQUIRE(plan.feasible);
        CHECK(plan.time_ms <= exact.time_ms * (1 + 1e-12));
        ++compared;
      }
      if (plan.feasible) CHECK(plan.peak_bytes <= budget);
    }
  }
  CHECK(compared > 40);
}
