#include "cli/optimizer_options.h"

#include <CLI/CLI.hpp>

#include <cmath>

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
  cmd->add_option("--weight-decay", options->weight_decay,
                  "the optimizer's weight_decay: Adam's and SGD's add it to each gradient in a new tensor, which the "
                  "update's temporaries then count (AdamW's decay is in place and changes nothing)");
  cmd->add_flag("--amsgrad", options->amsgrad,
                "with adam or adamw: amsgrad=True, one more state tensor per parameter (the largest second moment)");
  cmd->add_flag("--nesterov", options->nesterov,
                "with sgd --momentum: nesterov=True, whose look-ahead gradient is a new tensor in the for-loop update");
}

OptimizerChoice OptimizerChoiceOf(const OptimizerOptions& options, const std::string& gpu) {
  if (options.momentum < 0) throw BadInput("invalid --momentum " + std::to_string(options.momentum) + ": must be 0 or more");
  if (options.momentum > 0 && options.name != "sgd" && options.name != "momentum") {
    throw BadInput("--momentum is for --optimizer sgd (adam and adamw keep their moments anyway)");
  }
  if (!(options.weight_decay >= 0) || !std::isfinite(options.weight_decay)) {
    throw BadInput("invalid --weight-decay " + std::to_string(options.weight_decay) + ": must be 0 or more");
  }
  if (options.amsgrad && options.name != "adam" && options.name != "adamw") {
    throw BadInput("--amsgrad is for --optimizer adam or adamw");
  }
  if (options.nesterov && !(options.name == "momentum" || (options.name == "sgd" && options.momentum > 0))) {
    throw BadInput("--nesterov needs SGD with momentum: --optimizer sgd --momentum 0.9 --nesterov");
  }
  OptimizerChoice choice(options.name == "sgd" && options.momentum > 0 ? "momentum" : options.name);
  choice.flags.weight_decay = options.weight_decay;
  choice.flags.amsgrad = options.amsgrad;
  choice.flags.nesterov = options.nesterov;
  if (options.impl != "auto") {
    choice.impl = ParseOptimizerImpl(options.impl);
  } else if (!gpu.empty() && gpu != "cpu") {
    choice.impl = OptimizerImpl::kForeach;
  }
  return choice;
}

}  // namespace ckplan
