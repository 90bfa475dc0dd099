#pragma once
/// Fixed checkpointing strategies, as schedules in the same format as the
/// optimal plan, for comparison.

#include "planner/contracts/schedule.h"

namespace ckplan {

/// Keep everything: every stage with autograd, then the backward.
Schedule NoCheckpointSchedule(int length);

/// Segments of `n` stages: the forward keeps only each segment's input; in
/// the backward each segment is recomputed once with autograd and then
/// back-propagated (as torch.utils.checkpoint does). n = 1 is `every`.
Schedule EveryNSchedule(int length, int n);

/// Chen et al. 2016: segments of about sqrt(L) stages.
Schedule SqrtSchedule(int length);

/// The segment length `sqrt` uses for a chain of `length` stages.
int SqrtSegmentLength(int length);

}  // namespace ckplan
