#include "cli/terminal.h"

#include "planner/base/json_io.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

namespace ckplan {

std::string FormatTable(const std::vector<std::vector<std::string>>& rows,
                        const std::vector<bool>& right_align) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) {
      const std::string& cell = rows[r][c];
      std::string pad(width[c] - cell.size(), ' ');
      bool right = c < right_align.size() && right_align[c];
      line += right ? pad + cell : cell + pad;
      if (c + 1 < rows[r].size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string FormatPct(double pct) { return Format("%+.1f%%", std::fabs(pct) < 0.05 ? 0.0 : pct); }

std::string FormatMs(double ms) { return Format("%.2f ms", ms); }

void EmitOutput(const std::string& path, const std::string& text, FILE* human) {
  if (path.empty()) return;
  if (path == "-") {
    WriteStdout(text);
    return;
  }
  WriteFileAtomic(path, text);
  std::fprintf(human, "\nwrote %s\n", path.c_str());
}

bool StderrIsTerminal() { return ::isatty(2) == 1; }

namespace {
double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

ProgressBar::ProgressBar(std::string label, bool enabled, double show_after_s)
    : label_(std::move(label)), enabled_(enabled), start_s_(NowSeconds()), show_after_s_(show_after_s) {}

ProgressBar::~ProgressBar() { Done(); }

void ProgressBar::Update(double fraction) {
  if (!enabled_) return;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const int percent = static_cast<int>(std::clamp(fraction, 0.0, 1.0) * 100);
  const double now = NowSeconds();
  if (now - start_s_ < show_after_s_) return;
  if (percent <= last_percent_ || (drawn_ && now - last_draw_s_ < 0.1)) return;
  constexpr int kWidth = 30;
  const int filled = percent * kWidth / 100;
  std::fprintf(stderr, "\r%s [%s%s] %3d%%", label_.c_str(), std::string(static_cast<size_t>(filled), '#').c_str(),
               std::string(static_cast<size_t>(kWidth - filled), '.').c_str(), percent);
  std::fflush(stderr);
  drawn_ = true;
  last_draw_s_ = now;
  last_percent_ = percent;
}

void ProgressBar::Done() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

double ProgressDelaySeconds() {
  const char* text = std::getenv("CKPLAN_PROGRESS_AFTER_S");
  if (text == nullptr || *text == '\0') return 0.5;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  return *end == '\0' && seconds >= 0 ? seconds : 0.5;
}

}  // namespace ckplan
