// CUPTI's activity API behind KernelActivitySource: concurrent-kernel and
// runtime-API records, delivered through CUPTI's buffer callbacks.

#include <cupti.h>

#include <cstdlib>
#include <mutex>

#include "gpu/kernel_timing.h"

namespace ckplan {
namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kAlign = 8;

std::mutex g_mutex;
std::vector<LaunchRecord>* g_launches = nullptr;
std::vector<KernelRecord>* g_kernels = nullptr;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  void* p = nullptr;
  if (posix_memalign(&p, kAlign, kBufferBytes) != 0) p = nullptr;
  *buffer = static_cast<uint8_t*>(p);
  *size = p ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(g_mutex);
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      auto* k = reinterpret_cast<CUpti_ActivityKernel10*>(record);
      if (g_kernels) g_kernels->push_back({k->correlationId, k->start, k->end, k->name ? k->name : ""});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME || record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      auto* api = reinterpret_cast<CUpti_ActivityAPI*>(record);
      if (g_launches) g_launches->push_back({api->correlationId, api->start});
    }
  }
  std::free(buffer);
}

std::string Describe(CUptiResult result) {
  const char* text = nullptr;
  cuptiGetResultString(result, &text);
  return std::string(text ? text : "unknown CUPTI error") + " (" + std::to_string(static_cast<int>(result)) + ")";
}

class CuptiSource final : public KernelActivitySource {
 public:
  bool Start(std::string* why_not) override {
    launches_.clear();
    kernels_.clear();
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_launches = &launches_;
      g_kernels = &kernels_;
    }
    CUptiResult r = cuptiActivityRegisterCallbacks(&BufferRequested, &BufferCompleted);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    if (r == CUPTI_SUCCESS) r = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    if (r != CUPTI_SUCCESS) {
      *why_not = Describe(r);
      Detach();
      return false;
    }
    started_ = true;
    return true;
  }

  void Stop(std::vector<LaunchRecord>* launches, std::vector<KernelRecord>* kernels) override {
    if (started_) {
      cuptiActivityFlushAll(1);
      cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
      cuptiActivityDisable(CUPTI_ACTIVITY_KIND_RUNTIME);
      started_ = false;
    }
    Detach();
    *launches = std::move(launches_);
    *kernels = std::move(kernels_);
  }

  uint64_t Now() override {
    uint64_t t = 0;
    cuptiGetTimestamp(&t);
    return t;
  }

 private:
  void Detach() {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_launches = nullptr;
    g_kernels = nullptr;
  }
  bool started_ = false;
  std::vector<LaunchRecord> launches_;
  std::vector<KernelRecord> kernels_;
};

}  // namespace

std::unique_ptr<KernelActivitySource> MakeCuptiSource() { return std::make_unique<CuptiSource>(); }

}  // namespace ckplan
