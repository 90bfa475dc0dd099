// The device layer of a build whose LibTorch has no CUDA: the CPU only.

#include <ATen/CPUGeneratorImpl.h>

#include "planner/base/error.h"
#include "libtorch/runtime/device.h"
#include "libtorch/runtime/graph_program.h"

namespace ckplan {

int UsableCudaDevices() { return 0; }

bool BuiltWithCuda() { return false; }

DeviceInfo OpenDevice(const std::string& text) {
  if (text == "cpu") return DeviceInfo{c10::Device(c10::DeviceType::CPU), "cpu"};
  if (text.rfind("cuda", 0) == 0) {
    throw BadInput("--device " + text + ": this build of ckplan is CPU only (LibTorch " + LibTorchVersion() +
                   " without CUDA, or -DCKPLAN_WITH_CUDA=OFF): build it against the CUDA torch wheel, as "
                   "scripts/setup.sh does");
  }
  throw BadInput("invalid --device '" + text + "': use cpu or cuda[:N]");
}

void TrackDeviceMemory(const DeviceInfo&) {}
std::optional<int64_t> ResetDevicePeak(const DeviceInfo&) { return std::nullopt; }
std::optional<int64_t> DevicePeakBytes(const DeviceInfo&) { return std::nullopt; }
int64_t StepPeakBytes(const DeviceInfo&, std::optional<int64_t>, int64_t, int64_t ledger_peak) { return ledger_peak; }
void SynchronizeDevice(const DeviceInfo&) {}
at::Generator DefaultGenerator(const DeviceInfo&) { return at::detail::getDefaultCPUGenerator(); }
std::unique_ptr<GpuOpTimer> MakeGpuOpTimer(const DeviceInfo&, std::string*) { return nullptr; }

}  // namespace ckplan
