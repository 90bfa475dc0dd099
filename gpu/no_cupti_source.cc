// Built without CUPTI: no activity source; the profiler uses CUDA events.
#include "gpu/kernel_timing.h"

namespace ckplan {
std::unique_ptr<KernelActivitySource> MakeCuptiSource() { return nullptr; }
}  // namespace ckplan
