#pragma once
/// A schedule: the sequence of operations of one training step over a chain.
/// The only thing planning hands to execution.

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ckplan {

enum class StepKind {
  kForwardNoGradKeep,  ///< `fwd_nograd_keep`: stage i without autograd; its input stays stored
  kForwardNoGrad,      ///< `fwd_nograd`: stage i without autograd; its input is dropped after
  kForwardGrad,        ///< `fwd_grad`: stage i with autograd; keeps saved_bytes for backward
  kLoss,               ///< `loss`: loss and its gradient (stage L)
  kBackward,           ///< `bwd`: backward of stage i
};

struct ScheduleStep {
  StepKind kind;
  int stage;
  bool operator==(const ScheduleStep& other) const {
    return kind == other.kind && stage == other.stage;
  }
};

using Schedule = std::vector<ScheduleStep>;

/// The JSON name of an operation kind (`fwd_grad`, ...).
const char* StepKindName(StepKind kind);
/// `fwd_grad 3`, `loss`: for messages.
std::string Describe(const ScheduleStep& op);

/// Schedule to JSON: `[{"op":"fwd_grad","stage":0}, ...]`.
nlohmann::json ScheduleToJson(const Schedule& schedule);
/// Reads a schedule; `file` and `path` name the source in errors.
Schedule ScheduleFromJson(const nlohmann::json& node, const std::string& file,
                          const std::string& path);

/// Stages recomputed by the schedule: those with a forward without autograd.
std::vector<int> CheckpointedStages(const Schedule& schedule, int length);

}  // namespace ckplan
