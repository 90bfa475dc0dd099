#pragma once
// A CPU allocator that wraps LibTorch's and counts live and peak bytes
// exactly, attributing each allocation to the op that is running (a
// thread-local owner set by the profiler or executor). It refuses to go past
// the step's memory limit (memory_limit.h): the allocation that would throws
// ckplan::Error (bad input) saying what the step had and asked for, instead of
// the system killing the process. Part of the runtime.

#include <c10/core/Allocator.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ckplan {

/// Owner ids below 0 are not ops.
constexpr int kOwnerNone = -1;
constexpr int kOwnerLoss = -2;

class TrackingAllocator final : public c10::Allocator {
 public:
  /// The one instance; installed as the CPU allocator on first use.
  static TrackingAllocator& Instance();

  c10::DataPtr allocate(size_t bytes) override;
  c10::DeleterFnPtr raw_deleter() const override;
  void copy_data(void* dest, const void* src, std::size_t count) const override;

  /// Allocations made by another allocator (the CUDA caching allocator's
  /// trace), counted in the same ledger and attributed to the current owner.
  /// Meta storages (meta_device.h): in the ledger, never against the memory limit.
  void RecordExternal(void* ptr, size_t bytes) { Record(ptr, bytes, /*external=*/true); }
  void ForgetExternal(void* ptr) { Forget(ptr); }

  /// The owner new allocations are attributed to, on this thread.
  static void SetOwner(int owner);
  static int Owner();

  int64_t live_bytes() const;
  /// Peak since the last ResetPeak (the step's peak).
  int64_t peak_bytes() const;
  void ResetPeak();
  /// A second, nested peak for one op's window.
  int64_t window_peak_bytes() const;
  void ResetWindowPeak();

  /// A unique, increasing id of the live allocation at `ptr` (storage data
  /// pointer), or -1 if none.
  int64_t AllocationId(const void* ptr) const;
  /// The id the next allocation will get: allocations from now on have ids
  /// at least this.
  int64_t NextAllocationId() const;
  bool IsLive(int64_t allocation_id) const;

  struct LiveAllocation {
    int64_t id;
    int64_t bytes;
    int owner;
  };
  /// Every live allocation (for attributing what survives the forward).
  std::vector<LiveAllocation> LiveAllocations() const;

 private:
  TrackingAllocator() = default;
  static void Delete(void* ptr);
  void Record(void* ptr, size_t bytes, bool external = false);
  void Forget(void* ptr);

  struct Entry {
    int64_t id;
    int64_t bytes;
    int owner;
    bool external;
  };
  mutable std::mutex mutex_;
  std::unordered_map<const void*, Entry> live_;
  std::unordered_map<int64_t, const void*> by_id_;
  int64_t next_id_ = 1;
  int64_t live_bytes_ = 0;
  int64_t external_live_bytes_ = 0;  // of live_bytes_: meta storages, which take no memory
  int64_t peak_bytes_ = 0;
  int64_t window_peak_bytes_ = 0;
  int64_t limit_bytes_ = 0;  // 0: none
  std::string limit_source_;
};

/// Sets the allocation owner for a scope.
class OwnerScope {
 public:
  explicit OwnerScope(int owner) : previous_(TrackingAllocator::Owner()) { TrackingAllocator::SetOwner(owner); }
  ~OwnerScope() { TrackingAllocator::SetOwner(previous_); }
  OwnerScope(const OwnerScope&) = delete;
  OwnerScope& operator=(const OwnerScope&) = delete;

 private:
  int previous_;
};

}  // namespace ckplan
