// From a profile to a chain: the cost model of stages, on a small profile
// whose stage values are computed by hand below (torch-free: the LibTorch
// tests check the same code on real models, these pin each term).
// The profile is TwoBlockProfile (tests/test_profiles.h).

#include <doctest/doctest.h>

#include <map>
#include <string>

#include "tests/test_profiles.h"
#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/contracts/profile.h"
#include "planner/cost/chain_from_profile.h"

using namespace ckplan;
using ckplan::testing::TwoBlockProfile;

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

TEST_CASE("a profile's chain: the Python numbers an op keeps are saved, and held by every wrapped module around it") {
  nlohmann::json doc = TwoBlockProfile();
  doc["ops"][3]["kind"] = "aten::mul";  // b.act: `x * 0.5` keeps the 0.5 as an 8-byte host tensor
  doc["ops"][3]["wrapped_number_bytes"] = 8;
  const Chain plain = ChainFromProfile(ProfileFromJson(TwoBlockProfile(), "two_blocks.json"));
  const Chain chain = ChainFromProfile(ProfileFromJson(doc, "scaled.json"));
  REQUIRE(chain.stages.size() == 3);
  CHECK(chain.stages[2].saved_bytes == plain.stages[2].saved_bytes + 8);
  CHECK(*chain.stages[2].private_saved_bytes == *plain.stages[2].private_saved_bytes + 8);
  CHECK(chain.stages[0].saved_bytes == plain.stages[0].saved_bytes);
  CHECK(plain.pytorch.module_held_bytes.empty());
  CHECK(chain.pytorch.module_held_bytes == std::map<std::string, int64_t>{{"b", 8}, {"b.act", 8}});
}

TEST_CASE("a profile's chain carries what each module's eager forward held at its peak") {
  nlohmann::json doc = TwoBlockProfile();
  doc["module_eager_peak_bytes"] = {{"b", 4000}};
  CHECK(ChainFromProfile(ProfileFromJson(TwoBlockProfile(), "two_blocks.json")).pytorch.module_eager_peak_bytes.empty());
  const Chain chain = ChainFromProfile(ProfileFromJson(doc, "eager.json"));
  CHECK(chain.pytorch.module_eager_peak_bytes == std::map<std::string, int64_t>{{"b", 4000}});
  CHECK(ChainFromJson(ChainToJson(chain), "c.json").pytorch.module_eager_peak_bytes == chain.pytorch.module_eager_peak_bytes);
}

TEST_CASE("a profile's chain: with autograd, what an op saves beyond its outputs stays under the transients after it") {
  // b.fc saves 400 B of its own (not its output t3: attention's
  // probabilities, a dropout mask); b's forward then peaks after tanh with
  // t3, t4 and those 400 B: 800 above its output, 1200 with them.
  nlohmann::json doc = TwoBlockProfile();
  doc["ops"][2]["saved_bytes"] = 400;
  const Chain plain = ChainFromProfile(ProfileFromJson(TwoBlockProfile(), "two_blocks.json"));
  const Chain chain = ChainFromProfile(ProfileFromJson(doc, "internal.json"));
  CHECK(plain.stages[2].fwd_tmp_bytes == 800);
  CHECK(chain.stages[2].fwd_tmp_bytes == 1200);
  CHECK(chain.stages[2].saved_bytes == plain.stages[2].saved_bytes + 400);
  // An op whose saved bytes are its kept output adds nothing of its own (tanh's t4: unchanged above).
  CHECK(chain.stages[0].fwd_tmp_bytes == plain.stages[0].fwd_tmp_bytes);
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

TEST_CASE("a profile's chain is checked when it is built: one beyond the planner's limits is refused") {
  // Each tensor within the profile reader's per-field limit, the stages'
  // bytes together beyond kMaxTotalBytes: ValidateChain refuses the chain,
  // naming the file, as it refuses the same chain read from a chain file.
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  for (TensorRecord& t : profile.tensors) t.bytes = kMaxTotalBytes / 4;
  try {
    ChainFromProfile(profile, "big.json");
    FAIL("a chain beyond kMaxTotalBytes was built");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kBadInput);
    const std::string what = e.what();
    CHECK(what.find("big.json: the chain cut from it: field 'stages'") != std::string::npos);
  }
}

TEST_CASE("a profile's chain: a stage run without autograd costs its ops as a step runs them and the executor's stage run") {
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  for (OpRecord& op : profile.ops) op.fwd_nograd_ms = op.fwd_ms / 2;
  // Without the measured recomputation cost: the ops' forward without autograd.
  const Chain plain = ChainFromProfile(profile);
  REQUIRE(plain.stages.size() == 3);
  CHECK(plain.stages[0].fwd_nograd_ms == doctest::Approx(0.5));
  CHECK(plain.stages[2].fwd_nograd_ms == doctest::Approx(2.375 / 2));
  // With it: the ops scaled as a step runs them, plus one stage run each;
  // the forward with autograd (the step without recomputation) unchanged.
  profile.calibration.nograd_scale = 1.25;
  profile.calibration.stage_run_ms = 0.01;
  const Chain chain = ChainFromProfile(profile);
  for (size_t s = 0; s < chain.stages.size(); ++s) {
    CAPTURE(s);
    CHECK(chain.stages[s].fwd_nograd_ms == doctest::Approx(1.25 * *plain.stages[s].fwd_nograd_ms + 0.01));
    CHECK(chain.stages[s].fwd_ms == plain.stages[s].fwd_ms);
  }
  // Through the contract, in the `calibration` object: the fields read back,
  // with the stages they were measured on; a negative one is refused.
  profile.calibration.stages = {{0, 0}, {1, 1}, {2, 4}};
  const nlohmann::json doc = ProfileToJson(profile);
  CHECK(doc["calibration"]["stage_run_ms"] == 0.01);
  CHECK(doc["calibration"]["nograd_scale"] == 1.25);
  CHECK(doc["calibration"]["stages"] == nlohmann::json::parse("[[0, 0], [1, 1], [2, 4]]"));
  CHECK(!doc["totals"].contains("stage_run_ms"));
  const Profile back = ProfileFromJson(doc, "back.json");
  CHECK(back.calibration.stage_run_ms == 0.01);
  CHECK(back.calibration.nograd_scale == 1.25);
  REQUIRE(back.calibration.stages.size() == 3);
  CHECK(back.calibration.stages[2].first == 2);
  CHECK(back.calibration.stages[2].last == 4);
  CHECK(!ProfileToJson(ProfileFromJson(TwoBlockProfile(), "two_blocks.json")).contains("calibration"));
  nlohmann::json bad = doc;
  bad["calibration"]["stage_run_ms"] = -1;
  CHECK_THROWS_WITH_AS(ProfileFromJson(bad, "bad.json"), doctest::Contains("calibration.stage_run_ms"), Error);
  bad = doc;
  bad["calibration"]["stages"][1] = {3, 2};
  CHECK_THROWS_WITH_AS(ProfileFromJson(bad, "bad.json"), doctest::Contains("calibration.stages[1]"), Error);
  // A profile made before the figures were one object, with them under
  // `totals`: it reads the same, and its chain is the same.
  nlohmann::json old = doc;
  for (const char* field : {"stage_run_ms", "nograd_scale"}) old["totals"][field] = doc["calibration"][field];
  old.erase("calibration");
  const Profile read_old = ProfileFromJson(old, "old.json");
  CHECK(read_old.calibration.stage_run_ms == 0.01);
  CHECK(read_old.calibration.nograd_scale == 1.25);
  CHECK(read_old.calibration.stages.empty());
  CHECK(ChainToJson(ChainFromProfile(read_old)) == ChainToJson(ChainFromProfile(back)));
  // Stages recorded by another cutter than this build's: the figures are per
  // stage run and per ms of ops, so they price this build's stages alike.
  nlohmann::json other = doc;
  other["calibration"]["stages"] = nlohmann::json::parse("[[0, 2], [3, 4]]");
  CHECK(ChainToJson(ChainFromProfile(ProfileFromJson(other, "other.json"))) == ChainToJson(ChainFromProfile(back)));
}

TEST_CASE("a profile's chain: the step without recomputation is the one `ckplan run` runs, where the profile measured it") {
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  double ops_ms = 0;
  for (const OpRecord& op : profile.ops) ops_ms += op.fwd_ms + op.bwd_ms;
  const auto no_recompute_ms = [](const Chain& chain) {
    double ms = chain.loss_bwd_ms;
    for (const Stage& s : chain.stages) ms += s.fwd_ms + s.bwd_ms;
    return ms;
  };
  // The step timed whole: the loss is what its ops leave.
  profile.totals.step_ms = ops_ms + 0.5;
  CHECK(ChainFromProfile(profile).loss_bwd_ms == doctest::Approx(0.5));
  // The step as the executor runs it, adam's update included: the chain's
  // step without recomputation, with adam's update, is that step.
  profile.totals.optimizer_step_ms = {{"sgd", 0.1}, {"adam", 0.4}};
  profile.calibration.run_step_ms = ops_ms + 1.25;
  const Chain chain = ChainFromProfile(profile);
  CHECK(chain.loss_bwd_ms == doctest::Approx(0.85));
  CHECK(no_recompute_ms(chain) + 0.4 == doctest::Approx(*profile.calibration.run_step_ms));
  // A step measured faster than its ops timed one by one: no negative loss.
  profile.calibration.run_step_ms = ops_ms / 2;
  CHECK(ChainFromProfile(profile).loss_bwd_ms == 0);
  // Without adam's update measured, what run_step_ms includes is unknown: the step timed whole.
  profile.calibration.run_step_ms = ops_ms + 1.25;
  profile.totals.optimizer_step_ms.erase("adam");
  CHECK(ChainFromProfile(profile).loss_bwd_ms == doctest::Approx(0.5));
  // Through the contract: read back; a negative one refused; absent when not measured.
  const nlohmann::json doc = ProfileToJson(profile);
  CHECK(doc["calibration"]["run_step_ms"] == profile.calibration.run_step_ms);
  CHECK(ProfileFromJson(doc, "back.json").calibration.run_step_ms == profile.calibration.run_step_ms);
  CHECK(!ProfileToJson(ProfileFromJson(TwoBlockProfile(), "two_blocks.json")).contains("calibration"));
  nlohmann::json bad = doc;
  bad["calibration"]["run_step_ms"] = -2;
  CHECK_THROWS_WITH_AS(ProfileFromJson(bad, "bad.json"), doctest::Contains("run_step_ms"), Error);
}

TEST_CASE("a profile's chain: the PyTorch target's prices from the step as `ckplan run` runs it eagerly") {
  Profile profile = ProfileFromJson(TwoBlockProfile(), "two_blocks.json");
  for (OpRecord& op : profile.ops) op.fwd_nograd_ms = op.fwd_ms / 2;
  double ops_ms = 0;
  for (const OpRecord& op : profile.ops) ops_ms += op.fwd_ms + op.bwd_ms;
  profile.totals.optimizer_step_ms = {{"adam", 0.4}};
  profile.calibration.nograd_scale = 1.25;
  profile.calibration.stage_run_ms = 0.01;
  profile.calibration.run_step_ms = ops_ms + 1.25;
  const Chain schedule = ChainFromProfile(profile);
  // Not measured: the schedule's prices stand for the PyTorch target's.
  for (const Stage& s : schedule.stages) CHECK(!s.module_fwd_nograd_ms);
  CHECK(schedule.pytorch.checkpoint_call_ms == 0);
  CHECK(!schedule.module_loss_bwd_ms);
  // Measured: each stage's ops at the scale inside a wrapped module (no
  // stage run: the wrap's fixed cost is the chain's), the eager step's loss
  // less adam's update; the schedule target's prices unchanged.
  profile.calibration.module_step_ms = ops_ms + 2.0;
  profile.calibration.module_nograd_scale = 1.5;
  profile.calibration.checkpoint_call_ms = 0.125;
  const Chain chain = ChainFromProfile(profile);
  REQUIRE(chain.stages.size() == schedule.stages.size());
  for (size_t s = 0; s < chain.stages.size(); ++s) {
    CAPTURE(s);
    double nograd = 0;
    for (int op = chain.stages[s].ops->first; op <= chain.stages[s].ops->last; ++op) {
      nograd += *profile.ops[static_cast<size_t>(op)].fwd_nograd_ms;
    }
    CHECK(chain.stages[s].module_fwd_nograd_ms == doctest::Approx(1.5 * nograd));
    CHECK(chain.stages[s].fwd_nograd_ms == schedule.stages[s].fwd_nograd_ms);
    CHECK(chain.stages[s].fwd_ms == schedule.stages[s].fwd_ms);
  }
  CHECK(chain.pytorch.checkpoint_call_ms == 0.125);
  REQUIRE(chain.module_loss_bwd_ms);
  CHECK(*chain.module_loss_bwd_ms == doctest::Approx(2.0 - 0.4));
  CHECK(chain.loss_bwd_ms == schedule.loss_bwd_ms);
  CHECK(chain.ModuleNoRecomputeTimeMs() + 0.4 == doctest::Approx(*profile.calibration.module_step_ms));
  CHECK(chain.NoRecomputeTimeMs() == schedule.NoRecomputeTimeMs());
  // An eager step measured faster than its ops timed one by one: a negative
  // loss, the step without recomputation still that step; never below 0.
  profile.calibration.module_step_ms = ops_ms / 2;
  const Chain faster = ChainFromProfile(profile);
  CHECK(*faster.module_loss_bwd_ms < 0);
  CHECK(faster.ModuleNoRecomputeTimeMs() + 0.4 == doctest::Approx(ops_ms / 2));
  CHECK(faster.NoRecomputeTimeMs() == schedule.NoRecomputeTimeMs());
  profile.calibration.module_step_ms = 0.1;  // below adam's update alone
  CHECK(ChainFromProfile(profile).ModuleNoRecomputeTimeMs() == doctest::Approx(0).epsilon(1e-9));
  profile.calibration.module_step_ms = ops_ms / 2;
  // Through the contract: read back; negative ones refused; absent when not measured.
  const nlohmann::json doc = ProfileToJson(profile);
  const Profile back = ProfileFromJson(doc, "back.json");
  CHECK(back.calibration.module_step_ms == profile.calibration.module_step_ms);
  CHECK(back.calibration.module_nograd_scale == 1.5);
  CHECK(back.calibration.checkpoint_call_ms == 0.125);
  const nlohmann::json plain = ProfileToJson(ProfileFromJson(TwoBlockProfile(), "two_blocks.json"));
  for (const char* field : {"module_step_ms", "module_nograd_scale", "checkpoint_call_ms"}) {
    CAPTURE(field);
    CHECK(!plain["totals"].contains(field));
    CHECK(!plain.contains("calibration"));
    nlohmann::json bad = doc;
    bad["calibration"][field] = -0.5;
    CHECK_THROWS_WITH_AS(ProfileFromJson(bad, "bad.json"), doctest::Contains(field), Error);
  }
}

TEST_CASE("a profile's chain: beside a model's own loss, the loop holds its other outputs, those no op keeps") {
  // As if the model returned (loss, t3, t4): its output object holds t3
  // (800 B, kept by no op) to the step's end; t4 is kept by tanh, counted there.
  const Chain plain = ChainFromProfile(ProfileFromJson(TwoBlockProfile(), "two_blocks.json"));
  CHECK(plain.output_held_bytes == 800);
  nlohmann::json doc = TwoBlockProfile();
  doc["held_outputs"] = {3, 4};
  const Profile profile = ProfileFromJson(doc, "held.json");
  CHECK(profile.held_outputs == std::vector<int>{3, 4});
  CHECK(ProfileFromJson(ProfileToJson(profile), "again.json").held_outputs == profile.held_outputs);
  CHECK(ChainFromProfile(profile).output_held_bytes == 800 + 800);
  // t4, which tanh saves, is counted in stage b until b's backward releases
  // it; the loop holds it on through the update.
  const Chain held = ChainFromProfile(profile);
  CHECK(held.output_kept_bytes == 800);
  CHECK(held.output_kept_stage == 2);
  CHECK(plain.output_kept_bytes == 0);
  CHECK(!plain.output_kept_stage);
  const Chain back = ChainFromJson(ChainToJson(held), "held_chain.json");
  CHECK(back.output_kept_bytes == 800);
  CHECK(back.output_kept_stage == 2);
  Chain none = held;
  none.output_kept_bytes = 0;
  none.output_kept_stage = 1;  // bytes without a stage, or a stage without bytes: refused
  CHECK_THROWS_AS(ValidateChain(none, "bad.json", ""), ckplan::Error);
  doc["held_outputs"] = {9};
  CHECK_THROWS_AS(ProfileFromJson(doc, "bad.json"), ckplan::Error);
}
