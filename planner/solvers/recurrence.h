#pragma once
/// The optimal persistent schedule for a heterogeneous chain (Beaumont,
/// Eyraud-Dubois, Herrmann, Joly, Shilova 2019), computed by dynamic
/// programming over memory slots. See the README for the recurrence.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/schedule.h"

namespace ckplan {

/// A chain with sizes in whole memory units (slots), as the recurrence sees
/// it. Index k of `x` is x_k (k = 0..L+1, x_{L+1} = 0); index k of `xbar` is
/// the saved size of stage k-1 (k = 1..L+1, xbar_{L+1} = 0); the per-stage
/// arrays have L+1 entries, the last one the loss (no forward, no fwd_tmp).
/// `fwd` is a forward with autograd (the base case's F_all), `fwd_nograd`
/// one without (what the forwards of a leaf, F_ck and F_null, cost).
/// `grad` is the parameter gradients each stage's backward makes (held to
/// the end of the step), `bwd_grad` what of them its backward's peak holds
/// (Chain::BwdGradBytes), both 0 for the loss. The gradients of a run
/// of stages are rounded as one sum, not stage by stage (a long chain's
/// would otherwise gain up to a slot per stage): `grad_hi[k]` and
/// `grad_lo[k]` are the byte sum over stages < k in slots, rounded up and
/// down (the other way round for a chain rounded down), L+2 entries.
/// `bwd_replay` is Chain::BwdReplayBytes per stage (-1 where the chain has
/// no replay, and for the loss): the stage's backward, above its saved
/// values, in place of x_i + x_{i+1} + bwd_tmp + bwd_grad.
struct DiscreteChain {
  int length = 0;
  std::vector<int64_t> x, xbar, fwd_tmp, bwd_tmp, grad, bwd_grad, grad_hi, grad_lo, bwd_replay;
  std::vector<double> fwd, bwd, fwd_nograd;
  /// The parameter gradients of stages a..b (0 when b < a), in slots:
  /// never below their bytes for a chain rounded up, never above for one
  /// rounded down.
  int64_t GradBytes(int a, int b) const {
    if (b < a) return 0;
    const int64_t slots = grad_hi[static_cast<size_t>(b) + 1] - grad_lo[static_cast<size_t>(a)];
    return slots > 0 ? slots : 0;
  }
};

/// Sizes rounded UP to whole slots of `slot_bytes` (so a plan never exceeds
/// its budget); `slot_bytes` = 1 gives the exact chain in bytes. Rounded
/// down (`round_up` false): a relaxation, whose optimum at floor(M / slot)
/// slots bounds the optimum in bytes at M from below.
DiscreteChain Discretize(const Chain& chain, int64_t slot_bytes, bool round_up = true);

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

/// The same optimum, computed fast (see solver_fast.cc); `threads` >= 1.
OptimalSolution SolveOptimal(const DiscreteChain& chain, int64_t memory_slots, int threads = 1,
                             const SolverProgress& progress = {});

/// Bytes of the fast solver's table for this chain and memory (what
/// SolveOptimal allocates), for benchmarks.
size_t FastSolverTableBytes(const DiscreteChain& chain, int64_t memory_slots);

/// The recurrence's base case: the memory stage i needs (its input held
/// outside) to run with autograd and then backward, the gradient of its
/// output held, charged as the simulator charges it:
/// max(KeptStageMemory(i), x_{i+1} + max(xbar_{i+1}, x_{i+1} + fwdtmp_i)).
int64_t BaseMemory(const DiscreteChain& chain, int i);

/// What choice (b) (stage i kept with autograd, i..l solved below it) needs
/// of stage i itself: its backward, x_i + x_{i+1} + xbar_{i+1} + bwdtmp_i +
/// its own parameter gradients at that peak (bwd_grad_i); where the chain
/// carries the stage's replay, xbar_{i+1} + bwd_replay_i.
/// Its forward then runs while the gradient of x_{l+1} is held, which the
/// floor of (i, l) and the memory of (i+1, l) already cover.
int64_t KeptStageMemory(const DiscreteChain& chain, int i);

/// Choice (b) on (i, l): KeptStageMemory(i) plus the parameter gradients of
/// stages i+1..l, made by their backwards before stage i's.
int64_t ChainMemory(const DiscreteChain& chain, int i, int l);

/// The smallest total memory (chain input included), in the chain's units,
/// for which the recurrence is feasible.
int64_t MinimumMemory(const DiscreteChain& chain);

/// Memory above which the recurrence needs no recomputation at all (every
/// stage run once with autograd), in the chain's units.
int64_t NoRecomputeMemory(const DiscreteChain& chain);

}  // namespace ckplan
