#pragma once
/// `--optimizer`, `--momentum`, `--optimizer-impl` and the options that
/// change the optimizer's memory (`--weight-decay`, `--amsgrad`,
/// `--nesterov`), as `solve` and `report` take them: the optimizer a plan
/// is priced for.

#include <string>

#include "planner/contracts/fixed_memory.h"

namespace CLI {
class App;
}

namespace ckplan {

struct OptimizerOptions {
  std::string name = "adam";
  double momentum = 0;
  std::string impl = "auto";
  double weight_decay = 0;
  bool amsgrad = false;
  bool nesterov = false;
};

void AddOptimizerOptions(CLI::App* cmd, OptimizerOptions* options);

/// The choice the options make: `sgd --momentum M` (M > 0) is `momentum`;
/// `auto` leaves the implementation to the profile's device, or foreach
/// when `gpu` names one (what torch picks on CUDA).
OptimizerChoice OptimizerChoiceOf(const OptimizerOptions& options, const std::string& gpu = "");

}  // namespace ckplan
