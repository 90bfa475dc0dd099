#include "planner/contracts/schedule.h"

#include <nlohmann/json.hpp>

#include "planner/base/json_io.h"

namespace ckplan {

namespace {
constexpr StepKind kAllKinds[] = {StepKind::kForwardNoGradKeep, StepKind::kForwardNoGrad,
                                StepKind::kForwardGrad, StepKind::kLoss, StepKind::kBackward};
}

const char* StepKindName(StepKind kind) {
  switch (kind) {
    case StepKind::kForwardNoGradKeep: return "fwd_nograd_keep";
    case StepKind::kForwardNoGrad: return "fwd_nograd";
    case StepKind::kForwardGrad: return "fwd_grad";
    case StepKind::kLoss: return "loss";
    case StepKind::kBackward: return "bwd";
  }
  return "?";
}

std::string Describe(const ScheduleStep& op) {
  if (op.kind == StepKind::kLoss) return "loss";
  return std::string(StepKindName(op.kind)) + " " + std::to_string(op.stage);
}

nlohmann::json ScheduleToJson(const Schedule& schedule) {
  nlohmann::json ops = nlohmann::json::array();
  for (const ScheduleStep& op : schedule) ops.push_back({{"op", StepKindName(op.kind)}, {"stage", op.stage}});
  return ops;
}

Schedule ScheduleFromJson(const nlohmann::json& node, const std::string& file,
                          const std::string& path) {
  JsonReader ops(node, file, path);
  Schedule schedule;
  for (size_t i = 0; i < ops.ArraySize(); ++i) {
    JsonReader item = ops.Item(i);
    std::string name = item.Field("op").String();
    bool known = false;
    ScheduleStep op{StepKind::kLoss, 0};
    for (StepKind kind : kAllKinds) {
      if (name == StepKindName(kind)) {
        op.kind = kind;
        known = true;
      }
    }
    if (!known) item.Field("op").Fail("unknown operation \"" + name + "\"");
    int64_t stage = item.Field("stage").Integer();
    if (stage < 0 || stage > 1000000) item.Field("stage").Fail("out of range");
    op.stage = static_cast<int>(stage);
    schedule.push_back(op);
  }
  return schedule;
}

std::vector<int> CheckpointedStages(const Schedule& schedule, int length) {
  std::vector<bool> recomputed(static_cast<size_t>(length), false);
  for (const ScheduleStep& op : schedule) {
    if ((op.kind == StepKind::kForwardNoGradKeep || op.kind == StepKind::kForwardNoGrad) &&
        op.stage >= 0 && op.stage < length) {
      recomputed[static_cast<size_t>(op.stage)] = true;
    }
  }
  std::vector<int> stages;
  for (int i = 0; i < length; ++i) {
    if (recomputed[static_cast<size_t>(i)]) stages.push_back(i);
  }
  return stages;
}

}  // namespace ckplan
