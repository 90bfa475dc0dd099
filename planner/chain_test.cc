#include "ckplan/planner/chain.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "../tests/test_chains.h"
#include "ckplan/planner/error.h"

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
  CHECK(back.InputBytes(4) == 0);
  CHECK(back.InputBytes(3) == 8);
}

TEST_CASE("chain errors name the file and the field") {
  nlohmann::json doc = Valid();
  doc["schema"] = "ckplan.chain/2";
  CHECK(ErrorOf(doc) == "c.json: field 'schema': expected \"ckplan.chain/1\", got \"ckplan.chain/2\"");

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
