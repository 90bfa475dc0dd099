#include "ckplan/profiler/cpu_peak.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/variable.h>
#include <unistd.h>

#include <algorithm>
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

double MatmulTflops(at::ScalarType type) {
  const int64_t n = 512;
  at::Tensor a = at::randn({n, n}).to(type), b = at::randn({n, n}).to(type);
  const double s = BestSeconds(5, [&] { at::mm(a, b); });
  return 2.0 * n * n * n / s / 1e12;
}

}  // namespace

GpuSpec MeasureCpuPeak(int threads) {
  at::set_num_threads(threads);
  GpuSpec cpu;
  cpu.name = "cpu";
  cpu.description = "this machine's CPU, " + std::to_string(threads) + " thread(s), measured";
  cpu.fp32_tflops = MatmulTflops(at::kFloat);
  cpu.bf16_tflops = MatmulTflops(at::kBFloat16);
  cpu.fp16_tflops = MatmulTflops(at::kHalf);
  // Memory-bound ops on a CPU are bound by their arithmetic as much as by
  // memory: the rate of an elementwise GELU over 16 Mi floats (64 MiB read,
  // 64 MiB written) stands for them, not a plain copy.
  at::Tensor src = at::randn({int64_t{16} << 20});
  const double gelu_s = BestSeconds(3, [&] { at::gelu(src); });
  cpu.bandwidth_gb_per_s = 2.0 * static_cast<double>(src.nbytes()) / gelu_s / 1e9;
  // The fixed cost of an op and direction: a one-element multiply with
  // autograd, forward and backward (dispatch, allocation, the graph's node).
  at::Tensor x = at::ones({1}).set_requires_grad(true);
  std::vector<double> us;
  for (int r = 0; r < 1001; ++r) {
    const auto start = Clock::now();
    at::Tensor z = at::mul(x, 2.0);
    z.backward(at::ones({1}));
    us.push_back(MsSince(start) * 1e3 / 2);
  }
  std::nth_element(us.begin(), us.begin() + static_cast<long>(us.size() / 2), us.end());
  cpu.op_overhead_us = us[us.size() / 2];
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGE_SIZE);
  cpu.memory_bytes = pages > 0 && page_bytes > 0 ? static_cast<int64_t>(pages) * page_bytes : 0;
  cpu.source = "measured: 512x512 matmuls (fp32, bf16, fp16), an elementwise GELU over 64 MiB, a one-element "
               "multiply forward and backward";
  return cpu;
}

}  // namespace ckplan
