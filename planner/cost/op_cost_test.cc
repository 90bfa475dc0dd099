#include "planner/cost/op_cost.h"

#include <doctest/doctest.h>

using namespace ckplan;

TEST_CASE("FitOpCost recovers an exact law: 20 us + 1 us per 10 kFLOP + 1 us per 4 KB of weight") {
  const LinearOpCost truth{20, 1e-4, 0, 2.5e-4};
  std::vector<OpCostSample> samples;
  for (const OpFeatures f : {OpFeatures{1e4, 0, 4e3}, OpFeatures{1e6, 0, 4e3}, OpFeatures{1e6, 0, 4e6},
                             OpFeatures{1e8, 0, 1e5}, OpFeatures{1e3, 0, 0}}) {
    samples.push_back({f, truth.Us(f)});
  }
  const LinearOpCost fit = FitOpCost(samples);
  CHECK(fit.fixed_us == doctest::Approx(20));
  CHECK(fit.flop_us == doctest::Approx(1e-4));
  CHECK(fit.weight_byte_us == doctest::Approx(2.5e-4));
  CHECK(fit.byte_us == 0);
}

TEST_CASE("FitOpCost: coefficients are never negative, one sample gives a fixed cost") {
  // Times that fall with bytes: a negative per-byte cost fits them best, so
  // the law keeps the fixed cost alone (the mean in relative error: 1 / mean(1 / us)).
  const LinearOpCost flat = FitOpCost({{{0, 1e3, 0}, 10}, {{0, 1e6, 0}, 8}});
  CHECK(flat.byte_us == 0);
  CHECK(flat.fixed_us == doctest::Approx((1.0 / 10 + 1.0 / 8) / (1.0 / 100 + 1.0 / 64)));
  // One sample: every one-feature law fits it exactly; the fixed cost comes first.
  const LinearOpCost one = FitOpCost({{{0, 1e6, 0}, 100}});
  CHECK(one.fixed_us == doctest::Approx(100));
  CHECK(one.byte_us == 0);
  // Memory-bound samples: 5 us + 1 us per 10 KB.
  const LinearOpCost mem = FitOpCost({{{0, 1e4, 0}, 6}, {{0, 1e5, 0}, 15}, {{0, 1e6, 0}, 105}});
  CHECK(mem.fixed_us == doctest::Approx(5));
  CHECK(mem.byte_us == doctest::Approx(1e-4));
  CHECK(FitOpCost({}).Us({1, 1, 1}) == 0);
}
