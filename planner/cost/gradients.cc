#include "planner/cost/gradients.h"

#include <algorithm>

namespace ckplan {

int64_t AttachParamGrads(Chain* chain, const Profile& profile) {
  if (profile.parameters.empty()) return 0;
  const StageGradients grads = StageGradientBytes(*chain, profile);
  int64_t total = 0;
  for (size_t i = 0; i < chain->stages.size(); ++i) {
    Stage& s = chain->stages[i];
    s.param_grad_bytes = grads.bytes[i];
    s.param_grad_bwd_bytes = std::min(grads.held_in_bwd[i], grads.bytes[i]);
    s.bwd_replay_peak_bytes = i < grads.bwd_peak_bytes.size() ? grads.bwd_peak_bytes[i] : -1;
    s.bwd_run_peak_bytes = i < grads.run_bwd_peak_bytes.size() ? grads.run_bwd_peak_bytes[i] : -1;
    total += grads.bytes[i];
  }
  chain->checkpoint_state_bytes = grads.checkpoint_state_bytes;
  return total;
}

Chain WithoutParamGrads(Chain chain) {
  for (Stage& s : chain.stages) {
    s.param_grad_bytes = 0;
    s.param_grad_bwd_bytes = -1;
    s.bwd_replay_peak_bytes = -1;  // they count the stage's gradients
    s.bwd_run_peak_bytes = -1;
  }
  return chain;
}

StageGradients StageGradientsOf(const Chain& chain) {
  StageGradients out;
  for (size_t i = 0; i < chain.stages.size(); ++i) {
    out.bytes.push_back(chain.stages[i].param_grad_bytes);
    out.held_in_bwd.push_back(chain.BwdGradBytes(static_cast<int>(i)));
    out.bwd_peak_bytes.push_back(chain.stages[i].bwd_replay_peak_bytes);
    out.run_bwd_peak_bytes.push_back(chain.stages[i].bwd_run_peak_bytes);
  }
  out.checkpoint_state_bytes = chain.checkpoint_state_bytes;
  out.loss_scalar_bytes = chain.checkpoint_state_bytes > 0 ? kLossScalarBytes : 0;  // a chain cut from a profile
  return out;
}

}  // namespace ckplan
