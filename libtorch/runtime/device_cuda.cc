// The device layer of a build whose LibTorch has CUDA: the CPU, or a GPU.
// Compiled in every CI run (the torch wheel has CUDA); run only where a GPU is.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAGeneratorImpl.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <deque>
#include <mutex>

#include "planner/base/error.h"
#include "gpu/kernel_timing.h"
#include "libtorch/runtime/device.h"
#include "libtorch/runtime/graph_program.h"
#include "libtorch/runtime/tracking_allocator.h"

namespace ckplan {
namespace {

using c10::CachingDeviceAllocator::TraceEntry;

c10::DeviceIndex Index(const DeviceInfo& device) { return device.device.has_index() ? device.device.index() : 0; }

// CUPTI: kernels belong to the op whose host window launched them.
class CuptiOpTimer final : public GpuOpTimer {
 public:
  explicit CuptiOpTimer(std::unique_ptr<KernelActivitySource> source) : source_(std::move(source)) {}
  bool Start(std::string* why_not) { return source_->Start(why_not); }
  void Begin(int op, bool backward) override { open_.push_back({op, backward, source_->Now(), 0}); }
  void End(int op, bool backward) override {
    for (auto it = open_.rbegin(); it != open_.rend(); ++it) {
      if (it->op == op && it->backward == backward) {
        it->end_ns = source_->Now();
        windows_.push_back(*it);
        open_.erase(std::next(it).base());
        return;
      }
    }
  }
  void Collect(std::vector<double>* fwd_ms, std::vector<double>* bwd_ms) override {
    c10::cuda::device_synchronize();
    std::vector<LaunchRecord> launches;
    std::vector<KernelRecord> kernels;
    source_->Stop(&launches, &kernels);
    KernelAttribution a = AttributeKernels(static_cast<int>(fwd_ms->size()), windows_, launches, kernels);
    for (size_t k = 0; k < a.per_op.size() && k < fwd_ms->size(); ++k) {
      (*fwd_ms)[k] += a.per_op[k].fwd_ms;
      (*bwd_ms)[k] += a.per_op[k].bwd_ms;
    }
  }

 private:
  std::unique_ptr<KernelActivitySource> source_;
  std::vector<OpWindow> open_;
  std::vector<OpWindow> windows_;
};

// CUDA events on the current stream around each op and backward function.
class EventOpTimer final : public GpuOpTimer {
 public:
  void Begin(int op, bool backward) override {
    Pair& p = pairs_.emplace_back();
    p.op = op;
    p.backward = backward;
    p.start.record();
  }
  void End(int op, bool backward) override {
    for (auto it = pairs_.rbegin(); it != pairs_.rend(); ++it) {
      if (it->op == op && it->backward == backward && !it->closed) {
        it->end.record();
        it->closed = true;
        return;
      }
    }
  }
  void Collect(std::vector<double>* fwd_ms, std::vector<double>* bwd_ms) override {
    c10::cuda::device_synchronize();
    for (Pair& p : pairs_) {
      if (!p.closed || p.op < 0 || static_cast<size_t>(p.op) >= fwd_ms->size()) continue;
      double ms = p.start.elapsed_time(p.end);
      (p.backward ? *bwd_ms : *fwd_ms)[static_cast<size_t>(p.op)] += ms;
    }
    pairs_.clear();
  }

 private:
  struct Pair {
    int op = -1;
    bool backward = false;
    bool closed = false;
    c10::cuda::CUDAEvent start{cudaEventDefault};
    c10::cuda::CUDAEvent end{cudaEventDefault};
  };
  std::deque<Pair> pairs_;  // events do not move: deque keeps them in place
};

}  // namespace

int UsableCudaDevices() { return c10::cuda::device_count(); }

bool BuiltWithCuda() { return true; }

DeviceInfo OpenDevice(const std::string& text) {
  if (text == "cpu") return DeviceInfo{c10::Device(c10::DeviceType::CPU), "cpu"};
  if (text.rfind("cuda", 0) != 0) throw BadInput("invalid --device '" + text + "': use cpu or cuda[:N]");
  c10::Device device(c10::DeviceType::CPU);
  try {
    device = c10::Device(text);
  } catch (const c10::Error&) {
    throw BadInput("invalid --device '" + text + "': use cpu or cuda[:N]");
  }
  const int count = c10::cuda::device_count();
  if (count == 0) {
    throw BadInput("--device " + text + ": no usable CUDA GPU on this machine (no device or no driver; LibTorch " +
                   LibTorchVersion() + " has CUDA): profile on the CPU, or on a machine with a GPU");
  }
  const int index = device.has_index() ? device.index() : 0;
  if (index >= count) {
    throw BadInput("--device " + text + ": this machine has " + std::to_string(count) + " CUDA device(s)");
  }
  device = c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index));
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
  return DeviceInfo{device, "cuda:" + std::to_string(index) + " (" +
                                at::cuda::getDeviceProperties(static_cast<c10::DeviceIndex>(index))->name + ")"};
}

void TrackDeviceMemory(const DeviceInfo& device) {
  if (!device.cuda()) return;
  static std::once_flag attached;
  std::call_once(attached, [] {
    // Called by the caching allocator under its own lock: no PyTorch calls here.
    c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker([](const TraceEntry& entry) {
      if (entry.action_ == TraceEntry::ALLOC) {
        TrackingAllocator::Instance().RecordExternal(reinterpret_cast<void*>(entry.addr_), entry.size_);
      } else if (entry.action_ == TraceEntry::FREE_REQUESTED) {
        TrackingAllocator::Instance().ForgetExternal(reinterpret_cast<void*>(entry.addr_));
      }
    });
  });
}

namespace {
c10::CachingAllocator::Stat AllocatedBytes(const DeviceInfo& device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(Index(device))
      .allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
}
}  // namespace

std::optional<int64_t> ResetDevicePeak(const DeviceInfo& device) {
  if (!device.cuda()) return std::nullopt;
  c10::cuda::device_synchronize();
  c10::cuda::CUDACachingAllocator::resetPeakStats(Index(device));
  return AllocatedBytes(device).current;
}

std::optional<int64_t> DevicePeakBytes(const DeviceInfo& device) {
  if (!device.cuda()) return std::nullopt;
  c10::cuda::device_synchronize();
  return AllocatedBytes(device).peak;
}

int64_t StepPeakBytes(const DeviceInfo& device, std::optional<int64_t> device_base, int64_t ledger_kept,
                      int64_t ledger_peak) {
  if (!device.cuda()) return ledger_peak;
  // What the device held at the reset that is not the model's state or
  // inputs (another step's leftovers, cached workspaces) is not the step's.
  const int64_t not_ours = std::max<int64_t>(0, device_base.value_or(0) - ledger_kept);
  return *DevicePeakBytes(device) - not_ours;
}

void SynchronizeDevice(const DeviceInfo& device) {
  if (device.cuda()) c10::cuda::device_synchronize();
}

at::Generator DefaultGenerator(const DeviceInfo& device) {
  if (!device.cuda()) return at::detail::getDefaultCPUGenerator();
  return at::cuda::detail::getDefaultCUDAGenerator(Index(device));
}

std::unique_ptr<GpuOpTimer> MakeGpuOpTimer(const DeviceInfo& device, std::string* timer_line) {
  if (!device.cuda()) return nullptr;
  std::unique_ptr<KernelActivitySource> cupti = MakeCuptiSource();
  std::string why_not = "ckplan was built without CUPTI";
  if (cupti) {
    auto timer = std::make_unique<CuptiOpTimer>(std::move(cupti));
    if (timer->Start(&why_not)) {
      *timer_line = "timer: CUPTI kernel activity records, attributed to ops";
      return timer;
    }
  }
  *timer_line = "timer: CUDA events around each op (CUPTI unavailable: " + why_not + ")";
  return std::make_unique<EventOpTimer>();
}

}  // namespace ckplan
