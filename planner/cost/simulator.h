#pragma once
/// Replays a schedule over a chain, in bytes, without LibTorch: its peak
/// memory and time. Independent of the solver; every plan is checked by it.
///
/// Memory model (the one the solver's recurrence is safe for):
/// - stored values: act[k] (input of stage k, x_k), saved[i] (what stage i
///   keeps with autograd, saved_bytes, containing act[i+1]), grad[k] (the
///   gradient of act[k], x_k). Initially act[0].
/// - fwd_nograd_keep i / fwd_nograd i: needs act[i]; peak = stored + x_{i+1}
///   + fwd_tmp_i; adds act[i+1]; fwd_nograd drops a stored act[i] after.
/// - fwd_grad i: needs act[i]; peak = stored + max(saved_i, x_{i+1} +
///   fwd_tmp_i); adds saved[i].
/// - loss: needs act[L]; peak = stored + x_L + loss bwd_tmp; adds grad[L],
///   drops act[L].
/// - bwd i: needs saved[i], grad[i+1] and act[i]; peak = stored + x_i +
///   bwd_tmp_i + the stage's own parameter gradients held at that peak
///   (Chain::GradsAtBackwardPeakBytes), or, where the chain carries the stage's
///   backward replay, stored - x_{i+1} + Chain::ExecutorBackwardBytes(i) (the
///   replay counts the output's gradient, the input's, the stage's
///   gradients and transients); drops saved[i], grad[i+1], act[i]; adds grad[i]
///   and the stage's parameter gradients (param_grad_bytes), which stay to
///   the end of the step: gradients appear during backward.
/// An operation's peak is at least what is stored after it; the step's, at
/// least what is stored at its end plus the update's temporary.
/// A step is complete when every backward and the loss ran exactly once.
/// Time: fwd_grad costs the stage's fwd_ms, fwd_nograd(_keep) its forward
/// without autograd (NoGradFwdMs), bwd its bwd_ms, loss the loss's bwd_ms.

#include <cstdint>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/schedule.h"

namespace ckplan {

struct SimulationResult {
  int64_t peak_bytes = 0;                 ///< highest memory at any moment
  double time_ms = 0;                     ///< sum of the operations' times
  int64_t live_after_forward_bytes = 0;   ///< stored when the loss starts
  std::vector<int64_t> stored_after_bytes;  ///< per operation: stored after it
  std::vector<int64_t> peak_during_bytes;   ///< per operation: peak during it
};

/// Simulates `schedule` on `chain`. Throws Error(kVerifyFailed) naming the
/// operation for a schedule that reads a value it dropped (or never made),
/// names a stage out of range, or is incomplete.
SimulationResult Simulate(const Chain& chain, const Schedule& schedule);

}  // namespace ckplan
