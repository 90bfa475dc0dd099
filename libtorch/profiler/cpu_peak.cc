#include "libtorch/profiler/cpu_peak.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/SequenceNumber.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/variable.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <functional>
#include <initializer_list>
#include <set>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "planner/base/dtype.h"
#include "planner/cost/cost_model.h"
#include "libtorch/runtime/scalar_type.h"
#include "libtorch/runtime/timing.h"

namespace ckplan {
namespace {

// Best seconds of `reps` runs of `work` (after one warm-up).
template <typename F>
double BestSeconds(int reps, F work) {
  work();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto start = Clock::now();
    work();
    best = std::min(best, MsSince(start) * 1e-3);
  }
  return best;
}

// (FLOPs, achieved TFLOP/s) of a linear layer (aten::linear: input [n, n],
// weight [n, n], bias [n], the call the models make) at each size in `sizes`.
std::vector<std::pair<double, double>> LinearCurve(at::ScalarType type, std::initializer_list<int64_t> sizes) {
  std::vector<std::pair<double, double>> curve;
  for (int64_t n : sizes) {
    at::Tensor a = at::randn({n, n}).to(type), w = at::randn({n, n}).to(type), b = at::randn({n}).to(type);
    const double flops = 2.0 * static_cast<double>(n * n * n);
    const double s = BestSeconds(n >= 256 ? 3 : 9, [&] { at::linear(a, w, b); });
    curve.emplace_back(flops, flops / s / 1e12);
  }
  return curve;
}

// The same for a 3x3 convolution, C -> C channels, on 2 x C x 16 x 16.
std::vector<std::pair<double, double>> ConvolutionCurve(at::ScalarType type, std::initializer_list<int64_t> channels) {
  std::vector<std::pair<double, double>> curve;
  for (int64_t ch : channels) {
    at::Tensor x = at::randn({2, ch, 16, 16}).to(type), w = at::randn({ch, ch, 3, 3}).to(type);
    const double flops = 2.0 * static_cast<double>(2 * ch * 16 * 16 * ch * 9);
    const double s =
        BestSeconds(ch >= 128 ? 3 : 9, [&] { at::conv2d(x, w, {}, /*stride=*/{1, 1}, /*padding=*/{1, 1}); });
    curve.emplace_back(flops, flops / s / 1e12);
  }
  return curve;
}

// The same for scaled dot-product attention, q, k, v [1, 8, L, 32] needing
// gradients (the kernel a training forward picks), forward only; with a
// boolean mask [1, 1, L, L] when `masked` (another kernel on the CPU).
std::vector<std::pair<double, double>> AttentionCurve(at::ScalarType type, bool masked,
                                                      std::initializer_list<int64_t> lengths) {
  std::vector<std::pair<double, double>> curve;
  for (int64_t l : lengths) {
    auto make = [&] { return at::randn({1, 8, l, 32}).to(type).set_requires_grad(true); };
    at::Tensor q = make(), k = make(), v = make();
    std::optional<at::Tensor> mask;
    if (masked) mask = at::ones({1, 1, l, l}, at::kBool);
    const double flops = 4.0 * 8 * static_cast<double>(l * l) * 32;
    const double s = BestSeconds(l >= 256 ? 3 : 9, [&] { at::scaled_dot_product_attention(q, k, v, mask); });
    curve.emplace_back(flops, flops / s / 1e12);
  }
  return curve;
}

double Median(std::vector<double> v) {
  std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

// Microseconds per op of a chain of `n` tiny ops on one-element tensors with
// autograd, called boxed through the dispatcher as the graph interpreter
// calls them (`op(stack)`), forward and backward (the engine's node each):
// medians of 101 chains.
std::pair<double, double> ChainOverheadUs(const char* name, const char* overload, bool view) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  const at::Tensor one = at::ones({1, 1});
  const int n = 64;
  std::vector<double> fwd_us, bwd_us;
  for (int r = 0; r < 101; ++r) {
    at::Tensor x = at::ones({1, 1}).set_requires_grad(true);
    const auto fwd_start = Clock::now();
    at::Tensor z = x;
    for (int i = 0; i < n; ++i) {
      torch::jit::Stack stack;
      if (view) {
        stack = {z, int64_t{0}, int64_t{1}};
      } else {
        stack = {z, one, c10::Scalar(1)};
      }
      op.callBoxed(&stack);
      z = stack[0].toTensor();
    }
    fwd_us.push_back(MsSince(fwd_start) * 1e3 / n);
    const auto bwd_start = Clock::now();
    z.backward(at::ones({1, 1}));
    bwd_us.push_back(MsSince(bwd_start) * 1e3 / n);
  }
  return {Median(fwd_us), Median(bwd_us)};
}

// One call of an op for its cost law: its forward on arguments made before
// the clock starts, the arguments its backward reaches, and the cost model's
// features of the call (its FLOPs, bytes and weight bytes, counted as
// CountOpWork counts them).
struct Call {
  std::vector<at::Tensor> leaves;
  std::function<at::Tensor()> forward;
  OpFeatures features;
};

int64_t Bytes(std::initializer_list<at::Tensor> tensors) {
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return n;
}

// What one backward pass costs beyond its nodes (the engine's task: set-up,
// its thread's queue, the gradients' capture), which a model's step pays
// once, not per op: a backward through one one-element add less one node
// (the per-node cost from 1 and 9 adds), medians of 51.
double EngineTaskUs() {
  static const double task_us = [] {
    auto backward_us = [](int n) {
      std::vector<double> us;
      for (int r = -1; r < 51; ++r) {
        at::Tensor x = at::ones({1, 1}).set_requires_grad(true);
        at::Tensor y = x;
        for (int i = 0; i < n; ++i) y = y + 1;
        const auto start = Clock::now();
        torch::autograd::grad({y}, {x}, {at::ones({1, 1})});
        if (r >= 0) us.push_back(MsSince(start) * 1e3);
      }
      return Median(us);
    };
    const double one = backward_us(1), nine = backward_us(9);
    return std::max(0.0, one - std::max(0.0, nine - one) / 8);
  }();
  return task_us;
}

// Forward and backward microseconds per call, as a model's step runs the op:
// `calls` calls (each on its own arguments from make(k), with autograd),
// then one backward of all their outputs (torch::autograd::grad, the
// engine's nodes, no .grad written; the engine's task, once per backward
// pass, taken out); medians of `reps` after a warm-up.
// The autograd nodes one call made in the last TimeCalls (sequence numbers
// taken: what a profile's `grad_nodes` counts).
double g_nodes_per_call = 0;

std::pair<OpCostSample, OpCostSample> TimeCalls(int calls, int reps, const std::function<Call(int)>& make) {
  std::vector<double> fwd_us, bwd_us;
  OpFeatures features;
  for (int r = -1; r < reps; ++r) {
    std::vector<Call> set;
    for (int k = 0; k < calls; ++k) set.push_back(make(k));
    features = set[0].features;
    std::vector<at::Tensor> outputs, leaves, grads;
    const uint64_t seq_before = at::sequence_number::peek();
    const auto start = Clock::now();
    for (Call& c : set) outputs.push_back(c.forward());
    const double f = MsSince(start) * 1e3 / calls;
    g_nodes_per_call = static_cast<double>(at::sequence_number::peek() - seq_before) / calls;
    for (Call& c : set) leaves.insert(leaves.end(), c.leaves.begin(), c.leaves.end());
    for (const at::Tensor& o : outputs) grads.push_back(at::ones_like(o));
    const auto backward_start = Clock::now();
    torch::autograd::grad(outputs, leaves, grads, /*retain_graph=*/false, /*create_graph=*/false,
                          /*allow_unused=*/true);
    const double b = std::max(0.0, MsSince(backward_start) * 1e3 - EngineTaskUs()) / calls;
    if (r >= 0) {
      fwd_us.push_back(f);
      bwd_us.push_back(b);
    }
  }
  return {{features, Median(fwd_us)}, {features, Median(bwd_us)}};
}

// The autograd nodes per call of the last FitCalls (the fewest over its sizes).
double g_law_nodes = 0;

// The laws of one kind from its calls at each size (make(size, k)).
std::pair<LinearOpCost, LinearOpCost> FitCalls(const std::vector<std::function<Call(int)>>& sizes, int calls,
                                               int reps) {
  std::vector<OpCostSample> fwd, bwd;
  g_law_nodes = 1e30;
  for (const auto& make : sizes) {
    const auto [f, b] = TimeCalls(calls, reps, make);
    fwd.push_back(f);
    bwd.push_back(b);
    g_law_nodes = std::min(g_law_nodes, g_nodes_per_call);
  }
  return {FitOpCost(fwd), FitOpCost(bwd)};
}

at::Tensor Leaf(std::vector<int64_t> shape, at::ScalarType type) {
  return at::randn(shape).to(type).set_requires_grad(true);
}

// A memory-bound op on one tensor of `shape` (and a second operand where it
// takes one): its call, features: arguments' and output's bytes.
using UnaryOp = std::function<at::Tensor(const at::Tensor&, at::ScalarType)>;

std::function<Call(int)> MemoryCall(std::vector<int64_t> shape, at::ScalarType type, bool inplace, UnaryOp op) {
  return [=](int) {
    Call c;
    at::Tensor leaf = Leaf(shape, type);
    c.leaves = {leaf};
    at::Tensor x = inplace ? leaf.clone() : leaf;
    c.forward = [x, type, op] { return op(x, type); };
    // Bytes as the cost model counts them: the forward's arguments (the
    // op reports its extra ones through its output's size) and output.
    at::Tensor probe;
    {
      at::NoGradGuard no_grad;
      probe = op(x.detach().clone(), type);
    }
    c.features.bytes = static_cast<double>(Bytes({x}) + Bytes({probe}));
    return c;
  };
}

// The memory-bound kinds the laws cover: (kind, image-like 4-D arguments,
// in place, the op; extra operands are made inside at the argument's size
// and counted by ExtraBytes).
struct MemoryKind {
  const char* kind;
  bool image;
  bool inplace;
  UnaryOp op;
  double extra_arguments;  // further arguments of the input's size (add: 1), counted in its bytes
};

const std::vector<MemoryKind>& MemoryKinds() {
  static const std::vector<MemoryKind> kinds = {
      {"add", false, false, [](const at::Tensor& x, at::ScalarType) { return at::add(x, x.detach()); }, 1},
      {"sub", false, false, [](const at::Tensor& x, at::ScalarType) { return at::sub(x, x.detach()); }, 1},
      {"mul", false, false, [](const at::Tensor& x, at::ScalarType) { return at::mul(x, x.detach()); }, 1},
      {"div", false, false, [](const at::Tensor& x, at::ScalarType) { return at::div(x, x.detach() + 2); }, 1},
      {"relu", false, false, [](const at::Tensor& x, at::ScalarType) { return at::relu(x); }, 0},
      {"relu_", true, true, [](const at::Tensor& x, at::ScalarType) { at::Tensor y = x; return at::relu_(y); }, 0},
      {"gelu", false, false, [](const at::Tensor& x, at::ScalarType) { return at::gelu(x); }, 0},
      {"gelu_tanh", false, false, [](const at::Tensor& x, at::ScalarType) { return at::gelu(x, "tanh"); }, 0},
      {"tanh", false, false, [](const at::Tensor& x, at::ScalarType) { return at::tanh(x); }, 0},
      {"silu", false, false, [](const at::Tensor& x, at::ScalarType) { return at::silu(x); }, 0},
      {"sigmoid", false, false, [](const at::Tensor& x, at::ScalarType) { return at::sigmoid(x); }, 0},
      {"pow", false, false, [](const at::Tensor& x, at::ScalarType) { return at::pow(x, 2); }, 0},
      {"rsqrt", false, false, [](const at::Tensor& x, at::ScalarType) { return at::rsqrt(x.abs() + 1); }, 0},
      {"softmax", false, false, [](const at::Tensor& x, at::ScalarType) { return at::softmax(x, -1); }, 0},
      {"dropout", false, false, [](const at::Tensor& x, at::ScalarType) { return at::dropout(x, 0.1, true); }, 0},
      {"mean", false, false, [](const at::Tensor& x, at::ScalarType) { return at::mean(x, {-1}, true); }, 0},
      {"layer_norm", false, false,
       [](const at::Tensor& x, at::ScalarType) { return at::layer_norm(x, {x.size(-1)}); }, 0},
      {"batch_norm", true, false,
       [](const at::Tensor& x, at::ScalarType t) {
         const int64_t ch = x.size(1);
         return at::batch_norm(x, at::ones({ch}).to(t), at::zeros({ch}).to(t), at::zeros({ch}).to(t),
                               at::ones({ch}).to(t), true, 0.1, 1e-5, false);
       },
       0},
      {"max_pool2d", true, false, [](const at::Tensor& x, at::ScalarType) { return at::max_pool2d(x, {3, 3}, {2, 2}, {1, 1}); },
       0},
      {"adaptive_avg_pool2d", true, false,
       [](const at::Tensor& x, at::ScalarType) { return at::adaptive_avg_pool2d(x, {1, 1}); }, 0},
      {"hardtanh_", true, true, [](const at::Tensor& x, at::ScalarType) { at::Tensor y = x; return at::hardtanh_(y, 0, 6); }, 0},
      {"silu_", true, true, [](const at::Tensor& x, at::ScalarType) { at::Tensor y = x; return at::silu_(y); }, 0},
      {"dropout_", false, true,
       [](const at::Tensor& x, at::ScalarType) { at::Tensor y = x; return at::dropout_(y, 0.1, true); }, 0},
      {"hardswish_", true, true, [](const at::Tensor& x, at::ScalarType) { at::Tensor y = x; return at::hardswish_(y); }, 0},
      {"hardsigmoid", true, false, [](const at::Tensor& x, at::ScalarType) { return at::hardsigmoid(x); }, 0},
      {"cat", true, false, [](const at::Tensor& x, at::ScalarType) { return at::cat({x, x.detach()}, 1); }, 1},
      {"contiguous", false, false,
       [](const at::Tensor& x, at::ScalarType) { return x.transpose(0, 1).contiguous(); }, 0},
      {"masked_fill", false, false,
       [](const at::Tensor& x, at::ScalarType) { return at::masked_fill(x, at::zeros(x.sizes(), at::kBool), -1.0); },
       0.25},  // the mask: a byte per element
  };
  return kinds;
}

// The law of one memory-bound kind in `type`: three sizes, 4 Ki to 256 Ki elements.
std::pair<LinearOpCost, LinearOpCost> MemoryLaw(const MemoryKind& kind, at::ScalarType type) {
  const std::vector<std::vector<int64_t>> image = {{2, 8, 16, 16}, {2, 16, 32, 32}, {2, 32, 64, 64}};
  const std::vector<std::vector<int64_t>> sequence = {{2, 32, 64}, {4, 64, 128}, {8, 128, 256}};
  std::vector<std::function<Call(int)>> sizes;
  for (const auto& shape : kind.image ? image : sequence) {
    std::function<Call(int)> base = MemoryCall(shape, type, kind.inplace, kind.op);
    const double extra = kind.extra_arguments * static_cast<double>(at::elementSize(type));
    sizes.push_back([base, extra, shape](int k) {
      Call c = base(k);
      double n = 1;
      for (int64_t d : shape) n *= static_cast<double>(d);
      c.features.bytes += extra * n;
      return c;
    });
  }
  return FitCalls(sizes, 4, 3);
}

// aten::linear, input [m, k], weight [n, k], bias [n]: squares 32..256 (512
// in fp32) and two weight-bound shapes (8 rows).
std::pair<LinearOpCost, LinearOpCost> LinearLaw(at::ScalarType type) {
  std::vector<std::array<int64_t, 3>> shapes = {{32, 32, 32}, {64, 64, 64}, {128, 128, 128}, {256, 256, 256},
                                                {8, 256, 256}, {8, 512, 512}};
  if (type == at::kFloat) shapes.push_back({512, 512, 512});
  std::vector<std::function<Call(int)>> sizes;
  for (const auto& [m, k, n] : shapes) {
    sizes.push_back([=](int) {
      Call c;
      at::Tensor x = Leaf({m, k}, type), w = Leaf({n, k}, type), b = Leaf({n}, type);
      c.leaves = {x, w, b};
      c.forward = [x, w, b] { return at::linear(x, w, b); };
      c.features = {2.0 * static_cast<double>(m * n * k),
                    static_cast<double>(Bytes({x, w, b}) + m * n * static_cast<int64_t>(at::elementSize(type))),
                    static_cast<double>(Bytes({w}))};
      return c;
    });
  }
  return FitCalls(sizes, 2, 3);
}

// 3x3 convolutions C -> C (padding 1) on 2 x C x S x S, from many small
// channels on large images to 512 channels on 2 x 2 (weight-bound).
std::pair<LinearOpCost, LinearOpCost> ConvolutionLaw(at::ScalarType type) {
  const std::vector<std::pair<int64_t, int64_t>> shapes = {{8, 16}, {32, 16}, {128, 16}, {64, 32}, {256, 4}, {512, 2}};
  std::vector<std::function<Call(int)>> sizes;
  for (const auto& [ch, side] : shapes) {
    sizes.push_back([=](int) {
      Call c;
      at::Tensor x = Leaf({2, ch, side, side}, type), w = Leaf({ch, ch, 3, 3}, type);
      c.leaves = {x, w};
      c.forward = [x, w] { return at::conv2d(x, w, {}, {1, 1}, {1, 1}); };
      c.features = {2.0 * static_cast<double>(2 * ch * side * side * ch * 9), static_cast<double>(2 * Bytes({x}) + Bytes({w})),
                    static_cast<double>(Bytes({w}))};
      return c;
    });
  }
  return FitCalls(sizes, 2, 3);
}

// Scaled dot-product attention, q, k, v [1, 8, L, D], (L, D) = (16, 32),
// (64, 32), (256, 32), (64, 16), (128, 64):
// plain or with dropout 0.1 (the fused kernel or the math path on the CPU),
// each with a boolean mask or causal where the op is.
std::pair<LinearOpCost, LinearOpCost> AttentionLaw(at::ScalarType type, bool masked, double dropout_p, bool causal) {
  std::vector<std::function<Call(int)>> sizes;
  for (const auto& [l, d] : std::vector<std::pair<int64_t, int64_t>>{{16, 32}, {64, 32}, {256, 32}, {64, 16}, {128, 64}}) {
    sizes.push_back([=](int) {
      Call c;
      at::Tensor q = Leaf({1, 8, l, d}, type), k = Leaf({1, 8, l, d}, type), v = Leaf({1, 8, l, d}, type);
      std::optional<at::Tensor> mask;
      if (masked) mask = at::ones({1, 1, l, l}, at::kBool);
      c.leaves = {q, k, v};
      c.forward = [q, k, v, mask, dropout_p, causal] {
        return at::scaled_dot_product_attention(q, k, v, mask, dropout_p, causal);
      };
      // Bytes as the cost model counts them: q, k, v, the mask and the
      // output, and on the math path (dropout) the attention matrix.
      const int64_t matrix = dropout_p > 0 ? 8 * l * l * static_cast<int64_t>(at::elementSize(type)) : 0;
      c.features = {4.0 * 8 * static_cast<double>(l * l * d),
                    static_cast<double>(4 * Bytes({q}) + (mask ? Bytes({*mask}) : 0) + matrix), 0};
      return c;
    });
  }
  return FitCalls(sizes, 2, 3);
}

// One-layer LSTM or GRU (batch first) on [B, T, H], hidden H: per call
// (batch, time steps, hidden) = (4, 8, 16), (4, 32, 16), (4, 16, 64),
// (4, 16, 128), (16, 8, 32). Features as
// the cost model counts them: 2 x batch x time x the weight matrices'
// elements; the arguments' and outputs' bytes; the weights'; and the time
// steps, each a small step paying the law's fixed cost.
std::pair<LinearOpCost, LinearOpCost> RecurrentLaw(at::ScalarType type, bool lstm) {
  std::vector<std::function<Call(int)>> sizes;
  const int64_t gates = lstm ? 4 : 3;
  for (const auto& [batch, steps, hidden] : std::vector<std::array<int64_t, 3>>{
           {4, 8, 16}, {4, 32, 16}, {4, 16, 64}, {4, 16, 128}, {16, 8, 32}}) {
    sizes.push_back([=](int) {
      Call c;
      at::Tensor x = Leaf({batch, steps, hidden}, type);
      at::Tensor h0 = at::zeros({1, batch, hidden}).to(type), c0 = at::zeros({1, batch, hidden}).to(type);
      std::vector<at::Tensor> params = {Leaf({gates * hidden, hidden}, type), Leaf({gates * hidden, hidden}, type),
                                        Leaf({gates * hidden}, type), Leaf({gates * hidden}, type)};
      c.leaves = params;
      c.leaves.push_back(x);
      c.forward = [=] {
        if (lstm) return std::get<0>(at::lstm(x, {h0, c0}, params, true, 1, 0.0, true, false, true));
        return std::get<0>(at::gru(x, h0, params, true, 1, 0.0, true, false, true));
      };
      const double weights = static_cast<double>(params[0].numel() + params[1].numel());
      int64_t bytes = Bytes({x, h0, params[0], params[1], params[2], params[3]}) + Bytes({x}) + Bytes({h0});
      if (lstm) bytes += 2 * Bytes({c0});
      c.features = {2.0 * static_cast<double>(batch * steps) * weights, static_cast<double>(bytes),
                    static_cast<double>(Bytes({params[0], params[1]})), static_cast<double>(steps)};
      return c;
    });
  }
  return FitCalls(sizes, 2, 3);
}

// A parameter's gradient delivered to its `.grad` (AccumulateGrad) as a
// training step does it: gradients set to None before the step
// (`zero_grad()`'s default, as the profiled and the plain steps and `ckplan
// run` do), so autograd takes the new gradient as `.grad` without an add
// (it copies it only where the gradient does not have the parameter's
// layout). Measured as what a backward writing `.grad` costs beyond the
// same backward returning the gradients (torch::autograd::grad: no
// AccumulateGrad): 64 parameters of 4 Ki, 64 Ki and 1 Mi elements (feature:
// the parameter's bytes), each behind a `mul` (a fresh contiguous gradient,
// as a layer's backward makes), the median of 9 differences, each of two
// backwards back to back; plus the engine's node
// (`node_us`: both backwards schedule it, only one runs it).
std::pair<LinearOpCost, LinearOpCost> AccumulateLaw(at::ScalarType type, double node_us) {
  std::vector<OpCostSample> samples;
  for (int64_t n : {int64_t{4096}, int64_t{65536}, int64_t{1} << 20}) {
    const int64_t count = n >= (int64_t{1} << 20) ? 8 : 64;
    std::vector<double> apply_us_reps;  // per rep: into .grad less returned, back to back
    for (int r = -1; r < 9; ++r) {
      double us[2] = {0, 0};
      for (const bool into_grad : {true, false}) {
        std::vector<at::Tensor> leaves, outputs, grads;
        for (int64_t k = 0; k < count; ++k) {
          leaves.push_back(at::randn({n}).to(type).set_requires_grad(true));
          outputs.push_back(leaves.back() * 2);
          grads.push_back(at::ones_like(outputs.back()));
        }
        const auto start = Clock::now();
        if (into_grad) {
          torch::autograd::backward(outputs, grads);
        } else {
          torch::autograd::grad(outputs, leaves, grads);
        }
        us[into_grad ? 0 : 1] = MsSince(start) * 1e3 / static_cast<double>(count);
      }
      if (r >= 0) apply_us_reps.push_back(us[0] - us[1]);
    }
    const double apply_us = std::max(0.0, Median(apply_us_reps));
    samples.push_back({{0, static_cast<double>(n * static_cast<int64_t>(at::elementSize(type))), 0}, apply_us});
  }
  LinearOpCost law = FitOpCost(samples);
  law.fixed_us += node_us;
  return {LinearOpCost{}, law};
}

// The engine's sum of two gradients of one value (its input buffer adds
// the second into the first in place, no autograd): add_ of 4 Ki, 64 Ki and
// 1 Mi elements (feature: the value's bytes), medians of 5.
std::pair<LinearOpCost, LinearOpCost> GradSumLaw(at::ScalarType type) {
  at::NoGradGuard no_grad;
  std::vector<OpCostSample> samples;
  for (int64_t n : {int64_t{4096}, int64_t{65536}, int64_t{1} << 20}) {
    const int64_t count = n >= (int64_t{1} << 20) ? 4 : 32;
    std::vector<double> us;
    for (int r = -1; r < 5; ++r) {
      std::vector<at::Tensor> a, b;
      for (int64_t k = 0; k < count; ++k) {
        a.push_back(at::randn({n}).to(type));
        b.push_back(at::randn({n}).to(type));
      }
      const auto start = Clock::now();
      for (int64_t k = 0; k < count; ++k) a[static_cast<size_t>(k)].add_(b[static_cast<size_t>(k)]);
      if (r >= 0) us.push_back(MsSince(start) * 1e3 / static_cast<double>(count));
    }
    samples.push_back({{0, static_cast<double>(n * static_cast<int64_t>(at::elementSize(type))), 0}, Median(us)});
  }
  const LinearOpCost law = FitOpCost(samples);
  return {law, law};
}

// One more autograd node, forward and backward: chains of views (a [64, 64]
// float tensor flattened and viewed back, alternately) with autograd,
// 33 against 1 (the difference per node), the backward through the engine
// (torch::autograd::grad); medians of 21.
std::pair<double, double> ExtraNodeUs() {
  auto chain_us = [](int n) {
    std::vector<double> fwd, bwd;
    for (int r = -1; r < 21; ++r) {
      at::Tensor x = at::randn({64, 64}).set_requires_grad(true);
      at::Tensor y = x * 1;
      const auto start = Clock::now();
      for (int i = 0; i < n; ++i) y = y.dim() == 2 ? y.view({4096}) : y.view({64, 64});
      const double f = MsSince(start) * 1e3;
      const at::Tensor grad = at::ones_like(y);
      const auto backward_start = Clock::now();
      torch::autograd::grad({y}, {x}, {grad});
      if (r >= 0) {
        fwd.push_back(f);
        bwd.push_back(MsSince(backward_start) * 1e3);
      }
    }
    return std::pair{Median(fwd), Median(bwd)};
  };
  const auto [f1, b1] = chain_us(1);
  const auto [f33, b33] = chain_us(33);
  return {std::max(0.0, (f33 - f1) / 32), std::max(0.0, (b33 - b1) / 32)};
}

}  // namespace

void MeasureCpuOpCosts(const Profile& profile, GpuSpec* cpu) {
  std::set<std::pair<std::string, std::string>> wanted;  // (bare kind or stand-in, dtype)
  for (const OpRecord& op : profile.ops) {
    const OpWork w = CountOpWork(profile, op);
    if (w.op_class == OpClass::kView) continue;
    const Dtype* d = FindDtypeIgnoringCase(w.dtype);
    const std::string dtype = d != nullptr ? d->python : "";
    if (dtype != "float32" && dtype != "bfloat16") continue;
    std::string name = w.kind;
    if (w.op_class == OpClass::kMatmul) name = "linear";
    if (w.op_class == OpClass::kConvolution) name = "conv2d";
    // Attention: w.kind names its CPU path (`sdpa`, `sdpa_dropout`, with `_mask` or `_causal`).
    wanted.insert({name, dtype});
  }
  std::set<std::string> parameter_dtypes;
  for (const auto& [name, dtype] : wanted) {
    if (name == "linear" || name == "conv2d") parameter_dtypes.insert(dtype);
  }
  if (parameter_dtypes.empty()) parameter_dtypes.insert("float32");
  for (const auto& [name, dtype] : wanted) {
    const at::ScalarType type = ToScalarType(*FindPythonDtype(dtype));
    const std::string key = name + ":" + dtype;
    if (name == "linear") cpu->op_costs[key] = LinearLaw(type);
    if (name == "conv2d") cpu->op_costs[key] = ConvolutionLaw(type);
    if (name.rfind("sdpa", 0) == 0) {
      cpu->op_costs[key] = AttentionLaw(type, name.find("_mask") != std::string::npos,
                                        name.find("_dropout") != std::string::npos ? 0.1 : 0,
                                        name.find("_causal") != std::string::npos);
    }
    if (name == "lstm" || name == "gru") cpu->op_costs[key] = RecurrentLaw(type, name == "lstm");
    for (const MemoryKind& kind : MemoryKinds()) {
      if (name == kind.kind) cpu->op_costs[key] = MemoryLaw(kind, type);
    }
    if (cpu->op_costs.count(key)) cpu->op_cost_nodes[key] = g_law_nodes;
  }
  std::tie(cpu->extra_node_fwd_us, cpu->extra_node_bwd_us) = ExtraNodeUs();
  for (const std::string& dtype : parameter_dtypes) {
    const at::ScalarType type = ToScalarType(*FindPythonDtype(dtype));
    cpu->op_costs["accumulate_grad:" + dtype] = AccumulateLaw(type, cpu->extra_node_bwd_us);
    cpu->op_costs["grad_sum:" + dtype] = GradSumLaw(type);
  }
}

GpuSpec MeasureCpuPeak(int threads) {
  at::set_num_threads(threads);
  GpuSpec cpu;
  cpu.name = "cpu";
  cpu.description = "this machine's CPU, " + std::to_string(threads) + " thread(s), measured";
  // Matmul rates by size, per dtype (a CPU's rate depends on both: the test
  // models' layers are 32-512 wide, and bf16's rate is not fp32's).
  cpu.measured_tflops["matmul:float32"] = LinearCurve(at::kFloat, {32, 64, 128, 256, 512});
  cpu.measured_tflops["matmul:bfloat16"] = LinearCurve(at::kBFloat16, {32, 64, 128, 256, 512});
  cpu.measured_tflops["matmul:float16"] = LinearCurve(at::kHalf, {64, 256});
  cpu.measured_tflops["convolution:float32"] = ConvolutionCurve(at::kFloat, {8, 32, 128});
  for (const auto& [type, name] : {std::pair{at::kFloat, "float32"}, std::pair{at::kBFloat16, "bfloat16"}}) {
    cpu.measured_tflops[std::string("attention:") + name] = AttentionCurve(type, false, {32, 128, 512});
    cpu.measured_tflops[std::string("attention_mask:") + name] = AttentionCurve(type, true, {32, 128, 512});
  }
  auto best_of = [](const std::vector<std::pair<double, double>>& curve) {
    double best = 0;
    for (const auto& point : curve) best = std::max(best, point.second);
    return best;
  };
  cpu.fp32_tflops = best_of(cpu.measured_tflops["matmul:float32"]);
  cpu.bf16_tflops = best_of(cpu.measured_tflops["matmul:bfloat16"]);
  cpu.fp16_tflops = best_of(cpu.measured_tflops["matmul:float16"]);
  // Memory-bound ops on a CPU are bound by their arithmetic as much as by
  // memory: the rate of an elementwise GELU over 16 Mi floats (64 MiB read,
  // 64 MiB written) stands for them, not a plain copy.
  at::Tensor src = at::randn({int64_t{16} << 20});
  const double gelu_s = BestSeconds(3, [&] { at::gelu(src); });
  cpu.bandwidth_gb_per_s = 2.0 * static_cast<double>(src.nbytes()) / gelu_s / 1e9;
  // The same GELU in bf16 (16 Mi elements, 32 MiB each way): converted to float and back.
  at::Tensor src16 = src.to(at::kBFloat16);
  const double gelu16_s = BestSeconds(3, [&] { at::gelu(src16); });
  cpu.elementwise_gb_per_s["bfloat16"] = 2.0 * static_cast<double>(src16.nbytes()) / gelu16_s / 1e9;
  // Dropout (p = 0.1, training) over 1 Mi floats: its random numbers bound it.
  at::Tensor small = at::randn({int64_t{1} << 20});
  const double dropout_s = BestSeconds(3, [&] { at::dropout(small, 0.1, true); });
  cpu.random_gb_per_s = 2.0 * static_cast<double>(small.nbytes()) / dropout_s / 1e9;
  // The fixed cost of an op: one-element adds (a kernel each way) and
  // transposes (views: no kernel), forward with autograd and backward.
  const auto [add_fwd_us, add_bwd_us] = ChainOverheadUs("aten::add", "Tensor", /*view=*/false);
  const auto [view_fwd_us, view_bwd_us] = ChainOverheadUs("aten::transpose", "int", /*view=*/true);
  cpu.op_overhead_us = add_fwd_us;
  cpu.bwd_op_overhead_us = add_bwd_us;
  cpu.view_overhead_us = (view_fwd_us + view_bwd_us) / 2;
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGE_SIZE);
  cpu.memory_bytes = pages > 0 && page_bytes > 0 ? static_cast<int64_t>(pages) * page_bytes : 0;
  cpu.source =
      "measured: aten::linear n x n x n (n = 32..512) per dtype, 3x3 convolutions (8..128 channels, 16x16), "
      "scaled dot-product attention [1, 8, L, 32] (L = 32..512) with and without a mask per dtype, an elementwise "
      "GELU over 64 MiB (and 32 MiB in bf16), dropout over 4 MiB, chains of 64 one-element adds and transposes "
      "with autograd, forward and backward (boxed dispatch)";
  return cpu;
}

}  // namespace ckplan
