#include "ckplan/planner/solver.h"

namespace ckplan {

OptimalSolution SolveOptimal(const DiscreteChain& chain, int64_t memory_slots, int /*threads*/) {
  return SolveOptimalReference(chain, memory_slots);
}

}  // namespace ckplan
