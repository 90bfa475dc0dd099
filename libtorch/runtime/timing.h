#pragma once
// Clocks shared by the profiler and the executor. Internal.
//
// On the CPU, work runs on one thread (at::set_num_threads(1); autograd runs
// CPU backward functions on the calling thread), so its cost is the thread's
// CPU time: unlike wall time, it does not grow when other processes take the
// CPU (on a shared machine, wall-clock steps of one model varied 2x between
// runs). A GPU's kernels run while the thread waits: there, wall time.

#include <time.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace ckplan {

/// CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), as a std::chrono clock.
struct ThreadCpuClock {
  using duration = std::chrono::nanoseconds;
  using rep = duration::rep;
  using period = duration::period;
  using time_point = std::chrono::time_point<ThreadCpuClock>;
  static constexpr bool is_steady = true;
  static time_point now() noexcept {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return time_point(duration(static_cast<rep>(ts.tv_sec) * 1000000000 + ts.tv_nsec));
  }
};

/// Op and step times on the CPU.
using Clock = ThreadCpuClock;
using WallClock = std::chrono::steady_clock;

inline double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

/// What reading the clock twice adds to a window (CLOCK_THREAD_CPUTIME_ID is
/// a system call: about 2 us on a virtual machine, as long as a small op):
/// the median of empty windows, measured once.
inline double TimerOverheadMs() {
  static const double overhead = [] {
    std::vector<double> empty;
    for (int k = 0; k < 201; ++k) {
      const Clock::time_point start = Clock::now();
      empty.push_back(MsSince(start));
    }
    std::sort(empty.begin(), empty.end());
    return empty[empty.size() / 2];
  }();
  return overhead;
}

/// An op's time: the window less the clock's own part of it.
inline double OpMsSince(Clock::time_point start) { return std::max(0.0, MsSince(start) - TimerOverheadMs()); }

/// Times a whole step: thread CPU time, or wall time where `wall` (a GPU).
class StepTimer {
 public:
  explicit StepTimer(bool wall) : wall_(wall), cpu_(Clock::now()), wall_start_(WallClock::now()) {}
  double Ms() const {
    return wall_ ? std::chrono::duration<double, std::milli>(WallClock::now() - wall_start_).count() : MsSince(cpu_);
  }

 private:
  bool wall_;
  Clock::time_point cpu_;
  WallClock::time_point wall_start_;
};

/// The median; 0 for none.
inline double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace ckplan
