#include "planner/solvers/pipeline.h"

#include <algorithm>

#include <doctest/doctest.h>

#include "tests/test_chains.h"
#include "planner/base/error.h"
#include "planner/cost/simulator.h"

using namespace ckplan;

TEST_CASE("in-flight solver equals brute force over every schedule of the recurrence (up to 6 stages)") {
  int compared = 0, feasible = 0, differs_from_single = 0;
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    const int length = 1 + static_cast<int>(seed % 6);
    Chain chain = testing::SmallIntegerChain(length, seed);
    DiscreteChain d = Discretize(chain, 1);
    const int64_t none = NoRecomputeMemory(d);
    for (int in_flight : {1, 2, 3, 4}) {
      for (int64_t memory = 0; memory <= in_flight * none + 4; memory += 1 + in_flight / 2) {
        InFlightSolution fast = SolveInFlight(d, memory, in_flight);
        InFlightSolution brute = BruteForceInFlight(d, memory, in_flight);
        ++compared;
        REQUIRE(fast.feasible == brute.feasible);
        if (!fast.feasible) continue;
        ++feasible;
        CHECK(fast.time_ms == doctest::Approx(brute.time_ms).epsilon(1e-12));
        CHECK(fast.need + (in_flight - 1) * fast.stored_after_forward <= memory);
        // The simulator agrees on what is kept after the forward, and the peak fits.
        SimulationResult sim = Simulate(chain, fast.schedule);
        CHECK(sim.live_after_forward_bytes == fast.stored_after_forward);
        CHECK(sim.peak_bytes + (in_flight - 1) * sim.live_after_forward_bytes <= memory);
        if (in_flight > 1 && fast.time_ms < SolveInFlight(d, memory / in_flight, 1).time_ms) ++differs_from_single;
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(feasible > 300);
  // Counting stored bytes once per microbatch is not the same as dividing the budget.
  CHECK(differs_from_single > 0);
}

TEST_CASE("in-flight plan is never slower than the best single-budget plan that fits") {
  for (uint32_t seed = 100; seed < 112; ++seed) {
    Chain chain = testing::RandomChain(4 + static_cast<int>(seed % 8), seed, 1000);
    // About 40 slots for the no-recomputation memory.
    DiscreteChain d = Discretize(chain, std::max<int64_t>(1, NoRecomputeMemory(Discretize(chain, 1)) / 40));
    const int64_t none = NoRecomputeMemory(d);
    for (int in_flight : {2, 4}) {
      for (int64_t memory = none; memory <= in_flight * none; memory += std::max<int64_t>(1, none / 3)) {
        InFlightSolution joint = SolveInFlight(d, memory, in_flight);
        // A single-budget plan: the plain optimum at some budget b, taken when
        // its stored-after-forward counted per microbatch still fits.
        double best_single = kInfinity;
        for (int64_t b = 0; b <= memory; ++b) {
          InFlightSolution single = SolveInFlight(d, b, 1);
          if (single.feasible && single.need + (in_flight - 1) * single.stored_after_forward <= memory) {
            best_single = std::min(best_single, single.time_ms);
          }
        }
        if (best_single < kInfinity) {
          REQUIRE(joint.feasible);
          CHECK(joint.time_ms <= best_single + 1e-9);
        }
      }
    }
  }
}

TEST_CASE("1F1B holds min(p - s, m) microbatches, GPipe all of them") {
  CHECK(MicrobatchesInFlight(PipelineSchedule::kOneFOneB, 0, 4, 16) == 4);
  CHECK(MicrobatchesInFlight(PipelineSchedule::kOneFOneB, 3, 4, 16) == 1);
  CHECK(MicrobatchesInFlight(PipelineSchedule::kOneFOneB, 0, 4, 2) == 2);
  CHECK(MicrobatchesInFlight(PipelineSchedule::kGPipe, 3, 4, 16) == 16);
}

namespace {

// Every split into `stages` contiguous parts, each planned by SolveInFlight:
// the smallest slowest-stage time.
double BruteForceSplit(const Chain& chain, int stages, int microbatches, PipelineSchedule schedule, int64_t budget,
                       int slots, const std::function<int64_t(int, int)>& fixed) {
  const int L = chain.length();
  double best = kInfinity;
  std::vector<int> cuts;
  std::function<void(int, int)> go = [&](int s, int first) {
    if (s == stages - 1) {
      cuts.push_back(L);
      double slowest = 0;
      int a = 0;
      for (int k = 0; k < stages; ++k) {
        const int b = cuts[static_cast<size_t>(k)];
        const int64_t act = budget - fixed(a, b);
        double t = kInfinity;
        if (act > 0) {
          int64_t slot = std::max<int64_t>(1, act / slots);
          Chain sub = SubChain(chain, a, b);
          InFlightSolution sol =
              SolveInFlight(Discretize(sub, slot), act / slot, MicrobatchesInFlight(schedule, k, stages, microbatches));
          if (sol.feasible) t = Simulate(sub, sol.schedule).time_ms;
        }
        slowest = std::max(slowest, t);
        a = b;
      }
      best = std::min(best, slowest);
      cuts.pop_back();
      return;
    }
    for (int b = first + 1; b <= L - (stages - 1 - s); ++b) {
      cuts.push_back(b);
      go(s + 1, b);
      cuts.pop_back();
    }
  };
  go(0, 0);
  return best;
}

}  // namespace

TEST_CASE("the split minimises the slowest stage, and each stage fits its budget") {
  int feasible = 0;
  for (uint32_t seed = 7; seed < 15; ++seed) {
    Chain chain = testing::RandomChain(6 + static_cast<int>(seed % 4), seed, 1000);
    auto fixed = [&](int first, int last) { return int64_t{300} * (last - first); };
    for (int stages : {2, 3}) {
      for (PipelineSchedule schedule : {PipelineSchedule::kOneFOneB, PipelineSchedule::kGPipe}) {
        const int64_t whole = NoRecomputeMemory(Discretize(chain, 1));
        for (int64_t budget : {whole / 4, whole / 2, whole, 3 * whole}) {
          PipelinePlan plan = PlanPipeline(chain, stages, 4, schedule, budget, 60, fixed);
          double brute = BruteForceSplit(chain, stages, 4, schedule, budget, 60, fixed);
          REQUIRE(plan.feasible == (brute < kInfinity));
          if (!plan.feasible) {
            CHECK(plan.min_budget_bytes > budget);
            CHECK(PlanPipeline(chain, stages, 4, schedule, plan.min_budget_bytes, 60, fixed).feasible);
            continue;
          }
          ++feasible;
          CHECK(plan.slowest_stage_ms == doctest::Approx(brute).epsilon(1e-12));
          REQUIRE(plan.stages.size() == static_cast<size_t>(stages));
          CHECK(plan.stages.front().first == 0);
          CHECK(plan.stages.back().last == chain.length());
          for (const PipelineStagePlan& s : plan.stages) CHECK(s.peak_bytes <= budget);
        }
      }
    }
  }
  CHECK(feasible > 40);
}

TEST_CASE("a stage's step end (its fixed part and the optimizer's update) is within the budget and in its peak") {
  int compared = 0;
  for (uint32_t seed = 7; seed < 12; ++seed) {
    Chain chain = testing::RandomChain(6 + static_cast<int>(seed % 3), seed, 1000);
    auto fixed = [&](int first, int last) { return int64_t{300} * (last - first); };
    const int64_t whole = NoRecomputeMemory(Discretize(chain, 1));
    for (int64_t update : {int64_t{0}, whole / 8, whole}) {
      auto end = [&](int first, int last) { return fixed(first, last) + update * (last - first); };
      for (int64_t budget : {whole / 2, whole, 3 * whole}) {
        const PipelinePlan without = PlanPipeline(chain, 2, 4, PipelineSchedule::kOneFOneB, budget, 60, fixed);
        const PipelinePlan with = PlanPipeline(chain, 2, 4, PipelineSchedule::kOneFOneB, budget, 60, fixed, end);
        if (update == 0) {
          CHECK(with.feasible == without.feasible);
          if (with.feasible) CHECK(with.slowest_stage_ms == without.slowest_stage_ms);
        }
        if (!with.feasible) continue;
        for (const PipelineStagePlan& st : with.stages) {
          CHECK(st.peak_bytes <= budget);
          CHECK(st.peak_bytes >= end(st.first, st.last));
        }
        ++compared;
      }
    }
  }
  CHECK(compared > 10);
}

TEST_CASE("bad pipeline requests name the value and the largest or smallest that works") {
  Chain chain = testing::ThreeStageChain();
  auto fixed = [](int, int) { return int64_t{0}; };
  try {
    PlanPipeline(chain, 4, 4, PipelineSchedule::kOneFOneB, 1000, 50, fixed);
    FAIL("accepted --pipeline 4 on 3 stages");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kBadInput);
    CHECK(std::string(e.what()).find("--pipeline 4") != std::string::npos);
    CHECK(std::string(e.what()).find("at most --pipeline 3") != std::string::npos);
  }
  CHECK_THROWS_AS(PlanPipeline(chain, 0, 4, PipelineSchedule::kOneFOneB, 1000, 50, fixed), Error);
  CHECK_THROWS_AS(PlanPipeline(chain, 2, 0, PipelineSchedule::kOneFOneB, 1000, 50, fixed), Error);
}
