#include "ckplan/planner/param_grads.h"

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
    total += grads.bytes[i];
  }
  return total;
}

Chain WithoutParamGrads(Chain chain) {
  for (Stage& s : chain.stages) {
    s.param_grad_bytes = 0;
    s.param_grad_bwd_bytes = -1;
  }
  return chain;
}

StageGradients StageGradientsOf(const Chain& chain) {
  StageGradients out;
  for (size_t i = 0; i < chain.stages.size(); ++i) {
    out.bytes.push_back(chain.stages[i].param_grad_bytes);
    out.held_in_bwd.push_back(chain.BwdGradBytes(static_cast<int>(i)));
  }
  return out;
}

}  // namespace ckplan
