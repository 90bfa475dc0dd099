#pragma once
/// The optimal persistent schedule for a heterogeneous chain (Beaumont,
/// Eyraud-Dubois, Herrmann, Joly, Shilova 2019), computed by dynamic
/// programming over memory slots. See the README for the recurrence.

#include <cstdint>
#include <limits>
#include <vector>

#include "ckplan/planner/chain.h"
#include "ckplan/planner/schedule.h"

namespace ckplan {

/// A chain with sizes in whole memory units (slots), as the recurrence sees
/// it. Index k of `x` is x_k (k = 0..L+1, x_{L+1} = 0); index k of `xbar` is
/// the saved size of stage k-1 (k = 1..L+1, xbar_{L+1} = 0); the per-stage
/// arrays have L+1 entries, the last one the loss (no forward, no fwd_tmp).
struct DiscreteChain {
  int length = 0;
  std::vector<int64_t> x, xbar, fwd_tmp, bwd_tmp;
  std::vector<double> fwd, bwd;
};

/// Sizes rounded UP to whole slots of `slot_bytes` (so a plan never exceeds
/// its budget); `slot_bytes` = 1 gives the exact chain in bytes.
DiscreteChain Discretize(const Chain& chain, int64_t slot_bytes);

constexpr double kInfinity = std::numeric_limits<double>::infinity();

struct OptimalSolution {
  bool feasible = false;
  double time_ms = kInfinity;     ///< OPT(M - x_0, 0, L)
  Schedule schedule;              ///< empty when infeasible
  /// time_ms of the optimum for every total memory 0..M (in slots, chain
  /// input included): the whole memory/time curve; infinity where infeasible.
  std::vector<double> curve_ms;
};

/// The recurrence computed plainly: every (m, i, l) with an O(L) scan per
/// cell. The reference for tests and benchmarks.
OptimalSolution SolveOptimalReference(const DiscreteChain& chain, int64_t memory_slots);

/// The same optimum, computed fast (see solver_fast.cc); `threads` >= 1.
OptimalSolution SolveOptimal(const DiscreteChain& chain, int64_t memory_slots, int threads = 1);

/// Bytes of the fast solver's table for this chain and memory (what
/// SolveOptimal allocates), for benchmarks.
size_t FastSolverTableBytes(const DiscreteChain& chain, int64_t memory_slots);

/// The recurrence's base case: the memory stage i needs (its input held
/// outside) to run with autograd and then backward, the gradient of its
/// output held: max(x_i + x_{i+1} + xbar_{i+1} + bwdtmp_i, x_{i+1} + xbar_{i+1} + fwdtmp_i).
int64_t BaseMemory(const DiscreteChain& chain, int i);

/// The smallest total memory (chain input included), in the chain's units,
/// for which the recurrence is feasible.
int64_t MinimumMemory(const DiscreteChain& chain);

/// Memory above which the recurrence needs no recomputation at all (every
/// stage run once with autograd), in the chain's units.
int64_t NoRecomputeMemory(const DiscreteChain& chain);

}  // namespace ckplan
