// The plan contract: every plan `ckplan solve` can write reads back to the
// same value and writes back to the same document.

#include "planner/contracts/plan_document.h"

#include <doctest/doctest.h>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/cost/optimizer_memory.h"
#include "planner/cost/sac_candidates.h"
#include "planner/plan/plan.h"
#include "planner/plan/plan_to_document.h"
#include "planner/plan/planner_input.h"
#include "planner/solvers/modules.h"
#include "planner/solvers/recurrence.h"
#include "tests/test_chains.h"
#include "tests/test_errors.h"

using namespace ckplan;

namespace {

// The source of a plan made from a chain file.
PlanSource ChainSource(const std::string& path) {
  PlanSource source;
  source.kind = "chain";
  source.path = path;
  return source;
}

}  // namespace
using namespace ckplan::testing;

namespace {

std::string ExampleProfile() { return std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json"; }

// Both directions: the document through the value and back, and the value
// through the document and back.
void CheckRoundTrip(const nlohmann::json& written) {
  const PlanDocument read = PlanFromJson(written, "plan.json");
  CHECK(PlanToJson(read) == written);
  CHECK(PlanFromJson(PlanToJson(read), "again.json") == read);
  CHECK(PlanToJson(read).dump(2) == written.dump(2));
}

}  // namespace

TEST_CASE("plans of every algorithm and target made from a profile round-trip") {
  PlannerInput in = LoadPlannerInput(ExampleProfile(), "adam");
  const int64_t budget = in.fixed.total() + in.profile.totals.saved_bytes * 3 / 5 + in.chain.input_bytes * 4;
  std::vector<WrappableModule> modules = WrappableModules(in.chain, &in.profile);
  int written = 0;
  for (Algorithm algorithm : {Algorithm::kOptimal, Algorithm::kNone, Algorithm::kEvery, Algorithm::kEveryN,
                              Algorithm::kSqrt}) {
    for (bool pytorch : {false, true}) {
      PlanRequest request;
      request.algorithm = algorithm;
      request.budget.bytes = budget;
      request.every_n = 3;
      if (pytorch) request.pytorch_modules = &modules;
      Plan plan = MakePlan(in.chain, in.fixed, request);
      CAPTURE(AlgorithmName(algorithm));
      CAPTURE(pytorch);
      nlohmann::json doc = PlanToJson(plan, in.chain, in.source);
      CheckRoundTrip(doc);
      const PlanDocument read = PlanFromJson(doc, "plan.json");
      // The value holds what the planner decided, not a copy of the text.
      CHECK(read.algorithm == AlgorithmName(algorithm));
      CHECK(read.stages.size() == static_cast<size_t>(in.chain.length()));
      CHECK(read.schedule == plan.schedule);
      CHECK(read.checkpointed_stages == plan.checkpointed_stages);
      CHECK(read.predicted.peak_bytes == plan.peak_bytes);
      CHECK(read.predicted.time_ms == plan.time_ms);
      CHECK(read.fixed.total() == in.fixed.total());
      CHECK(doc["fixed"]["total_bytes"] == in.fixed.total());
      CHECK(read.checkpoint_modules == plan.pytorch.checkpoint_modules);
      CHECK(doc["pytorch"]["checkpoint_modules"] == doc["checkpoint_modules"]);
      CHECK(read.slots.has_value() == (algorithm == Algorithm::kOptimal));
      CHECK(read.unit_style == std::optional<std::string>("decimal"));
      ++written;
    }
  }
  CHECK(written == 10);
}

TEST_CASE("a plan's strategy table round-trips and is refused field by field") {
  const Chain chain = ThreeStageChain();
  PlanRequest request;
  request.budget.bytes = int64_t{1} << 40;
  PlanDocument document = MakePlanDocument(MakePlan(chain, FixedMemory{}, request), chain, ChainSource("c"));
  CHECK(!PlanToJson(document).contains("strategies"));  // optional: absent when there is none
  document.strategies = {{"none", 4096, 10.0, 0.0, true}, {"optimal (pytorch)", 2048, 12.5, 25.0, false}};
  const nlohmann::json doc = PlanToJson(document);
  CHECK(doc["strategies"][1]["name"] == "optimal (pytorch)");
  CHECK(doc["strategies"][1]["fits"] == false);
  CheckRoundTrip(doc);
  CHECK(PlanFromJson(doc, "p").strategies == document.strategies);
  auto refused = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(doc, mutate, [](const nlohmann::json& d) { PlanFromJson(d, "bad.json"); });
  };
  CHECK(refused([](nlohmann::json& d) { d["strategies"][0].erase("peak_bytes"); }).find("strategies[0].peak_bytes") !=
        std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["strategies"][1]["fits"] = 1; }).find("strategies[1].fits") !=
        std::string::npos);
}

TEST_CASE("a selective-checkpointing plan's policies round-trip and are refused field by field") {
  PlannerInput in = LoadPlannerInput(ExampleProfile(), "adam");
  std::vector<WrappableModule> modules = WrappableModules(in.chain, &in.profile);
  AddSacCandidates(in.profile, in.chain, &modules);
  PlanRequest request;
  request.pytorch_modules = &modules;
  request.budget.bytes = int64_t{1} << 40;
  const Plan loose = MakePlan(in.chain, in.fixed, request);
  request.budget.bytes = (loose.min_budget_bytes + loose.peak_bytes) / 2;
  const Plan plan = MakePlan(in.chain, in.fixed, request);
  REQUIRE(plan.feasible);
  CHECK(!plan.pytorch.checkpoint_modules.empty());
  CHECK(plan.target == "sac");
  nlohmann::json doc = PlanToJson(plan, in.chain, in.source);
  CheckRoundTrip(doc);
  const PlanDocument read = PlanFromJson(doc, "plan.json");
  REQUIRE(read.pytorch.sac.has_value());
  CHECK(read.pytorch.sac->size() == plan.pytorch.checkpoint_modules.size());
  // The families the policies count by, with their dispatched ops: SacFamilies(), the one list.
  REQUIRE(read.pytorch.sac_families.has_value());
  CHECK(read.pytorch.sac_families->size() == SacFamilies().size());
  for (const SacFamily& family : SacFamilies()) CHECK(read.pytorch.sac_families->at(family.name) == family.dispatched);
  CHECK(read.pytorch.sac_families->at("mm") == std::vector<std::string>{"mm", "addmm", "bmm", "baddbmm"});
  // One with a saved op written by hand, to refuse its fields.
  PlanDocument document = read;
  document.pytorch.sac =
      std::vector<PlanSacModule>{{"a.b", {{"mm", 2}}, {{"mm", 1, 7, "aten::linear", {4, 8}, 128}}, 40, 0.48}};
  const nlohmann::json sac = PlanToJson(document);
  CHECK(sac["pytorch"]["sac"][0]["save"][0]["occurrence"] == 1);
  CHECK(sac["pytorch"]["sac"][0]["dispatched_ops"] == 40);
  CheckRoundTrip(sac);
  auto refused = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(sac, mutate, [](const nlohmann::json& d) { PlanFromJson(d, "bad.json"); });
  };
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["sac"][0]["save"][0]["occurrence"] = 2; })
            .find("pytorch.sac[0].save[0].occurrence") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["sac"][0].erase("family_counts"); })
            .find("pytorch.sac[0].family_counts") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["sac"][0]["save"][0]["shape"] = {-1}; })
            .find("pytorch.sac[0].save[0].shape[0]") != std::string::npos);
  const std::string no_mm = refused([](nlohmann::json& d) { d["pytorch"]["sac_families"].erase("mm"); });
  CHECK(no_mm.find("pytorch.sac_families") != std::string::npos);
  CHECK(no_mm.find("has no family 'mm' that module 'a.b' saves") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["sac_families"]["mm"] = {1}; })
            .find("pytorch.sac_families.mm[0]") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["sac"][0]["dispatch_ms"] = -1; })
            .find("pytorch.sac[0].dispatch_ms") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["sac"][0].erase("dispatch_ms"); })
            .find("pytorch.sac[0].dispatch_ms") != std::string::npos);
}

TEST_CASE("a banded plan, a chain's plan and an infeasible plan round-trip") {
  const Chain long_chain = RandomChain(kExactMaxStages + 20, 7);
  PlanRequest request;
  request.budget.bytes = MinimumOptimalBudget(long_chain, FixedMemory{}, 200) * 3 / 2;
  request.slots = 200;
  Plan banded = MakePlan(long_chain, FixedMemory{}, request);
  REQUIRE(banded.feasible);
  REQUIRE(banded.solver.band > 0);
  nlohmann::json doc = PlanToJson(banded, long_chain, ChainSource("long.json"));
  CHECK(doc["solver"]["method"] == "banded");
  CheckRoundTrip(doc);
  CHECK(PlanFromJson(doc, "p").solver->band == banded.solver.band);

  const Chain chain = ThreeStageChain();
  request.budget.bytes = 1;
  Plan infeasible = MakePlan(chain, FixedMemory{}, request);
  REQUIRE(!infeasible.feasible);
  CheckRoundTrip(PlanToJson(infeasible, chain, ChainSource("c.json")));
}

TEST_CASE("distributed plans round-trip: a pipeline's top level with its stage documents, a data-parallel rank") {
  const Chain chain = ThreeStageChain();
  PlanRequest request;
  request.budget.bytes = int64_t{1} << 40;
  const Plan plan = MakePlan(chain, FixedMemory{}, request);
  FixedMemory fixed;
  fixed.shard = ShardMode::kFull;
  fixed.data_parallel = 2;
  fixed.param_bytes = 300;
  fixed.units = {{"", 100, 50}, {"a.b", 400, 200}};
  PlanDocument stage = MakePlanDocument(plan, chain, ChainSource("c"));
  stage.min_budget_bytes.reset();
  PlanPipelineStage& ps = stage.pipeline_stage.emplace();
  ps.index = 1;
  ps.first_chain_stage = 2;
  ps.last_chain_stage = 4;
  ps.in_flight = 2;
  ps.stored_after_forward_bytes = 77;
  ps.fixed = fixed;
  ps.activation_budget_bytes = -3;  // written as computed, even below zero
  ps.peak_bytes = 1234;
  CheckRoundTrip(PlanToJson(stage));
  CHECK(!PlanToJson(stage).contains("min_budget_bytes"));

  PlanDocument top;
  top.algorithm = "optimal";
  top.source = ChainSource("c");
  top.budget_bytes = 1000;
  top.checkpoint_modules = {"a.b"};
  PlanDistributed& d = top.distributed.emplace();
  d.pipeline = 2;
  d.microbatches = 4;
  d.schedule = "1f1b";
  d.slowest_stage_ms = 2.5;
  d.stages = {stage, stage};
  const nlohmann::json written = PlanToJson(top);
  CHECK(!written.contains("schedule"));
  CHECK(written["distributed"]["stages"][1]["pipeline_stage"]["fixed"]["units"][1]["module"] == "a.b");
  CheckRoundTrip(written);
  const PlanDocument read = PlanFromJson(written, "top.json");
  CHECK(read.is_pipeline());
  CHECK(read.schedule.empty());
  CHECK(read == top);
  // A stage document's error names its whole path.
  nlohmann::json bad = written;
  bad["distributed"]["stages"][1]["schedule"][0]["stage"] = "x";
  CHECK(testing::Refusal(bad, [](nlohmann::json&) {}, [](const nlohmann::json& doc) { PlanFromJson(doc, "top.json"); })
            .find("distributed.stages[1].schedule") != std::string::npos);

  PlanDocument rank_plan = MakePlanDocument(plan, chain, ChainSource("c"));
  PlanDistributed& dp = rank_plan.distributed.emplace();
  dp.data_parallel = 2;
  dp.shard = "full";
  dp.fsdp_units = {"a.b"};
  dp.ranks.push_back({fixed, 900, 1100, 1200, 400});
  CheckRoundTrip(PlanToJson(rank_plan));
  CHECK(!PlanFromJson(PlanToJson(rank_plan), "dp.json").is_pipeline());
  CHECK(PlanFromJson(PlanToJson(rank_plan), "dp.json") == rank_plan);
}

TEST_CASE("the plan reader names the file and field it refuses") {
  const Chain chain = ThreeStageChain();
  PlanRequest request;
  request.budget.bytes = int64_t{1} << 40;
  const nlohmann::json good = PlanToJson(MakePlan(chain, FixedMemory{}, request), chain, ChainSource("c"));
  auto refused = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(good, mutate, [](const nlohmann::json& doc) { PlanFromJson(doc, "bad.json"); });
  };
  CHECK(refused([](nlohmann::json& d) { d["schema"] = "ckplan.chain/1"; }).find("bad.json") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["schema"] = "ckplan.chain/1"; }).find("ckplan.plan/1") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d.erase("schedule"); }).find("schedule") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["unit_style"] = "metric"; }).find("unit_style") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["predicted"]["time_ms"] = -1; }).find("predicted.time_ms") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["stages"][1]["first_op"] = "x"; }).find("stages[1].first_op") !=
        std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["pytorch"]["predicted"]["fits_budget"] = 1; }).find("fits_budget") !=
        std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["source"].erase("kind"); }).find("source.kind") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["source"]["model_sha256"] = 7; }).find("source.model_sha256") !=
        std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["source"]["inputs"] = "8x3"; }).find("source.inputs") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) {}) == "(no error)");
}

TEST_CASE("a plan's source names the profile's model and passes its inputs through") {
  PlannerInput in = LoadPlannerInput(ExampleProfile(), "adam");
  CHECK(in.source.kind == "profile");
  CHECK(in.source.path == ExampleProfile());
  REQUIRE(in.source.model_sha256);
  CHECK(in.source.model_sha256 == in.profile.model.sha256);
  REQUIRE(in.source.inputs);
  CHECK(*in.source.inputs == ProfileToJson(in.profile)["model"]["inputs"]);
  PlanRequest request;
  request.budget.bytes = int64_t{1} << 40;
  const nlohmann::json doc = PlanToJson(MakePlan(in.chain, in.fixed, request), in.chain, in.source);
  CHECK(PlanFromJson(doc, "plan.json").source == in.source);
  CHECK(doc["source"]["inputs"] == ProfileToJson(in.profile)["model"]["inputs"]);
}

TEST_CASE("a plan records its batch, from the profile's first input, and its accumulation") {
  const PlannerInput in = LoadPlannerInput(ExampleProfile(), "adam");
  PlanRequest request;
  request.budget.bytes = int64_t{1} << 40;
  PlanDocument document = MakePlanDocument(MakePlan(in.chain, in.fixed, request), in.chain, in.source);
  REQUIRE(document.batch.has_value());
  CHECK(*document.batch == in.profile.model.inputs->front().shape.front());
  CHECK(!PlanToJson(document).contains("global_batch"));
  document.global_batch = *document.batch * 4;
  document.accumulation_steps = 4;
  const nlohmann::json doc = PlanToJson(document);
  CHECK(doc["batch"] == *document.batch);
  CheckRoundTrip(doc);
  auto refused = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(doc, mutate, [](const nlohmann::json& d) { PlanFromJson(d, "bad.json"); });
  };
  CHECK(refused([](nlohmann::json& d) { d["accumulation_steps"] = 3; }).find("global_batch") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d.erase("accumulation_steps"); }).find("global_batch") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["batch"] = 0; }).find("batch") != std::string::npos);
  // A chain's plan has no batch.
  const Chain chain = ThreeStageChain();
  CHECK(!PlanToJson(MakePlanDocument(MakePlan(chain, FixedMemory{}, request), chain, ChainSource("c"))).contains("batch"));
}

TEST_CASE("a fine-tuning, mixed-precision plan's source says what trains and the autocast, and round-trips") {
  Profile profile = ProfileFromJson(ReadJsonFile(ExampleProfile()), "example");
  REQUIRE(profile.parameters.size() >= 2);
  profile.parameters[0].requires_grad = false;  // frozen
  profile.environment.autocast = "bfloat16";
  PlannerInput in = PlannerInputFromProfile(profile, "p.json", "adam");
  REQUIRE(in.source.trainable_count.has_value());
  CHECK(*in.source.trainable_count == static_cast<int64_t>(profile.parameters.size()) - 1);
  CHECK(*in.source.trainable_bytes == *in.source.param_bytes - profile.parameters[0].bytes);
  CHECK(in.source.autocast == std::optional<std::string>("bfloat16"));
  CHECK(in.fixed.grad_bytes == *in.source.trainable_bytes);
  PlanRequest request;
  request.algorithm = Algorithm::kNone;
  request.budget.bytes = int64_t{1} << 40;
  Plan plan = MakePlan(in.chain, in.fixed, request);
  nlohmann::json doc = PlanToJson(plan, in.chain, in.source);
  CHECK(doc["source"]["trainable_count"] == *in.source.trainable_count);
  CHECK(doc["source"]["autocast"] == "bfloat16");
  CheckRoundTrip(doc);
  // Every parameter trained, no autocast: neither is written.
  PlannerInput plain = LoadPlannerInput(ExampleProfile(), "adam");
  CHECK_FALSE(plain.source.trainable_count.has_value());
  CHECK_FALSE(plain.source.autocast.has_value());
}

TEST_CASE("a plan priced for param groups records each group, and round-trips; one group writes none") {
  Profile profile = ProfileFromJson(ReadJsonFile(ExampleProfile()), "example");
  REQUIRE(profile.parameters.size() >= 3);
  OptimizerChoice adam("adam");
  const PlannerInput plain = PlannerInputFromProfile(profile, "p.json", adam);
  OptimizerGroup decayed, rest;
  decayed.params = {profile.parameters[0].name};
  decayed.flags.weight_decay = 0.1;
  for (size_t k = 1; k < profile.parameters.size(); ++k) rest.params.push_back(profile.parameters[k].name);
  rest.impl = OptimizerImpl::kFused;
  const nlohmann::json file = {{"schema", kOptimizerGroupsSchema}, {"groups", OptimizerGroupsToJson({decayed, rest})}};
  OptimizerChoice grouped = WithOptimizerGroups(adam, OptimizerGroupsFileFromJson(file, "groups.json"), "groups.json");
  const PlannerInput in = PlannerInputFromProfile(profile, "p.json", grouped);
  PlanRequest request;
  request.algorithm = Algorithm::kNone;
  request.budget.bytes = int64_t{1} << 40;
  const nlohmann::json doc = PlanToJson(MakePlan(in.chain, in.fixed, request), in.chain, in.source);
  const nlohmann::json& groups = doc["fixed"]["optimizer_groups"];
  REQUIRE(groups.size() == 2);
  CHECK(groups[0]["optimizer"] == "adam");
  CHECK(groups[0]["optimizer_impl"] == "for-loop");  // the profile's device's (the CPU)
  CHECK(groups[0]["optimizer_options"]["weight_decay"] == 0.1);
  CHECK(groups[0]["params"] == nlohmann::json::array({profile.parameters[0].name}));
  CHECK(groups[1]["optimizer_impl"] == "fused");
  CHECK_FALSE(groups[1].contains("optimizer_options"));
  CheckRoundTrip(doc);
  CHECK(PlanFromJson(doc, "plan.json").fixed.optimizer.groups.size() == 2);
  // The state is the same (adam's moments and counters whatever the options); a decay adds none.
  CHECK(in.fixed.optimizer_bytes == plain.fixed.optimizer_bytes);
  Plan none = MakePlan(plain.chain, plain.fixed, request);
  CHECK_FALSE(PlanToJson(none, plain.chain, plain.source)["fixed"].contains("optimizer_groups"));
  // A groups file is refused field by field.
  auto read = [](const nlohmann::json& d) { OptimizerGroupsFileFromJson(d, "groups.json"); };
  CHECK(Refusal(
            file, [](nlohmann::json& d) { d["schema"] = "ckplan.plan/1"; }, read)
            .find("schema") != std::string::npos);
  CHECK(Refusal(
            file, [](nlohmann::json& d) { d["groups"][0].erase("params"); }, read)
            .find("groups[0].params") != std::string::npos);
  CHECK(Refusal(
            file, [](nlohmann::json& d) { d["groups"][1]["optimizer_impl"] = "fast"; }, read)
            .find("groups[1].optimizer_impl") != std::string::npos);
}
