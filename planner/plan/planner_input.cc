#include "planner/plan/planner_input.h"

#include <algorithm>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/cost/gradients.h"
#include "planner/cost/stages.h"

namespace ckplan {

PlanSource ProfileSource(const Profile& profile, const std::string& profile_path) {
  PlanSource source;
  source.kind = "profile";
  source.path = profile_path;
  // The profile keeps `model` as written (profile.h): its fields as found.
  const nlohmann::json& model = profile.model;
  if (model.contains("sha256") && model["sha256"].is_string()) source.model_sha256 = model["sha256"].get<std::string>();
  if (model.contains("path") && model["path"].is_string()) source.model_path = model["path"].get<std::string>();
  if (model.contains("inputs")) source.inputs = model["inputs"];
  return source;
}

namespace {

// The scalars adam's update wraps as tensors (a double and a float, 0-dim).
constexpr int64_t kAdamScalarBytes = 12;

// `ckplan run`'s adam updates each parameter in slices of 64K elements: its
// temporary (the denominator) is at most that many of the largest
// parameter's elements. With gradients appearing in backward the step's end
// (every gradient made, the update running) can be its peak, so it counts.
int64_t AdamUpdateTmpBytes(const std::vector<ParameterRecord>& parameters) {
  int64_t most = 0;
  for (const ParameterRecord& p : parameters) {
    int64_t elements = 1;
    for (int64_t d : p.shape) elements *= d;
    if (elements <= 0) continue;
    most = std::max(most, std::min<int64_t>(elements, int64_t{1} << 16) * (p.bytes / elements));
  }
  // And the scalars the update wraps as tensors while a slice's temporary is
  // alive (measured: 12 B on the CPU, `ckplan run` of mlp_chain).
  return most > 0 ? most + kAdamScalarBytes : 0;
}

}  // namespace

PlannerInput PlannerInputFromProfile(Profile profile, const std::string& path, const std::string& optimizer) {
  PlannerInput input;
  input.from_profile = true;
  input.profile = std::move(profile);
  input.chain = ChainFromProfile(input.profile, path);
  // Gradients appear during backward, stage by stage (param_grads.h); a
  // profile without its `parameters` list keeps them for the whole step.
  const int64_t backward_grad_bytes = AttachParamGrads(&input.chain, input.profile);
  if (optimizer == "adam") input.chain.update_tmp_bytes = AdamUpdateTmpBytes(input.profile.parameters);
  ValidateChain(input.chain, path, "the chain cut from it");
  input.fixed = FixedMemoryFor(input.profile.totals.param_bytes, input.profile.totals.buffer_bytes, optimizer);
  input.fixed.backward_grad_bytes = std::min(backward_grad_bytes, input.fixed.grad_bytes);
  auto step = input.profile.totals.optimizer_step_ms.find(optimizer);
  if (step != input.profile.totals.optimizer_step_ms.end()) input.fixed.optimizer_step_ms = step->second;
  input.source = ProfileSource(input.profile, path);
  return input;
}

PlannerInput LoadPlannerInput(const std::string& path, const std::string& optimizer) {
  nlohmann::json doc = ReadJsonFile(path);
  if (!doc.is_object() || !doc.contains("schema") || !doc["schema"].is_string()) {
    throw BadInput(path + ": field 'schema': missing (expected \"ckplan.chain/1\" or \"ckplan.profile/1\")");
  }
  std::string schema = doc["schema"].get<std::string>();
  PlannerInput input;
  if (schema == "ckplan.chain/1") {
    input.chain = ChainFromJson(doc, path);
    input.fixed = FixedMemoryFor(0, 0, "none");
    input.fixed.grad_bytes = 0;
    input.source.kind = "chain";
    input.source.path = path;
    return input;
  }
  if (schema == "ckplan.profile/1") return PlannerInputFromProfile(ProfileFromJson(doc, path), path, optimizer);
  throw BadInput(path + ": field 'schema': expected \"ckplan.chain/1\" or \"ckplan.profile/1\", got \"" + schema + "\"");
}

}  // namespace ckplan
