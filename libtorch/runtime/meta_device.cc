#include "libtorch/runtime/meta_device.h"

#include <c10/core/Allocator.h>

#include <mutex>

#include "planner/base/error.h"
#include "libtorch/runtime/graph_program.h"
#include "libtorch/runtime/meta_kernels.h"
#include "libtorch/runtime/scalar_type.h"
#include "libtorch/runtime/tracking_allocator.h"

namespace ckplan {
namespace {

// Meta storages have no data: the DataPtr's pointer is null. Its context is
// a unique non-null token, the ledger's key for the allocation (the profiler
// reads a storage's key from its data pointer, or its context when that is
// null), freed with the storage.
class MetaTrackingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t bytes) override {
    if (bytes == 0) return {nullptr, nullptr, nullptr, c10::Device(c10::DeviceType::Meta)};
    auto* token = new char;
    TrackingAllocator::Instance().RecordExternal(token, bytes);
    return {nullptr, token, &MetaTrackingAllocator::Delete, c10::Device(c10::DeviceType::Meta)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  void copy_data(void*, const void*, std::size_t) const override {}

 private:
  static void Delete(void* token) {
    if (token == nullptr) return;
    TrackingAllocator::Instance().ForgetExternal(token);
    delete static_cast<char*>(token);
  }
};

}  // namespace

DeviceInfo OpenMetaDevice() {
  static std::once_flag installed;
  std::call_once(installed, [] {
    TrackingAllocator::Instance();  // the CPU side of the ledger first
    static MetaTrackingAllocator allocator;
    // Above the default MetaAllocator's priority (0), so that it wins.
    c10::SetAllocator(c10::DeviceType::Meta, &allocator, /*priority=*/100);
    RegisterMetaKernels();
  });
  return DeviceInfo{c10::Device(c10::DeviceType::Meta), "meta"};
}

std::optional<c10::ScalarType> ParseProfileDtype(const std::string& text) {
  if (text.empty()) return std::nullopt;
  if (const Dtype* d = FindPrecision(text)) return ToScalarType(*d);
  throw BadInput("invalid --dtype '" + text + "': use bf16, fp16 or fp32");
}

bool HasMetaWeights(const torch::jit::Module& module) {
  for (const auto& p : module.named_parameters()) {
    if (p.value.is_meta()) return true;
  }
  for (const auto& b : module.named_buffers()) {
    if (b.value.is_meta()) return true;
  }
  return false;
}

void PrepareModule(torch::jit::Module& module, const DeviceInfo& device, std::optional<c10::ScalarType> dtype) {
  if (!device.device.is_meta()) {
    if (dtype) module.to(*dtype);
    return;
  }
  // Module::to cannot move across device kinds (set_data refuses meta):
  // each tensor attribute is replaced by its meta copy, tied ones once.
  std::unordered_map<const c10::TensorImpl*, at::Tensor> moved;
  for (const torch::jit::Module& m : module.modules()) {
    for (const auto& attribute : m.named_attributes(/*recurse=*/false)) {
      if (!attribute.value.isTensor()) continue;
      const at::Tensor& t = attribute.value.toTensor();
      if (!t.defined()) continue;
      auto found = moved.find(t.unsafeGetTensorImpl());
      if (found == moved.end()) {
        const at::ScalarType type = dtype && t.is_floating_point() ? *dtype : t.scalar_type();
        at::Tensor meta = t.is_meta() && type == t.scalar_type() ? t : t.detach().to(device.device, type);
        meta = meta.detach().set_requires_grad(t.requires_grad());
        found = moved.emplace(t.unsafeGetTensorImpl(), meta).first;
      }
      torch::jit::Module(m).setattr(attribute.name, found->second);
    }
  }
}

void RetargetConstantsToMeta(const GraphProgram& program) {
  const c10::Device meta(c10::DeviceType::Meta);
  for (const ProgramNode& p : program.nodes()) {
    torch::jit::Node* node = p.node;
    if (p.kind != NodeKind::kConstant || !node->hasAttribute(c10::attr::value)) continue;
    const c10::TypePtr& type = node->output()->type();
    if (type->kind() == c10::TypeKind::DeviceObjType) {
      node->s_(c10::attr::value, meta.str());
    } else if (node->kindOf(c10::attr::value) == torch::jit::AttributeKind::t) {
      // A one-element CPU tensor mixes with tensors on any device (like a
      // scalar); larger ones are moved.
      const at::Tensor& t = node->t(c10::attr::value);
      if (t.numel() > 1 && !t.is_meta()) node->t_(c10::attr::value, t.to(meta));
    }
  }
}

std::vector<at::Tensor> MakeMetaInputs(const std::vector<InputSpec>& specs, std::optional<c10::ScalarType> dtype) {
  std::vector<at::Tensor> inputs;
  for (const InputSpec& spec : specs) {
    at::ScalarType type = ToScalarType(*FindPythonDtype(spec.dtype));  // ParseInputSpec named one
    if (dtype && at::isFloatingType(type)) type = *dtype;
    inputs.push_back(at::empty(spec.shape, at::TensorOptions().dtype(type).device(c10::kMeta)));
  }
  return inputs;
}

void CastInputs(std::vector<at::Tensor>* inputs, std::optional<c10::ScalarType> dtype) {
  if (!dtype) return;
  for (at::Tensor& t : *inputs) {
    if (t.is_floating_point()) t = t.to(*dtype);
  }
}

}  // namespace ckplan
