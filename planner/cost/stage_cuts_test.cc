// Cutting and naming: where a profile's stages are cut and what they are
// called, on a small profile of hand-chosen values (tests/test_profiles.h).

#include <doctest/doctest.h>

#include "tests/test_profiles.h"
#include "planner/contracts/profile.h"
#include "planner/cost/stage_cuts.h"

using namespace ckplan;
using ckplan::testing::TwoBlockProfile;

TEST_CASE("a profile's stages: cut where one tensor crosses, never inside a block with a skip connection") {
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  std::vector<StageCut> cuts = CutStages(profile);
  REQUIRE(cuts.size() == 3);
  CHECK(cuts[0].name == "a.fc");
  CHECK(cuts[1].name == "a.act");
  CHECK(cuts[2].name == "b");
  CHECK(cuts[2].first_op == 2);
  CHECK(cuts[2].last_op == 4);
}

TEST_CASE("a profile's stages: an encoder-decoder's decoder is cut between its blocks, the encoder's output crossing") {
  // The decoder is called with x and the encoder's output; each cut between
  // its blocks carries the hidden state and the encoder's output: as many,
  // no skip connection added.
  const Profile profile = ProfileFromJson(ckplan::testing::EncoderDecoderProfile(), "enc_dec.json");
  const std::vector<StageCut> cuts = CutStages(profile);
  std::vector<std::string> names;
  for (const StageCut& cut : cuts) names.push_back(cut.name);
  CHECK(names == std::vector<std::string>{"enc.fc", "enc.act", "dec.embed", "dec.block0", "dec.block1", "head"});
}
