#pragma once
/// `ckplan run`: a real training step of a TorchScript model under a plan,
/// and the same step without checkpointing, measured and compared.
/// Torch-free header.

#include <cstdint>
#include <functional>
#include <string>

#include "planner/contracts/plan_document.h"
#include "planner/contracts/run_report.h"

namespace ckplan {

/// `ckplan run`'s options (cli/cmd_torch.cc binds its flags to them).
struct RunOptions {
  std::string model_path;
  std::string plan_path;       ///< for messages
  int steps = 3;               ///< measured steps per mode, after a warm-up; time is the median
  std::string loss = "sum";    ///< sum, mean or mse (against a fixed random target)
  bool force = false;          ///< run a plan made for another model or other inputs
  int threads = 1;
  std::string device = "cpu";
  /// --autocast: bf16, fp16 or off; empty: the plan's (its profile's autocast).
  std::string autocast;
  double lr = 1e-3;            ///< optimizer learning rate
  /// Hears what runs and the fraction of the steps done, 0 to 1 (may be empty).
  std::function<void(const std::string& what, double fraction)> progress;
};

/// Runs the plan (`ckplan.plan/1` as PlanFromJson read it from
/// options.plan_path, made from a profile of the model). Throws BadInput
/// (exit 2), naming the plan's field as PlanFromJson does, for a plan that
/// is no schedule (a pipeline's top level), not made from a profile, or
/// whose stages or module paths do not match the model, or made for
/// another model or inputs without `force`; an op failing during recompute
/// names the stage and op.
RunReport RunPlan(const RunOptions& options, const PlanDocument& plan);

}  // namespace ckplan
