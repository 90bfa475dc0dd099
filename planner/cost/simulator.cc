#include "planner/cost/simulator.h"

#include <algorithm>
#include <map>
#include <string>

#include "planner/base/error.h"

namespace ckplan {

namespace {

// Memory of the stored values when the chain knows its storages: a storage
// held by several values (a skip connection crossing several cuts) counts once.
class SharedStorages {
 public:
  explicit SharedStorages(const Chain& chain) : chain_(chain) {}

  const std::vector<std::pair<int64_t, int64_t>>& Cut(int k) const {
    return k == 0 ? chain_.input_storages : chain_.stages[static_cast<size_t>(k - 1)].out_storages;
  }
  // Bytes of the storages at cut k that nothing holds yet.
  int64_t NewBytes(int k) const {
    int64_t total = 0;
    for (const auto& [id, bytes] : Cut(k)) {
      auto it = refs_.find(id);
      if (it == refs_.end() || it->second == 0) total += bytes;
    }
    return total;
  }
  int64_t Hold(int k) {  // returns the bytes it adds
    int64_t added = 0;
    for (const auto& [id, bytes] : Cut(k)) {
      if (refs_[id]++ == 0) added += bytes;
    }
    return added;
  }
  int64_t Release(int k) {  // returns the bytes it frees
    int64_t freed = 0;
    for (const auto& [id, bytes] : Cut(k)) {
      if (--refs_[id] == 0) freed += bytes;
    }
    return freed;
  }

 private:
  const Chain& chain_;
  std::map<int64_t, int> refs_;
};

}  // namespace

SimulationResult Simulate(const Chain& chain, const Schedule& schedule) {
  const int length = chain.length();
  const bool shared = chain.has_storages();
  SharedStorages storages(chain);
  const size_t n = static_cast<size_t>(length) + 2;
  std::vector<bool> act(n, false), saved(n, false), grad(n, false);
  std::vector<int> backward_runs(n, 0);
  auto x = [&](int k) { return chain.StageInputBytes(k); };

  SimulationResult result;
  int64_t stored = shared ? storages.Hold(0) : x(0);
  act[0] = true;
  result.peak_bytes = stored;
  bool forward_done = false;

  for (size_t index = 0; index < schedule.size(); ++index) {
    const ScheduleStep& op = schedule[index];
    const int i = op.stage;
    auto fail = [&](const std::string& why) {
      return Error(ExitCode::kVerifyFailed,
                   "schedule op " + std::to_string(index) + " (" + Describe(op) + "): " + why);
    };
    const int max_stage = op.kind == StepKind::kLoss ? length : length - 1;
    if (i < 0 || i > max_stage || (op.kind == StepKind::kLoss && i != length)) {
      throw fail("stage out of range 0.." + std::to_string(max_stage));
    }
    const size_t u = static_cast<size_t>(i);
    // act[i] is readable when stored alone or inside saved[i-1].
    auto input_available = [&] { return act[u] || (i > 0 && saved[u - 1]); };
    int64_t peak = stored;

    switch (op.kind) {
      case StepKind::kForwardNoGradKeep:
      case StepKind::kForwardNoGrad: {
        if (!input_available()) throw fail("reads the input of stage " + std::to_string(i) + ", which is not stored");
        const Stage& s = chain.stages[u];
        if (shared) {
          peak = stored + storages.NewBytes(i + 1) + s.fwd_tmp_bytes;
          if (!act[u + 1]) {
            act[u + 1] = true;
            stored += storages.Hold(i + 1);
          }
          if (op.kind == StepKind::kForwardNoGrad && act[u]) {
            act[u] = false;
            stored -= storages.Release(i);
          }
          break;
        }
        peak = stored + s.out_bytes + s.fwd_tmp_bytes;
        if (!act[u + 1]) {
          act[u + 1] = true;
          stored += s.out_bytes;
        }
        if (op.kind == StepKind::kForwardNoGrad && act[u]) {
          act[u] = false;
          stored -= x(i);
        }
        break;
      }
      case StepKind::kForwardGrad: {
        if (!input_available()) throw fail("reads the input of stage " + std::to_string(i) + ", which is not stored");
        const Stage& s = chain.stages[u];
        if (saved[u]) throw fail("stage " + std::to_string(i) + " is already stored with autograd");
        saved[u] = true;
        if (shared) {
          const int64_t fresh = storages.NewBytes(i + 1);
          peak = stored + std::max(*s.private_saved_bytes + fresh, fresh + s.fwd_tmp_bytes);
          stored += *s.private_saved_bytes + storages.Hold(i + 1);
          break;
        }
        peak = stored + std::max(s.saved_bytes, s.out_bytes + s.fwd_tmp_bytes);
        stored += s.saved_bytes;
        break;
      }
      case StepKind::kLoss: {
        if (!input_available()) throw fail("reads the chain output, which is not stored");
        if (backward_runs[u] > 0) throw fail("the loss runs twice");
        peak = stored + x(length) + chain.loss_bwd_tmp_bytes;
        result.live_after_forward_bytes = stored;
        grad[u] = true;
        stored += x(length);
        if (act[u]) {
          act[u] = false;
          stored -= shared ? storages.Release(length) : x(length);
        }
        backward_runs[u]++;
        forward_done = true;
        break;
      }
      case StepKind::kBackward: {
        const Stage& s = chain.stages[u];
        if (!saved[u]) throw fail("needs what stage " + std::to_string(i) + " saved with autograd, which is not stored");
        if (!grad[u + 1]) throw fail("needs the gradient of the output of stage " + std::to_string(i) + ", which is not there");
        if (!input_available()) throw fail("needs the input of stage " + std::to_string(i) + ", which is not stored");
        if (backward_runs[u] > 0) throw fail("the backward of stage " + std::to_string(i) + " runs twice");
        // The stage's parameter gradients appear in its backward and stay.
        // With the stage's replay: what it adds above what is stored less
        // its output's gradient (which the replay counts).
        const int64_t replay = chain.ExecutorBackwardBytes(i);
        peak = replay >= 0 ? stored - x(i + 1) + replay : stored + x(i) + s.bwd_tmp_bytes + chain.GradsAtBackwardPeakBytes(i);
        stored += s.param_grad_bytes;
        saved[u] = false;
        stored -= shared ? *s.private_saved_bytes + storages.Release(i + 1) : s.saved_bytes;
        grad[u + 1] = false;
        stored -= x(i + 1);
        if (act[u]) {
          act[u] = false;
          stored -= shared ? storages.Release(i) : x(i);
        }
        grad[u] = true;
        stored += x(i);
        backward_runs[u]++;
        break;
      }
    }
    switch (op.kind) {
      case StepKind::kForwardNoGradKeep:
      case StepKind::kForwardNoGrad:
        result.time_ms += chain.stages[u].NoGradFwdMs();
        break;
      case StepKind::kForwardGrad:
        result.time_ms += chain.stages[u].fwd_ms;
        break;
      case StepKind::kLoss:
        result.time_ms += chain.loss_bwd_ms;
        break;
      case StepKind::kBackward:
        result.time_ms += chain.stages[u].bwd_ms;
        break;
    }
    peak = std::max(peak, stored);  // what stays after it is held at its end
    result.peak_bytes = std::max(result.peak_bytes, peak);
    result.stored_after_bytes.push_back(stored);
    result.peak_during_bytes.push_back(peak);
  }
  // The step's end: every gradient made, the optimizer's update running.
  result.peak_bytes = std::max(result.peak_bytes, stored + chain.update_tmp_bytes);
  if (!forward_done) {
    throw Error(ExitCode::kVerifyFailed, "schedule is incomplete: the loss never runs");
  }
  for (int i = 0; i < length; ++i) {
    if (backward_runs[static_cast<size_t>(i)] != 1) {
      throw Error(ExitCode::kVerifyFailed,
                  "schedule is incomplete: no backward for stage " + std::to_string(i));
    }
  }
  return result;
}

}  // namespace ckplan
