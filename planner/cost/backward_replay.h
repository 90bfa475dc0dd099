#pragma once
/// A stage's backward replayed op by op from the profile's measurements.

#include <cstdint>
#include <vector>

#include "planner/contracts/profile.h"

namespace ckplan {

/// The backward of ops [first_op, last_op], replayed op by op in reverse:
/// each op's measured transient on top of the gradients alive at that
/// point, less the saved tensors already released (gradients of the range's
/// inputs left out). `peak_bytes` is the largest such figure (may be
/// negative); with `held_after` (bytes each op's backward leaves held, by op
/// id), `peak_with_held_bytes` adds what the ops already back-propagated hold.
struct BackwardReplay {
  int64_t peak_bytes = 0;
  int64_t peak_with_held_bytes = 0;
};
BackwardReplay ReplayBackward(const Profile& profile, int first_op, int last_op,
                              const std::vector<int64_t>* held_after = nullptr);

}  // namespace ckplan
