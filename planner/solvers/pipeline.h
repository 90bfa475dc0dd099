#pragma once
/// Pipeline parallelism: the chain split into P contiguous stages, each with
/// its own checkpoint plan, where what a plan keeps after its forward is held
/// once per microbatch in flight (1F1B: stage s of p holds up to
/// min(p - s, m) microbatches, GPipe all m). Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/schedule.h"
#include "planner/solvers/recurrence.h"

namespace ckplan {

enum class PipelineSchedule { kOneFOneB, kGPipe };

const char* PipelineScheduleName(PipelineSchedule schedule);  ///< `1f1b`, `gpipe`
/// Throws BadInput quoting `name` if unknown.
PipelineSchedule ParsePipelineSchedule(const std::string& name);

/// Microbatches whose stored activations stage `stage` (0-based) of `stages`
/// holds at once, the one running its backward included.
int MicrobatchesInFlight(PipelineSchedule schedule, int stage, int stages, int microbatches);

/// The best persistent schedule of the recurrence for `chain` (in slots) such
/// that (in_flight - 1) x stored-after-forward + peak <= memory_slots, where
/// stored-after-forward is what the schedule holds when the loss starts (the
/// chain input included) and the peak is the recurrence's memory need (chain
/// input included). Exact: for each candidate stored-after-forward a, the
/// recurrence at memory M - (in_flight - 1) a with the first-descent path (the
/// checkpoints kept until the loss) limited to a; the sub-chains off that path
/// are solved by the plain recurrence (one table for all a).
struct InFlightSolution {
  bool feasible = false;
  double time_ms = kInfinity;
  Schedule schedule;
  int64_t stored_after_forward = 0;  ///< slots, chain input included
  int64_t need = 0;                  ///< slots: the schedule's own peak need, chain input included
};
InFlightSolution SolveInFlight(const DiscreteChain& chain, int64_t memory_slots, int in_flight);

/// For tests: every schedule the recurrence can build on `chain` (all choices
/// at every sub-chain), with its time, need and stored-after-forward, as in
/// SolveInFlight; the best one that fits `memory_slots` with `in_flight`.
InFlightSolution BruteForceInFlight(const DiscreteChain& chain, int64_t memory_slots, int in_flight);

/// The chain's stages [first, last) as a chain of their own: the input is
/// x_first; for a stage that is not the last, the "loss" is the arrival of the
/// output's gradient from the next stage (no time, no temporaries). Where the
/// chain lists storages, the sub-chain keeps them (its input's are those
/// crossing the cut before `first`).
Chain SubChain(const Chain& chain, int first, int last);

/// One pipeline stage's plan.
struct PipelineStagePlan {
  int first = 0, last = 0;        ///< chain stages [first, last)
  int in_flight = 1;
  int64_t fixed_bytes = 0;        ///< parameters, gradients, optimizer state of this stage (per rank)
  int64_t activation_budget_bytes = 0;
  InFlightSolution solution;      ///< in slots of slot_bytes
  int64_t slot_bytes = 1;
  double time_ms = 0;             ///< one microbatch's forward+backward, recomputation included
  int64_t stored_after_forward_bytes = 0;   ///< simulated, per microbatch
  int64_t peak_bytes = 0;         ///< simulated: fixed + (in_flight - 1) x stored + the schedule's peak
};

struct PipelinePlan {
  bool feasible = false;
  std::vector<PipelineStagePlan> stages;
  double slowest_stage_ms = kInfinity;
  /// The smallest budget for which some split fits (searched when infeasible; 0 if none).
  int64_t min_budget_bytes = 0;
};

/// `stage_fixed_bytes(first, last)`: the fixed part a stage covering chain
/// stages [first, last) holds, its parameter gradients included: with several
/// microbatches in flight they are held from the stage's first backward on,
/// while later microbatches run forward, so the chain passed here carries
/// none (WithoutParamGrads). Chooses the split minimising the slowest
/// stage's time (recomputation included) under `budget_bytes` per stage, each
/// stage planned by SolveInFlight with `slots` memory slots. Throws BadInput
/// when `stages` exceeds the chain's length or is below 1.
/// `stage_end_bytes(first, last)` (optional): what the stage holds at the
/// step's end, its activations gone and the optimizer's update running (the
/// fixed part and the update's temporaries); a stage fits only where it is
/// within the budget, and its peak is at least that.
PipelinePlan PlanPipeline(const Chain& chain, int stages, int microbatches, PipelineSchedule schedule,
                          int64_t budget_bytes, int slots,
                          const std::function<int64_t(int, int)>& stage_fixed_bytes,
                          const std::function<int64_t(int, int)>& stage_end_bytes = nullptr);

}  // namespace ckplan
