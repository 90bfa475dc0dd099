#pragma once
// Executing a TorchScript model's forward graph node by node: the ground the
// profiler and the executor stand on. Part of the runtime (includes LibTorch).

#include <torch/script.h>

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "planner/contracts/input_spec.h"

namespace ckplan {

enum class NodeKind {
  kConstant,
  kGetAttr,
  kListConstruct,
  kListUnpack,
  kTupleConstruct,
  kTupleUnpack,
  kTupleIndex,
  kOperation,  ///< anything with a registered operator
};

struct ProgramNode {
  torch::jit::Node* node = nullptr;
  NodeKind kind = NodeKind::kOperation;
  torch::jit::Operation operation = nullptr;
  bool is_op = false;       ///< recorded in the profile: an operator with tensor outputs
  int op_id = -1;           ///< its index among the profile's ops
  std::string module_path;  ///< `layer1.0.conv1`; empty for the top-level module
  /// The autocast it runs under: kAutocastOuter (the program's, SetAutocast),
  /// kAutocastOff (a region the model turned autocast off in), else the
  /// c10::ScalarType of a region the model turned it on in (an exported
  /// program's `wrap_with_autocast` regions, pt2_model.cc).
  int autocast = -2;
};

constexpr int kAutocastOuter = -2;
constexpr int kAutocastOff = -1;

using Environment = std::unordered_map<const torch::jit::Value*, c10::IValue>;

/// The inlined forward graph of a module, ready to run node by node.
class GraphProgram {
 public:
  explicit GraphProgram(torch::jit::Module module);

  torch::jit::Module& module() { return module_; }
  const std::vector<ProgramNode>& nodes() const { return nodes_; }
  int num_ops() const { return static_cast<int>(op_nodes_.size()); }
  /// Node index of profile op `op_id`.
  size_t OpNode(int op_id) const { return op_nodes_[static_cast<size_t>(op_id)]; }
  /// Last node index that reads `value`; nodes().size() for graph outputs.
  size_t LastUse(const torch::jit::Value* value) const;
  /// Model inputs the forward takes (the module itself not counted).
  size_t num_inputs() const;
  const torch::jit::Value* InputValue(size_t index) const;
  /// Binds the model inputs (graph input 0 is the module itself).
  void BindInputs(Environment& env, const std::vector<at::Tensor>& inputs) const;
  /// Runs node `index`: reads its inputs from env, writes its outputs; an op
  /// under the autocast its region sets (SetAutocast, the model's own
  /// regions), as torch.autocast runs it: the same kernels eager PyTorch
  /// runs, the casts of trainable weights cached until EndAutocast.
  void RunNode(size_t index, Environment& env) const;
  /// The autocast the forward and the loss run under, as
  /// `with torch.autocast(device, dtype=...)` around them (nullopt: none;
  /// `device` the program's tensors'); regions the model sets itself (an
  /// exported `torch.autocast(enabled=False)`) keep theirs. On the meta
  /// device (a profile that prices a GPU) CUDA's autocast policy is applied
  /// by hand: matrix products, convolutions and attention cast to `dtype`
  /// (the weights' casts cached to EndAutocast), norms, softmax, losses and
  /// the ops CUDA keeps in fp32 cast to fp32, the promoting ops to the widest.
  void SetAutocast(std::optional<c10::ScalarType> dtype, c10::DeviceType device);
  std::optional<c10::ScalarType> autocast() const { return autocast_; }
  /// Whether any op runs under autocast.
  bool uses_autocast() const { return autocast_.has_value() || explicit_autocast_; }
  /// Sets the program's autocast for what runs while it lives (the loss);
  /// nothing when the program has none.
  class AutocastScope {
   public:
    explicit AutocastScope(const GraphProgram& program);
    ~AutocastScope();
    AutocastScope(const AutocastScope&) = delete;
    AutocastScope& operator=(const AutocastScope&) = delete;

   private:
    bool active_ = false;
    c10::DeviceType device_ = c10::DeviceType::CPU;
    bool was_enabled_ = false;
    c10::ScalarType was_dtype_ = c10::ScalarType::Undefined;
  };
  /// The end of the autocast region (torch.autocast's exit): the casts of
  /// weights it cached are dropped. Call after the loss, and after a
  /// recomputation, as eager PyTorch leaves its autocast there.
  void EndAutocast() const;
  /// Drops from env the values whose last use is node `index`.
  void FreeDeadAfter(size_t index, Environment& env) const;
  /// The graph's output values and their IValues.
  std::vector<const torch::jit::Value*> OutputValues() const;
  std::vector<c10::IValue> Outputs(const Environment& env) const;
  /// The tensors that outlive every step: the module's attributes
  /// (parameters, buffers, tensors the tracer kept) and the graph's tensor
  /// constants. A node that returns one as it is (a GetAttr, a constant,
  /// `aten::to` of one) makes no new tensor.
  void StaticTensors(std::unordered_set<const c10::TensorImpl*>* out) const;
  /// Whether the graph's one output is the model's own training loss (a
  /// Hugging Face model's `loss`, given its labels): back-propagated as it is,
  /// not through --loss.
  bool returns_loss() const { return returns_loss_; }
  /// Whether that loss is the job's own, exported with the model
  /// (ckplan_torch.export's loss_fn).
  bool returns_job_loss() const { return returns_job_loss_; }
  /// What was chosen from a dict or loss output, in one sentence ("" when
  /// the outputs are taken as the model returns them).
  const std::string& output_choice() const { return output_choice_; }
  /// With returns_loss(): the model's other tensor outputs (a Hugging Face
  /// model's logits beside its loss), which the training loop holds in the
  /// output it got to the step's end; those the graph still computes.
  const std::vector<const torch::jit::Value*>& held_outputs() const { return held_outputs_; }

 private:
  // A forward returning a dict (a Hugging Face ModelOutput traced with
  // strict=False) or a tuple led by a loss: the graph's outputs rewritten to
  // the model's loss when it returns one, else to the tensors a loss reads.
  void SelectTrainingOutputs();

  torch::jit::Module module_;
  std::shared_ptr<torch::jit::Graph> graph_;
  std::vector<ProgramNode> nodes_;
  std::vector<size_t> op_nodes_;
  std::unordered_map<const torch::jit::Value*, size_t> last_use_;
  std::vector<std::vector<const torch::jit::Value*>> dies_after_;
  // Per node, filled on its first run (after RetargetConstantsToMeta may have
  // changed the graph's constants): a constant's value, and a GetAttr's slot
  // in its object. Looking them up each run (a string search among the
  // object's attributes, a new IValue) cost a recomputed stage microseconds
  // per node that no op's time shows.
  mutable std::vector<std::optional<c10::IValue>> constant_value_;
  mutable std::vector<int64_t> attribute_slot_;
  // On the meta device, where autocast casts nothing (it casts tensors of a
  // real device only): CUDA's cast policy applied by hand, op by op
  // (EmulateAutocast), with its cache of the weights' casts.
  void EmulateAutocast(size_t index, c10::ScalarType lower, torch::jit::Stack& stack) const;
  std::optional<c10::ScalarType> autocast_;
  c10::DeviceType autocast_device_ = c10::DeviceType::CPU;
  std::vector<int8_t> cast_policy_;  // per node, on the meta device (graph_program.cc's CastPolicy)
  std::vector<int> dtype_argument_;  // per node: its schema's `dtype` argument, or -1
  mutable std::unordered_map<const c10::TensorImpl*, at::Tensor> cast_cache_;
  bool explicit_autocast_ = false;  // some node runs in a region of the model's own
  bool returns_loss_ = false;
  bool returns_job_loss_ = false;
  std::string output_choice_;
  std::vector<const torch::jit::Value*> held_outputs_;
};

/// Tensors inside an IValue (a tensor, list, tuple), in order.
void CollectTensors(const c10::IValue& value, std::vector<at::Tensor>* out);

/// Loads a TorchScript file. Throws BadInput naming the file for a missing
/// file, a file that is not a TorchScript archive, or one saved by a newer
/// PyTorch (with both versions).
torch::jit::Module LoadModel(const std::string& path);

/// `--autocast`'s values (bf16, bfloat16, fp16, float16, off, none) as a
/// dtype (nullopt: off). Throws BadInput naming the value.
std::optional<c10::ScalarType> ParseAutocast(const std::string& text);
/// The autocast a run uses: `flag` (`--autocast`) when given, else
/// `recorded` (a plan's or an archive's dtype name), else none.
std::optional<c10::ScalarType> ResolveAutocast(const std::string& flag, const std::optional<std::string>& recorded);
/// A dtype's name as torch names it: `bfloat16`, `float16`.
std::string TorchDtypeName(c10::ScalarType type);
/// Inputs from specs: float ones from a normal distribution (or uniform in
/// LO..HI), integer ones uniform in [LO, HI). Seeded: the same every run.
std::vector<at::Tensor> MakeInputs(const std::vector<InputSpec>& specs, uint64_t seed);

/// The LibTorch version ckplan was built with: `1.13.0`.
std::string LibTorchVersion();

}  // namespace ckplan
