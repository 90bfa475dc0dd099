#include "gpu/kernel_timing.h"

#include <algorithm>
#include <unordered_map>

namespace ckplan {

KernelAttribution AttributeKernels(int num_ops, const std::vector<OpWindow>& windows,
                                   const std::vector<LaunchRecord>& launches,
                                   const std::vector<KernelRecord>& kernels) {
  KernelAttribution out;
  out.per_op.assign(static_cast<size_t>(std::max(0, num_ops)), OpKernelTime{});
  // The window holding each launch: the innermost (latest start) that covers it.
  std::vector<OpWindow> sorted = windows;
  std::sort(sorted.begin(), sorted.end(), [](const OpWindow& a, const OpWindow& b) { return a.start_ns < b.start_ns; });
  std::unordered_map<uint32_t, const OpWindow*> owner;
  for (const LaunchRecord& launch : launches) {
    const OpWindow* found = nullptr;
    auto it = std::upper_bound(sorted.begin(), sorted.end(), launch.start_ns,
                               [](uint64_t t, const OpWindow& w) { return t < w.start_ns; });
    while (it != sorted.begin()) {
      --it;
      if (launch.start_ns <= it->end_ns) {
        found = &*it;
        break;
      }
    }
    if (found) owner[launch.correlation_id] = found;
  }
  for (const KernelRecord& k : kernels) {
    const double ms = static_cast<double>(k.end_ns > k.start_ns ? k.end_ns - k.start_ns : 0) / 1e6;
    out.total_ms += ms;
    auto it = owner.find(k.correlation_id);
    if (it == owner.end() || it->second->op < 0 || it->second->op >= num_ops) {
      out.unattributed_ms += ms;
      continue;
    }
    OpKernelTime& t = out.per_op[static_cast<size_t>(it->second->op)];
    (it->second->backward ? t.bwd_ms : t.fwd_ms) += ms;
    t.kernels++;
  }
  return out;
}

TimerChoice ChooseGpuTimer(KernelActivitySource* cupti) {
  TimerChoice choice;
  if (cupti == nullptr) {
    choice.message = "GPU timer: CUDA events (ckplan was built without CUPTI)";
    return choice;
  }
  std::string why;
  if (cupti->Start(&why)) {
    std::vector<LaunchRecord> launches;
    std::vector<KernelRecord> kernels;
    cupti->Stop(&launches, &kernels);
    choice.cupti = true;
    choice.message = "GPU timer: CUPTI kernel activity records";
    return choice;
  }
  choice.message = "GPU timer: CUDA events (CUPTI unavailable: " + why + ")";
  return choice;
}

}  // namespace ckplan
