// The batch table contract (`ckplan.batches/1`): round trip, and refusals
// that name the field.
#include "planner/contracts/batch_table.h"

#include <doctest/doctest.h>

#include "planner/base/error.h"
#include "tests/test_errors.h"

using namespace ckplan;

TEST_CASE("a batch table round-trips and is refused field by field") {
  BatchTable t;
  t.model = "m.pt2";
  t.budget_bytes = 80'000'000'000;
  t.max_batch = 4096;
  t.device = "meta";
  t.global_batch = 64;
  t.largest_none = 1;
  t.largest_plan = 7;
  t.fastest_none = 1;
  t.fastest_plan = 2;
  t.chosen = 2;
  BatchRow one{1, "", 65'000'000'000, 249.3, true, 4.0, 60'000'000'000, BatchPlanFit{65'000'000'000, 249.3, 0, "no checkpointing", 4.0}};
  BatchRow two{2, "", 82'000'000'000, 446.3, false, 0, 70'000'000'000, BatchPlanFit{79'700'000'000, 458.2, 2.7, "wrap 3 modules", 4.4}};
  BatchRow eight{8, "", 184'000'000'000, 1628.4, false, 0, 82'200'000'000, std::nullopt};
  BatchRow failed{9, "the machine cannot hold it", 0, 0, false, 0, 0, std::nullopt};
  t.rows = {one, two, eight, failed};
  const nlohmann::json doc = BatchTableToJson(t);
  CHECK(doc["schema"] == "ckplan.batches/1");
  CHECK(doc["rows"][2]["plan"]["fits"] == false);
  CHECK(!doc["rows"][3].contains("none"));
  CHECK(BatchTableFromJson(doc, "t.json") == t);
  CHECK(BatchTableToJson(BatchTableFromJson(doc, "t.json")) == doc);
  auto refused = [&](const std::function<void(nlohmann::json&)>& mutate) {
    return testing::Refusal(doc, mutate, [](const nlohmann::json& d) { BatchTableFromJson(d, "bad.json"); });
  };
  CHECK(refused([](nlohmann::json& d) { d["schema"] = "ckplan.plan/1"; }).find("schema") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["rows"][1]["batch"] = 1; }).find("rows[1].batch") != std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["rows"][1]["plan"].erase("what"); }).find("rows[1].plan.what") !=
        std::string::npos);
  CHECK(refused([](nlohmann::json& d) { d["largest_plan"] = -1; }).find("largest_plan") != std::string::npos);
}

TEST_CASE("a sequence-length table names its dimension; a batch table leaves it out") {
  BatchTable t;
  t.model = "m.pt2";
  t.max_batch = 4096;
  t.device = "cpu";
  CHECK(!BatchTableToJson(t).contains("dimension"));
  t.dimension = "seq";
  const nlohmann::json doc = BatchTableToJson(t);
  CHECK(doc["dimension"] == "seq");
  CHECK(BatchTableFromJson(doc, "t.json") == t);
  nlohmann::json bad = doc;
  bad["dimension"] = "width";
  CHECK_THROWS_AS(BatchTableFromJson(bad, "t.json"), Error);
}
