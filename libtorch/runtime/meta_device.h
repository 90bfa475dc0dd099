#pragma once
// `ckplan profile --device meta`: the same graph, autograd included, run on
// meta tensors (shapes and dtypes, no data). Their storages are allocated
// through the allocator registered for the meta device; ckplan registers one
// that hands out no memory but counts every allocation and free in the
// tracking ledger (tracking_allocator.h), exactly as the CPU allocator does,
// so saved bytes, outputs, transients and the step's peak come from the same
// mechanism as on real tensors. Part of the runtime (LibTorch).

#include <torch/script.h>

#include <optional>
#include <string>
#include <vector>

#include "planner/contracts/input_spec.h"
#include "libtorch/runtime/device.h"

namespace ckplan {

class GraphProgram;

/// The meta device, counted by the tracking ledger from now on; the missing
/// meta kernels registered.
DeviceInfo OpenMetaDevice();

/// `--dtype`: bf16, fp16, fp32 (or bfloat16, float16, float32); empty: none.
/// Throws BadInput for anything else.
std::optional<c10::ScalarType> ParseProfileDtype(const std::string& text);

/// Whether a parameter or buffer of the module is a meta tensor (a
/// shapes-only archive: no weights).
bool HasMetaWeights(const torch::jit::Module& module);

/// Casts the module's floating-point parameters and buffers to `dtype` and
/// moves them to `device` (meta: no data).
void PrepareModule(torch::jit::Module& module, const DeviceInfo& device, std::optional<c10::ScalarType> dtype);

/// Device constants (`device=cpu` in a traced or exported graph) and tensor
/// constants of more than one element are moved to the meta device, so that
/// tensors made inside the graph are meta tensors too.
void RetargetConstantsToMeta(const GraphProgram& program);

/// The model's inputs as meta tensors of their specs' shapes (floating-point
/// ones in `dtype` when given).
std::vector<at::Tensor> MakeMetaInputs(const std::vector<InputSpec>& specs, std::optional<c10::ScalarType> dtype);

/// Floating-point inputs cast to `dtype` (real tensors).
void CastInputs(std::vector<at::Tensor>* inputs, std::optional<c10::ScalarType> dtype);

}  // namespace ckplan
