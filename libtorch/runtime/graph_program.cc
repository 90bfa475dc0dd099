#include "libtorch/runtime/graph_program.h"

#include <ATen/autocast_mode.h>
#include <torch/csrc/jit/ir/constants.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/version.h>

#include <algorithm>
#include <fstream>
#include <unistd.h>
#include <regex>
#include <functional>
#include <set>
#include <unordered_set>

#include "planner/base/error.h"
#include "planner/base/units.h"
#include "libtorch/runtime/pt2_model.h"
#include "libtorch/runtime/scalar_type.h"

namespace ckplan {
namespace {

using torch::jit::Node;
using torch::jit::Value;

bool IsTensorType(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto list = type->cast<c10::ListType>()) return IsTensorType(list->getElementType());
  if (auto optional = type->cast<c10::OptionalType>()) return IsTensorType(optional->getElementType());
  return false;
}

NodeKind Classify(const Node* node) {
  const c10::Symbol kind = node->kind();
  if (kind == c10::prim::Constant) return NodeKind::kConstant;
  if (kind == c10::prim::GetAttr) return NodeKind::kGetAttr;
  if (kind == c10::prim::ListConstruct) return NodeKind::kListConstruct;
  if (kind == c10::prim::ListUnpack) return NodeKind::kListUnpack;
  if (kind == c10::prim::TupleConstruct) return NodeKind::kTupleConstruct;
  if (kind == c10::prim::TupleUnpack) return NodeKind::kTupleUnpack;
  if (kind == c10::prim::TupleIndex) return NodeKind::kTupleIndex;
  return NodeKind::kOperation;
}

// Module paths: a class type maps to the one path that has it (traced
// modules have one type per instance); shared types fall back to the
// instance names on the call stack.
class ModulePaths {
 public:
  explicit ModulePaths(const torch::jit::Module& module) {
    std::set<const c10::ClassType*> ambiguous;
    for (const auto& item : module.named_modules()) {
      const c10::ClassType* type = item.value.type().get();
      if (by_type_.count(type)) ambiguous.insert(type);
      by_type_[type] = item.name;
    }
    for (const auto* type : ambiguous) by_type_.erase(type);
  }

  std::string PathOf(const Node* node) const {
    std::string exported = ExportModulePath(node);
    if (!exported.empty()) return exported;
    auto callstack = node->callstack();
    if (!callstack) return "";
    std::vector<torch::jit::InlinedCallStackEntry> entries = (*callstack)->vec();
    std::string joined;
    for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
      const auto& info = std::get<2>(*it);
      if (!info) continue;
      auto found = by_type_.find(info->class_type().get());
      if (found != by_type_.end()) return found->second;
      break;
    }
    for (const auto& entry : entries) {
      const auto& info = std::get<2>(entry);
      if (!info) continue;
      if (!joined.empty()) joined += ".";
      joined += info->instance_name();
    }
    return joined;
  }

 private:
  std::unordered_map<const c10::ClassType*, std::string> by_type_;
};

}  // namespace

GraphProgram::GraphProgram(torch::jit::Module module) : module_(std::move(module)) {
  graph_ = module_.get_method("forward").graph()->copy();
  // Inline() inlines method calls only while the graph executor optimises.
  const bool optimize = torch::jit::getGraphExecutorOptimize();
  torch::jit::setGraphExecutorOptimize(true);
  torch::jit::Inline(*graph_);
  torch::jit::setGraphExecutorOptimize(optimize);
  SelectTrainingOutputs();
  // Each --input is one tensor: a forward taking a list, a dict or a number
  // would fail inside LibTorch with an internal assertion.
  for (size_t i = 1; i < graph_->inputs().size(); ++i) {
    c10::TypePtr type = graph_->inputs()[i]->type();
    if (auto optional = type->cast<c10::OptionalType>()) type = optional->getElementType();
    if (!type->cast<c10::TensorType>()) {
      const Value* input = graph_->inputs()[i];
      throw BadInput("the model's forward takes input " + std::to_string(i) + " ('" + input->debugNameBase() + "') as " +
                     input->type()->annotation_str() +
                     ": ckplan gives each input one tensor (--input); save a model whose forward takes tensors");
    }
  }
  ModulePaths paths(module_);
  for (Node* node : graph_->nodes()) {
    if (!node->blocks().empty()) {
      throw BadInput("the model's forward has control flow (" + std::string(node->kind().toQualString()) +
                     "): trace it with torch.jit.trace instead of torch.jit.script");
    }
    ProgramNode p;
    p.node = node;
    p.kind = Classify(node);
    if (p.kind == NodeKind::kOperation) {
      if (!node->maybeOperator()) {
        throw BadInput("unsupported node " + std::string(node->kind().toQualString()) + " in the model's forward");
      }
      p.operation = node->getOperation();
      for (const Value* out : node->outputs()) {
        if (IsTensorType(out->type())) p.is_op = true;
      }
    }
    p.autocast = ExportAutocast(node);
    explicit_autocast_ = explicit_autocast_ || p.autocast >= 0;
    if (p.is_op) {
      p.op_id = static_cast<int>(op_nodes_.size());
      p.module_path = paths.PathOf(node);
      op_nodes_.push_back(nodes_.size());
    }
    nodes_.push_back(std::move(p));
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    for (const Value* in : nodes_[i].node->inputs()) last_use_[in] = i;
  }
  for (const Value* out : graph_->outputs()) last_use_[out] = nodes_.size();
  dies_after_.resize(nodes_.size());
  constant_value_.resize(nodes_.size());
  attribute_slot_.assign(nodes_.size(), -1);
  for (const auto& [value, index] : last_use_) {
    if (index < nodes_.size()) dies_after_[index].push_back(value);
  }
}

namespace {

// Whether `value` is the job's own loss, exported with the model
// (ckplan_torch.export's loss_fn; the .pt2 reader marks it).
bool IsJobLoss(const Value* value) { return value->node()->hasAttribute(c10::Symbol::attr("ckplan_job_loss")); }

// Whether `value` is a loss: made by a loss op (aten::cross_entropy_loss,
// nll_loss, mse_loss, ...), or by a few scalar steps after one (a Hugging
// Face loss divides the summed cross entropy by the number of items).
bool IsLossValue(const Value* value) {
  if (IsJobLoss(value)) return true;
  for (int step = 0; step < 4 && value != nullptr; ++step) {
    const Node* node = value->node();
    const std::string kind = node->kind().toQualString();
    if (kind.rfind("aten::", 0) == 0 && kind.size() > 10 && kind.compare(kind.size() - 4, 4, "loss") == 0) return true;
    // Follow the first tensor input of a scalar step (div, mul, add, to, mean).
    const Value* next = nullptr;
    for (const Value* in : node->inputs()) {
      if (in->type()->kind() == c10::TypeKind::TensorType) {
        next = in;
        break;
      }
    }
    value = next;
  }
  return false;
}

}  // namespace

void GraphProgram::SelectTrainingOutputs() {
  if (graph_->outputs().size() != 1) return;
  Node* made = graph_->outputs()[0]->node();
  std::vector<Value*> chosen, held;
  if (made->kind() == c10::prim::DictConstruct) {
    std::vector<std::pair<std::string, Value*>> entries;
    std::string keys;
    for (size_t k = 0; k + 1 < made->inputs().size(); k += 2) {
      std::optional<c10::IValue> key = torch::jit::toIValue(made->inputs()[k]);
      if (!key || !key->isString()) {
        throw BadInput("the model's forward returns a dict whose keys are not constant strings: return a tensor, a "
                       "tuple of tensors, or a dict with string keys (a Hugging Face ModelOutput)");
      }
      entries.push_back({key->toStringRef(), made->inputs()[k + 1]});
      keys += (keys.empty() ? "" : ", ") + key->toStringRef();
    }
    auto find = [&](const std::string& name) -> Value* {
      for (const auto& [key, value] : entries) {
        if (key == name && IsTensorType(value->type())) return value;
      }
      return nullptr;
    };
    if (Value* loss = find("loss")) {
      chosen = {loss};
      returns_loss_ = true;
      for (const auto& [key, value] : entries) {
        if (value != loss && IsTensorType(value->type())) held.push_back(value);
      }
      output_choice_ = "the model returns a dict (" + keys +
                       "): its 'loss' is the training loss, back-propagated as it is (--loss does not apply)";
    }
    for (const char* name : {"logits", "last_hidden_state", "prediction_logits", "start_logits"}) {
      Value* v = chosen.empty() ? find(name) : nullptr;
      if (v == nullptr) continue;
      chosen = {v};
      output_choice_ = "the model returns a dict (" + keys + ") without a loss: the loss (--loss) is taken over its '" +
                       name + "'; trace it with its labels for the model's own loss";
    }
    if (chosen.empty()) {
      for (const auto& [key, value] : entries) {
        if (IsTensorType(value->type())) chosen.push_back(value);
      }
      output_choice_ = "the model returns a dict (" + keys + "): the loss (--loss) is taken over its tensors";
    }
    if (chosen.empty()) {
      throw BadInput("the model's forward returns a dict (" + keys + ") with no tensor in it: nothing to train");
    }
  } else if (made->kind() == c10::prim::TupleConstruct && !made->inputs().empty() &&
             made->inputs()[0]->type()->kind() == c10::TypeKind::TensorType && IsLossValue(made->inputs()[0])) {
    // A Hugging Face model traced with return_dict=False and its labels: (loss, logits, ...).
    chosen = {made->inputs()[0]};
    returns_loss_ = true;
    for (size_t k = 1; k < made->inputs().size(); ++k) {
      if (made->inputs()[k]->type()->kind() == c10::TypeKind::TensorType) held.push_back(made->inputs()[k]);
    }
    returns_job_loss_ = IsJobLoss(made->inputs()[0]);
    output_choice_ = returns_job_loss_
                         ? std::string("the archive returns the job's loss (its loss_fn) and the model's outputs: that "
                                       "loss is back-propagated as it is (--loss does not apply)")
                         : "the model returns a tuple led by its loss (" +
                               std::string(made->inputs()[0]->node()->kind().toQualString()) +
                               "): that is the training loss, back-propagated as it is (--loss does not apply)";
  } else {
    return;
  }
  graph_->eraseOutput(0);
  for (Value* v : chosen) graph_->registerOutput(v);
  torch::jit::EliminateDeadCode(graph_);
  // The held outputs the loss still needs survive; one the loss never reads
  // is no longer computed (not counted: less, never a wrong tensor).
  std::unordered_set<const Value*> alive;
  for (const Node* node : graph_->nodes()) {
    for (const Value* v : node->outputs()) alive.insert(v);
  }
  for (const Value* v : held) {
    if (alive.count(v) != 0) held_outputs_.push_back(v);
  }
}

size_t GraphProgram::LastUse(const Value* value) const {
  auto it = last_use_.find(value);
  return it == last_use_.end() ? 0 : it->second;
}

size_t GraphProgram::num_inputs() const { return graph_->inputs().size() - 1; }

const Value* GraphProgram::InputValue(size_t index) const { return graph_->inputs()[index + 1]; }

void GraphProgram::BindInputs(Environment& env, const std::vector<at::Tensor>& inputs) const {
  env[graph_->inputs()[0]] = module_._ivalue();
  for (size_t i = 0; i < inputs.size() && i + 1 < graph_->inputs().size(); ++i) {
    env[graph_->inputs()[i + 1]] = inputs[i];
  }
}

namespace {

// A prim::ListUnpack given a list of another length than its outputs: the
// op that made the list and its module named.
Error UnpackMismatch(const std::vector<ProgramNode>& nodes, size_t index, size_t length) {
  const Node* node = nodes[index].node;
  const Node* producer = node->inputs()[0]->node();
  std::string where;
  for (const ProgramNode& p : nodes) {
    if (p.node == producer && !p.module_path.empty()) where = " in module '" + p.module_path + "'";
  }
  return BadInput("the model's graph unpacks the list made by " + std::string(producer->kind().toQualString()) + where +
                  " into " + std::to_string(node->outputs().size()) + " values, but this run's list has " +
                  std::to_string(length) +
                  ": its trace fixed a length that depends on the data (a loop over torch.nonzero or torch.where "
                  "results, as a mixture of experts' eager routing does: which experts get tokens changes as the "
                  "model trains); save the model in a form without such a loop (Hugging Face MoE models: "
                  "experts_implementation=\"grouped_mm\", their default)");
}

}  // namespace

void GraphProgram::RunNode(size_t index, Environment& env) const {
  const ProgramNode& p = nodes_[index];
  const Node* node = p.node;
  auto input = [&](size_t k) -> const c10::IValue& {
    auto it = env.find(node->inputs()[k]);
    if (it == env.end()) {
      throw Error(ExitCode::kInternal, "value %" + node->inputs()[k]->debugName() + " is not available for " +
                                           std::string(node->kind().toQualString()));
    }
    return it->second;
  };
  switch (p.kind) {
    case NodeKind::kConstant: {
      std::optional<c10::IValue>& value = constant_value_[index];
      if (!value) value = *torch::jit::toIValue(node->output());
      env[node->output()] = *value;
      return;
    }
    case NodeKind::kGetAttr: {
      const auto& object = input(0).toObject();
      int64_t& slot = attribute_slot_[index];
      if (slot < 0) slot = static_cast<int64_t>(object->type()->getAttributeSlot(node->s(c10::attr::name)));
      env[node->output()] = object->getSlot(static_cast<size_t>(slot));
      return;
    }
    case NodeKind::kListConstruct: {
      auto list_type = node->output()->type()->expect<c10::ListType>();
      c10::impl::GenericList list(list_type->getElementType());
      list.reserve(node->inputs().size());
      for (size_t k = 0; k < node->inputs().size(); ++k) list.push_back(input(k));
      env[node->output()] = c10::IValue(std::move(list));
      return;
    }
    case NodeKind::kListUnpack: {
      auto list = input(0).toListRef();
      // A trace fixes how many values a list unpacks into, also where the
      // list's length depends on the data (a loop over torch.nonzero rows:
      // a mixture of experts' eager routing, which training changes). Read
      // past its end, the list gives whatever the heap holds there.
      if (list.size() != node->outputs().size()) throw UnpackMismatch(nodes_, index, list.size());
      for (size_t k = 0; k < node->outputs().size(); ++k) env[node->outputs()[k]] = list[k];
      return;
    }
    case NodeKind::kTupleConstruct: {
      std::vector<c10::IValue> elements;
      for (size_t k = 0; k < node->inputs().size(); ++k) elements.push_back(input(k));
      env[node->output()] = c10::ivalue::Tuple::create(std::move(elements));
      return;
    }
    case NodeKind::kTupleUnpack: {
      const auto& elements = input(0).toTupleRef().elements();
      for (size_t k = 0; k < node->outputs().size(); ++k) env[node->outputs()[k]] = elements[k];
      return;
    }
    case NodeKind::kTupleIndex: {
      const auto& elements = input(0).toTupleRef().elements();
      int64_t i = input(1).toInt();
      if (i < 0) i += static_cast<int64_t>(elements.size());
      env[node->output()] = elements[static_cast<size_t>(i)];
      return;
    }
    case NodeKind::kOperation: {
      torch::jit::Stack stack;
      stack.reserve(node->inputs().size());
      for (size_t k = 0; k < node->inputs().size(); ++k) stack.push_back(input(k));
      // The autocast of the op's region: the program's, or the model's own.
      const int mode = !uses_autocast()              ? kAutocastOff
                       : p.autocast != kAutocastOuter ? p.autocast
                       : autocast_                    ? static_cast<int>(*autocast_)
                                                      : kAutocastOff;
      if (uses_autocast() && autocast_device_ == c10::DeviceType::Meta) {
        if (mode >= 0) EmulateAutocast(index, static_cast<c10::ScalarType>(mode), stack);
        const_cast<torch::jit::Operation&>(p.operation)(stack);
      } else if (uses_autocast()) {
        // torch.autocast's thread-local state for the op, as its region sets it.
        const bool was_enabled = at::autocast::is_autocast_enabled(autocast_device_);
        const c10::ScalarType was_dtype = at::autocast::get_autocast_dtype(autocast_device_);
        at::autocast::set_autocast_enabled(autocast_device_, mode >= 0);
        if (mode >= 0) at::autocast::set_autocast_dtype(autocast_device_, static_cast<c10::ScalarType>(mode));
        try {
          const_cast<torch::jit::Operation&>(p.operation)(stack);
        } catch (...) {
          at::autocast::set_autocast_enabled(autocast_device_, was_enabled);
          at::autocast::set_autocast_dtype(autocast_device_, was_dtype);
          throw;
        }
        at::autocast::set_autocast_enabled(autocast_device_, was_enabled);
        at::autocast::set_autocast_dtype(autocast_device_, was_dtype);
      } else {
        const_cast<torch::jit::Operation&>(p.operation)(stack);
      }
      for (size_t k = 0; k < node->outputs().size(); ++k) env[node->outputs()[k]] = std::move(stack[k]);
      return;
    }
  }
}

namespace {

// CUDA's autocast policies (ATen/autocast_mode.h: the op lists every backend
// registers, by op name; aten/src/ATen/autocast_mode.cpp registers them for
// CUDA), for EmulateAutocast. cross_entropy_loss, a composite CUDA's autocast
// reaches through its log_softmax and nll_loss, is taken as fp32 (as the CPU's
// list has it).
enum CastPolicy : int8_t { kNoCast, kLowerPrecision, kFp32, kFp32SetOptDtype, kPromote };

#define CKPLAN_AUTOCAST_OP_NAME(op, ...) #op,
CastPolicy CastPolicyOf(const std::string& name) {
  static const std::unordered_set<std::string> lower = {AT_FORALL_LOWER_PRECISION_FP(CKPLAN_AUTOCAST_OP_NAME)
                                                        "cudnn_convolution", "cudnn_convolution_transpose"};
  static const std::unordered_set<std::string> fp32 = {AT_FORALL_FP32(CKPLAN_AUTOCAST_OP_NAME) "cross_entropy_loss"};
  static const std::unordered_set<std::string> set_opt_dtype = {AT_FORALL_FP32_SET_OPT_DTYPE(CKPLAN_AUTOCAST_OP_NAME)};
  static const std::unordered_set<std::string> promote = {AT_FORALL_PROMOTE(CKPLAN_AUTOCAST_OP_NAME)};
  if (lower.count(name) != 0) return kLowerPrecision;
  if (fp32.count(name) != 0) return kFp32;
  if (set_opt_dtype.count(name) != 0) return kFp32SetOptDtype;
  if (promote.count(name) != 0) return kPromote;
  return kNoCast;
}
#undef CKPLAN_AUTOCAST_OP_NAME

// What autocast casts: floating-point tensors but double ones.
bool Eligible(const at::Tensor& t) { return t.defined() && t.is_floating_point() && t.scalar_type() != at::kDouble; }

}  // namespace

void GraphProgram::SetAutocast(std::optional<c10::ScalarType> dtype, c10::DeviceType device) {
  autocast_ = dtype;
  autocast_device_ = device;
  cast_policy_.assign(nodes_.size(), kNoCast);
  dtype_argument_.assign(nodes_.size(), -1);
  if (device != c10::DeviceType::Meta) return;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    const Node* node = nodes_[i].node;
    if (nodes_[i].kind != NodeKind::kOperation || !node->kind().is_aten()) continue;
    cast_policy_[i] = CastPolicyOf(node->kind().toUnqualString());
    if (const c10::FunctionSchema* schema = node->maybeSchema()) {
      for (size_t k = 0; k < schema->arguments().size(); ++k) {
        if (schema->arguments()[k].name() == "dtype") dtype_argument_[i] = static_cast<int>(k);
      }
    }
  }
}

void GraphProgram::EmulateAutocast(size_t index, c10::ScalarType lower, torch::jit::Stack& stack) const {
  const int8_t policy = index < cast_policy_.size() ? cast_policy_[index] : kNoCast;
  if (policy == kNoCast) return;
  // autocast's cached_cast: the lower-precision casts of fp32 weights (leaves
  // requiring grad) made once per region.
  auto cast = [&](const at::Tensor& t, c10::ScalarType to) -> at::Tensor {
    if (!Eligible(t) || t.scalar_type() == to) return t;
    if (to == lower && t.scalar_type() == at::kFloat && t.requires_grad() && t.is_leaf() && !t.is_view()) {
      auto found = cast_cache_.find(t.unsafeGetTensorImpl());
      if (found != cast_cache_.end()) return found->second;
      at::Tensor made = t.to(to);
      cast_cache_.emplace(t.unsafeGetTensorImpl(), made);
      return made;
    }
    return t.to(to);
  };
  auto each = [&](const std::function<void(const at::Tensor&)>& visit) {
    for (const c10::IValue& v : stack) {
      if (v.isTensor()) visit(v.toTensor());
      if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorVector()) visit(t);
      }
    }
  };
  auto cast_all = [&](c10::ScalarType to) {
    for (c10::IValue& v : stack) {
      if (v.isTensor()) {
        v = cast(v.toTensor(), to);
      } else if (v.isTensorList()) {
        std::vector<at::Tensor> items = v.toTensorVector();
        for (at::Tensor& t : items) t = cast(t, to);
        v = c10::IValue(items);
      }
    }
  };
  switch (policy) {
    case kLowerPrecision: cast_all(lower); return;
    case kFp32: cast_all(at::kFloat); return;
    case kFp32SetOptDtype: {
      // The op computes in fp32 (its dtype argument set) when its first argument is eligible.
      const int k = dtype_argument_[index];
      if (k >= 0 && static_cast<size_t>(k) < stack.size() && stack[static_cast<size_t>(k)].isNone() &&
          !stack.empty() && stack[0].isTensor() && Eligible(stack[0].toTensor())) {
        stack[static_cast<size_t>(k)] = c10::IValue(static_cast<int64_t>(at::kFloat));
      }
      return;
    }
    case kPromote: {
      c10::ScalarType to = lower;
      each([&](const at::Tensor& t) {
        if (Eligible(t)) to = at::promoteTypes(to, t.scalar_type());
      });
      cast_all(to);
      return;
    }
    default: return;
  }
}

GraphProgram::AutocastScope::AutocastScope(const GraphProgram& program) {
  if (!program.autocast_ || program.autocast_device_ == c10::DeviceType::Meta) return;
  active_ = true;
  device_ = program.autocast_device_;
  was_enabled_ = at::autocast::is_autocast_enabled(device_);
  was_dtype_ = at::autocast::get_autocast_dtype(device_);
  at::autocast::set_autocast_enabled(device_, true);
  at::autocast::set_autocast_dtype(device_, *program.autocast_);
}

GraphProgram::AutocastScope::~AutocastScope() {
  if (!active_) return;
  at::autocast::set_autocast_enabled(device_, was_enabled_);
  at::autocast::set_autocast_dtype(device_, was_dtype_);
}

void GraphProgram::EndAutocast() const {
  if (!uses_autocast()) return;
  if (autocast_device_ == c10::DeviceType::Meta) {
    cast_cache_.clear();
  } else {
    at::autocast::clear_cache();
  }
}

std::optional<c10::ScalarType> ParseAutocast(const std::string& text) {
  // Off, or float32's two names (not `float`); else a 16-bit precision by any of its names.
  if (text == "off" || text == "none" || text == "fp32" || text == "float32") return std::nullopt;
  if (const Dtype* d = FindPrecision(text); d != nullptr && d->bytes == 2) return ToScalarType(*d);
  throw BadInput("invalid --autocast '" + text + "': bf16 or fp16 (torch.autocast's dtype), or off");
}

std::optional<c10::ScalarType> ResolveAutocast(const std::string& flag, const std::optional<std::string>& recorded) {
  if (!flag.empty()) return ParseAutocast(flag);
  if (recorded) return ParseAutocast(*recorded);
  return std::nullopt;
}

std::string TorchDtypeName(c10::ScalarType type) {
  const Dtype* d = DtypeOf(type);
  return d != nullptr ? d->python : c10::toString(type);
}

void GraphProgram::StaticTensors(std::unordered_set<const c10::TensorImpl*>* out) const {
  for (const auto& attribute : module_.named_attributes(/*recurse=*/true)) {
    std::vector<at::Tensor> tensors;
    CollectTensors(attribute.value, &tensors);
    for (const at::Tensor& t : tensors) {
      if (t.defined()) out->insert(t.unsafeGetTensorImpl());
    }
  }
  for (size_t index = 0; index < nodes_.size(); ++index) {
    if (nodes_[index].kind != NodeKind::kConstant) continue;
    std::optional<c10::IValue>& value = constant_value_[index];
    if (!value) value = *torch::jit::toIValue(nodes_[index].node->output());
    if (value->isTensor() && value->toTensor().defined()) out->insert(value->toTensor().unsafeGetTensorImpl());
  }
}

void GraphProgram::FreeDeadAfter(size_t index, Environment& env) const {
  for (const Value* value : dies_after_[index]) env.erase(value);
}

std::vector<const Value*> GraphProgram::OutputValues() const {
  return {graph_->outputs().begin(), graph_->outputs().end()};
}

std::vector<c10::IValue> GraphProgram::Outputs(const Environment& env) const {
  std::vector<c10::IValue> out;
  for (const Value* v : graph_->outputs()) out.push_back(env.at(v));
  return out;
}

void CollectTensors(const c10::IValue& value, std::vector<at::Tensor>* out) {
  if (value.isTensor()) {
    out->push_back(value.toTensor());
  } else if (value.isTuple()) {
    for (const auto& e : value.toTupleRef().elements()) CollectTensors(e, out);
  } else if (value.isList()) {
    for (const auto& e : value.toListRef()) CollectTensors(e, out);
  } else if (value.isGenericDict()) {
    for (const auto& kv : value.toGenericDict()) CollectTensors(kv.value(), out);
  }
}

std::string LibTorchVersion() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

torch::jit::Module LoadModel(const std::string& path) {
  {
    std::ifstream probe(path, std::ios::binary);
    if (!probe) throw BadInput(path + ": cannot open: no such file or not readable");
    char magic[2] = {0, 0};
    probe.read(magic, 2);
    if (magic[0] != 'P' || magic[1] != 'K') {
      throw BadInput(path + ": not a model archive (expected a zip file from torch.jit.save or torch.export.save)");
    }
  }
  if (IsExportArchive(path)) return LoadExportedProgram(path);
  try {
    torch::jit::Module module = torch::jit::load(path);
    return module;
  } catch (const c10::Error& e) {
    std::string message = e.what_without_backtrace();
    std::smatch match;
    static const std::regex version_re("version (\\d+).*maximum supported version for reading is (\\d+)");
    if (std::regex_search(message, match, version_re)) {
      throw BadInput(path + ": saved by a newer PyTorch (file format version " + match[1].str() +
                     ") than the LibTorch " + LibTorchVersion() + " ckplan was built with (reads up to version " +
                     match[2].str() + "); save it with that PyTorch version or rebuild ckplan against a newer LibTorch");
    }
    std::string first_line = message.substr(0, message.find('\n'));
    if (message.find("hasRecord(\"version\")") != std::string::npos) {
      throw BadInput(path + ": not a model archive: a zip file with neither a TorchScript model nor a torch.export "
                            "program in it");
    }
    if (message.find("PytorchStreamReader failed reading zip archive") != std::string::npos) {
      // miniz's own words up to the first sentence's end: "failed finding central directory".
      std::string why = first_line.substr(first_line.find(':') + 1);
      why = why.substr(why.find_first_not_of(' '));
      why = why.substr(0, why.find('.'));
      throw BadInput(path + ": not a readable model archive: the zip is truncated or corrupted (" + why + ")");
    }
    if (message.find("constants.pkl") != std::string::npos || message.find("data.pkl") != std::string::npos ||
        message.find("PytorchStreamReader") != std::string::npos) {
      throw BadInput(path + ": not a TorchScript archive (" + first_line.substr(0, first_line.find(". ")) + ")");
    }
    throw BadInput(path + ": cannot load the TorchScript model: " + first_line);
  } catch (const std::exception& e) {
    // The TorchScript compiler's errors (torch::jit::ErrorReport) when it
    // reads the archive's code: an op LibTorch does not have is a custom op
    // or one from an extension library, registered in the Python process
    // that saved the model.
    const std::string message = e.what();
    std::smatch match;
    static const std::regex unknown_re("Unknown builtin op: ([A-Za-z0-9_:.]+?)\\.?\\s");
    if (std::regex_search(message, match, unknown_re)) {
      std::string where;
      std::smatch owner;
      static const std::regex owner_re("self: __torch__\\.(?:[A-Za-z0-9_]+\\.)*([A-Za-z0-9_]+)");
      if (std::regex_search(message, owner, owner_re)) where = " in a module of class '" + owner[1].str() + "'";
      throw BadInput(path + ": unknown op " + match[1].str() + where + ": LibTorch " + LibTorchVersion() +
                     " does not have it (a custom or extension op, registered by Python code when the model was "
                     "saved); ckplan runs models made of PyTorch's own ops");
    }
    const size_t start = std::min(message.find_first_not_of('\n'), message.size());
    const std::string first_line = message.substr(start, message.find('\n', start) - start);
    throw BadInput(path + ": cannot compile the TorchScript model's code: " + first_line);
  }
}

std::vector<at::Tensor> MakeInputs(const std::vector<InputSpec>& specs, uint64_t seed) try {
  // Refused up front when the inputs alone would not fit in this machine
  // (integers are drawn as int64 first).
  double needed = 0;
  std::string texts;
  for (const InputSpec& spec : specs) {
    needed += static_cast<double>(InputBytes(spec)) * (IsIntegerDtype(spec.dtype) ? 2.0 : 1.0);
    texts += (texts.empty() ? "" : " ") + spec.text;
  }
  const long pages = ::sysconf(_SC_PHYS_PAGES), page_bytes = ::sysconf(_SC_PAGE_SIZE);
  const double memory = pages > 0 && page_bytes > 0 ? static_cast<double>(pages) * static_cast<double>(page_bytes) : 0;
  if (memory > 0 && needed > memory) {
    throw BadInput("--input " + texts + ": the inputs alone need " + FormatBytes(static_cast<int64_t>(needed)) +
                   ", more than this machine's " + FormatBytes(static_cast<int64_t>(memory)) +
                   " of memory; use a smaller batch");
  }
  at::Generator generator = at::detail::createCPUGenerator(seed);
  std::vector<at::Tensor> inputs;
  for (const InputSpec& spec : specs) {
    const at::ScalarType type = ToScalarType(*FindPythonDtype(spec.dtype));  // ParseInputSpec named one
    at::Tensor t;
    if (IsIntegerDtype(spec.dtype)) {
      t = at::randint(static_cast<int64_t>(spec.lo), static_cast<int64_t>(spec.hi), spec.shape, generator,
                      at::TensorOptions().dtype(at::kLong));
      t = t.to(type);
    } else if (spec.has_range) {
      const at::ScalarType draw = type == at::kDouble ? at::kDouble : at::kFloat;
      t = at::empty(spec.shape, at::TensorOptions().dtype(draw)).uniform_(spec.lo, spec.hi, generator).to(type);
    } else {
      t = at::randn(spec.shape, generator, at::TensorOptions().dtype(at::kFloat)).to(type);
    }
    inputs.push_back(t);
  }
  return inputs;
} catch (const c10::Error& e) {
  const std::string what = e.what_without_backtrace();
  throw BadInput("--input: cannot make the inputs: " + what.substr(0, what.find('\n')));
}

}  // namespace ckplan
