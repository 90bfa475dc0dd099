#pragma once
/// Op times without running them: a roofline per op from its FLOPs and the
/// bytes it moves, against a device (gpu_table.h), for models profiled on
/// meta tensors (no time measured) or to predict another device. Torch-free:
/// the counts come from the shapes the profile records (`ops[].args`, the
/// op's tensor arguments with the weights, and its outputs).
///
/// time = overhead + max(flops / (peak(dtype) x compute efficiency),
///                       bytes / (bandwidth x memory efficiency))
/// per op and direction (overhead: the device's forward or backward fixed
/// cost; peak x efficiency: the measured rate at the op's size where the
/// device has one, `--gpu cpu`); views (outputs sharing an input's storage,
/// not in place) cost the device's view overhead only (0 on a GPU); ops whose
/// outputs need no gradient have no backward.

#include <string>

#include "planner/cost/gpu_table.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// kMaskedAttention: attention with an explicit mask (another kernel on a CPU);
/// kRandom: dropout and bernoulli (bound by the random numbers on a CPU);
/// kDropoutAttention: attention with dropout (the CPU's math path);
/// kRecurrent: LSTM, GRU and RNN layers (a matmul per weight and timestep).
enum class OpClass {
  kView, kMatmul, kConvolution, kAttention, kMemory, kMaskedAttention, kRandom, kDropoutAttention, kRecurrent
};

/// The work of one op: forward and backward.
struct OpWork {
  OpClass op_class = OpClass::kMemory;
  double fwd_flops = 0, fwd_bytes = 0;
  double bwd_flops = 0, bwd_bytes = 0;
  bool has_backward = false;
  std::string dtype;  ///< the dtype its FLOPs run in (its first floating-point argument)
  std::string kind;   ///< the op's kind without its namespace: `linear`
  double weight_bytes = 0;  ///< a matmul's or convolution's second operand (weight), a recurrent layer's weights
  double calls = 1;  ///< a recurrent layer: its steps (time steps x layers x directions), each paying the fixed cost
  std::optional<int> grad_nodes;  ///< the autograd nodes its forward made, where the profile records them
};

/// Documented efficiency constants (fractions of the device's peak).
struct CostModelConstants {
  double matmul_efficiency = 0.70;       ///< matmul, linear, bmm: of the dtype's dense peak
  double convolution_efficiency = 0.55;  ///< convolutions
  double attention_efficiency = 0.45;    ///< scaled dot-product attention (fused kernels)
  double memory_efficiency = 0.80;       ///< of the memory bandwidth, every op
  double backward_matmul_factor = 2.0;   ///< backward FLOPs of a matmul or convolution over its forward's
  double backward_attention_factor = 2.5;  ///< flash attention's backward: 5 matmuls to the forward's 2
  double backward_memory_factor = 2.0;   ///< bytes a memory-bound backward moves over its forward's
};

/// FLOPs and bytes of op `op` of `profile` (needs its `args`; without them
/// only its outputs' bytes count).
OpWork CountOpWork(const Profile& profile, const OpRecord& op, const CostModelConstants& constants = {});

/// Milliseconds for `flops` and `bytes` of class `op_class` in `dtype` on `gpu`,
/// forward or `backward` (its fixed cost: gpu.bwd_op_overhead_us). `call_flops`:
/// the FLOPs of one kernel call, where the device has a measured rate curve
/// (`measured_tflops`) to read at that size (0: `flops`; a matmul's backward is
/// two calls of its forward's size).
double RooflineMs(const GpuSpec& gpu, OpClass op_class, const std::string& dtype, double flops, double bytes,
                  const CostModelConstants& constants = {}, bool backward = false, double call_flops = 0);

/// Milliseconds of one op forward or `backward` on `gpu`: the measured law of
/// its kind (or class) and dtype where the device has one (`op_costs`, `--gpu
/// cpu`), else the roofline (RooflineMs) of its FLOPs and bytes.
double OpMs(const GpuSpec& gpu, const OpWork& work, bool backward, const CostModelConstants& constants = {});

/// Gradients summed outside the ops, on a device with a measured law for it
/// (`accumulate_grad:DTYPE`, the bytes added its feature; 0 elsewhere): each
/// parameter's gradient added into its `.grad` (the autograd engine's
/// AccumulateGrad, in place: a training step with gradients kept defined, as
/// `ckplan run` keeps them, zeroed), and for a value read by k ops that need
/// its gradient, the engine's k - 1 sums (the law less one engine node).
double PredictedAccumulateGradMs(const Profile& profile, const GpuSpec& gpu);

/// The achieved TFLOP/s of `curve` (ascending (FLOPs, TFLOP/s) points) at
/// `flops`: log-log interpolation, clamped to the first and last points.
double InterpolateTflops(const std::vector<std::pair<double, double>>& curve, double flops);

/// The step's loss as the profiler computes it (each floating-point output
/// summed, cast to float32, the sums added), forward and backward: what a
/// whole measured step (`totals.step_ms`) holds beyond the ops.
double PredictedLossMs(const Profile& profile, const GpuSpec& gpu, const CostModelConstants& constants = {});

/// Replaces every op's fwd_ms and bwd_ms, and the totals', by the model's;
/// records the device and constants in `environment.time_model`.
void ApplyCostModel(Profile* profile, const GpuSpec& gpu, const CostModelConstants& constants = {});

/// Predicted forward + backward milliseconds of the profile's ops on `gpu`.
double PredictedStepMs(const Profile& profile, const GpuSpec& gpu, const CostModelConstants& constants = {});

}  // namespace ckplan
