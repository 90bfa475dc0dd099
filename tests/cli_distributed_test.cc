// `ckplan solve --data-parallel/--shard/--pipeline` and `report --plan`: the
// binary's output, plan files and exit codes.

#include <regex>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "planner/contracts/chain.h"
#include "planner/contracts/plan_document.h"
#include "planner/base/units.h"
#include "tests/cli_helpers.h"
#include "tests/test_chains.h"

using namespace ckplan::testing;

namespace {

std::string Example() { return std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json"; }

nlohmann::json ReadJson(const std::string& path) { return nlohmann::json::parse(ReadAll(path)); }

}  // namespace

TEST_CASE("solve --data-parallel --shard optimizer: a per-rank plan with the fixed part by component") {
  std::string dir = TempDir();
  CommandResult r = RunCkplan("solve " + Example() + " --budget 10MiB --data-parallel 4 --shard optimizer -o " + dir +
                                  "/plan.json",
                              dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("per-rank fixed part") != std::string::npos);
  nlohmann::json plan = ReadJson(dir + "/plan.json");
  CHECK(plan["schema"] == "ckplan.plan/1");
  const nlohmann::json& fixed = plan["distributed"]["ranks"][0]["fixed"];
  const int64_t params = fixed["param_bytes"].get<int64_t>();
  CHECK(fixed["grad_bytes"].get<int64_t>() == params);
  CHECK(fixed["optimizer_bytes"].get<int64_t>() == 2 * ((params + 3) / 4));
  CHECK(plan["fixed"]["total_bytes"] == fixed["total_bytes"]);
  CHECK(plan["predicted"]["peak_bytes"].get<int64_t>() <= plan["budget_bytes"].get<int64_t>());
  CHECK(plan["unit_style"] == "binary");  // 10MiB: as every plan, the style the budget was written in
  // Through the plan contract (plan_document.h): typed, and written back the same.
  const ckplan::PlanDocument document = ckplan::PlanFromJson(plan, "plan.json");
  REQUIRE(document.distributed);
  CHECK(document.distributed->data_parallel == 4);
  CHECK(document.distributed->ranks.at(0).fixed.optimizer_bytes == 2 * ((params + 3) / 4));
  CHECK(ckplan::PlanToJson(document) == plan);

  // The report shows it per rank.
  CommandResult report = RunCkplan("report " + Example() + " --plan " + dir + "/plan.json -o " + dir + "/r.md", dir);
  REQUIRE(report.exit_code == 0);
  CHECK(ReadAll(dir + "/r.md").find("Per rank (4 data-parallel rank(s), --shard optimizer)") != std::string::npos);
}

TEST_CASE("distributed bad input: counts, an old profile for --shard full, a budget below the per-rank minimum") {
  std::string dir = TempDir();
  CommandResult r = RunCkplan("solve " + Example() + " --budget 10MiB --data-parallel 0", dir);
  CHECK(r.exit_code == 2);
  CHECK(r.err == "ckplan: error: invalid --data-parallel 0: must be at least 1\n");
  r = RunCkplan("solve " + Example() + " --budget 10MiB --pipeline 2 --microbatches -3", dir);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("invalid --microbatches -3") != std::string::npos);
  // A profile made before the parameter list (the example without it).
  nlohmann::json old = ReadJson(Example());
  REQUIRE(old.contains("parameters"));
  old.erase("parameters");
  WriteText(dir + "/old.profile.json", old.dump());
  r = RunCkplan("solve " + dir + "/old.profile.json --budget 10MiB --data-parallel 2 --shard full", dir);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("no 'parameters' list") != std::string::npos);

  r = RunCkplan("solve " + Example() + " --budget 1MiB --data-parallel 2 --shard grad -o " + dir + "/p.json", dir);
  CHECK(r.exit_code == 3);
  CHECK(!FileExists(dir + "/p.json"));
  std::smatch m;
  REQUIRE(std::regex_search(r.err, m, std::regex("per-rank minimum ([0-9.]+[A-Za-z]+)")));
  CHECK(RunCkplan("solve " + Example() + " --budget " + m[1].str() + " --data-parallel 2 --shard grad", dir).exit_code == 0);
}

TEST_CASE("solve --pipeline on a chain: a plan per stage, each within the budget; --pipeline above the stages") {
  std::string dir = TempDir();
  WriteText(dir + "/chain.json", ckplan::ChainToJson(RandomChain(12, 5, 100000)).dump());
  CommandResult r = RunCkplan("solve " + dir + "/chain.json --budget 40MB --pipeline 3 --microbatches 4 -o " + dir +
                                  "/plan.json",
                              dir);
  REQUIRE(r.exit_code == 0);
  nlohmann::json plan = ReadJson(dir + "/plan.json");
  const nlohmann::json& stages = plan["distributed"]["stages"];
  REQUIRE(stages.size() == 3);
  int covered = 0;
  for (size_t s = 0; s < 3; ++s) {
    const nlohmann::json& st = stages[s]["pipeline_stage"];
    CHECK(st["in_flight"] == static_cast<int>(3 - s));  // 1F1B: min(p - s, m)
    CHECK(st["peak_bytes"].get<int64_t>() <= 40000000);
    CHECK(st["first_chain_stage"] == covered);
    covered = st["last_chain_stage"].get<int>() + 1;
    CHECK(stages[s]["schema"] == "ckplan.plan/1");
  }
  CHECK(covered == 12);
  // 40MB: decimal, at the top level and in each stage's plan.
  CHECK(plan["unit_style"] == "decimal");
  for (const nlohmann::json& stage : stages) CHECK(stage["unit_style"] == "decimal");
  const ckplan::PlanDocument document = ckplan::PlanFromJson(plan, "plan.json");
  CHECK(document.is_pipeline());
  REQUIRE(document.distributed->stages.size() == 3);
  CHECK(document.distributed->stages[2].pipeline_stage->last_chain_stage == 11);
  CHECK(ckplan::PlanToJson(document) == plan);

  r = RunCkplan("solve " + dir + "/chain.json --budget 20MB --pipeline 13 --microbatches 4", dir);
  CHECK(r.exit_code == 2);
  CHECK(r.err == "ckplan: error: invalid --pipeline 13: the chain has 12 stages, so at most --pipeline 12\n");
  r = RunCkplan("solve " + dir + "/chain.json --budget 1MB --pipeline 3 --microbatches 4", dir);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("below the per-stage minimum") != std::string::npos);
}

TEST_CASE("--sweep and --algo are refused with the distributed options") {
  std::string dir = TempDir();
  CommandResult r = RunCkplan("solve " + Example() + " --budget 10MiB --data-parallel 2 --algo every", dir);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("not available with --data-parallel") != std::string::npos);
  r = RunCkplan("solve " + Example() + " --budget 10MiB --pipeline 2 --sweep " + dir + "/s.json", dir);
  CHECK(r.exit_code == 2);
  CHECK(!FileExists(dir + "/s.json"));
}

TEST_CASE("solve --data-parallel on a profile plans the modules each rank wraps; what it prints is what is applied") {
  std::string dir = TempDir();
  // At the per-rank minimum it prints: the plan holds there, and its printed peak is the applied plan's.
  CommandResult loose = RunCkplan("solve " + Example() + " --budget 1GiB --data-parallel 4 --shard full", dir);
  REQUIRE(loose.exit_code == 0);
  std::smatch m;
  REQUIRE(std::regex_search(loose.out, m, std::regex("smallest per-rank budget \\(pytorch target\\): ([0-9.]+ [A-Za-z]+)")));
  const std::string minimum = std::regex_replace(m[1].str(), std::regex(" "), "");
  CommandResult r = RunCkplan("solve " + Example() + " --budget " + minimum + " --data-parallel 4 --shard full -o " +
                                  dir + "/plan.json",
                              dir);
  REQUIRE(r.exit_code == 0);
  nlohmann::json plan = ReadJson(dir + "/plan.json");
  CHECK(plan["target"] == "pytorch");
  const nlohmann::json& predicted = plan["pytorch"]["predicted"];
  CHECK(predicted["fits_budget"] == true);
  CHECK(predicted["peak_bytes"].get<int64_t>() <= plan["budget_bytes"].get<int64_t>());
  CHECK(plan["distributed"]["ranks"][0]["pytorch_peak_bytes"] == predicted["peak_bytes"]);
  CHECK(plan["distributed"]["ranks"][0]["peak_bytes"] == predicted["peak_bytes"]);
  const std::string printed = "pytorch target plan per rank: peak " +
                              ckplan::FormatBytes(predicted["peak_bytes"].get<int64_t>(), ckplan::UnitStyle::kBinary);
  CHECK(r.out.find(printed) != std::string::npos);
  // The schedule target on request, as on one device.
  r = RunCkplan("solve " + Example() + " --budget " + minimum + " --data-parallel 4 --shard full --target schedule", dir);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("optimal plan per rank") != std::string::npos);
  r = RunCkplan("solve " + Example() + " --budget 1GiB --data-parallel 4 --target sac", dir);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--target sac is not available") != std::string::npos);
}
