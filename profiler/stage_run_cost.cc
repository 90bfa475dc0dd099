#include "stage_run_cost.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>

#include "ckplan/planner/baselines.h"
#include "ckplan/planner/stages.h"
#include "ckplan/profiler/executor.h"
#include "optimizer_step.h"
#include "schedule_runner.h"
#include "staged_program.h"
#include "timing.h"
#include "tracking_allocator.h"

namespace ckplan {

RecomputeCost MeasureRecomputeCost(const Profile& profile, GraphProgram& program, const torch::jit::Module& module,
                                   const std::vector<at::Tensor>& inputs, const DeviceInfo& device, int pairs) {
  const Chain chain = ChainFromProfile(profile, profile.model.value("path", std::string("profile")));
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::string> names;
  for (const Stage& s : chain.stages) {
    ranges.push_back({s.first_op, s.last_op});
    names.push_back(s.name);
  }
  StagedProgram staged(program, ranges), whole(program, {{0, chain.stages.back().last_op}});
  // The parameters and buffers as the executor lists them (each once).
  auto [params, buffers] = UniqueModuleTensors(module);
  RunOptions options;
  options.model_path = profile.model.value("path", std::string());
  TrackingAllocator& tracker = TrackingAllocator::Instance();
  ScheduleRunner cut(options, staged, device, tracker, params, buffers, names);
  ScheduleRunner one(options, whole, device, tracker, params, buffers, {"the whole forward"});
  // First runs: which values require gradients, which stages draw random
  // numbers and write buffers are learnt.
  cut.RunPlainStep(inputs, /*record=*/true);
  cut.ZeroGrads();
  cut.TimeNoGradForward(inputs, /*recompute=*/false);
  one.TimeNoGradForward(inputs, /*recompute=*/false);
  OptimizerStep adam("adam", 1e-3);
  cut.set_optimizer_step(&adam);
  const Schedule step = NoCheckpointSchedule(chain.length());
  // Each forward right after a step, as a recomputation runs: the cut one
  // as recomputations (random state and buffers restored, the cut's stage
  // runs), the whole one as one first run (no restore, one stage run).
  std::vector<double> cut_ms, whole_ms;
  for (int k = 0; k < 2 * pairs; ++k) {
    cut.ZeroGrads();
    cut.RunSchedule(inputs, step);
    cut.ZeroGrads();
    if ((k + k / 2) % 2 == 0) {
      cut_ms.push_back(cut.TimeNoGradForward(inputs, /*recompute=*/true));
    } else {
      whole_ms.push_back(one.TimeNoGradForward(inputs, /*recompute=*/false));
    }
  }
  cut.set_optimizer_step(nullptr);
  RecomputeCost cost;
  double ops_ms = 0;
  for (const OpRecord& op : profile.ops) ops_ms += std::max(0.0, op.fwd_nograd_ms);
  if (ops_ms > 0) cost.nograd_scale = Median(whole_ms) / ops_ms;
  if (chain.length() > 1) {
    cost.stage_run_ms = std::max(0.0, (Median(cut_ms) - Median(whole_ms)) / static_cast<double>(chain.length() - 1));
  }
  return cost;
}

}  // namespace ckplan
