#pragma once
/// Small helpers for what the CLI prints: tables and progress lines.

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#include "planner/base/format.h"  // Format

namespace ckplan {

/// A plain text table: columns padded to the widest cell; the first row is
/// the header. Numbers right-aligned when `right_align[i]`.
std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<bool>& right_align);

/// A percentage (an overhead, an error) as every output prints it: `+3.5%`,
/// and `+0.0%` for anything that rounds to zero (never `-0.0%`).
std::string FormatPct(double pct);

/// A time as every output prints it: `12.34 ms` (two decimals).
std::string FormatMs(double ms);

/// Where a command's JSON goes: `-` is stdout, an empty path nowhere, any
/// other path a file written atomically, announced on `human` as `wrote PATH`.
void EmitOutput(const std::string& path, const std::string& text, FILE* human);

/// True when stderr is a terminal (progress lines are shown only then).
bool StderrIsTerminal();

/// A progress bar on stderr, `label [#######.............]  35%`, for long
/// work only: drawn when `enabled` (by default: stderr is a terminal) and
/// only once `show_after_s` seconds have passed since construction (a short
/// solve shows nothing), redrawn at most every 100 ms and erased when done,
/// so that nothing of it stays in the output. Update may be called from
/// several threads (a call that finds another drawing returns at once).
class ProgressBar {
 public:
  explicit ProgressBar(std::string label, bool enabled = StderrIsTerminal(), double show_after_s = 0.5);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void Update(double fraction);
  /// Erases the bar (if drawn).
  void Done();

 private:
  std::string label_;
  bool enabled_;
  double start_s_;
  double show_after_s_;
  std::mutex mutex_;
  bool drawn_ = false;
  double last_draw_s_ = -1;
  int last_percent_ = -1;
};

/// The delay before a progress bar shows, in seconds: 0.5, or the
/// environment's CKPLAN_PROGRESS_AFTER_S (tests set 0).
double ProgressDelaySeconds();

}  // namespace ckplan
