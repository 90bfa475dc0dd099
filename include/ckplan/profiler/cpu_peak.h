#pragma once
/// `--gpu cpu`: this machine's own peak for the cost model, measured with a
/// short matmul and copy benchmark (LibTorch, on `threads` threads). Torch-free header.

#include "ckplan/planner/gpu_table.h"

namespace ckplan {

/// FP32 and BF16 matmul throughput (512^3, best of several), copy bandwidth
/// (a 64 MiB tensor: out of the caches) and the fixed cost of one tiny op
/// (median), as a GpuSpec named `cpu`; memory: this machine's physical memory.
GpuSpec MeasureCpuPeak(int threads);

}  // namespace ckplan
