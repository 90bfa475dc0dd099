#include "planner/solvers/budget_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "planner/solvers/chain_solver.h"
#include "planner/base/error.h"

namespace ckplan {

SlotGrid GridFor(int64_t chain_budget_bytes, int slots) {
  if (chain_budget_bytes <= 0) return {1, -1};
  if (chain_budget_bytes < slots) return {1, chain_budget_bytes};
  // Every whole slot of the budget: the remainder of a division by `slots`
  // would be up to `slots` - 1 slot sizes' worth of budget lost.
  const int64_t slot_bytes = chain_budget_bytes / slots;
  return {slot_bytes, chain_budget_bytes / slot_bytes};
}

// Feasibility with the solver the request's slot count picks (exact or
// banded: their smallest memories differ).
bool OptimalFeasible(const Chain& chain, int64_t chain_budget_bytes, int slots) {
  SlotGrid grid = GridFor(chain_budget_bytes, slots);
  if (grid.memory_slots < 0) return false;
  const SolverMethod method = ChooseSolver(chain.length(), slots);
  if (SolverMinimumMemory(Discretize(chain, grid.slot_bytes), method) <= grid.memory_slots) return true;
  // The finer grids MakePlan refines to where the request's is infeasible.
  const std::vector<SlotGrid> grids = RefinedGrids(chain, chain_budget_bytes, slots);
  for (size_t k = 1; k < grids.size(); ++k) {
    const SlotGrid& finer = grids[k];
    if (MinimumMemory(Discretize(chain, finer.slot_bytes)) <= finer.memory_slots) return true;
  }
  return false;
}

std::vector<ChainSolution> Baselines(const Chain& chain) {
  std::vector<ChainSolution> baselines;
  for (const auto& solver : BaselineSolvers(chain.length())) {
    baselines.push_back(solver->Solve(chain, std::numeric_limits<int64_t>::max()));  // fits: every figure given
  }
  return baselines;
}

std::optional<ChainSolution> FastestFitting(const Chain& chain, int64_t chain_budget_bytes) {
  std::optional<ChainSolution> best;
  for (ChainSolution& b : Baselines(chain)) {
    if (b.peak_bytes <= chain_budget_bytes && (!best || b.time_ms < best->time_ms)) best = std::move(b);
  }
  return best;
}

int64_t SmallestBaselinePeak(const Chain& chain) {
  int64_t smallest = std::numeric_limits<int64_t>::max();
  for (const ChainSolution& b : Baselines(chain)) smallest = std::min(smallest, b.peak_bytes);
  return smallest;
}

void CheckStageCount(const Chain& chain) {
  if (chain.length() > kMaxStages) {
    throw BadInput("the chain has " + std::to_string(chain.length()) + " stages; at most " +
                   std::to_string(kMaxStages) + " are supported");
  }
}

bool OptimalChainBudgetFeasible(const Chain& chain, int64_t chain_budget_bytes, int slots) {
  CheckStageCount(chain);
  return OptimalFeasible(chain, chain_budget_bytes, slots) || SmallestBaselinePeak(chain) <= chain_budget_bytes;
}

int64_t MinimumOptimalChainBudget(const Chain& chain, int slots) {
  // Exact sizes give a lower bound; rounding to slots only adds. Search up
  // from it for the first feasible budget (to 0.01%).
  CheckStageCount(chain);
  // Sizes round up to whole slots: with too few slots no budget works.
  const int64_t largest = int64_t{1} << 61;
  if (!OptimalFeasible(chain, largest, slots)) {
    throw BadInput("no budget is feasible with --slots " + std::to_string(slots) +
                   ": every value takes at least one slot; use more slots (default 500)");
  }
  const int64_t baseline = SmallestBaselinePeak(chain);
  int64_t lower = SolverMinimumMemory(Discretize(chain, 1), ChooseSolver(chain.length(), slots));
  if (lower >= baseline) return baseline;
  if (OptimalFeasible(chain, lower, slots)) return lower;
  int64_t upper = lower;
  int64_t step = std::max<int64_t>(lower / 64, 1);
  while (!OptimalFeasible(chain, upper, slots)) {
    if (upper >= baseline) return baseline;  // a baseline fits where the solver does not
    lower = upper;
    upper = std::min(upper + step, baseline);
    step *= 2;
  }
  while (upper - lower > std::max<int64_t>(upper / 10000, 1)) {
    int64_t middle = lower + (upper - lower) / 2;
    if (OptimalFeasible(chain, middle, slots)) {
      upper = middle;
    } else {
      lower = middle;
    }
  }
  return upper;
}

namespace {

// Rounding sizes up to slots makes the solver's plan safe but can cost
// time. Certify that it costs at most kRoundingShare of the activation
// budget: the plan is no slower than the optimum in bytes at
// (1 - kRoundingShare) of the budget, which the optimum over sizes rounded
// DOWN bounds from below. Where that fails, halve the slot and solve again
// (exact solver only, the table within kRefineTableBytes); the fastest plan
// found is kept. Every plan is re-checked in bytes by the simulator.
constexpr double kRoundingShare = 0.005;
constexpr size_t kRefineTableBytes = size_t{256} << 20;

bool RoundingCertified(const Chain& chain, int64_t chain_budget, const SlotGrid& grid, const OptimalSolution& solution) {
  const int64_t relaxed_slots =
      static_cast<int64_t>(std::floor(static_cast<double>(chain_budget) * (1 - kRoundingShare))) / grid.slot_bytes;
  const DiscreteChain down = Discretize(chain, grid.slot_bytes, false);
  if (SolverTableBytes(down, relaxed_slots) > kRefineTableBytes) return true;  // nothing finer is affordable
  const OptimalSolution lower = SolveOptimal(down, relaxed_slots);
  if (!lower.feasible) return true;
  return solution.feasible && solution.time_ms <= lower.time_ms * (1 + 1e-12);
}

}  // namespace

// The grids RefineSlots may use at this budget: the request's, then halved
// slots while the exact solver's table stays within kRefineTableBytes.
std::vector<SlotGrid> RefinedGrids(const Chain& chain, int64_t chain_budget, int slots) {
  std::vector<SlotGrid> grids = {GridFor(chain_budget, slots)};
  for (int round = 0; round < 16; ++round) {
    const SlotGrid& last = grids.back();
    if (last.memory_slots < 0 || last.slot_bytes <= 1 || last.memory_slots > (1 << 29)) break;
    const SlotGrid finer = GridFor(chain_budget, static_cast<int>(last.memory_slots * 2));
    if (ChooseSolver(chain.length(), finer.memory_slots) != SolverMethod::kExact ||
        ChooseSolver(chain.length(), slots) != SolverMethod::kExact ||
        SolverTableBytes(Discretize(chain, finer.slot_bytes), finer.memory_slots) > kRefineTableBytes) {
      break;
    }
    grids.push_back(finer);
  }
  return grids;
}

void RefineSlots(const Chain& chain, int64_t chain_budget, int slots, int threads, SlotGrid* grid,
                 OptimalSolution* solution) {
  const std::vector<SlotGrid> grids = RefinedGrids(chain, chain_budget, slots);
  for (size_t k = 1; k < grids.size(); ++k) {
    if (solution->feasible && RoundingCertified(chain, chain_budget, grids[k - 1], *solution)) return;
    const SlotGrid& finer = grids[k];
    SolverOptions options;
    options.threads = threads;
    OptimalSolution next = SolveChain(Discretize(chain, finer.slot_bytes), finer.memory_slots, options);
    if (next.feasible && (!solution->feasible || next.time_ms < solution->time_ms)) {
      *solution = std::move(next);
      *grid = finer;
    }
  }
}

}  // namespace ckplan
