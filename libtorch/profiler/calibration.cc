#include "libtorch/profiler/calibration.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>

#include "planner/solvers/baselines.h"
#include "planner/solvers/modules.h"
#include "planner/cost/chain_from_profile.h"
#include "libtorch/executor/executor.h"
#include "libtorch/executor/optimizer_step.h"
#include "libtorch/executor/schedule_runner.h"
#include "libtorch/executor/staged_program.h"
#include "libtorch/runtime/timing.h"
#include "libtorch/runtime/tracking_allocator.h"

namespace ckplan {

Calibration MeasureCalibration(const Profile& profile, GraphProgram& program, const torch::jit::Module& module,
                               const std::vector<at::Tensor>& inputs, const DeviceInfo& device, int pairs,
                               bool schedules) {
  const Chain chain = ChainFromProfile(profile, profile.model.path.value_or("profile"));
  std::vector<std::pair<int, int>> ranges;
  std::vector<std::string> names;
  for (const Stage& s : chain.stages) {
    ranges.push_back({s.ops->first, s.ops->last});
    names.push_back(s.name);
  }
  StagedProgram staged(program, ranges), whole(program, {{0, chain.stages.back().ops->last}});
  // The parameters and buffers as the executor lists them (each once).
  auto [params, buffers] = UniqueModuleTensors(module);
  RunOptions options;
  options.model_path = profile.model.path.value_or("");
  TrackingAllocator& tracker = TrackingAllocator::Instance();
  ScheduleRunner cut(options, staged, device, tracker, params, buffers, names);
  ScheduleRunner one(options, whole, device, tracker, params, buffers, {"the whole forward"});
  // First runs: which values require gradients, which stages draw random
  // numbers and write buffers are learnt.
  cut.RunPlainStep(inputs, /*record=*/true);
  cut.ZeroGrads();
  cut.TimeNoGradForward(inputs, /*recompute=*/false);
  if (schedules) one.TimeNoGradForward(inputs, /*recompute=*/false);
  OptimizerStep adam("adam", 1e-3);
  cut.set_optimizer_step(&adam);
  const Schedule step = NoCheckpointSchedule(chain.length());
  const Schedule every = EveryNSchedule(chain.length(), 1);
  // Rounds of two steps, the order alternating: without recomputation and
  // with every stage checkpointed (each stage's forward once without
  // autograd, then again with it just before its backward). Their
  // difference holds what a stage run without autograd costs inside a step
  // and what the backward gains from the recomputed values being fresh in
  // the caches; paired, it cancels a machine that drifts. After each round
  // a forward without autograd, as a recomputation runs right after a
  // step: in turn stage by stage as recomputations (random state and
  // buffers restored, a stage run each) or whole as one first run (no
  // restore, one stage run); their difference is the stage runs' cost. One
  // round to warm up (a schedule's first steps run slow), then at least
  // `pairs` rounds and more, up to 25, until 1.2 s of steps (a small
  // model's step is noisier; a large model's rounds are few).
  //
  // Then the PyTorch target's step as `ckplan run` runs it (eagerly, node
  // by node, each wrapped module an autograd function), the order turning:
  // nothing wrapped, and two sets of wrapped modules. A wrapped module costs
  // its stages' forward without autograd (in proportion to their ops) and a
  // fixed cost of its own; two sets of other ratios of wraps to ops
  // separate the two. To keep the profile short,
  // they ride the first rounds only, after the warm-up round (its steps
  // warm the same stages): at least `pairs` and more, up to 25, until 0.6 s
  // of their steps.
  // The modules wrapped are those a plan can wrap (WrappableModules): the
  // single-stage ones, and the outermost ones (fewer wraps over more ops).
  const std::vector<WrappableModule> wrappable = WrappableModules(chain, &profile);
  std::vector<std::pair<size_t, size_t>> wrap_modes[3];
  double wrap_count[3] = {0, 0, 0}, wrap_ops_ms[3] = {0, 0, 0};
  for (const WrappableModule& m : wrappable) {
    bool outermost = true;
    for (const WrappableModule& o : wrappable) {
      const bool contains = o.first_stage <= m.first_stage && m.last_stage <= o.last_stage;
      outermost = outermost && !(contains && (o.first_stage != m.first_stage || o.last_stage != m.last_stage));
    }
    for (int mode = 1; mode <= 2; ++mode) {
      if (mode == 1 ? m.first_stage != m.last_stage : !outermost) continue;
      wrap_modes[mode].push_back({static_cast<size_t>(m.first_stage), static_cast<size_t>(m.last_stage)});
      wrap_count[mode] += 1;
      for (int i = m.first_stage; i <= m.last_stage; ++i) {
        const Stage& stage = chain.stages[static_cast<size_t>(i)];
        for (int op = stage.ops->first; op <= stage.ops->last; ++op) {
          wrap_ops_ms[mode] += profile.ops[static_cast<size_t>(op)].fwd_nograd_ms.value_or(0);
        }
      }
    }
  }
  for (auto& mode : wrap_modes) std::sort(mode.begin(), mode.end());
  if (wrap_modes[2] == wrap_modes[1]) wrap_modes[2].clear();  // no module spans several stages
  std::vector<double> cut_ms, whole_ms, extra_ms, step_ms, module_step_ms, singles_ms, outermost_ms;
  double spent_ms = 0, wrap_spent_ms = 0;
  for (int k = 0;; ++k) {
    const bool stage_rounds = schedules && (k <= pairs || (k <= 25 && spent_ms < 1200));
    const bool wraps = k >= 1 && (k <= pairs || (k <= 40 && wrap_spent_ms < 1500));
    if (!stage_rounds && !wraps && k > 0) break;
    double ms[2] = {0, 0};
    for (int turn = 0; stage_rounds && turn < 2; ++turn) {
      const int mode = turn ^ (k % 2);
      cut.ZeroGrads();
      ms[mode] = cut.RunSchedule(inputs, mode == 1 ? every : step).ms;
    }
    double wrap_ms[3] = {0, 0, 0};
    for (int turn = 0; wraps && turn < 3; ++turn) {
      const int mode = (turn + k) % 3;
      if (mode > 0 && wrap_modes[mode].empty()) continue;
      cut.ZeroGrads();
      wrap_ms[mode] = cut.RunModules(inputs, wrap_modes[mode]).ms;
    }
    cut.ZeroGrads();
    if (k == 0) continue;
    if (wraps) {
      module_step_ms.push_back(wrap_ms[0]);
      singles_ms.push_back(wrap_ms[1] - wrap_ms[0]);
      outermost_ms.push_back(wrap_ms[2] - wrap_ms[0]);
      wrap_spent_ms += wrap_ms[0] + wrap_ms[1] + wrap_ms[2];
    }
    if (!stage_rounds) continue;
    extra_ms.push_back(ms[1] - ms[0]);
    step_ms.push_back(ms[0]);
    spent_ms += ms[0] + ms[1];
    if ((k + k / 2) % 2 == 0) {
      cut_ms.push_back(cut.TimeNoGradForward(inputs, /*recompute=*/true));
    } else {
      whole_ms.push_back(one.TimeNoGradForward(inputs, /*recompute=*/false));
    }
  }
  cut.ZeroGrads();
  cut.set_optimizer_step(nullptr);
  Calibration cost;
  for (const Stage& s : chain.stages) cost.stages.push_back(*s.ops);
  double ops_ms = 0;
  for (const OpRecord& op : profile.ops) ops_ms += op.fwd_nograd_ms.value_or(0);
  if (schedules) cost.run_step_ms = Median(step_ms);
  if (schedules && chain.length() > 1) {
    cost.stage_run_ms = std::max(0.0, (Median(cut_ms) - Median(whole_ms)) / static_cast<double>(chain.length() - 1));
  }
  // The every schedule runs each stage once more, without autograd: what
  // it adds, less the stage runs' own cost, per ms of the ops' forward
  // without autograd. Noise cannot make it vanish: at least a quarter.
  if (schedules && ops_ms > 0) {
    const double runs_ms = chain.length() * cost.stage_run_ms.value_or(0);
    cost.nograd_scale = std::max(0.25, (Median(extra_ms) - runs_ms) / ops_ms);
  }
  // The PyTorch target: each set of wrapped modules adds a fixed cost per
  // wrap and its ops' forward without autograd at a scale; two sets of
  // other ratios (n wraps over ops of o ms) give both. Noise cannot make the
  // fixed cost negative nor the scale vanish (at least a quarter, as above).
  // Without a module over several stages: the scale alone, the fixed cost
  // in it.
  cost.module_step_ms = Median(module_step_ms);
  const double d1 = wrap_modes[1].empty() ? 0 : Median(singles_ms);
  const double d2 = wrap_modes[2].empty() ? 0 : Median(outermost_ms);
  const double n1 = wrap_count[1], o1 = wrap_ops_ms[1], n2 = wrap_count[2], o2 = wrap_ops_ms[2];
  const double det = n1 * o2 - n2 * o1;
  if (!wrap_modes[1].empty() && !wrap_modes[2].empty() && std::fabs(det) > 1e-6 * (n1 * o2 + n2 * o1)) {
    cost.checkpoint_call_ms = std::max(0.0, (d1 * o2 - d2 * o1) / det);
    // The scale from the set with more ops (the larger, steadier difference).
    const bool second = o2 >= o1;
    const double n = second ? n2 : n1, o = second ? o2 : o1, d = second ? d2 : d1;
    if (o > 0) cost.module_nograd_scale = std::max(0.25, (d - n * *cost.checkpoint_call_ms) / o);
  } else if (!wrap_modes[1].empty() && o1 > 0) {
    cost.module_nograd_scale = std::max(0.25, d1 / o1);
  } else if (!wrap_modes[2].empty() && o2 > 0) {
    cost.module_nograd_scale = std::max(0.25, d2 / o2);
  }
  return cost;
}

}  // namespace ckplan
