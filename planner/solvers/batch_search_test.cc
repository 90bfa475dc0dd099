// The batch search against brute force: for step memories that grow with
// the batch as models' do (affine, with steps where a kernel's workspace or
// an allocator's rounding jumps, and a batch the model refuses), the largest
// batch that fits with and without checkpointing equals the largest found by
// measuring every batch, and the batch after it is measured not to fit.
#include <cstdint>
#include <random>
#include <set>

#include <doctest/doctest.h>

#include "planner/solvers/batch_search.h"

using namespace ckplan;

namespace {

struct Model {
  int64_t fixed;        // parameters, gradients, optimizer state
  int64_t per_sample;   // activations without checkpointing
  int64_t plan_per_sample;
  int64_t step_every;   // a jump of `step` every this many samples (0: none)
  int64_t step;
  bool refuses_one;     // batch norm refuses a batch of 1 in training
};

int64_t Jump(const Model& m, int b) { return m.step_every > 0 ? (b / m.step_every) * m.step : 0; }

BatchPoint Evaluate(const Model& m, int64_t budget, int b) {
  BatchPoint p;
  p.batch = b;
  if (m.refuses_one && b == 1) {
    p.error = "Expected more than 1 value per channel when training";
    return p;
  }
  p.none_peak_bytes = m.fixed + m.per_sample * b + Jump(m, b);
  p.min_budget_bytes = m.fixed + m.plan_per_sample * b + Jump(m, b);
  p.none_fits = p.none_peak_bytes <= budget;
  p.plan_fits = p.min_budget_bytes <= budget;
  p.none_ms = 1.0 + 0.5 * b;
  p.plan_ms = 1.3 + 0.6 * b;
  return p;
}

int Brute(const Model& m, int64_t budget, int max_batch, bool plan) {
  int largest = 0;
  for (int b = 1; b <= max_batch; ++b) {
    const BatchPoint p = Evaluate(m, budget, b);
    if (plan ? p.plan_fits : p.none_fits) largest = b;
  }
  return largest;
}

}  // namespace

TEST_CASE("batch search: the largest batch that fits equals brute force, and one more is measured not to") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int64_t> fixed(0, 1 << 20), per(1, 1 << 14), jump_every(0, 40), jump(0, 1 << 15);
  std::uniform_int_distribution<int> max_batch(1, 3000);
  for (int trial = 0; trial < 400; ++trial) {
    Model m{fixed(rng), 0, 0, jump_every(rng), jump(rng), trial % 5 == 0};
    m.plan_per_sample = per(rng);
    m.per_sample = m.plan_per_sample * (1 + trial % 7);
    const int cap = max_batch(rng);
    const int64_t budget = m.fixed + m.plan_per_sample * (std::uniform_int_distribution<int>(0, 2 * cap)(rng));
    int evaluations = 0;
    const BatchSearch s = SearchBatches(cap, budget, [&](int b) {
      ++evaluations;
      CHECK(b >= 1);
      CHECK(b <= cap);
      return Evaluate(m, budget, b);
    });
    CAPTURE(trial);
    CAPTURE(cap);
    const int plan = Brute(m, budget, cap, true), none = Brute(m, budget, cap, false);
    CHECK(s.largest_plan == plan);
    CHECK(s.largest_none == none);
    // The answer rests on measurements: the batch itself, and the next one (unless at the cap).
    for (int largest : {plan, none}) {
      if (largest > 0) CHECK(s.points.count(largest) == 1);
      if (largest < cap) CHECK(s.points.count(largest + 1) == 1);
    }
    // Far fewer profiles than batches: doubling, then about two per bracket when affine.
    CHECK(evaluations <= 2 * 12 + 2 * 2 * 12);
    if (m.step_every == 0 && !m.refuses_one) CHECK(static_cast<size_t>(evaluations) <= s.points.size());
    // The fastest among those measured that fit.
    if (s.fastest_plan > 0) {
      for (const auto& [b, p] : s.points) {
        if (p.plan_fits) CHECK(p.samples_per_s(true) <= s.points.at(s.fastest_plan).samples_per_s(true));
      }
    }
  }
}

TEST_CASE("batch search: affine memory takes the doubling and two more profiles per bracket") {
  const Model m{1000, 300, 100, 0, 0, false};
  const int64_t budget = 1000 + 100 * 37 + 50;  // the plan fits 37, no checkpointing 12
  std::set<int> asked;
  const BatchSearch s = SearchBatches(1 << 20, budget, [&](int b) {
    CHECK(asked.insert(b).second);  // never the same batch twice
    return Evaluate(m, budget, b);
  });
  CHECK(s.largest_plan == 37);
  CHECK(s.largest_none == 12);
  CHECK(asked == std::set<int>{1, 2, 4, 8, 16, 32, 64, 37, 38, 12, 13});
  CHECK(s.fastest_plan == 37);  // time per sample falls with the batch here
  CHECK(s.fastest_none == 12);
}

TEST_CASE("batch search: nothing fits, and everything up to the cap fits") {
  const Model m{1000, 300, 100, 0, 0, false};
  BatchSearch none = SearchBatches(64, 900, [&](int b) { return Evaluate(m, 900, b); });
  CHECK(none.largest_plan == 0);
  CHECK(none.largest_none == 0);
  CHECK(none.points.size() == 1);
  BatchSearch all = SearchBatches(100, 1 << 30, [&](int b) { return Evaluate(m, 1 << 30, b); });
  CHECK(all.largest_plan == 100);
  CHECK(all.largest_none == 100);
  CHECK(all.points.count(100) == 1);
}
