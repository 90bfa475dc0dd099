#include "libtorch/executor/staged_program.h"

#include <optional>
#include <unordered_map>

namespace ckplan {

using torch::jit::Value;

std::vector<at::Tensor> Flatten(const std::vector<c10::IValue>& values) {
  std::vector<at::Tensor> out;
  for (const auto& v : values) CollectTensors(v, &out);
  return out;
}

StagedProgram::StagedProgram(GraphProgram& program, const std::vector<std::pair<int, int>>& op_ranges)
    : program_(program) {
  const size_t stages = op_ranges.size();
  const size_t nodes = program.nodes().size();
  for (size_t s = 0; s < stages; ++s) {
    size_t begin = s == 0 ? 0 : program.OpNode(op_ranges[s - 1].second) + 1;
    size_t end = s + 1 == stages ? nodes - 1 : program.OpNode(op_ranges[s].second);
    begin_.push_back(begin);
    end_.push_back(end);
  }
  // boundary[k]: values made before stage k starts and read from it on.
  std::unordered_map<const Value*, size_t> defined_at;
  for (size_t n = 0; n < nodes; ++n) {
    for (const Value* out : program.nodes()[n].node->outputs()) defined_at[out] = n;
  }
  boundary_.resize(stages + 1);
  for (size_t k = 0; k <= stages; ++k) {
    size_t cut = k < stages ? begin_[k] : nodes;
    for (size_t n = 0; n < cut; ++n) {
      for (const Value* out : program.nodes()[n].node->outputs()) {
        size_t last = program.LastUse(out);
        if (last >= cut && (last > n || k == stages)) boundary_[k].push_back(out);
      }
    }
  }
  for (size_t s = 0; s < stages; ++s) written_.push_back(WrittenInputs(s));
}

// From the ops' schemas: outputs that alias an input (views, unpacked
// lists) carry its index; an argument marked as written (`Tensor(a!)`)
// that carries one marks that input written.
std::vector<bool> StagedProgram::WrittenInputs(size_t s) const {
  const std::vector<const Value*>& in = boundary_[s];
  std::vector<bool> written(in.size(), false);
  std::unordered_map<const Value*, size_t> alias_of;
  for (size_t k = 0; k < in.size(); ++k) alias_of[in[k]] = k;
  for (size_t n = begin_[s]; n <= end_[s]; ++n) {
    const torch::jit::Node* node = program_.nodes()[n].node;
    std::optional<size_t> source;
    bool aliasing_outputs = node->kind() == c10::prim::ListUnpack || node->kind() == c10::prim::TupleUnpack;
    const c10::FunctionSchema* schema = node->maybeSchema();
    for (size_t i = 0; i < node->inputs().size(); ++i) {
      auto it = alias_of.find(node->inputs()[i]);
      if (it == alias_of.end()) continue;
      const c10::AliasInfo* info =
          schema && i < schema->arguments().size() ? schema->arguments()[i].alias_info() : nullptr;
      if (info && info->isWrite()) written[it->second] = true;
      if (info || aliasing_outputs) source = it->second;
    }
    if (!source) continue;
    for (size_t j = 0; j < node->outputs().size(); ++j) {
      const bool aliases = aliasing_outputs || (schema && j < schema->returns().size() &&
                                                schema->returns()[j].alias_info() != nullptr);
      if (aliases) alias_of[node->outputs()[j]] = *source;
    }
  }
  return written;
}

}  // namespace ckplan
