// The GPU timing layer with canned activity records, and CUPTI on a machine
// without a GPU: it must fail to start with a reason, not crash.

#include "gpu/kernel_timing.h"

#include <doctest/doctest.h>

#include <filesystem>
#include <system_error>

using namespace ckplan;

namespace {

// Canned records: the stand-in for CUPTI in tests.
class CannedSource final : public KernelActivitySource {
 public:
  CannedSource(std::vector<LaunchRecord> launches, std::vector<KernelRecord> kernels, bool available = true)
      : launches_(std::move(launches)), kernels_(std::move(kernels)), available_(available) {}
  bool Start(std::string* why_not) override {
    if (!available_) *why_not = "CUPTI_ERROR_UNKNOWN (999)";
    return available_;
  }
  void Stop(std::vector<LaunchRecord>* launches, std::vector<KernelRecord>* kernels) override {
    *launches = launches_;
    *kernels = kernels_;
  }
  uint64_t Now() override { return now_ += 1000; }

 private:
  std::vector<LaunchRecord> launches_;
  std::vector<KernelRecord> kernels_;
  bool available_;
  uint64_t now_ = 0;
};

}  // namespace

TEST_CASE("kernels are attributed to the op and phase that launched them") {
  // op 0 forward [100, 200], op 1 forward [200, 300], op 1 backward [400, 500],
  // op 0 backward [500, 600]; kernels run later on the device, asynchronously.
  std::vector<OpWindow> windows = {{0, false, 100, 200}, {1, false, 200, 300}, {1, true, 400, 500}, {0, true, 500, 600}};
  std::vector<LaunchRecord> launches = {{1, 110}, {2, 150}, {3, 250}, {4, 450}, {5, 560}, {6, 350}};
  std::vector<KernelRecord> kernels = {
      {1, 1000000, 3000000, "conv"},  {2, 3000000, 3500000, "bn"},     {3, 3500000, 7500000, "gemm"},
      {4, 8000000, 16000000, "gemm_bwd"}, {5, 16000000, 17000000, "conv_bwd"}, {6, 7500000, 8000000, "memset"}};
  KernelAttribution a = AttributeKernels(2, windows, launches, kernels);
  CHECK(a.per_op[0].fwd_ms == doctest::Approx(2.5));
  CHECK(a.per_op[1].fwd_ms == doctest::Approx(4.0));
  CHECK(a.per_op[1].bwd_ms == doctest::Approx(8.0));
  CHECK(a.per_op[0].bwd_ms == doctest::Approx(1.0));
  CHECK(a.per_op[0].kernels == 3);
  CHECK(a.unattributed_ms == doctest::Approx(0.5));  // launched between windows
  CHECK(a.total_ms == doctest::Approx(16.0));
}

TEST_CASE("nested windows: the innermost one owns the launch") {
  std::vector<OpWindow> windows = {{0, true, 0, 1000}, {3, true, 100, 200}};
  std::vector<LaunchRecord> launches = {{7, 150}, {8, 500}};
  std::vector<KernelRecord> kernels = {{7, 0, 2000000, "a"}, {8, 0, 1000000, "b"}};
  KernelAttribution a = AttributeKernels(4, windows, launches, kernels);
  CHECK(a.per_op[3].bwd_ms == doctest::Approx(2.0));
  CHECK(a.per_op[0].bwd_ms == doctest::Approx(1.0));
}

TEST_CASE("the timer falls back to CUDA events, saying why, when CUPTI cannot start") {
  CannedSource unavailable({}, {}, false);
  TimerChoice choice = ChooseGpuTimer(&unavailable);
  CHECK_FALSE(choice.cupti);
  CHECK(choice.message == "GPU timer: CUDA events (CUPTI unavailable: CUPTI_ERROR_UNKNOWN (999))");
  CannedSource available({}, {});
  CHECK(ChooseGpuTimer(&available).cupti);
  CHECK(ChooseGpuTimer(nullptr).message.find("without CUPTI") != std::string::npos);
}

TEST_CASE("real CUPTI on this machine: starts only with a GPU, and never crashes") {
  std::unique_ptr<KernelActivitySource> cupti = MakeCuptiSource();
  TimerChoice choice = ChooseGpuTimer(cupti.get());
  MESSAGE(choice.message);
  if (!cupti) {  // built without CUPTI
    CHECK_FALSE(choice.cupti);
    CHECK(choice.message.find("without CUPTI") != std::string::npos);
    return;
  }
  // Whether a GPU is there is decided independently of CUPTI: the NVIDIA
  // driver lists each GPU it drives under /proc/driver/nvidia/gpus.
  std::error_code error;
  const bool gpu = std::filesystem::is_directory("/proc/driver/nvidia/gpus", error) &&
                   !std::filesystem::is_empty("/proc/driver/nvidia/gpus", error);
  CHECK(choice.cupti == gpu);
  if (choice.cupti) {
    CHECK(choice.message.find("CUPTI kernel activity records") != std::string::npos);
  } else {
    CHECK(choice.message.find("CUDA events (CUPTI unavailable: ") != std::string::npos);
  }
}
