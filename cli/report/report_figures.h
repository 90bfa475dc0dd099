#pragma once
// The report's SVG figures (inline in the HTML page): the memory/time
// trade-off, the memory over the chosen plan's schedule, and the memory
// kept per stage. Labels are placed by label_layout.h.

#include <string>

#include "cli/report/report.h"

namespace ckplan {

/// Each strategy's predicted peak and step time, the optimal curve, and the
/// runs' measured points joined to their predictions.
std::string TradeoffSvg(const Report& report);
/// The chosen plan's simulated memory per schedule operation: the peak
/// during it and what stays stored after it, with the budget and the fixed part.
std::string TimelineSvg(const Report& report);
/// Activation memory kept for backward per stage, recomputed stages marked.
std::string ModulesSvg(const Report& report);
/// `--batches`: samples per second against batch, with and without checkpointing.
std::string BatchesSvg(const Report& report);

}  // namespace ckplan
