#pragma once
// The staged program (the executor, torch): the forward graph of a
// TorchScript model cut into a plan's stages.

#include <torch/script.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "libtorch/runtime/graph_program.h"

namespace ckplan {

/// The tensors inside `values` (lists and tuples included), in order.
std::vector<at::Tensor> Flatten(const std::vector<c10::IValue>& values);

// The forward graph cut into the plan's stages: node ranges and the values
// live at each cut.
class StagedProgram {
 public:
  StagedProgram(GraphProgram& program, const std::vector<std::pair<int, int>>& op_ranges);

  /// Whether stage s writes in place into its input k (`dropout_` on a
  /// `flatten` of it): such an input is copied when the stage starts, or a
  /// recomputation would read the written values, and autograd refuses to
  /// write into a view of the leaf that collects the input's gradient.
  bool Writes(size_t s, size_t k) const { return written_[s][k]; }

  size_t stages() const { return begin_.size(); }
  const std::vector<const torch::jit::Value*>& boundary(size_t k) const { return boundary_[k]; }
  size_t begin(size_t s) const { return begin_[s]; }
  size_t end(size_t s) const { return end_[s]; }
  GraphProgram& program() { return program_; }

 private:
  // From the ops' schemas: outputs that alias an input (views, unpacked
  // lists) carry its index; an argument marked as written (`Tensor(a!)`)
  // that carries one marks that input written.
  std::vector<bool> WrittenInputs(size_t s) const;

  GraphProgram& program_;
  std::vector<size_t> begin_, end_;
  std::vector<std::vector<const torch::jit::Value*>> boundary_;
  std::vector<std::vector<bool>> written_;
};

}  // namespace ckplan
