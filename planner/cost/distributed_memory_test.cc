#include "planner/cost/distributed_memory.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/test_chains.h"
#include "planner/base/error.h"

using namespace ckplan;

namespace {

// Two blocks and a head; stage modules name the blocks.
Chain TwoBlockChain() {
  Chain chain = testing::ThreeStageChain();
  chain.stages[0].modules = {"blocks.0"};
  chain.stages[1].modules = {"blocks.1"};
  chain.stages[2].modules = {"head"};
  return chain;
}

std::vector<ParameterRecord> Parameters() {
  return {{"blocks.0.weight", {64, 32}, 64 * 32 * 4},  // 8 KiB
          {"blocks.0.bias", {63}, 63 * 4},
          {"blocks.1.weight", {128, 32}, 128 * 32 * 4},
          {"head.weight", {10, 32}, 10 * 32 * 4},
          {"embed.weight", {100, 16}, 100 * 16 * 4},  // no stage covers it: root
          {"scale", {}, 4}};
}

int64_t Sum(const std::vector<ParameterRecord>& ps) {
  int64_t s = 0;
  for (const auto& p : ps) s += p.bytes;
  return s;
}

}  // namespace

TEST_CASE("FSDP2 shards each parameter on dim 0, padded to a multiple of the ranks") {
  CHECK(ShardBytes({"w", {64, 32}, 64 * 32 * 4}, 4) == 16 * 32 * 4);
  CHECK(ShardBytes({"b", {63}, 63 * 4}, 4) == 16 * 4);   // ceil(63 / 4) = 16 rows
  CHECK(ShardBytes({"s", {}, 4}, 4) == 4);               // a scalar stays whole
}

TEST_CASE("per-rank fixed part: DDP, ZeRO-1, ZeRO-2, FSDP2") {
  const auto params = Parameters();
  const int64_t P = Sum(params);
  const Chain chain = TwoBlockChain();
  FixedMemory ddp = RankFixedMemory(chain, params, P, 100, "adam", 4, ShardMode::kNone, "p.json");
  CHECK(ddp.total() == 100 + 4 * P);
  FixedMemory zero1 = RankFixedMemory(chain, params, P, 100, "adam", 4, ShardMode::kOptimizer, "p.json");
  CHECK(zero1.param_bytes == P);
  CHECK(zero1.grad_bytes == P);
  CHECK(zero1.optimizer_bytes == 2 * ((P + 3) / 4));
  FixedMemory zero2 = RankFixedMemory(chain, params, P, 100, "adam", 4, ShardMode::kGrad, "p.json");
  CHECK(zero2.grad_bytes == (P + 3) / 4);
  CHECK(zero2.reduce_bytes == 128 * 32 * 4);  // the largest unit's gradients before their reduce-scatter
  FixedMemory full = RankFixedMemory(chain, params, P, 100, "adam", 4, ShardMode::kFull, "p.json");
  int64_t shards = 0;
  for (const auto& p : params) shards += ShardBytes(p, 4);
  CHECK(full.param_bytes == shards);
  CHECK(full.grad_bytes == shards);
  CHECK(full.optimizer_bytes == 2 * shards);
  // Units: root (embed + scale), blocks.0, blocks.1, head.
  REQUIRE(full.units.size() == 4);
  CHECK(full.units[0].module.empty());
  CHECK(full.units[0].param_bytes == 100 * 16 * 4 + 4);
  CHECK(full.units[1].param_bytes == 64 * 32 * 4 + 63 * 4);
  // The root gathered throughout, plus blocks.0 running with blocks.1 prefetched.
  CHECK(full.gathered_bytes == 100 * 16 * 4 + 4 + (64 * 32 * 4 + 63 * 4) + 128 * 32 * 4);
  CHECK(full.total() < ddp.total());
  // One rank: nothing is divided or gathered.
  FixedMemory single = RankFixedMemory(chain, params, P, 100, "adam", 1, ShardMode::kFull, "p.json");
  CHECK(single.total() == ddp.total());
}

TEST_CASE("per-rank fixed part: amsgrad's third state is sharded as the moments are") {
  const auto params = Parameters();
  const int64_t P = Sum(params);
  const Chain chain = TwoBlockChain();
  OptimizerFlags amsgrad;
  amsgrad.amsgrad = true;
  for (ShardMode mode : {ShardMode::kNone, ShardMode::kOptimizer, ShardMode::kGrad, ShardMode::kFull}) {
    const FixedMemory plain = RankFixedMemory(chain, params, P, 100, "adam", 4, mode, "p.json");
    const FixedMemory with = RankFixedMemory(chain, params, P, 100, "adam", 4, mode, "p.json", amsgrad);
    CHECK(with.optimizer_bytes * 2 == plain.optimizer_bytes * 3);
    // adamw too; SGD has no amsgrad.
    CHECK(RankFixedMemory(chain, params, P, 100, "adamw", 4, mode, "p.json", amsgrad).optimizer_bytes == with.optimizer_bytes);
    CHECK(RankFixedMemory(chain, params, P, 100, "momentum", 4, mode, "p.json", amsgrad).optimizer_bytes ==
          RankFixedMemory(chain, params, P, 100, "momentum", 4, mode, "p.json").optimizer_bytes);
  }
}

TEST_CASE("bad distributed requests") {
  const Chain chain = TwoBlockChain();
  CHECK_THROWS_AS(RankFixedMemory(chain, Parameters(), 10, 0, "adam", 0, ShardMode::kNone, "p.json"), Error);
  CHECK_THROWS_AS(RankFixedMemory(chain, Parameters(), 10, 0, "adam", -2, ShardMode::kNone, "p.json"), Error);
  // --shard full needs the profile's parameter list.
  CHECK_THROWS_AS(RankFixedMemory(chain, {}, 10, 0, "adam", 2, ShardMode::kFull, "p.json"), Error);
  CHECK_THROWS_AS(ParseShardMode("zero3"), Error);
}

TEST_CASE("the profile's optional parameter list is read and written; profiles without it still read") {
  nlohmann::json doc = {
      {"schema", "ckplan.profile/1"},
      {"model", nlohmann::json::object()},
      {"totals", {{"param_bytes", 40}, {"buffer_bytes", 0}, {"input_bytes", 8}, {"saved_bytes", 8},
                  {"output_bytes", 8}, {"fwd_ms", 1}, {"bwd_ms", 1}, {"peak_bytes", 64}}},
      {"tensors", {{{"id", 0}, {"shape", {2}}, {"dtype", "float32"}, {"bytes", 8}, {"producer", -1}},
                   {{"id", 1}, {"shape", {2}}, {"dtype", "float32"}, {"bytes", 8}, {"producer", 0}}}},
      {"ops", {{{"id", 0}, {"kind", "aten::relu"}, {"module", "fc"}, {"inputs", {0}}, {"outputs", {1}},
                {"saved_bytes", 8}, {"fwd_tmp_bytes", 0}, {"bwd_tmp_bytes", 0}, {"fwd_ms", 1}, {"bwd_ms", 1}}}},
      {"inputs", {0}},
      {"outputs", {1}}};
  Profile without = ProfileFromJson(doc, "p.json");
  CHECK(without.parameters.empty());
  CHECK(!ProfileToJson(without).contains("parameters"));
  doc["parameters"] = {{{"name", "fc.weight"}, {"shape", {4, 2}}, {"bytes", 32}},
                       {{"name", "fc.bias"}, {"shape", {2}}, {"bytes", 8}}};
  Profile with = ProfileFromJson(doc, "p.json");
  REQUIRE(with.parameters.size() == 2);
  CHECK(with.parameters[0].name == "fc.weight");
  CHECK(with.parameters[0].shape == std::vector<int64_t>{4, 2});
  CHECK(ProfileToJson(with)["parameters"] == doc["parameters"]);
  doc["parameters"][1]["bytes"] = -1;
  CHECK_THROWS_AS(ProfileFromJson(doc, "p.json"), Error);
}
