#include "ckplan/profiler/cpu_peak.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/variable.h>
#include <unistd.h>

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "timing.h"

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

}  // namespace

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
