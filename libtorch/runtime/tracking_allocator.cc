#include "libtorch/runtime/tracking_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <malloc.h>

#include <algorithm>
#include <cstring>

#include "planner/base/error.h"
#include "planner/base/units.h"
#include "libtorch/runtime/memory_limit.h"

namespace ckplan {
namespace {
thread_local int g_owner = kOwnerNone;
}

TrackingAllocator& TrackingAllocator::Instance() {
  static TrackingAllocator* instance = [] {
    // Keep freed memory in the process instead of returning it to the system
    // after every tensor: a fresh mapping faults in page by page, and on
    // virtual machines that made step times vary several-fold between runs.
    // Byte counts are the allocator's own and do not change.
    mallopt(M_MMAP_THRESHOLD, 1 << 30);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    auto* allocator = new TrackingAllocator();
    const MemoryLimit limit = StepMemoryLimit();
    allocator->limit_bytes_ = limit.bytes;
    allocator->limit_source_ = limit.source;
    // Above the default CPU allocator's priority, so that it wins.
    c10::SetCPUAllocator(allocator, /*priority=*/100);
    return allocator;
  }();
  return *instance;
}

void TrackingAllocator::SetOwner(int owner) { g_owner = owner; }
int TrackingAllocator::Owner() { return g_owner; }

c10::DataPtr TrackingAllocator::allocate(size_t bytes) {
  if (limit_bytes_ > 0) {
    const int64_t asked = static_cast<int64_t>(std::min<uint64_t>(bytes, uint64_t{1} << 62));
    int64_t live = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live = live_bytes_ - external_live_bytes_;
    }
    if (live + asked > limit_bytes_) {
      throw BadInput("the step needs more memory than this machine can give it: at least " + FormatBytes(live + asked) +
                     " (" + FormatBytes(live) + " in use, " + FormatBytes(asked) + " more asked for), above " +
                     FormatBytes(limit_bytes_) + " from " + limit_source_ + "; use a smaller batch (--input)");
    }
  }
  void* ptr = bytes == 0 ? nullptr : c10::alloc_cpu(bytes);
  if (ptr != nullptr) Record(ptr, bytes);
  // oneDNN frees through raw_deleter(): context == data, a plain deleter.
  return {ptr, ptr, &TrackingAllocator::Delete, c10::Device(c10::DeviceType::CPU)};
}

c10::DeleterFnPtr TrackingAllocator::raw_deleter() const { return &TrackingAllocator::Delete; }

void TrackingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}

void TrackingAllocator::Delete(void* ptr) {
  if (ptr == nullptr) return;
  Instance().Forget(ptr);
  c10::free_cpu(ptr);
}

void TrackingAllocator::Record(void* ptr, size_t bytes, bool external) {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t id = next_id_++;
  live_[ptr] = Entry{id, static_cast<int64_t>(bytes), g_owner, external};
  if (external) external_live_bytes_ += static_cast<int64_t>(bytes);
  by_id_[id] = ptr;
  live_bytes_ += static_cast<int64_t>(bytes);
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  window_peak_bytes_ = std::max(window_peak_bytes_, live_bytes_);
}

void TrackingAllocator::Forget(void* ptr) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) return;  // allocated before this allocator was installed
  live_bytes_ -= it->second.bytes;
  if (it->second.external) external_live_bytes_ -= it->second.bytes;
  by_id_.erase(it->second.id);
  live_.erase(it);
}

int64_t TrackingAllocator::live_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_bytes_;
}

int64_t TrackingAllocator::peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return peak_bytes_;
}

void TrackingAllocator::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  peak_bytes_ = live_bytes_;
  window_peak_bytes_ = live_bytes_;
}

int64_t TrackingAllocator::window_peak_bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return window_peak_bytes_;
}

void TrackingAllocator::ResetWindowPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  window_peak_bytes_ = live_bytes_;
}

int64_t TrackingAllocator::AllocationId(const void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = live_.find(ptr);
  return it == live_.end() ? -1 : it->second.id;
}

int64_t TrackingAllocator::NextAllocationId() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return next_id_;
}

bool TrackingAllocator::IsLive(int64_t allocation_id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return by_id_.count(allocation_id) > 0;
}

std::vector<TrackingAllocator::LiveAllocation> TrackingAllocator::LiveAllocations() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<LiveAllocation> out;
  out.reserve(live_.size());
  for (const auto& kv : live_) out.push_back({kv.second.id, kv.second.bytes, kv.second.owner});
  return out;
}

}  // namespace ckplan
