// The invariant of issue 12, in one memory model (gradients appear during
// backward): at every budget from the smallest feasible one to the peak
// without checkpointing, the optimal plan (the input's default target) is
// never slower than a baseline that fits, its smallest feasible budget is no
// more than any baseline's peak, and with nothing recomputed it peaks where
// `none` does.

#include <cstdlib>
#include <string>

#include <doctest/doctest.h>

#include "tests/test_chains.h"
#include "planner/plan/planner_input.h"
#include "planner/cost/optimizer_memory.h"
#include "planner/plan/plan.h"
#include "planner/solvers/modules.h"

using namespace ckplan;

namespace {

struct Target {
  const char* name;
  const std::vector<WrappableModule>* modules;  // null: the schedule target
};

void CheckInvariant(const Chain& chain, const FixedMemory& fixed, const Target& target) {
  CAPTURE(target.name);
  auto request = [&](Algorithm algorithm, int64_t budget, int every_n) {
    PlanRequest r;
    r.algorithm = algorithm;
    r.budget.bytes = budget;
    r.every_n = every_n;
    r.pytorch_modules = target.modules;  // baselines too: counted as the target counts
    return r;
  };
  const int64_t unlimited = int64_t{1} << 50;
  struct Baseline {
    Algorithm algorithm;
    int every_n;
  };
  const std::vector<Baseline> baselines = {{Algorithm::kNone, 0},   {Algorithm::kEvery, 1},  {Algorithm::kSqrt, 0},
                                           {Algorithm::kEveryN, 2}, {Algorithm::kEveryN, 4}, {Algorithm::kEveryN, 8}};
  const Plan none = MakePlan(chain, fixed, request(Algorithm::kNone, unlimited, 0));
  const Plan roomy = MakePlan(chain, fixed, request(Algorithm::kOptimal, unlimited, 0));
  REQUIRE(roomy.feasible);
  // Nothing recomputed: the same step, the same peak.
  CHECK(roomy.checkpointed_stages.empty());
  CHECK(roomy.peak_bytes == none.peak_bytes);
  CHECK(roomy.time_ms == doctest::Approx(none.time_ms).epsilon(1e-12));
  const int64_t minimum = roomy.min_budget_bytes;
  for (const Baseline& b : baselines) {
    const Plan p = MakePlan(chain, fixed, request(b.algorithm, unlimited, b.every_n));
    CAPTURE(AlgorithmName(b.algorithm));
    CAPTURE(b.every_n);
    CHECK(minimum <= p.peak_bytes);
  }
  REQUIRE(minimum <= none.peak_bytes);
  for (int k = 0; k < 20; ++k) {
    const int64_t budget = minimum + (none.peak_bytes - minimum) * k / 19;
    CAPTURE(budget);
    const Plan optimal = MakePlan(chain, fixed, request(Algorithm::kOptimal, budget, 0));
    REQUIRE(optimal.feasible);
    CHECK(optimal.peak_bytes <= budget);
    for (const Baseline& b : baselines) {
      const Plan p = MakePlan(chain, fixed, request(b.algorithm, budget, b.every_n));
      CAPTURE(AlgorithmName(b.algorithm));
      CAPTURE(b.every_n);
      if (p.feasible) CHECK(optimal.time_ms <= p.time_ms * (1 + 1e-12));
    }
  }
}

}  // namespace

TEST_CASE("optimal against every baseline in one memory model: the example profile, both targets") {
  PlannerInput in = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam");
  REQUIRE(in.chain.has_param_grads());
  CHECK(in.fixed.backward_grad_bytes == in.fixed.grad_bytes);  // every gradient is counted in backward
  const std::vector<WrappableModule> modules = WrappableModules(in.chain, &in.profile);
  REQUIRE(!modules.empty());
  CheckInvariant(in.chain, in.fixed, {"pytorch", &modules});
  CheckInvariant(in.chain, in.fixed, {"schedule", nullptr});
  // With a time noise stated, ties within its band are chosen by memory,
  // and still never slower than a baseline that fits (a wide band: 50%).
  for (double noise : {5.0, 50.0}) {
    CAPTURE(noise);
    Chain noisy = in.chain;
    noisy.pytorch.time_noise_pct = noise;
    CheckInvariant(noisy, in.fixed, {"pytorch", &modules});
  }
  // Both targets price each stage's backward by its replay, the schedule
  // target as `ckplan run`'s executor runs it: that holds the gradient of a
  // stage's output to the stage's end, where PyTorch frees it once consumed,
  // so with nothing recomputed the schedule target never peaks lower.
  PlanRequest none;
  none.algorithm = Algorithm::kNone;
  none.budget.bytes = int64_t{1} << 40;
  const Plan schedule_none = MakePlan(in.chain, in.fixed, none);
  none.pytorch_modules = &modules;
  const Plan pytorch_none = MakePlan(in.chain, in.fixed, none);
  CHECK(schedule_none.target != pytorch_none.target);
  CHECK(schedule_none.peak_bytes >= pytorch_none.peak_bytes);
}

TEST_CASE("optimal against every baseline in one memory model: random chains with and without gradients") {
  const FixedMemory none = FixedMemoryFor(0, 0, "none");
  for (uint32_t seed = 0; seed < 6; ++seed) {
    Chain chain = testing::RandomChain(8 + 7 * static_cast<int>(seed), 4200 + seed);
    if (seed % 2 == 0) chain = testing::WithParamGrads(chain, seed, 1500000);
    if (seed % 3 != 2) chain = testing::WithBackwardReplays(chain, 17 + seed);
    CAPTURE(seed);
    CheckInvariant(chain, none, {"schedule", nullptr});
  }
}

// The profiles of the test models, made by tests/python/test_invariant_models.py
// (ctest `python_invariant_models`, which profiles every test model and runs
// this case on them); skipped where the variable is unset.
TEST_CASE("optimal against every baseline in one memory model: the profiles in CKPLAN_INVARIANT_PROFILES" *
          doctest::skip(std::getenv("CKPLAN_INVARIANT_PROFILES") == nullptr)) {
  const std::string list = std::getenv("CKPLAN_INVARIANT_PROFILES");
  int checked = 0;
  for (size_t begin = 0; begin < list.size();) {
    size_t end = list.find(':', begin);
    if (end == std::string::npos) end = list.size();
    const std::string path = list.substr(begin, end - begin);
    begin = end + 1;
    if (path.empty()) continue;
    CAPTURE(path);
    PlannerInput in = LoadPlannerInput(path, "adam");
    const std::vector<WrappableModule> modules = WrappableModules(in.chain, &in.profile);
    CheckInvariant(in.chain, in.fixed, {"pytorch", &modules});
    CheckInvariant(in.chain, in.fixed, {"schedule", nullptr});
    ++checked;
  }
  CHECK(checked > 0);
}
