#pragma once
/// The optimal persistent schedule for a heterogeneous chain (Beaumont,
/// Eyraud-Dubois, Herrmann, Joly, Shilova 2019), computed by dynamic
/// programming over memory slots on a DiscreteChain (discrete_chain.h).
/// The recurrence is described in docs/how-it-works.md.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "planner/contracts/schedule.h"
#include "planner/solvers/discrete_chain.h"

namespace ckplan {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

struct OptimalSolution {
  bool feasible = false;
  double time_ms = kInfinity;     ///< OPT(M - x_0, 0, L)
  Schedule schedule;              ///< empty when infeasible
  /// time_ms of the optimum for every total memory 0..M (in slots, chain
  /// input included): the whole memory/time curve; infinity where infeasible.
  std::vector<double> curve_ms;
  /// A proven lower bound on the recurrence's optimum at this memory:
  /// time_ms itself when the solution is exact (proven_optimal).
  double lower_bound_ms = kInfinity;
  bool proven_optimal = false;
  int band = 0;                   ///< the banded solver's band; 0 for the exact one
};

/// How SolveChain works a chain: the exact table over every sub-chain, or,
/// for long chains, the banded solver (see SolveBanded).
enum class SolverMethod { kExact, kBanded };

/// Longest chain the exact table is used for (more stages: banded), and the
/// banded solver's band.
constexpr int kExactMaxStages = 400;
constexpr int kDefaultBand = 32;
/// Largest table any solver allocates, in bytes (the process stays under 4 GB).
constexpr size_t kSolverTableLimitBytes = size_t{3} << 30;
/// Most stages a chain may have.
constexpr int kMaxStages = 32000;

/// Exact when the chain has at most kExactMaxStages stages and the exact
/// table cannot exceed kSolverTableLimitBytes at this memory; else banded.
/// Depends on the sizes only, so feasibility checks and solves agree.
SolverMethod ChooseSolver(int length, int64_t memory_slots);

/// Called with the fraction of the work done (0..1), from the solving thread.
using SolverProgress = std::function<void(double fraction)>;

struct SolverOptions {
  int threads = 1;            ///< the exact solver's threads; the banded one uses one
  SolverProgress progress;    ///< may be empty
};

/// Bytes the solver chosen by ChooseSolver will allocate for its table at
/// this memory, computed from the chain's sizes before anything large is
/// allocated.
size_t SolverTableBytes(const DiscreteChain& chain, int64_t memory_slots);

/// Throws BadInput (exit 2) when the chain has more than kMaxStages stages
/// or SolverTableBytes is above kSolverTableLimitBytes; the message gives
/// the figure. Allocates nothing large.
void CheckSolverFits(const DiscreteChain& chain, int64_t memory_slots);

/// The optimum by the method ChooseSolver picks. Throws BadInput (exit 2),
/// before allocating, when the chain has more than kMaxStages stages or the
/// table would exceed kSolverTableLimitBytes; the message gives the figure.
OptimalSolution SolveChain(const DiscreteChain& chain, int64_t memory_slots, const SolverOptions& options = {});

/// The smallest total memory for which SolveChain finds a plan with
/// `method`: MinimumMemory for the exact one.
int64_t SolverMinimumMemory(const DiscreteChain& chain, SolverMethod method);

/// A proven lower bound on the recurrence's smallest total memory
/// (x_0 + MinimumMemory), from the banded lower program in O(L (band^2 + L))
/// integer work: for chains too long for MinimumMemory's O(L^3). Equal to
/// it when the band covers the chain.
int64_t MinimumMemoryLowerBound(const DiscreteChain& chain, int band = kDefaultBand);

/// The banded solver, for chains too long for the exact table. An upper
/// bound and a lower bound on the recurrence's optimum, each by a dynamic
/// program over the sub-chains (i, l) with l - i < band plus the suffixes
/// (i, L), so O(L (band + S)) memory:
///  - upper: the plan it returns, the best among the schedules whose every
///    recomputed segment (a leaf at j on (i, l): stages i..j-1 run again) is
///    shorter than `band` stages or runs with no recomputation inside itself
///    (feasible from the memory the recurrence counts for that);
///  - lower: the same program where a longer segment's own cost is replaced
///    by a lower bound (every stage once forward and backward, plus one more
///    forward when its memory is below what no recomputation needs; infinite
///    below its floor or any of its stages' base memory).
/// Every schedule of the recurrence maps to the lower program at no more
/// cost, so lower_bound_ms <= the exact optimum <= time_ms; proven_optimal
/// when they are equal. With band > L both are the exact solver.
OptimalSolution SolveBanded(const DiscreteChain& chain, int64_t memory_slots, int band = kDefaultBand,
                            const SolverProgress& progress = {});

/// The recurrence computed plainly: every (m, i, l) with an O(L) scan per
/// cell. The reference for tests and benchmarks.
OptimalSolution SolveOptimalReference(const DiscreteChain& chain, int64_t memory_slots);

/// The same optimum, computed fast (see recurrence.cc); `threads` >= 1.
OptimalSolution SolveOptimal(const DiscreteChain& chain, int64_t memory_slots, int threads = 1,
                             const SolverProgress& progress = {});

/// Bytes of the fast solver's table for this chain and memory (what
/// SolveOptimal allocates), for benchmarks.
size_t FastSolverTableBytes(const DiscreteChain& chain, int64_t memory_slots);

}  // namespace ckplan
