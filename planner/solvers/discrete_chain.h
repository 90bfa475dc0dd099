#pragma once
/// The chain as the recurrence sees it, sizes in whole memory slots, and
/// the memory each of the recurrence's choices needs (its floors).

#include <cstdint>
#include <vector>

#include "planner/contracts/chain.h"

namespace ckplan {

/// A chain with sizes in whole memory units (slots), as the recurrence sees
/// it. Index k of `x` is x_k (k = 0..L+1, x_{L+1} = 0); index k of `xbar` is
/// the saved size of stage k-1 (k = 1..L+1, xbar_{L+1} = 0); the per-stage
/// arrays have L+1 entries, the last one the loss (no forward, no fwd_tmp).
/// `fwd` is a forward with autograd (the base case's F_all), `fwd_nograd`
/// one without (what the forwards of a leaf, F_ck and F_null, cost).
/// `grad` is the parameter gradients each stage's backward makes (held to
/// the end of the step), `grads_at_bwd_peak` what of them its backward's peak holds
/// (Chain::GradsAtBackwardPeakBytes), both 0 for the loss. The gradients of a run
/// of stages are rounded as one sum, not stage by stage (a long chain's
/// would otherwise gain up to a slot per stage): `grad_hi[k]` and
/// `grad_lo[k]` are the byte sum over stages < k in slots, rounded up and
/// down (the other way round for a chain rounded down), L+2 entries.
/// `executor_bwd` is Chain::ExecutorBackwardBytes per stage (-1 where the chain has
/// no replay, and for the loss): the stage's backward, above its saved
/// values, in place of x_i + x_{i+1} + bwd_tmp + grads_at_bwd_peak.
struct DiscreteChain {
  int length = 0;
  std::vector<int64_t> x, xbar, fwd_tmp, bwd_tmp, grad, grads_at_bwd_peak, grad_hi, grad_lo, executor_bwd;
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

/// The floor of (i, l), l > i: every forward of i..l-1 runs while the
/// gradient of x_{l+1} is held.
int64_t FloorMemory(const DiscreteChain& chain, int i, int l);

/// The recurrence's base case: the memory stage i needs (its input held
/// outside) to run with autograd and then backward, the gradient of its
/// output held, charged as the simulator charges it:
/// max(KeptStageMemory(i), x_{i+1} + max(xbar_{i+1}, x_{i+1} + fwdtmp_i)).
int64_t BaseMemory(const DiscreteChain& chain, int i);

/// What choice (b) (stage i kept with autograd, i..l solved below it) needs
/// of stage i itself: its backward, x_i + x_{i+1} + xbar_{i+1} + bwdtmp_i +
/// its own parameter gradients at that peak (grads_at_bwd_peak_i); where the chain
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
