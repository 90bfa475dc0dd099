#pragma once
// Models saved with torch.export (`.pt2` archives), read in C++ into the form
// a TorchScript model takes here (pt2_model.cc), and what ckplan_torch.export
// recorded beside the program (extra/ckplan.json). Part of the runtime
// (includes LibTorch).

#include <torch/script.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckplan {

/// Whether `path` is a torch.export archive (`.pt2`, from torch.export.save).
bool IsExportArchive(const std::string& path);
/// A torch.export archive as a module whose forward graph holds its ATen
/// ops, each tagged with its module path: GraphProgram runs it as it runs
/// a TorchScript module.
torch::jit::Module LoadExportedProgram(const std::string& path);
/// The module path a node of an exported program was tagged with, or "".
std::string ExportModulePath(const torch::jit::Node* node);
/// The autocast region a node of an exported program runs in, as
/// ProgramNode::autocast (graph_program.h): kAutocastOuter unless inside a
/// region the model set itself.
int ExportAutocast(const torch::jit::Node* node);
/// The autocast an exported program was exported under
/// (ckplan_torch.export(autocast=...), extra/ckplan.json `autocast`):
/// `bfloat16` or `float16`; nullopt when none or not a .pt2.
std::optional<std::string> ExportAutocastDtype(const std::string& path);
/// The modules an exported program's node's outputs were passed to, as the
/// program's module call signatures record them: (module path, output).
std::vector<std::pair<std::string, const torch::jit::Value*>> ModuleCallInputs(const torch::jit::Node* node);
/// The bytes of Python numbers eager PyTorch's autograd node of an exported
/// program's node keeps (mul and div by a number: a 0-dim host tensor), or 0.
int64_t ExportWrappedNumberBytes(const torch::jit::Node* node);
/// Per module path, the most bytes its forward held at once in eager PyTorch
/// beyond what it was called with, as ckplan_torch.export measured it on its
/// example inputs (extra/ckplan.json); empty unless `path` is a .pt2 with
/// that record and `inputs` have the example's shapes and element sizes.
std::map<std::string, int64_t> ExportEagerModulePeaks(const std::string& path, const std::vector<at::Tensor>& inputs);
/// The `--input` texts of the example inputs ckplan_torch.export recorded in
/// a .pt2 (extra/ckplan.json `inputs`), in the program's order; empty when
/// it recorded none.
std::vector<std::string> ExportInputSpecs(const std::string& path);


}  // namespace ckplan
