#pragma once
/// `--gpu cpu`: this machine's own peak for the cost model, measured with a
/// short matmul and copy benchmark (LibTorch, on `threads` threads). Torch-free header.

#include "planner/cost/gpu_table.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// FP32, BF16 and FP16 matmul throughput (512^3, best of several), the rate
/// of an elementwise GELU over 64 MiB (as the "bandwidth": CPU elementwise
/// kernels are bound by their arithmetic as much as by memory) and the fixed
/// cost of one tiny op with autograd (median per direction), as a GpuSpec
/// named `cpu`; memory: this machine's physical memory.
GpuSpec MeasureCpuPeak(int threads);

/// Cost laws (`cpu->op_costs`, op_cost.h) for the op kinds and dtypes
/// `profile` uses that have a microbenchmark here (linear, convolution,
/// attention's three paths, common memory-bound ops; float32, bfloat16), and
/// for accumulating gradients into `.grad`: each op called as a model's step
/// calls it (with autograd, forward and backward, several calls each on its
/// own arguments, medians), at sizes fixed here, not the profile's.
void MeasureCpuOpCosts(const Profile& profile, GpuSpec* cpu);

}  // namespace ckplan
