#include "cli/optimizer_options.h"

#include <CLI/CLI.hpp>

#include "planner/base/error.h"
#include "planner/cost/optimizer_memory.h"

namespace ckplan {

void AddOptimizerOptions(CLI::App* cmd, OptimizerOptions* options) {
  cmd->add_option("--optimizer", options->name,
                  "the training job's torch.optim optimizer, whose state and update are counted in the budget: "
                  "adam, adamw, sgd (with --momentum for SGD(momentum=M)), none")
      ->check(CLI::IsMember(OptimizerNames()))
      ->capture_default_str();
  cmd->add_option("--momentum", options->momentum, "with --optimizer sgd: its momentum (above 0 keeps a buffer per parameter)");
  cmd->add_option("--optimizer-impl", options->impl,
                  "how the job's optimizer runs: auto (what torch picks: foreach on CUDA, for-loop elsewhere), "
                  "for-loop (foreach=False), foreach (foreach=True), fused (fused=True)")
      ->check(CLI::IsMember({"auto", "for-loop", "foreach", "fused"}))
      ->capture_default_str();
}

OptimizerChoice OptimizerChoiceOf(const OptimizerOptions& options, const std::string& gpu) {
  if (options.momentum < 0) throw BadInput("invalid --momentum " + std::to_string(options.momentum) + ": must be 0 or more");
  if (options.momentum > 0 && options.name != "sgd" && options.name != "momentum") {
    throw BadInput("--momentum is for --optimizer sgd (adam and adamw keep their moments anyway)");
  }
  OptimizerChoice choice(options.name == "sgd" && options.momentum > 0 ? "momentum" : options.name);
  if (options.impl != "auto") {
    choice.impl = ParseOptimizerImpl(options.impl);
  } else if (!gpu.empty() && gpu != "cpu") {
    choice.impl = OptimizerImpl::kForeach;
  }
  return choice;
}

}  // namespace ckplan
