#include "ckplan/planner/plan.h"

#include <doctest/doctest.h>

#include "ckplan/planner/error.h"

using namespace ckplan;

TEST_CASE("the optimal solver's scale is checked before anything is allocated") {
  // Within the estimate: 100 stages at 500 slots is about 21 MB.
  CHECK(OptimalSolverBytesEstimate(100, 500) == doctest::Approx(101.0 * 101 * 64 + 101.0 * 102 / 2 * 501 * 8));
  CHECK_NOTHROW(CheckOptimalSolverScale(100, 500, 1e9));
  // Above the memory given: refused with both figures.
  CHECK_THROWS_WITH(CheckOptimalSolverScale(1000, 5000, 8e9),
                    doctest::Contains("the optimal solver would need up to 18.7 GiB for 1000 stages at 5000 slots, "
                                      "more than this machine's 7.45 GiB of memory"));
  try {
    CheckOptimalSolverScale(40000, 500, 1e18);
    FAIL("40000 stages passed");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kBadInput);
    CHECK(std::string(e.what()) == "the chain has 40000 stages; the optimal solver takes at most 32000");
  }
  // This machine's memory by default: no machine has 300 TiB.
  CHECK_THROWS_AS(CheckOptimalSolverScale(30000, 100000), Error);
}
