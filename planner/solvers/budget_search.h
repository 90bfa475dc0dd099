#pragma once
/// The search for budgets around the optimal solver (chain_solver.cc): slot
/// grids, the baselines every optimal plan is compared with, feasibility of
/// the optimal algorithm at a budget, the smallest feasible budget, and the
/// refinement of slots where rounding costs time. Budgets here are the
/// chain's (its input included); the plan layer adds the step's fixed part.

#include <cstdint>
#include <optional>
#include <vector>

#include "planner/solvers/chain_solver.h"
#include "planner/solvers/recurrence.h"

namespace ckplan {

// The slot size and slot count used for an activation budget.
struct SlotGrid {
  int64_t slot_bytes;
  int64_t memory_slots;
};

SlotGrid GridFor(int64_t chain_budget_bytes, int slots);

/// The grids RefineSlots may use at this budget: the request's, then halved
/// slots while the exact solver's table stays small.
std::vector<SlotGrid> RefinedGrids(const Chain& chain, int64_t chain_budget, int slots);

/// Feasibility with the solver the request's slot count picks (exact or
/// banded), on the request's grid or a finer one RefineSlots would use.
bool OptimalFeasible(const Chain& chain, int64_t chain_budget_bytes, int slots);

// The baselines (BaselineSolvers), simulated in bytes. An optimal plan is
// never slower than a baseline that fits: the solver rounds sizes up to
// whole slots, and the banded solver searches a band; either can miss a
// baseline that fits.
std::vector<ChainSolution> Baselines(const Chain& chain);
std::optional<ChainSolution> FastestFitting(const Chain& chain, int64_t chain_budget_bytes);
int64_t SmallestBaselinePeak(const Chain& chain);

/// Throws BadInput for a chain of more than kMaxStages stages.
void CheckStageCount(const Chain& chain);

/// Whether the optimal algorithm with `slots` slots finds a plan within
/// `chain_budget_bytes`: the feasibility check alone, no DP table (a
/// baseline that fits counts: the optimal plan is never worse).
bool OptimalChainBudgetFeasible(const Chain& chain, int64_t chain_budget_bytes, int slots);

/// The smallest chain budget for which the optimal algorithm with `slots`
/// slots is feasible. Throws BadInput when no budget is (too few slots).
int64_t MinimumOptimalChainBudget(const Chain& chain, int slots);

/// Where rounding sizes to slots may cost time, solves again on finer grids
/// and keeps the fastest solution (and its grid).
void RefineSlots(const Chain& chain, int64_t chain_budget, int slots, int threads, SlotGrid* grid,
                 OptimalSolution* solution);

}  // namespace ckplan
