#pragma once
// The device a step runs on: the CPU, or a CUDA GPU when ckplan was built
// against a LibTorch with CUDA. Part of the runtime (LibTorch).
//
// On CUDA, memory is the caching allocator's own accounting: its trace of
// allocations and frees feeds the same tracking ledger the CPU allocator
// feeds (so allocations are attributed to the running op alike), and the
// step's peak is its device statistics' peak of allocated bytes, reset per
// measurement. Kernel time per op comes from CUPTI activity records, or
// from CUDA events where CUPTI cannot start.

#include <ATen/core/Generator.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ckplan {

struct DeviceInfo {
  c10::Device device = c10::Device(c10::DeviceType::CPU);
  bool cuda() const { return device.is_cuda(); }
  std::string name;  ///< "cpu", or "cuda:0 (NVIDIA H200)"
};

/// Parses `--device` ("cpu", "cuda", "cuda:N") and checks this build and
/// machine can use it. Throws BadInput (one line) otherwise.
DeviceInfo OpenDevice(const std::string& text);

/// Whether this build has the CUDA path compiled.
bool BuiltWithCuda();

/// CUDA GPUs this build can use on this machine: 0 without a GPU or when the
/// LibTorch ckplan was built against has no CUDA.
int UsableCudaDevices();

/// CUDA: the caching allocator's allocations from now on are counted by the
/// tracking ledger (installed once). CPU: nothing to do.
void TrackDeviceMemory(const DeviceInfo& device);
/// CUDA: resets the allocator's peak statistics and returns the bytes
/// allocated on the device now; CPU: nullopt.
std::optional<int64_t> ResetDevicePeak(const DeviceInfo& device);
/// CUDA: peak allocated bytes since the last reset; CPU: nullopt (use the ledger).
std::optional<int64_t> DevicePeakBytes(const DeviceInfo& device);
/// A step's peak: on a GPU the allocator's peak less what was allocated at
/// the reset and is not the model's (`device_base` from ResetDevicePeak,
/// `ledger_kept` the ledger's live bytes at the reset that are the model's
/// state and inputs); on the CPU, `ledger_peak`.
int64_t StepPeakBytes(const DeviceInfo& device, std::optional<int64_t> device_base, int64_t ledger_kept,
                      int64_t ledger_peak);
void SynchronizeDevice(const DeviceInfo& device);
/// The generator that random ops (dropout) on this device draw from.
at::Generator DefaultGenerator(const DeviceInfo& device);

/// Kernel time per op on a GPU, for one step: windows opened and closed
/// around each op's forward and its backward functions, collected after.
class GpuOpTimer {
 public:
  virtual ~GpuOpTimer() = default;
  virtual void Begin(int op, bool backward) = 0;
  virtual void End(int op, bool backward) = 0;
  /// Waits for the device; adds each op's kernel milliseconds.
  virtual void Collect(std::vector<double>* fwd_ms, std::vector<double>* bwd_ms) = 0;
};

/// CUPTI when it starts, else CUDA events; `*timer_line` says which and why.
/// nullptr on the CPU.
std::unique_ptr<GpuOpTimer> MakeGpuOpTimer(const DeviceInfo& device, std::string* timer_line);

}  // namespace ckplan
