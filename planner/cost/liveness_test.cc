// Liveness: the storages crossing a cut, on a small profile of hand-chosen
// values (tests/test_profiles.h).

#include <doctest/doctest.h>

#include "tests/test_profiles.h"
#include "planner/contracts/profile.h"
#include "planner/cost/liveness.h"

using namespace ckplan;
using ckplan::testing::TwoBlockProfile;

TEST_CASE("a profile's liveness: what crosses a cut, a skip connection included") {
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  // Crossing before b.act: t2 (the skip) and t3, two tensors; before b.fc: one.
  CHECK(CutLoadAt(profile, 3).tensors == 2);
  CHECK(CutLoadAt(profile, 3).bytes == 2800);
  CHECK(CutLoadAt(profile, 2).tensors == 1);
}
