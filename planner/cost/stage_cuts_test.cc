// Cutting and naming: where a profile's stages are cut and what they are
// called, on a small profile of hand-chosen values (tests/test_profiles.h).

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/test_profiles.h"
#include "planner/contracts/profile.h"
#include "planner/cost/stage_cuts.h"

using namespace ckplan;
using ckplan::testing::TwoBlockProfile;

namespace {

// The names of the stages a profile document is cut into, in order.
std::vector<std::string> StageNames(const nlohmann::json& doc) {
  std::vector<std::string> names;
  for (const StageCut& cut : CutStages(ProfileFromJson(doc, "profile.json"))) names.push_back(cut.name);
  return names;
}

// A profile tensor with its dtype and whether it requires a gradient.
nlohmann::json TypedTensor(int id, int64_t bytes, int producer, bool grad, const char* dtype) {
  nlohmann::json t = ckplan::testing::ProfileTensor(id, bytes, producer, grad);
  t["requires_grad"] = grad;
  t["dtype"] = dtype;
  return t;
}

bool Has(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
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
}

TEST_CASE("a profile's stages: an encoder-decoder's decoder is cut between its blocks, the encoder's output crossing") {
  // The decoder is called with x and the encoder's output; each cut between
  // its blocks carries the hidden state and the encoder's output: as many,
  // no skip connection added.
  const std::vector<std::string> names = StageNames(ckplan::testing::EncoderDecoderProfile());
  CHECK(names == std::vector<std::string>{"enc.fc", "enc.act", "dec.embed", "dec.block0", "dec.block1", "head"});
}

namespace {

// ids -> model.embed (requires grad); the second model input, of `mask_dtype`
// (an attention mask when integer) -> a float mask, no gradient, read by
// every layer.
nlohmann::json MaskProfile(const char* mask_dtype) {
  nlohmann::json doc = ckplan::testing::TwoBlockProfile();
  const auto& tensor = TypedTensor;
  auto op = [](int id, const char* module, std::vector<int> inputs, int output) {
    return ckplan::testing::ChainOp(id, "aten::linear", module, std::move(inputs), output);
  };
  doc["inputs"] = {0, 1};
  doc["outputs"] = {6};
  doc["tensors"] = {tensor(0, 1024, -1, false, "Long"), tensor(1, 1024, -1, false, mask_dtype),
                    tensor(2, 800, 0, true, "Float"),   tensor(3, 4096, 1, false, "Float"),
                    tensor(4, 800, 2, true, "Float"),   tensor(5, 800, 3, true, "Float"),
                    tensor(6, 800, 4, true, "Float")};
  doc["ops"] = {op(0, "model.embed", {0}, 2), op(1, "model", {1}, 3), op(2, "model.layers.0", {2, 3}, 4),
                op(3, "model.layers.1", {4, 3}, 5), op(4, "head", {5}, 6)};
  doc["ops"][1]["kind"] = "aten::to";
  doc["totals"]["input_bytes"] = 2048;
  return doc;
}

}  // namespace

TEST_CASE("a profile's stages: a mask made from an integer input is auxiliary, as one made from positions") {
  // ids -> model.embed (requires grad); the attention mask (an integer
  // model input) -> a float mask, no gradient, read by every layer. The
  // mask crossing the cuts between the layers is no skip connection: each
  // layer is a stage.
  const std::vector<std::string> names = StageNames(MaskProfile("Long"));
  CAPTURE(names.size());
  CHECK(Has(names, "model.layers.0"));
  CHECK(Has(names, "model.layers.1"));
}

TEST_CASE("a profile's stages: a decoder whose input ids are made from the labels is cut between its blocks too") {
  // A model given its labels shifts them into the decoder's input ids (an
  // integer tensor made without gradients, before the decoder): the decoder
  // is called with it and the encoder's output, as with ids given directly.
  using ckplan::testing::ProfileTensor;
  const auto& op = ckplan::testing::ChainOp;
  nlohmann::json doc = ckplan::testing::EncoderDecoderProfile();
  nlohmann::json shifted = ProfileTensor(7, 1000, 0, false);
  shifted["requires_grad"] = false;
  shifted["dtype"] = "Long";
  doc["tensors"][0]["dtype"] = "Long";
  doc["tensors"] = {doc["tensors"][0],         ProfileTensor(1, 800, 1, true), ProfileTensor(2, 800, 2, true),
                    ProfileTensor(3, 800, 3, true), ProfileTensor(4, 800, 4, true), ProfileTensor(5, 800, 5, true),
                    ProfileTensor(6, 800, 6, false), shifted};
  doc["ops"] = {op(0, "aten::roll", "", {0}, 7),          op(1, "aten::linear", "enc.fc", {0}, 1),
                op(2, "aten::relu", "enc.act", {1}, 2),   op(3, "aten::embedding", "dec.embed", {7}, 3),
                op(4, "aten::linear", "dec.block0", {3, 2}, 4), op(5, "aten::linear", "dec.block1", {4, 2}, 5),
                op(6, "aten::linear", "head", {5}, 6)};
  const std::vector<std::string> names = StageNames(doc);
  CAPTURE(names.size());
  CHECK(Has(names, "dec.block0"));
  CHECK(Has(names, "dec.block1"));
}

TEST_CASE("a profile's stages: auxiliary ops an encoder runs before its first layer join the stage before it") {
  // DeBERTa-v2: the encoder makes its attention mask from a constant
  // (torch.ones: no input read, no gradient) before layer.0, and every
  // layer reads it. Joined to layer.0's stage, that stage would not be
  // layer.0's ops alone, and no plan could wrap layer.0.
  nlohmann::json doc = ckplan::testing::TwoBlockProfile();
  const auto& tensor = TypedTensor;
  const auto& op = ckplan::testing::ChainOp;
  doc["inputs"] = {0};
  doc["outputs"] = {7};
  doc["tensors"] = {tensor(0, 1024, -1, false, "Long"), tensor(1, 800, 0, true, "Float"),
                    tensor(2, 4096, 1, false, "Float"), tensor(3, 4096, 2, false, "Float"),
                    tensor(4, 800, 3, true, "Float"),   tensor(5, 800, 4, true, "Float"),
                    tensor(6, 800, 5, true, "Float"),   tensor(7, 800, 6, true, "Float")};
  doc["ops"] = {op(0, "aten::embedding", "m.embed", {0}, 1), op(1, "aten::ones", "m.encoder", {}, 2),
                op(2, "aten::mul", "m.encoder", {2}, 3),       op(3, "aten::linear", "m.encoder.layer.0", {1, 3}, 4),
                op(4, "aten::relu", "m.encoder.layer.0", {4}, 5), op(5, "aten::linear", "m.encoder.layer.1", {5, 3}, 6),
                op(6, "aten::linear", "head", {6}, 7)};
  doc["totals"]["input_bytes"] = 1024;
  const std::vector<StageCut> cuts = CutStages(ProfileFromJson(doc, "profile.json"));
  std::vector<std::string> names;
  for (const StageCut& cut : cuts) names.push_back(cut.name);
  CAPTURE(names.size());
  // layer.0's first op starts a stage; the mask's ops end the one before.
  auto layer0 = std::find_if(cuts.begin(), cuts.end(), [](const StageCut& c) { return c.first_op == 3; });
  REQUIRE(layer0 != cuts.end());
  CHECK(layer0->name == "m.encoder.layer.0");
  CHECK(std::prev(layer0)->last_op == 2);
  CHECK(Has(names, "m.encoder.layer.1"));
}

TEST_CASE("a profile's stages: a float8 model input is floating point, on the data path as a float32 one is") {
  // The mask profile above with its second input in each dtype: a float8
  // input is cut as a float32 one, not as the integer mask.
  auto names = [](const char* dtype) { return StageNames(MaskProfile(dtype)); };
  const std::vector<std::string> floating = names("Float"), integer = names("Long");
  REQUIRE(floating != integer);
  CHECK(names("Float8_e4m3fn") == floating);
  CHECK(names("BFloat16") == floating);
  CHECK(names("ComplexFloat") == integer);
}
