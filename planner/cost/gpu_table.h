#pragma once
/// Named devices for the cost model (`--gpu NAME`): peak dense throughput per
/// dtype, memory bandwidth and memory size, from the vendors' datasheets
/// (docs/cost-model.md). Torch-free.

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "planner/cost/op_cost.h"

namespace ckplan {

struct GpuSpec {
  std::string name;              ///< `h100-sxm-80gb`
  std::string description;       ///< `NVIDIA H100 SXM5 80GB`
  double fp32_tflops = 0;        ///< dense FP32 (no TF32: PyTorch's default for matmul)
  double bf16_tflops = 0;        ///< dense BF16 tensor cores, FP32 accumulate
  double fp16_tflops = 0;        ///< dense FP16 tensor cores, FP32 accumulate
  double bandwidth_gb_per_s = 0; ///< memory bandwidth, 10^9 bytes per second
  int64_t memory_bytes = 0;      ///< device memory (as nvidia-smi reports its total)
  double op_overhead_us = 0;     ///< fixed cost per op, forward (a kernel launch; the CPU's dispatch + autograd node)
  std::string source;            ///< where the figures come from
  double bwd_op_overhead_us = 0; ///< fixed cost per op, backward (the autograd engine's node); 0: op_overhead_us
  double view_overhead_us = 0;   ///< fixed cost of a view per direction (no kernel: 0 on a GPU, dispatch on the CPU)
  /// Measured matmul/convolution rates by size (`--gpu cpu`), keyed `matmul:float32`, `matmul:bfloat16`,
  /// `convolution:float32`: (FLOPs of one call, achieved TFLOP/s), ascending. Where a key is present the
  /// roofline uses the rate interpolated at the op's size (log-log, clamped to the ends) instead of
  /// peak x efficiency; empty for the datasheet devices.
  /// Also `attention:DTYPE` and `attention_mask:DTYPE` (scaled dot-product attention without and with a mask).
  std::map<std::string, std::vector<std::pair<double, double>>> measured_tflops;
  double random_gb_per_s = 0;    ///< dropout's forward rate (bytes read + written); 0: bandwidth_gb_per_s
  /// Memory-bound ops' rate per dtype where it differs (`--gpu cpu`: `bfloat16`, elementwise bf16
  /// converts to float and back); other dtypes: bandwidth_gb_per_s.
  std::map<std::string, double> elementwise_gb_per_s;
  /// Measured cost laws (`--gpu cpu`), forward and backward, keyed by bare op kind and dtype
  /// (`linear:float32`, `layer_norm:bfloat16`; `sdpa:`, `sdpa_mask:`, `sdpa_dropout:` for the three paths
  /// of scaled dot-product attention; `accumulate_grad:` for a parameter's gradient delivered to its
  /// `.grad`, `grad_sum:` for the engine's sum of two gradients of one value): where an op's key is
  /// present its time is its law's (op_cost.h) instead of the roofline's.
  /// Empty for the datasheet devices.
  std::map<std::string, std::pair<LinearOpCost, LinearOpCost>> op_costs;
  /// The autograd nodes one call of each law's microbenchmark made (key as in op_costs): an op that
  /// makes more (a linear on 3-D input: two views more) pays extra_node_us for each.
  std::map<std::string, double> op_cost_nodes;
  /// One more autograd node, forward (a view op made through the dispatcher) and backward (the engine
  /// running a node that reshapes its gradient, on tensors of a layer's size); 0: none (GPUs: hidden).
  double extra_node_fwd_us = 0, extra_node_bwd_us = 0;
};

/// The table, in a fixed order.
const std::vector<GpuSpec>& KnownGpus();

/// The device named `name` (case-insensitive; `h100` and `h100-80gb` name
/// `h100-sxm-80gb`). Throws BadInput listing the known names otherwise.
/// `cpu` is not in the table: the profiler measures it (`MeasureCpuPeak`).
GpuSpec FindGpu(const std::string& name);

/// `h100-sxm-80gb, h200-141gb, ...` (for messages and --help).
std::string KnownGpuNames();

}  // namespace ckplan
