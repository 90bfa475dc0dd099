#include "planner/contracts/chain.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/test_chains.h"
#include "planner/base/error.h"
#include "planner/plan/planner_input.h"

using namespace ckplan;

namespace {
nlohmann::json Valid() { return ChainToJson(testing::ThreeStageChain()); }

std::string ErrorOf(const nlohmann::json& doc) {
  try {
    ChainFromJson(doc, "c.json");
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kBadInput);
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a chain round-trips through JSON") {
  Chain back = ChainFromJson(Valid(), "c.json");
  CHECK(back.length() == 3);
  CHECK(back.input_bytes == 10);
  CHECK(back.stages[1].saved_bytes == 15);
  CHECK(back.stages[2].bwd_tmp_bytes == 7);
  CHECK(back.loss_bwd_ms == 0.5);
  CHECK(back.StageInputBytes(4) == 0);
  CHECK(back.StageInputBytes(3) == 8);
}

TEST_CASE("chains, plain and cut from a profile with storages, round-trip both ways") {
  const Chain plain = testing::RandomChain(12, 3);
  Chain cut = LoadPlannerInput(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json", "adam").chain;
  REQUIRE(cut.has_storages());
  cut.pytorch.module_call_storages["layers.0"] = {{7, 512}, {9, 64}};
  cut.pytorch.module_held_bytes["layers.0"] = 16;
  cut.pytorch.module_eager_peak_bytes["layers.0"] = 854016;
  for (const Chain& chain : {plain, cut}) {
    const nlohmann::json written = ChainToJson(chain);
    const Chain read = ChainFromJson(written, "c.json");
    CHECK(ChainToJson(read) == written);
    // The value: every field the chain holds.
    REQUIRE(read.length() == chain.length());
    CHECK(read.input_bytes == chain.input_bytes);
    CHECK(read.input_storages == chain.input_storages);
    CHECK(read.pytorch.module_call_storages == chain.pytorch.module_call_storages);
    CHECK(read.pytorch.module_held_bytes == chain.pytorch.module_held_bytes);
    CHECK(read.pytorch.module_eager_peak_bytes == chain.pytorch.module_eager_peak_bytes);
    CHECK(read.loss_bwd_ms == chain.loss_bwd_ms);
    CHECK(read.loss_bwd_tmp_bytes == chain.loss_bwd_tmp_bytes);
    for (int i = 0; i < chain.length(); ++i) {
      const Stage &a = read.stages[static_cast<size_t>(i)], &b = chain.stages[static_cast<size_t>(i)];
      CAPTURE(i);
      CHECK(a.name == b.name);
      CHECK(a.fwd_ms == b.fwd_ms);
      CHECK(a.bwd_ms == b.bwd_ms);
      CHECK(a.fwd_nograd_ms == b.fwd_nograd_ms);
      CHECK(a.out_bytes == b.out_bytes);
      CHECK(a.saved_bytes == b.saved_bytes);
      CHECK(a.fwd_tmp_bytes == b.fwd_tmp_bytes);
      CHECK(a.bwd_tmp_bytes == b.bwd_tmp_bytes);
      CHECK(a.modules == b.modules);
      CHECK(a.ops.has_value() == b.ops.has_value());
      if (a.ops && b.ops) {
        CHECK(a.ops->first == b.ops->first);
        CHECK(a.ops->last == b.ops->last);
      }
      CHECK(a.out_storages == b.out_storages);
      CHECK(a.private_saved_bytes == b.private_saved_bytes);
      CHECK(a.kept_out_storages == b.kept_out_storages);
    }
  }
}

TEST_CASE("chain errors name the file and the field") {
  nlohmann::json doc = Valid();
  doc["schema"] = "ckplan.chain/2";
  CHECK(ErrorOf(doc) == "c.json: field 'schema': made by a newer ckplan (chain/2); this one reads chain/1: use the "
                        "ckplan that made it, or make it again with this one");
  doc["schema"] = "ckplan.plan/1";
  CHECK(ErrorOf(doc) == "c.json: field 'schema': expected \"ckplan.chain/1\", got \"ckplan.plan/1\"");

  doc = Valid();
  doc["stages"][1].erase("saved_bytes");
  CHECK(ErrorOf(doc) == "c.json: field 'stages[1].saved_bytes': missing");

  doc = Valid();
  doc["stages"][2]["fwd_ms"] = -1.0;
  CHECK(ErrorOf(doc) == "c.json: field 'stages[2].fwd_ms': must not be negative, got -1.0");

  doc = Valid();
  doc["stages"][0]["out_bytes"] = -5;
  CHECK(ErrorOf(doc) == "c.json: field 'stages[0].out_bytes': must not be negative, got -5");

  doc = Valid();
  doc["stages"][0]["out_bytes"] = "big";
  CHECK(ErrorOf(doc) == "c.json: field 'stages[0].out_bytes': expected a byte count");

  doc = Valid();
  doc["stages"][0]["out_bytes"] = 1.5;
  CHECK(ErrorOf(doc) == "c.json: field 'stages[0].out_bytes': expected a whole number of bytes, got 1.5");

  doc = Valid();
  doc.erase("loss");
  CHECK(ErrorOf(doc) == "c.json: field 'loss': missing");

  doc = Valid();
  doc["stages"] = nlohmann::json::array();
  CHECK(ErrorOf(doc) == "c.json: field 'stages': a chain needs at least one stage");

  CHECK(ErrorOf(nlohmann::json::array()) == "c.json: field '<root>': expected an object");
}

TEST_CASE("chain values no model has, and inconsistent storages, are refused naming the field") {
  nlohmann::json doc = Valid();
  doc["stages"][1]["saved_bytes"] = INT64_MAX;
  CHECK(ErrorOf(doc) == "c.json: field 'stages[1].saved_bytes': too large: 9223372036854775807 B is above 1 PiB, "
                        "more than any model has");
  doc = Valid();
  doc["stages"][1]["saved_bytes"] = 18446744073709551615ULL;
  CHECK(ErrorOf(doc).find("field 'stages[1].saved_bytes': too large") != std::string::npos);
  doc = Valid();
  doc["stages"][0]["bwd_ms"] = 1e20;
  CHECK(ErrorOf(doc).find("field 'stages[0].bwd_ms': too large") != std::string::npos);
  doc = Valid();
  for (auto& stage : doc["stages"]) stage["fwd_tmp_bytes"] = int64_t{1} << 50;  // each at the limit
  for (int k = 0; k < 70; ++k) doc["stages"].push_back(doc["stages"][0]);
  CHECK(ErrorOf(doc).find("add up to more than 64 PiB") != std::string::npos);
  doc = Valid();
  doc["stages"][0]["first_op"] = 5;
  doc["stages"][0]["last_op"] = 4;
  CHECK(ErrorOf(doc).find("field 'stages[0].last_op': out of range 5..") != std::string::npos);

  // Storages: a cut of two ids, then the same id twice, a size that differs,
  // more than the value, and a saved_bytes below what the stage keeps.
  auto with_storages = [] {
    nlohmann::json d = Valid();
    d["input_storages"] = {{-1, 10}};
    d["stages"][0]["out_storages"] = {{1, 12}, {2, 8}};
    d["stages"][0]["private_saved_bytes"] = 10;
    d["stages"][1]["out_storages"] = {{3, 5}};
    d["stages"][1]["private_saved_bytes"] = 10;
    d["stages"][2]["out_storages"] = {{3, 5}};
    d["stages"][2]["private_saved_bytes"] = 12;
    return d;
  };
  CHECK(ErrorOf(with_storages()).empty());
  doc = with_storages();
  doc["stages"][0]["out_storages"] = {{1, 12}, {1, 8}};
  CHECK(ErrorOf(doc) == "c.json: field 'stages[0].out_storages[1]': storage id 1 is listed twice");
  doc = with_storages();
  doc["stages"][2]["out_storages"] = {{3, 4}};
  CHECK(ErrorOf(doc).find("field 'stages[2].out_storages[0]': storage id 3 has 4 B here but 5 B in "
                          "stages[1].out_storages[0]") != std::string::npos);
  doc = with_storages();
  doc["stages"][0]["out_storages"] = {{1, 12}, {2, 9}};
  CHECK(ErrorOf(doc).find("field 'stages[0].out_storages': its storages add up to 21 B, more than out_bytes 20 B") !=
        std::string::npos);
  doc = with_storages();
  doc["stages"][0]["private_saved_bytes"] = 11;  // 11 + 20 made > 30 saved
  CHECK(ErrorOf(doc) == "c.json: field 'stages[0].saved_bytes': 30 B is less than the stage's own part 11 B and "
                        "the storages it makes 20 B");
  doc = with_storages();
  doc["stages"][2]["private_saved_bytes"] = 13;  // storage 3 is carried from stage 1: only 13 > 12
  CHECK(ErrorOf(doc).find("field 'stages[2].private_saved_bytes': is above saved_bytes 12") != std::string::npos);
}

TEST_CASE("the PyTorch target's prices round-trip (absent: the schedule's stand for them), negative ones are refused") {
  Chain chain = testing::ThreeStageChain();
  const nlohmann::json plain = ChainToJson(chain);
  CHECK(!plain["stages"][0].contains("module_fwd_nograd_ms"));
  CHECK(!plain.contains("checkpoint_call_ms"));
  CHECK(!plain["loss"].contains("module_bwd_ms"));
  const Chain read_plain = ChainFromJson(plain, "c.json");
  CHECK(!read_plain.stages[1].module_fwd_nograd_ms);
  CHECK(read_plain.stages[1].ModuleNoGradFwdMs() == read_plain.stages[1].NoGradFwdMs());
  CHECK(read_plain.pytorch.checkpoint_call_ms == 0);
  CHECK(read_plain.ModuleLossBwdMs() == read_plain.loss_bwd_ms);
  chain.stages[1].module_fwd_nograd_ms = 0.375;
  chain.pytorch.checkpoint_call_ms = 0.0625;
  chain.module_loss_bwd_ms = 1.25;
  const nlohmann::json written = ChainToJson(chain);
  const Chain read = ChainFromJson(written, "c.json");
  CHECK(ChainToJson(read) == written);
  CHECK(read.stages[1].module_fwd_nograd_ms == 0.375);
  CHECK(read.stages[1].ModuleNoGradFwdMs() == 0.375);
  CHECK(!read.stages[0].module_fwd_nograd_ms);
  CHECK(read.pytorch.checkpoint_call_ms == 0.0625);
  CHECK(read.module_loss_bwd_ms == 1.25);
  // Negative (the ops timed one by one slower than the eager step), as long
  // as the step it leaves is not.
  Chain faster = chain;
  faster.module_loss_bwd_ms = -0.5;
  CHECK(ChainFromJson(ChainToJson(faster), "c.json").ModuleLossBwdMs() == -0.5);
  CHECK(read.ModuleNoRecomputeTimeMs() == doctest::Approx(read.NoRecomputeTimeMs() - read.loss_bwd_ms + 1.25));
  nlohmann::json doc = written;
  doc["stages"][1]["module_fwd_nograd_ms"] = -0.5;
  CHECK(ErrorOf(doc) == "c.json: field 'stages[1].module_fwd_nograd_ms': must not be negative, got -0.5");
  doc = written;
  doc["checkpoint_call_ms"] = -1.0;
  CHECK(ErrorOf(doc) == "c.json: field 'checkpoint_call_ms': must not be negative, got -1.0");
  doc = written;
  doc["loss"]["module_bwd_ms"] = -1e6;
  CHECK(ErrorOf(doc).find("field 'loss.module_bwd_ms': the step without recomputation it leaves is negative") !=
        std::string::npos);
  doc = written;
  doc["loss"]["module_bwd_ms"] = "slow";
  CHECK(ErrorOf(doc).find("field 'loss.module_bwd_ms'") != std::string::npos);
}
