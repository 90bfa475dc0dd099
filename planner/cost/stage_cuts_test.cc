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
  // x (the model input) -> enc.fc -> enc.act (the encoder's output, read by
  // every decoder block); dec.embed embeds x again, then dec.block0 and
  // dec.block1 read the hidden state and the encoder's output. The decoder
  // is called with x and the encoder's output; each cut between its blocks
  // carries the hidden state and the encoder's output: as many, no skip
  // connection added.
  auto tensor = [](int id, int64_t bytes, int producer, bool kept) {
    return nlohmann::json{{"id", id},           {"shape", {bytes / 4}}, {"dtype", "Float"},
                          {"bytes", bytes},     {"requires_grad", producer >= 0},
                          {"producer", producer}, {"kept", kept}};
  };
  auto op = [](int id, const char* kind, const char* module, std::vector<int> inputs, int output) {
    return nlohmann::json{{"id", id},         {"kind", kind},        {"module", module},
                          {"inputs", inputs}, {"outputs", {output}}, {"saved_bytes", 800},
                          {"fwd_tmp_bytes", 0}, {"bwd_tmp_bytes", 800}, {"fwd_ms", 1.0}, {"bwd_ms", 2.0}};
  };
  const nlohmann::json doc = {
      {"schema", "ckplan.profile/1"},
      {"model", {{"path", "enc_dec.pt2"}}},
      {"totals",
       {{"param_bytes", 0}, {"buffer_bytes", 0}, {"input_bytes", 1000}, {"saved_bytes", 4800},
        {"output_bytes", 800}, {"fwd_ms", 6.0}, {"bwd_ms", 12.0}, {"peak_bytes", 9000}}},
      {"inputs", {0}},
      {"outputs", {6}},
      {"tensors",
       {tensor(0, 1000, -1, false), tensor(1, 800, 0, true), tensor(2, 800, 1, true), tensor(3, 800, 2, true),
        tensor(4, 800, 3, true), tensor(5, 800, 4, true), tensor(6, 800, 5, false)}},
      {"ops",
       {op(0, "aten::linear", "enc.fc", {0}, 1), op(1, "aten::relu", "enc.act", {1}, 2),
        op(2, "aten::embedding", "dec.embed", {0}, 3), op(3, "aten::linear", "dec.block0", {3, 2}, 4),
        op(4, "aten::linear", "dec.block1", {4, 2}, 5), op(5, "aten::linear", "head", {5}, 6)}}};
  const std::vector<StageCut> cuts = CutStages(ProfileFromJson(doc, "enc_dec.json"));
  std::vector<std::string> names;
  for (const StageCut& cut : cuts) names.push_back(cut.name);
  CHECK(names == std::vector<std::string>{"enc.fc", "enc.act", "dec.embed", "dec.block0", "dec.block1", "head"});
}
