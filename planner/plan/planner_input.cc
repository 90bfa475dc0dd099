#include "planner/plan/planner_input.h"

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/cost/chain_from_profile.h"
#include "planner/cost/optimizer_memory.h"

namespace ckplan {

PlanSource ProfileSource(const Profile& profile, const std::string& profile_path) {
  PlanSource source;
  source.kind = "profile";
  source.path = profile_path;
  source.model_sha256 = profile.model.sha256;
  source.model_path = profile.model.path;
  if (profile.model.inputs) {
    source.inputs = nlohmann::json::array();
    for (const InputSpec& spec : *profile.model.inputs) source.inputs->push_back(InputSpecToJson(spec));
  }
  if (!profile.parameters.empty()) {
    source.param_count = static_cast<int64_t>(profile.parameters.size());
    int64_t bytes = 0;
    for (const ParameterRecord& p : profile.parameters) bytes += p.bytes;
    source.param_bytes = bytes;
    const std::vector<ParameterRecord> trainable = TrainableParameters(profile.parameters);
    if (trainable.size() != profile.parameters.size()) {
      source.trainable_count = static_cast<int64_t>(trainable.size());
      source.trainable_bytes = TrainableBytes(profile.parameters);
    }
  }
  source.autocast = profile.environment.autocast;
  return source;
}

PlannerInput PlannerInputFromProfile(Profile profile, const std::string& path, const OptimizerChoice& optimizer) {
  PlannerInput input;
  input.from_profile = true;
  input.profile = std::move(profile);
  CheckOptimizerGroups(optimizer, input.profile, path);
  input.chain = ChainFromProfile(input.profile, path, optimizer);
  input.fixed = FixedMemoryOf(input.profile, input.chain, optimizer);
  input.source = ProfileSource(input.profile, path);
  return input;
}

PlannerInput LoadPlannerInput(const std::string& path, const OptimizerChoice& optimizer) {
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
