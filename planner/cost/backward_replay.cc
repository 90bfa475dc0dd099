#include "planner/cost/backward_replay.h"

#include <algorithm>
#include <set>

namespace ckplan {

BackwardReplay ReplayBackward(const Profile& profile, int first_op, int last_op,
                              const std::vector<int64_t>* held_after) {
  BackwardReplay replay;
  int64_t extra = 0, held = 0;
  std::set<int> grads;
  for (int op = last_op; op >= first_op; --op) {
    const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
    int64_t input_grads = 0;
    for (int t : rec.inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (in.requires_grad && in.producer < first_op && grads.insert(t).second) input_grads += in.nbytes;
    }
    replay.peak_bytes = std::max(replay.peak_bytes, extra + rec.bwd_tmp_bytes - input_grads);
    replay.peak_with_held_bytes = std::max(replay.peak_with_held_bytes, extra + rec.bwd_tmp_bytes - input_grads + held);
    if (held_after != nullptr) held += (*held_after)[static_cast<size_t>(op)];  // in its own transient, then held
    for (int t : rec.outputs) {
      if (grads.erase(t)) extra -= profile.tensors[static_cast<size_t>(t)].nbytes;
    }
    for (int t : rec.inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (in.requires_grad && in.producer >= first_op && grads.insert(t).second) extra += in.nbytes;
    }
    extra -= rec.saved_bytes;
  }
  return replay;
}

}  // namespace ckplan
