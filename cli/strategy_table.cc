#include "cli/strategy_table.h"

#include "cli/terminal.h"

namespace ckplan {

std::vector<std::vector<std::string>> StrategyTableRows(const std::vector<StrategyPoint>& points, UnitStyle style) {
  std::vector<std::vector<std::string>> rows = {{"strategy", "peak", "step", "overhead", "fits"}};
  for (const StrategyPoint& p : points) {
    rows.push_back({p.name, FormatBytes(p.peak_bytes, style), FormatMs(p.time_ms), FormatPct(p.overhead_pct),
                    p.fits ? "yes" : "no"});
  }
  return rows;
}

std::string StrategyTableText(const std::vector<StrategyPoint>& points, UnitStyle style) {
  return FormatTable(StrategyTableRows(points, style), {false, true, true, true, false});
}

}  // namespace ckplan
