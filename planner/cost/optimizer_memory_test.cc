// The step's fixed part for fine-tuning and mixed-precision jobs: frozen
// parameters are held with no gradient, optimizer state or update; fp16
// autocast adds GradScaler's scalars.

#include "planner/cost/optimizer_memory.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "planner/base/error.h"
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

namespace {

// Two float32 Linear(512, 512) layers, as named_parameters() names them.
Profile TwoLinears() {
  Profile profile;
  for (const char* layer : {"0", "1"}) {
    profile.parameters.push_back({std::string(layer) + ".weight", {512, 512}, 512 * 512 * 4, true});
    profile.parameters.push_back({std::string(layer) + ".bias", {512}, 512 * 4, true});
  }
  profile.totals.param_bytes = 2 * (512 * 512 * 4 + 512 * 4);
  return profile;
}

OptimizerGroup Group(std::vector<std::string> params, double weight_decay = 0, const std::string& name = "") {
  OptimizerGroup group;
  group.name = name;
  group.params = std::move(params);
  group.flags.weight_decay = weight_decay;
  return group;
}

// The optimizer `name` (for-loop) with `groups`, as `--optimizer-groups` gives them.
OptimizerChoice Grouped(const std::string& name, std::vector<OptimizerGroup> groups) {
  return WithOptimizerGroups(OptimizerChoice(name, OptimizerImpl::kForLoop), std::move(groups), "groups.json");
}

int64_t UpdateOf(const Profile& profile, const OptimizerChoice& optimizer) {
  return UpdateTmpBytes(optimizer, OptimizerImpl::kForLoop, TrainableParameters(profile.parameters));
}

}  // namespace

TEST_CASE("optimizer groups: each group's update with its own options, one group at a time") {
  const Profile profile = TwoLinears();
  const int64_t weight = 512 * 512 * 4, bias = 512 * 4;
  // Adam's coupled decay in the second group only: its weight's `grad + wd * param` beside the
  // denominator, and no earlier parameter of its group held (the first group's are freed).
  const OptimizerChoice split = Grouped("adam", {Group({"0.weight", "0.bias"}), Group({"1.weight", "1.bias"}, 0.1)});
  CHECK(UpdateOf(profile, split) == 3 * weight + 12);
  // One group priced with the first group's options (no decay) counted less; with the decay
  // everywhere, the previous parameter (0.bias) too.
  CHECK(UpdateOf(profile, OptimizerChoice("adam", OptimizerImpl::kForLoop)) == 2 * weight + bias + 12);
  OptimizerChoice decayed("adam", OptimizerImpl::kForLoop);
  decayed.flags.weight_decay = 0.1;
  CHECK(UpdateOf(profile, decayed) == 3 * weight + bias + 12);
  // The state is each group's: the same moments and step counters as one group.
  CHECK(FixedMemoryOf(profile, Chain{}, split).optimizer_bytes ==
        FixedMemoryOf(profile, Chain{}, OptimizerChoice("adam", OptimizerImpl::kForLoop)).optimizer_bytes);
  // Foreach in one group: its square roots of the whole group, made at once.
  OptimizerChoice foreach = split;
  foreach
    .groups[0].impl = OptimizerImpl::kForeach;
  foreach
    .groups[1].flags.weight_decay = 0;
  CHECK(UpdateOf(profile, foreach) == std::max(weight + bias + 12, 2 * weight + 12));
}

TEST_CASE("optimizer groups: state follows each group's options, and a parameter in no group has none") {
  const Profile profile = TwoLinears();
  const int64_t layer = 512 * 512 * 4 + 512 * 4;
  // SGD with momentum in one group: that group's buffers alone.
  const OptimizerChoice sgd =
      Grouped("sgd", {Group({"0.weight", "0.bias"}, 0, "momentum"), Group({"1.weight", "1.bias"}, 0, "sgd")});
  CHECK(FixedMemoryOf(profile, Chain{}, sgd).optimizer_bytes == layer);
  // amsgrad in one group: one more tensor per parameter of it.
  OptimizerChoice amsgrad = Grouped("adam", {Group({"0.weight", "0.bias"}), Group({"1.weight", "1.bias"})});
  amsgrad.groups[1].flags.amsgrad = true;
  CHECK(FixedMemoryOf(profile, Chain{}, amsgrad).optimizer_bytes == 2 * 2 * layer + 4 * 4 + layer);
  // The second layer in no group: no state, no update; its gradients held all the same.
  const OptimizerChoice first = Grouped("adam", {Group({"0.weight"}), Group({"0.bias"})});
  const FixedMemory fixed = FixedMemoryOf(profile, Chain{}, first);
  CHECK(fixed.optimizer_bytes == 2 * layer + 2 * 4);
  CHECK(fixed.grad_bytes == 2 * layer);
  CHECK(UpdateOf(profile, first) == 2 * 512 * 512 * 4 + 12);
  // Each group's implementation resolved, its flags those that change its memory (adamw's decay does not).
  const FixedMemory adamw = FixedMemoryOf(profile, Chain{}, Grouped("adamw", {Group({"0.weight"}, 0.1)}));
  REQUIRE(adamw.optimizer.groups.size() == 1);
  CHECK(adamw.optimizer.groups[0].impl == std::optional<OptimizerImpl>(OptimizerImpl::kForLoop));
  CHECK(adamw.optimizer.groups[0].flags.weight_decay == 0);
}

TEST_CASE("optimizer groups: refused where torch.optim would not run them or the profile lacks a parameter") {
  auto refusal = [](const std::string& name, std::vector<OptimizerGroup> groups) -> std::string {
    try {
      Grouped(name, std::move(groups));
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  CHECK(refusal("adam", {}).find("no group") != std::string::npos);
  CHECK(refusal("adam", {Group({"0.weight"}, 0, "sgd")}).find("of its kind") != std::string::npos);
  CHECK(refusal("adam", {Group({"0.weight"}), Group({"0.weight"})}).find("in another group") != std::string::npos);
  CHECK(refusal("none", {Group({"0.weight"})}).find("updates nothing") != std::string::npos);
  OptimizerGroup amsgrad = Group({"0.weight"}, 0, "sgd");
  amsgrad.flags.amsgrad = true;
  CHECK(refusal("sgd", {amsgrad}).find("amsgrad is for adam") != std::string::npos);
  OptimizerGroup nesterov = Group({"0.weight"}, 0, "sgd");
  nesterov.flags.nesterov = true;
  CHECK(refusal("sgd", {nesterov}).find("nesterov needs") != std::string::npos);
  CHECK(refusal("sgd", {Group({"0.weight"}, -1)}).find("weight_decay") != std::string::npos);
  CHECK(refusal("momentum", {Group({"0.weight"}, 0, "sgd")}) == "(no error)");
  const OptimizerChoice unknown = Grouped("adam", {Group({"0.weight", "2.weight"})});
  CHECK_THROWS_WITH_AS(CheckOptimizerGroups(unknown, TwoLinears(), "p.json"), doctest::Contains("'2.weight'"), Error);
  CHECK_NOTHROW(CheckOptimizerGroups(Grouped("adam", {Group({"1.bias"})}), TwoLinears(), "p.json"));
}
