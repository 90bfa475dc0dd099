#include "planner/solvers/baselines.h"

#include <algorithm>
#include <cmath>

namespace ckplan {

Schedule NoCheckpointSchedule(int length) {
  Schedule s;
  for (int i = 0; i < length; ++i) s.push_back({StepKind::kForwardGrad, i});
  s.push_back({StepKind::kLoss, length});
  for (int i = length - 1; i >= 0; --i) s.push_back({StepKind::kBackward, i});
  return s;
}

Schedule EveryNSchedule(int length, int n) {
  n = std::max(1, n);
  Schedule s;
  std::vector<int> starts;
  for (int begin = 0; begin < length; begin += n) {
    starts.push_back(begin);
    int end = std::min(length, begin + n);
    s.push_back({StepKind::kForwardNoGradKeep, begin});
    for (int k = begin + 1; k < end; ++k) s.push_back({StepKind::kForwardNoGrad, k});
  }
  s.push_back({StepKind::kLoss, length});
  for (auto it = starts.rbegin(); it != starts.rend(); ++it) {
    int begin = *it;
    int end = std::min(length, begin + n);
    for (int k = begin; k < end; ++k) s.push_back({StepKind::kForwardGrad, k});
    for (int k = end - 1; k >= begin; --k) s.push_back({StepKind::kBackward, k});
  }
  return s;
}

int SqrtSegmentLength(int length) {
  return std::max(1, static_cast<int>(std::lround(std::sqrt(static_cast<double>(length)))));
}

Schedule SqrtSchedule(int length) { return EveryNSchedule(length, SqrtSegmentLength(length)); }

}  // namespace ckplan
