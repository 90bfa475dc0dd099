#include "planner/solvers/recurrence.h"

#include <algorithm>
#include <functional>

#include "planner/base/error.h"

namespace ckplan {

OptimalSolution SolveOptimalReference(const DiscreteChain& c, int64_t memory_slots) {
  OptimalSolution solution;
  const int length = c.length;
  const int n = length + 1;
  const int64_t top = memory_slots - c.x[0];
  solution.curve_ms.assign(static_cast<size_t>(std::max<int64_t>(memory_slots, 0)) + 1, kInfinity);
  if (top < 0) return solution;
  const size_t cells = static_cast<size_t>(top + 1) * n * n;
  std::vector<double> opt(cells, kInfinity);
  std::vector<int32_t> what(cells, 0);  // j > 0: leaf (a) at j; -1: chain (b)
  auto index = [n](int64_t m, int i, int l) {
    return (static_cast<size_t>(m) * n + static_cast<size_t>(i)) * n + static_cast<size_t>(l);
  };

  for (int64_t m = 0; m <= top; ++m) {
    for (int i = 0; i < n; ++i) {
      if (m >= BaseMemory(c, i)) opt[index(m, i, i)] = c.fwd[static_cast<size_t>(i)] + c.bwd[static_cast<size_t>(i)];
    }
    for (int d = 1; d < n; ++d) {
      for (int i = 0; i + d < n; ++i) {
        const int l = i + d;
        if (m < FloorMemory(c, i, l)) continue;
        double best_leaf = kInfinity;
        int best_j = -1;
        double forward_sum = 0;
        for (int j = i + 1; j <= l; ++j) {
          forward_sum += c.fwd_nograd[static_cast<size_t>(j) - 1];
          const int64_t xj = c.x[static_cast<size_t>(j)];
          if (m < xj) continue;
          // The left part runs with the right part's parameter gradients held.
          const int64_t grads = c.GradBytes(j, l);
          if (m < grads) continue;
          double value = forward_sum + opt[index(m - xj, j, l)] + opt[index(m - grads, i, j - 1)];
          if (best_j < 0 || value < best_leaf) {
            best_leaf = value;
            best_j = j;
          }
        }
        double chain_value = kInfinity;
        const int64_t xbar = c.xbar[static_cast<size_t>(i) + 1];
        if (m >= xbar && m >= ChainMemory(c, i, l)) {
          chain_value = (c.fwd[static_cast<size_t>(i)] + c.bwd[static_cast<size_t>(i)]) + opt[index(m - xbar, i + 1, l)];
        }
        if (best_j >= 0 && best_leaf <= chain_value) {
          opt[index(m, i, l)] = best_leaf;
          what[index(m, i, l)] = best_j;
        } else {
          opt[index(m, i, l)] = chain_value;
          what[index(m, i, l)] = -1;
        }
      }
    }
    solution.curve_ms[static_cast<size_t>(m + c.x[0])] = opt[index(m, 0, length)];
  }

  solution.time_ms = opt[index(top, 0, length)];
  solution.feasible = solution.time_ms < kInfinity;
  if (!solution.feasible) return solution;

  std::function<void(int64_t, int, int)> read_back = [&](int64_t m, int i, int l) {
    if (i == l) {
      if (i == length) {
        solution.schedule.push_back({StepKind::kLoss, i});
      } else {
        solution.schedule.push_back({StepKind::kForwardGrad, i});
        solution.schedule.push_back({StepKind::kBackward, i});
      }
      return;
    }
    const int choice = what[index(m, i, l)];
    if (choice < 0) {
      solution.schedule.push_back({StepKind::kForwardGrad, i});
      read_back(m - c.xbar[static_cast<size_t>(i) + 1], i + 1, l);
      solution.schedule.push_back({StepKind::kBackward, i});
    } else {
      const int j = choice;
      solution.schedule.push_back({StepKind::kForwardNoGradKeep, i});
      for (int k = i + 1; k < j; ++k) solution.schedule.push_back({StepKind::kForwardNoGrad, k});
      read_back(m - c.x[static_cast<size_t>(j)], j, l);
      read_back(m - c.GradBytes(j, l), i, j - 1);
    }
  };
  read_back(top, 0, length);
  return solution;
}

}  // namespace ckplan
