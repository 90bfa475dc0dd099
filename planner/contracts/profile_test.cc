// The profile contract: what `ckplan profile` writes reads back to the same
// value and writes back to the same document.

#include "planner/contracts/profile.h"

#include <doctest/doctest.h>

#include "planner/base/error.h"
#include "planner/base/json_io.h"

using namespace ckplan;

TEST_CASE("the example profile round-trips through ckplan.profile/1") {
  const std::string file = std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json";
  const nlohmann::json written = ReadJsonFile(file);
  const Profile profile = ProfileFromJson(written, file);
  REQUIRE(!profile.ops.empty());
  const nlohmann::json again = ProfileToJson(profile);
  CHECK(again == written);
  // The value, through the document and back: every op and tensor the same.
  const Profile back = ProfileFromJson(again, "again.json");
  REQUIRE(back.ops.size() == profile.ops.size());
  REQUIRE(back.tensors.size() == profile.tensors.size());
  for (size_t k = 0; k < profile.ops.size(); ++k) {
    CAPTURE(k);
    CHECK(back.ops[k].kind == profile.ops[k].kind);
    CHECK(back.ops[k].saved_bytes == profile.ops[k].saved_bytes);
    CHECK(back.ops[k].fwd_ms == profile.ops[k].fwd_ms);
    CHECK(back.ops[k].inputs == profile.ops[k].inputs);
  }
  CHECK(ProfileToJson(back) == again);
  // An op's backward measured over all its autograd nodes, where a profile has it.
  CHECK(!back.ops[0].bwd_span_peak_bytes);
  Profile spanned = profile;
  spanned.ops[0].bwd_span_peak_bytes = 4096;
  CHECK(ProfileFromJson(ProfileToJson(spanned), "spanned.json").ops[0].bwd_span_peak_bytes == 4096);
  // The tensors each module is called with, where the export kept the call signatures.
  CHECK(back.module_inputs.empty());
  Profile called = profile;
  const int last = static_cast<int>(profile.tensors.size()) - 1;
  called.module_inputs = {{"layers.0", {0, last}}, {"layers.1", {last}}};
  CHECK(ProfileFromJson(ProfileToJson(called), "called.json").module_inputs == called.module_inputs);
  nlohmann::json bad = ProfileToJson(called);
  bad["module_inputs"]["layers.1"] = {last + 1};
  CHECK_THROWS_WITH_AS(ProfileFromJson(bad, "bad.json"), doctest::Contains("tensor id out of range"), ckplan::Error);
  // The Python numbers an op's eager autograd node keeps, where it keeps any.
  CHECK(back.ops[0].wrapped_number_bytes == 0);
  CHECK(!ProfileToJson(back)["ops"][0].contains("wrapped_number_bytes"));
  Profile scaled = profile;
  scaled.ops[0].wrapped_number_bytes = 8;
  CHECK(ProfileFromJson(ProfileToJson(scaled), "scaled.json").ops[0].wrapped_number_bytes == 8);
  nlohmann::json negative = ProfileToJson(scaled);
  negative["ops"][0]["wrapped_number_bytes"] = -8;
  CHECK_THROWS_AS(ProfileFromJson(negative, "negative.json"), ckplan::Error);
  // What each module's eager forward held at its peak, where measured.
  CHECK(!ProfileToJson(back).contains("module_eager_peak_bytes"));
  Profile eager = profile;
  eager.module_eager_peak_bytes = {{"layers.0", 854016}, {"layers.1", 0}};
  CHECK(ProfileFromJson(ProfileToJson(eager), "eager.json").module_eager_peak_bytes == eager.module_eager_peak_bytes);
  nlohmann::json below = ProfileToJson(eager);
  below["module_eager_peak_bytes"]["layers.0"] = -1;
  CHECK_THROWS_WITH_AS(ProfileFromJson(below, "below.json"), doctest::Contains("module_eager_peak_bytes"), ckplan::Error);
}
