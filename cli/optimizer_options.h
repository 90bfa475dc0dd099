#pragma once
/// `--optimizer`, `--momentum`, `--optimizer-impl` and the options that
/// change the optimizer's memory (`--weight-decay`, `--amsgrad`,
/// `--nesterov`), and its param groups (`--optimizer-groups FILE`), as
/// `solve` and `report` take them: the optimizer a plan is priced for
/// (ChooseOptimizer, planner/cost/optimizer_memory.h).

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
  std::string groups;  ///< `--optimizer-groups`: a ckplan.optimizer_groups/1 file, or empty
};

void AddOptimizerOptions(CLI::App* cmd, OptimizerOptions* options);

/// The optimizer `options` name (ChooseOptimizer's, `on_gpu` as it takes
/// it), with the groups of its `--optimizer-groups` file where given
/// (WithOptimizerGroups). Throws BadInput naming the option or the file.
OptimizerChoice ChosenOptimizer(const OptimizerOptions& options, bool on_gpu);

}  // namespace ckplan
