// Benchmark: the cost of `ckplan profile` against the same number of plain
// LibTorch forward+backward steps (module.forward, graph executor
// optimisations off) on the same model and inputs. Prints figures; asserts
// nothing.
//
//   bench_profile MODEL INPUT... [--reps N]

#include <ATen/Parallel.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <time.h>
#include <vector>

#include "libtorch/profiler/profiler.h"

using Clock = std::chrono::steady_clock;

static double Ms(Clock::time_point a) { return std::chrono::duration<double, std::milli>(Clock::now() - a).count(); }

// The process's CPU time: on a shared machine, wall time grows with the other
// jobs' load (the ratio moved by 0.4 between two runs at load 7 on 2 cores).
static double CpuMs() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_profile MODEL INPUT... [--reps N]\n");
    return 2;
  }
  std::string model = argv[1];
  std::vector<ckplan::InputSpec> specs;
  int reps = 5;
  for (int i = 2; i < argc; ++i) {
    if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      specs.push_back(ckplan::ParseInputSpec(argv[i]));
    }
  }
  at::set_num_threads(1);
  torch::jit::setGraphExecutorOptimize(false);
  const int steps = reps + 1;  // the profiler's warm-up plus its measured reps

  // ckplan profile (the whole call: load, graph walk, all steps, records).
  ckplan::ProfileOptions options;
  options.model_path = model;
  options.inputs = specs;
  options.reps = reps;
  std::vector<std::string> warnings;
  std::vector<double> profile_ms, plain_ms, profile_cpu_ms, plain_cpu_ms;
  for (int trial = 0; trial < 3; ++trial) {
    auto start = Clock::now();
    double cpu_start = CpuMs();
    ckplan::Profile p = ckplan::ProfileModel(options, &warnings);
    profile_ms.push_back(Ms(start));
    profile_cpu_ms.push_back(CpuMs() - cpu_start);

    // The same number of plain steps, loading included.
    start = Clock::now();
    cpu_start = CpuMs();
    torch::jit::Module module = torch::jit::load(model);
    std::vector<torch::jit::IValue> inputs;
    at::manual_seed(0);
    for (const auto& spec : specs) {
      if (ckplan::IsIntegerDtype(spec.dtype)) {
        inputs.push_back(at::randint(static_cast<int64_t>(spec.lo), static_cast<int64_t>(spec.hi), spec.shape, at::kLong));
      } else {
        inputs.push_back(at::randn(spec.shape));
      }
    }
    for (int s = 0; s < steps; ++s) {
      at::Tensor out = module.forward(inputs).toTensor();
      torch::autograd::backward({out.sum()});
    }
    plain_ms.push_back(Ms(start));
    plain_cpu_ms.push_back(CpuMs() - cpu_start);
  }
  for (auto* v : {&profile_ms, &plain_ms, &profile_cpu_ms, &plain_cpu_ms}) std::sort(v->begin(), v->end());
  std::printf("model %s, %d forward+backward steps, 1 thread, median of 3 trials\n", model.c_str(), steps);
  std::printf("                        wall       CPU\n");
  std::printf("  plain LibTorch steps: %8.1f ms %8.1f ms\n", plain_ms[1], plain_cpu_ms[1]);
  std::printf("  ckplan profile:       %8.1f ms %8.1f ms\n", profile_ms[1], profile_cpu_ms[1]);
  std::printf("  ratio:                %8.2fx   %8.2fx (goal: at most 2x)\n", profile_ms[1] / plain_ms[1],
              profile_cpu_ms[1] / plain_cpu_ms[1]);
  return 0;
}
