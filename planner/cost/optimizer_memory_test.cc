// The step's fixed part for fine-tuning and mixed-precision jobs: frozen
// parameters are held with no gradient, optimizer state or update; fp16
// autocast adds GradScaler's scalars.

#include "planner/cost/optimizer_memory.h"

#include <doctest/doctest.h>

#include "planner/contracts/profile.h"

using namespace ckplan;

namespace {

// A frozen 1,000-byte weight and a trainable 400-byte adapter (100 float32s).
Profile FineTuned() {
  Profile profile;
  profile.parameters.push_back({"base.weight", {250}, 1000, false});
  profile.parameters.push_back({"adapter.weight", {100}, 400, true});
  profile.totals.param_bytes = 1400;
  return profile;
}

}  // namespace

TEST_CASE("fixed memory: a frozen parameter is held, with no gradient, optimizer state or update") {
  const Profile profile = FineTuned();
  CHECK(TrainableBytes(profile.parameters) == 400);
  REQUIRE(TrainableParameters(profile.parameters).size() == 1);
  const FixedMemory adam = FixedMemoryOf(profile, Chain{}, OptimizerChoice("adam", OptimizerImpl::kForLoop));
  CHECK(adam.param_bytes == 1400);
  CHECK(adam.grad_bytes == 400);
  CHECK(adam.optimizer_bytes == 2 * 400 + 4);  // two moments and one step counter, the adapter's alone
  const FixedMemory momentum = FixedMemoryOf(profile, Chain{}, OptimizerChoice("momentum", OptimizerImpl::kForLoop));
  CHECK(momentum.optimizer_bytes == 400);
  // The update's temporaries over the trainable parameters only: adam's denominator (two of the
  // adapter's size) and its scalars.
  CHECK(UpdateTmpBytes(OptimizerChoice("adam", OptimizerImpl::kForLoop), OptimizerImpl::kForLoop,
                       TrainableParameters(profile.parameters)) == 2 * 400 + 12);
}

TEST_CASE("fixed memory: every parameter trains where the profile does not say (no requires_grad, no list)") {
  Profile profile = FineTuned();
  for (ParameterRecord& p : profile.parameters) p.requires_grad = true;
  CHECK(FixedMemoryOf(profile, Chain{}, OptimizerChoice("adam", OptimizerImpl::kForLoop)).grad_bytes == 1400);
  profile.parameters.clear();
  CHECK(FixedMemoryOf(profile, Chain{}, OptimizerChoice("sgd", OptimizerImpl::kForLoop)).grad_bytes == 1400);
}

TEST_CASE("fixed memory: fp16 autocast holds GradScaler's scale, growth tracker and found-inf flag") {
  Profile profile = FineTuned();
  const OptimizerChoice adam("adam", OptimizerImpl::kForLoop);
  const int64_t plain = FixedMemoryOf(profile, Chain{}, adam).optimizer_bytes;
  profile.environment.autocast = "bfloat16";
  CHECK(FixedMemoryOf(profile, Chain{}, adam).optimizer_bytes == plain);
  profile.environment.autocast = "float16";
  CHECK(FixedMemoryOf(profile, Chain{}, adam).optimizer_bytes == plain + kGradScalerBytes);
}

TEST_CASE("profile contract: a frozen parameter and the autocast round-trip, written only where they say something") {
  Profile profile = FineTuned();
  profile.environment.autocast = "bfloat16";
  OpRecord op;
  op.kind = "aten::linear";
  TensorRecord t;
  t.producer = -1;
  profile.tensors.push_back(t);
  TensorRecord out;
  out.id = 1;
  out.producer = 0;
  profile.tensors.push_back(out);
  op.inputs = {0};
  op.outputs = {1};
  profile.ops.push_back(op);
  profile.inputs = {0};
  profile.outputs = {1};
  const nlohmann::json doc = ProfileToJson(profile);
  CHECK(doc["parameters"][0]["requires_grad"] == false);
  CHECK_FALSE(doc["parameters"][1].contains("requires_grad"));
  CHECK(doc["environment"]["autocast"] == "bfloat16");
  const Profile back = ProfileFromJson(doc, "p.json");
  CHECK_FALSE(back.parameters[0].requires_grad);
  CHECK(back.parameters[1].requires_grad);
  CHECK(back.environment.autocast == std::optional<std::string>("bfloat16"));
}
