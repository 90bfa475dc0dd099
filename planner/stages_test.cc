// From a profile to a chain: the cost model of stages, on a small profile
// whose stage values are computed by hand below (torch-free: the LibTorch
// tests check the same code on real models, these pin each term).

#include "ckplan/planner/stages.h"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "ckplan/planner/profile.h"

using namespace ckplan;

namespace {

// Five ops in two blocks; block b has a skip connection (t2 is read by b's
// add), so it is one stage. Storage ids are the tensor ids.
//   t0 (x, 1000 B) -> a.fc -> t1 (2000, freed after use) -> a.act -> t2 (2000, kept by relu)
//   t2 -> b.fc -> t3 (800, freed) -> b.act -> t4 (800, kept by tanh)
//   b: add(t4, t2) -> t5 (800, the model output)
nlohmann::json TwoBlockProfile() {
  auto tensor = [](int id, int64_t bytes, int producer, bool kept) {
    return nlohmann::json{{"id", id},           {"shape", {bytes / 4}}, {"dtype", "Float"},
                          {"bytes", bytes},     {"requires_grad", producer >= 0},
                          {"producer", producer}, {"kept", kept}};
  };
  auto op = [](int id, const char* kind, const char* module, std::vector<int> inputs, int output,
               int64_t saved, int64_t fwd_tmp, int64_t bwd_tmp, double fwd_ms, double bwd_ms) {
    return nlohmann::json{{"id", id},           {"kind", kind},       {"module", module},
                          {"inputs", inputs},   {"outputs", {output}}, {"saved_bytes", saved},
                          {"fwd_tmp_bytes", fwd_tmp}, {"bwd_tmp_bytes", bwd_tmp},
                          {"fwd_ms", fwd_ms},   {"bwd_ms", bwd_ms}};
  };
  return {{"schema", "ckplan.profile/1"},
          {"model", {{"path", "two_blocks.pt"}}},
          {"totals",
           {{"param_bytes", 0}, {"buffer_bytes", 0}, {"input_bytes", 1000}, {"saved_bytes", 2800},
            {"output_bytes", 800}, {"fwd_ms", 3.875}, {"bwd_ms", 6.875}, {"peak_bytes", 9000}}},
          {"inputs", {0}},
          {"outputs", {5}},
          {"tensors",
           {tensor(0, 1000, -1, false), tensor(1, 2000, 0, false), tensor(2, 2000, 1, true),
            tensor(3, 800, 2, false), tensor(4, 800, 3, true), tensor(5, 800, 4, false)}},
          {"ops",
           {op(0, "aten::linear", "a.fc", {0}, 1, 0, 100, 500, 1.0, 2.0),
            op(1, "aten::relu", "a.act", {1}, 2, 2000, 0, 2000, 0.5, 0.25),
            op(2, "aten::linear", "b.fc", {2}, 3, 0, 50, 3000, 2.0, 4.0),
            op(3, "aten::tanh", "b.act", {3}, 4, 800, 0, 800, 0.125, 0.5),
            op(4, "aten::add", "b", {4, 2}, 5, 0, 0, 0, 0.25, 0.125)}}};
}

}  // namespace

TEST_CASE("a profile's stages: cut where one tensor crosses, never inside a block with a skip connection") {
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  std::vector<StageCut> cuts = CutStages(profile);
  REQUIRE(cuts.size() == 3);
  CHECK(cuts[0].name == "a.fc");
  CHECK(cuts[1].name == "a.act");
  CHECK(cuts[2].name == "b");
  CHECK(cuts[2].first_op == 2);
  CHECK(cuts[2].last_op == 4);
  // Crossing before b.act: t2 (the skip) and t3, two tensors; before b.fc: one.
  CHECK(CutLoadAt(profile, 3).tensors == 2);
  CHECK(CutLoadAt(profile, 3).bytes == 2800);
  CHECK(CutLoadAt(profile, 2).tensors == 1);
}

TEST_CASE("a profile's chain: every stage term computed by hand") {
  Chain chain = ChainFromProfile(ProfileFromJson(TwoBlockProfile(), "two_blocks.json"));
  REQUIRE(chain.stages.size() == 3);
  CHECK(chain.input_bytes == 1000);
  const Stage& fc = chain.stages[0];
  const Stage& act = chain.stages[1];
  const Stage& b = chain.stages[2];

  // a.fc: its output t1 is freed by the model after relu reads it, but in the
  // chain it is the next stage's input and kept for backward with it.
  CHECK(fc.fwd_ms == 1.0);
  CHECK(fc.bwd_ms == 2.0);
  CHECK(fc.out_bytes == 2000);
  CHECK(fc.saved_bytes == 2000);          // op saves 0 + its output t1 (not kept by the model)
  CHECK(fc.private_saved_bytes == 0);     // all of it is the cut's storage
  CHECK(fc.fwd_tmp_bytes == 100);         // t1 (2000) + the op's transient 100, above the output
  CHECK(fc.bwd_tmp_bytes == 500);         // the op's backward transient; x needs no gradient
  CHECK(fc.kept_out_storages.empty());

  // a.act: relu keeps its output t2, which is the cut.
  CHECK(act.out_bytes == 2000);
  CHECK(act.saved_bytes == 2000);
  CHECK(act.private_saved_bytes == 0);
  CHECK(act.fwd_tmp_bytes == 0);
  CHECK(act.bwd_tmp_bytes == 0);          // 2000 transient less the input's gradient (2000), counted in the chain
  REQUIRE(act.kept_out_storages.size() == 1);
  CHECK(act.kept_out_storages[0] == 2);

  // b: three ops; t3 dies inside the stage, t4 is kept by tanh, t5 leaves.
  CHECK(b.fwd_ms == 2.375);
  CHECK(b.bwd_ms == 4.625);
  CHECK(b.out_bytes == 800);
  CHECK(b.saved_bytes == 1600);           // tanh's t4 (800) + the output t5 (800)
  CHECK(b.private_saved_bytes == 800);    // t4
  // Forward: after tanh, t3 and t4 are live (1600) with t5 not yet made:
  // 1600 - 800 (the output, counted apart) = 800.
  CHECK(b.fwd_tmp_bytes == 800);
  // Backward in reverse: add leaves t4's gradient (800); tanh then holds it
  // plus its transient (800) = 1600; b.fc's transient 3000 is the largest.
  CHECK(b.bwd_tmp_bytes == 3000);
  REQUIRE(b.out_storages.size() == 1);
  CHECK(b.out_storages[0] == std::pair<int64_t, int64_t>{5, 800});
}

TEST_CASE("a profile's chain: a stage's backward transient counts the gradients it holds") {
  // b.fc's transient made small: the peak is then tanh's, on top of the
  // gradient of t4 that add left.
  nlohmann::json doc = TwoBlockProfile();
  doc["ops"][2]["bwd_tmp_bytes"] = 100;
  Chain chain = ChainFromProfile(ProfileFromJson(doc, "two_blocks.json"));
  CHECK(chain.stages[2].bwd_tmp_bytes == 1600);
  // The forward transient: b.fc's 50 on top of t3 is below the 800 after tanh.
  doc["ops"][2]["fwd_tmp_bytes"] = 1000;
  chain = ChainFromProfile(ProfileFromJson(doc, "two_blocks.json"));
  CHECK(chain.stages[2].fwd_tmp_bytes == 1000);  // t3 (800) + 1000 - 800
}
