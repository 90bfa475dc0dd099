#pragma once
/// GPU kernel time per op, from activity records (CUPTI), behind a small
/// interface so that tests feed canned records. Torch-free and CUDA-free.
///
/// The profiler marks each op's forward and backward as windows on the
/// activity source's clock; a kernel belongs to the op whose window holds the
/// host API call that launched it (matched through the correlation id).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ckplan {

struct KernelRecord {
  uint32_t correlation_id = 0;
  uint64_t start_ns = 0;   ///< on the device, activity clock
  uint64_t end_ns = 0;
  std::string name;
};

struct LaunchRecord {
  uint32_t correlation_id = 0;
  uint64_t start_ns = 0;   ///< the host API call that launched a kernel
};

struct OpWindow {
  int op = 0;
  bool backward = false;
  uint64_t start_ns = 0;
  uint64_t end_ns = 0;
};

struct OpKernelTime {
  double fwd_ms = 0;
  double bwd_ms = 0;
  int kernels = 0;
};

struct KernelAttribution {
  std::vector<OpKernelTime> per_op;
  double total_ms = 0;            ///< every kernel of the step
  double unattributed_ms = 0;     ///< kernels launched outside any op window
};

/// Sums kernel durations per op and phase. Windows may nest (a backward
/// function inside a window of the step): the innermost window wins.
KernelAttribution AttributeKernels(int num_ops, const std::vector<OpWindow>& windows,
                                   const std::vector<LaunchRecord>& launches,
                                   const std::vector<KernelRecord>& kernels);

/// A source of kernel activity: CUPTI, or canned records in tests.
class KernelActivitySource {
 public:
  virtual ~KernelActivitySource() = default;
  /// Starts recording. False, with the reason, when it cannot (no GPU, no
  /// CUPTI, no driver): the caller falls back to CUDA events.
  virtual bool Start(std::string* why_not) = 0;
  /// Stops and delivers every record since Start.
  virtual void Stop(std::vector<LaunchRecord>* launches, std::vector<KernelRecord>* kernels) = 0;
  /// Now, on the records' clock.
  virtual uint64_t Now() = 0;
};

/// CUPTI's activity API; nullptr when ckplan was built without CUPTI.
std::unique_ptr<KernelActivitySource> MakeCuptiSource();

/// Which GPU timer to use: CUPTI when it starts, else CUDA events. The
/// message says which, and why not CUPTI.
struct TimerChoice {
  bool cupti = false;
  std::string message;
};
TimerChoice ChooseGpuTimer(KernelActivitySource* cupti);

}  // namespace ckplan
