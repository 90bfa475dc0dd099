#include "cli/optimizer_options.h"

#include <CLI/CLI.hpp>

#include "planner/base/json_io.h"
#include "planner/contracts/plan_document.h"
#include "planner/cost/optimizer_memory.h"

namespace ckplan {

void AddOptimizerOptions(CLI::App* cmd, OptimizerOptions* options) {
  cmd->add_option("--optimizer", options->named.name,
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
  cmd->add_option("--weight-decay", options->named.flags.weight_decay,
                  "the optimizer's weight_decay: Adam's and SGD's add it to each gradient in a new tensor, which the "
                  "update's temporaries then count (AdamW's decay is in place and changes nothing)");
  cmd->add_flag("--amsgrad", options->named.flags.amsgrad,
                "with adam or adamw: amsgrad=True, one more state tensor per parameter (the largest second moment)");
  cmd->add_flag("--nesterov", options->named.flags.nesterov,
                "with sgd --momentum: nesterov=True, whose look-ahead gradient is a new tensor in the for-loop update");
  cmd->add_option("--optimizer-groups", options->groups,
                  "the optimizer's param groups, each priced with its own options and parameters (torch.optim "
                  "updates one group at a time): a ckplan.optimizer_groups/1 JSON file, {\"schema\", \"groups\": "
                  "[{\"params\": [names as named_parameters()], \"optimizer\", \"optimizer_impl\", "
                  "\"optimizer_options\"}]}, as ckplan_torch.plan writes it for a torch.optim optimizer with "
                  "several groups (a group without optimizer or optimizer_impl has --optimizer's, and "
                  "--momentum's for sgd); a trainable parameter in no group has no state and no update");
}

OptimizerChoice ChosenOptimizer(const OptimizerOptions& options, bool on_gpu) {
  const OptimizerChoice chosen = ChooseOptimizer(options.named, options.momentum, options.impl, on_gpu);
  if (options.groups.empty()) return chosen;
  return WithOptimizerGroups(chosen, OptimizerGroupsFileFromJson(ReadJsonFile(options.groups), options.groups),
                             options.groups);
}

}  // namespace ckplan
