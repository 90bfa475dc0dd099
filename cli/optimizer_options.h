#pragma once
/// `--optimizer`, `--momentum`, `--optimizer-impl` and the options that
/// change the optimizer's memory (`--weight-decay`, `--amsgrad`,
/// `--nesterov`), as `solve` and `report` take them: the optimizer a plan
/// is priced for (ChooseOptimizer, planner/cost/optimizer_memory.h).

#include <string>

#include "planner/contracts/fixed_memory.h"

namespace CLI {
class App;
}

namespace ckplan {

/// What the options are parsed into: the planner's OptimizerChoice (its
/// name and flags), and the two values ChooseOptimizer resolves, SGD's
/// momentum and the implementation as named (`auto`).
struct OptimizerOptions {
  OptimizerChoice named;
  double momentum = 0;
  std::string impl = "auto";
};

void AddOptimizerOptions(CLI::App* cmd, OptimizerOptions* options);

}  // namespace ckplan
