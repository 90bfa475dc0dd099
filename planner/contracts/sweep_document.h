#pragma once
/// The sweep contract, `ckplan.sweep/1`, as one value: what `ckplan solve
/// --sweep` writes, the optimal step time for every budget up to the
/// requested one (one DP table holds them all). Torch-free.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/contracts/plan_document.h"

namespace ckplan {

/// A point of the optimal memory/time curve.
struct CurvePoint {
  int64_t budget_bytes;   ///< in a Plan the whole step's (fixed part included); in a ChainSolution the chain's
  double time_ms;
};

/// One budget of the curve.
struct SweepPoint {
  int64_t budget_bytes = 0;  ///< the whole step, fixed part included
  double time_ms = 0;        ///< the optimal step time at it, the optimizer's update included
  double overhead_pct = 0;   ///< OverheadPct(time_ms, no_recompute_ms)
  bool operator==(const SweepPoint& o) const;
};

struct SweepDocument {
  PlanSource source;         ///< where the chain came from, as the plan's
  int slots = 0;             ///< the DP's memory slots
  int64_t slot_bytes = 0;
  int64_t fixed_bytes = 0;   ///< parameters, buffers, gradients, optimizer state held all step
  double no_recompute_ms = 0;
  std::vector<SweepPoint> points;  ///< the finite points, by budget
  bool operator==(const SweepDocument& o) const;
};


/// The `ckplan.sweep/1` document.
nlohmann::json SweepToJson(const SweepDocument& sweep);

/// Reads a `ckplan.sweep/1` document; every field is required. Throws
/// BadInput naming `file` and the field.
SweepDocument SweepFromJson(const nlohmann::json& doc, const std::string& file);

}  // namespace ckplan
