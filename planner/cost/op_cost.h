#pragma once
/// A measured cost law for one op kind and dtype on this machine (`--gpu cpu`):
/// time = fixed + per FLOP x FLOPs + per byte x bytes + per weight byte x
/// weight bytes, each coefficient non-negative, fitted to microbenchmarks of
/// the op itself (libtorch/profiler/cpu_peak.cc), forward and backward apart. The
/// features are the cost model's own counts of the op's forward
/// (cost_model.h: FLOPs, bytes read and written, and for matmuls and
/// convolutions the weight's bytes), so the backward's law reads the same
/// features. Torch-free.

#include <vector>

namespace ckplan {

/// The features of one call: the forward's FLOPs, its bytes (arguments read,
/// outputs written) and the bytes of its weight (matmul, convolution; else 0),
/// and the times its fixed cost is paid: 1, but for a recurrent layer, which
/// runs a small step per time step, layer and direction, that count.
struct OpFeatures {
  double flops = 0;
  double bytes = 0;
  double weight_bytes = 0;
  double calls = 1;
};

/// Microseconds of one call as a non-negative linear law of its features
/// (`fixed_us` once per `calls`).
struct LinearOpCost {
  double fixed_us = 0;
  double flop_us = 0;
  double byte_us = 0;
  double weight_byte_us = 0;
  double Us(const OpFeatures& f) const {
    return fixed_us * f.calls + flop_us * f.flops + byte_us * f.bytes + weight_byte_us * f.weight_bytes;
  }
};

/// One measured call: its features and its microseconds.
struct OpCostSample {
  OpFeatures features;
  double us = 0;
};

/// The law that fits `samples` best in relative error (least squares of
/// (law - us) / us), among the laws whose coefficients are all non-negative
/// and that use only features some sample has (every subset is tried, fewer
/// features first: they win a tie). A single sample gives a fixed cost.
LinearOpCost FitOpCost(const std::vector<OpCostSample>& samples);

}  // namespace ckplan
