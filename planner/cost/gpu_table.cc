#include "planner/cost/gpu_table.h"

#include <algorithm>
#include <cctype>

#include "planner/base/error.h"

namespace ckplan {

namespace {
constexpr int64_t kMiB = int64_t{1} << 20;
}

// Dense (not 2:4 sparse) peaks. Memory: the total nvidia-smi reports.
// Fixed costs: 4 us per op forward and backward (one CUDA kernel launch each;
// an assumption, not measured here: launch latency is commonly quoted at
// 3-10 us), 0 for a view (no kernel; the host's dispatch overlaps the queued
// kernels). No measured rate curves: peak x efficiency.
const std::vector<GpuSpec>& KnownGpus() {
  static const std::vector<GpuSpec> table = {
      {"h100-sxm-80gb", "NVIDIA H100 SXM5 80GB", 67.0, 989.4, 989.4, 3350, 81559 * kMiB, 4.0,
       "NVIDIA H100 Tensor Core GPU datasheet (2023): FP32 67 TFLOPS, BF16/FP16 1,979 TFLOPS with sparsity "
       "(989 dense), 3.35 TB/s HBM3",
       4.0, 0.0, {}, 0.0, {}, {}, {}, 0.0, 0.0},
      {"h200-141gb", "NVIDIA H200 SXM 141GB", 67.0, 989.4, 989.4, 4800, 143771 * kMiB, 4.0,
       "NVIDIA H200 Tensor Core GPU datasheet (2024): FP32 67 TFLOPS, BF16/FP16 1,979 TFLOPS with sparsity "
       "(989 dense), 4.8 TB/s HBM3e, 141 GB",
       4.0, 0.0, {}, 0.0, {}, {}, {}, 0.0, 0.0},
      {"a100-40gb", "NVIDIA A100 SXM4 40GB", 19.5, 312, 312, 1555, 40960 * kMiB, 4.0,
       "NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS, BF16/FP16 312 TFLOPS, 1,555 GB/s HBM2",
       4.0, 0.0, {}, 0.0, {}, {}, {}, 0.0, 0.0},
      {"a100-80gb", "NVIDIA A100 SXM4 80GB", 19.5, 312, 312, 2039, 81920 * kMiB, 4.0,
       "NVIDIA A100 Tensor Core GPU datasheet (2021): FP32 19.5 TFLOPS, BF16/FP16 312 TFLOPS, 2,039 GB/s HBM2e",
       4.0, 0.0, {}, 0.0, {}, {}, {}, 0.0, 0.0},
      {"l4-24gb", "NVIDIA L4 24GB", 30.3, 121, 121, 300, 23034 * kMiB, 4.0,
       "NVIDIA L4 Tensor Core GPU datasheet (2023): FP32 30.3 TFLOPS, BF16/FP16 242 TFLOPS with sparsity "
       "(121 dense), 300 GB/s GDDR6",
       4.0, 0.0, {}, 0.0, {}, {}, {}, 0.0, 0.0},
      {"rtx4090-24gb", "NVIDIA GeForce RTX 4090 24GB", 82.6, 165.2, 165.2, 1008, 24564 * kMiB, 4.0,
       "NVIDIA Ada Lovelace architecture whitepaper (v2.1), Table 2: FP32 82.6 TFLOPS, BF16/FP16 tensor "
       "165.2 TFLOPS dense with FP32 accumulate, 1,008 GB/s GDDR6X",
       4.0, 0.0, {}, 0.0, {}, {}, {}, 0.0, 0.0},
  };
  return table;
}

std::string KnownGpuNames() {
  std::string names;
  for (const GpuSpec& g : KnownGpus()) names += (names.empty() ? "" : ", ") + g.name;
  return names + ", cpu";
}

GpuSpec FindGpu(const std::string& name) {
  std::string key = name;
  std::transform(key.begin(), key.end(), key.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::vector<std::pair<std::string, std::string>> aliases = {
      {"h100", "h100-sxm-80gb"}, {"h100-80gb", "h100-sxm-80gb"}, {"h200", "h200-141gb"},
      {"a100", "a100-80gb"},     {"l4", "l4-24gb"},                {"rtx4090", "rtx4090-24gb"},
      {"4090", "rtx4090-24gb"}};
  for (const auto& [alias, target] : aliases) {
    if (key == alias) key = target;
  }
  for (const GpuSpec& g : KnownGpus()) {
    if (g.name == key) return g;
  }
  throw BadInput("unknown --gpu '" + name + "': known devices are " + KnownGpuNames());
}

}  // namespace ckplan
