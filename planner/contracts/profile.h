#pragma once
/// The profile contract (`ckplan.profile/1`): what `ckplan profile` measured
/// on a model, op by op. Written by the profiler, read by the planner.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/contracts/chain.h"
#include "planner/contracts/input_spec.h"

namespace ckplan {

/// A tensor of the forward graph (parameters excluded).
struct TensorRecord {
  int id = 0;
  std::vector<int64_t> shape;
  std::string dtype;        ///< `float32`, `int64`, ...
  int64_t bytes = 0;        ///< of its storage (shared storages: see `storage`)
  int64_t nbytes = 0;       ///< of the tensor itself (numel x element size): the size of its gradient
  bool requires_grad = false;
  int producer = -1;        ///< op id, or -1 for a model input
  int storage = -1;         ///< tensors with the same storage id share memory (views, in-place)
  bool kept = false;        ///< still allocated when the forward ends (outputs dropped)
  bool external = false;    ///< its storage existed before the forward (a parameter, buffer or input)
  /// Optional (`released_by`): the op during whose backward (or right after
  /// it, as autograd releases what the op's nodes saved) its storage was
  /// freed in the profiled step; unset when not measured or not freed in
  /// the backward (an output, an external storage).
  std::optional<int> released_by;
};

/// A tensor argument of an op as the op saw it (weights included).
struct ArgRecord {
  std::vector<int64_t> shape;
  std::string dtype;  ///< as LibTorch names it: `Float`, `BFloat16`, `Long`
};

/// One op of the forward graph, in execution order.
struct OpRecord {
  int id = 0;
  std::string kind;         ///< `aten::conv2d`
  std::string module;       ///< `layer1.0.conv1`; empty for the top-level module
  std::vector<int> inputs;  ///< tensor ids (parameters excluded)
  std::vector<int> outputs;
  bool inplace = false;     ///< writes its first input in place (`aten::relu_`)
  int64_t saved_bytes = 0;  ///< allocated by this op and still alive when the forward ends
  int64_t fwd_tmp_bytes = 0;  ///< transient peak above its outputs during its forward
  int64_t bwd_tmp_bytes = 0;  ///< transient peak during its backward
  /// Optional (`bwd_span_peak_bytes`): the peak over all of its backward's
  /// autograd nodes (a GRU's layers, a Linear's addmm and bias sum) above
  /// the memory live when its first node starts: its gradients as they are
  /// made, what its nodes release as they finish. bwd_tmp_bytes is the
  /// largest single node's. Unset when the profile has none.
  std::optional<int64_t> bwd_span_peak_bytes;
  double fwd_ms = 0;
  double bwd_ms = 0;
  /// Optional (`args`): every tensor argument, parameters included, in order:
  /// what the cost model (cost_model.h) counts FLOPs and bytes from.
  std::vector<ArgRecord> args;
  /// Optional: the forward without autograd (torch::NoGradGuard), what a
  /// recomputation costs; unset when the profile has none (fwd_ms stands
  /// for it).
  std::optional<double> fwd_nograd_ms;
  /// Optional (`dropout_p`): the op's dropout probability where its schema
  /// has one (scaled dot-product attention; on the CPU a non-zero one takes
  /// the math path, not the fused kernel); 0 when absent.
  double dropout_p = 0;
  /// Optional (`is_causal`, written where true): attention's causal flag (on
  /// the CPU another kernel path, another cost).
  bool is_causal = false;
  /// Optional (`approximate`): GELU's approximation where it is not `none`
  /// (`tanh`: another kernel, another cost); empty when absent.
  std::string approximate;
  /// Optional (`recurrent`): an LSTM/GRU/RNN layer's arguments that decide
  /// its time steps (the CPU runs one small step per time step, layer and
  /// direction); num_layers 0 when absent.
  struct Recurrent {
    bool batch_first = false;
    int num_layers = 0;
    bool bidirectional = false;
  } recurrent;
  /// Optional (`grad_nodes`): the autograd nodes its forward made (sequence
  /// numbers taken; a composite op makes several: a linear on 3-D input
  /// four, its views included); unset when absent.
  std::optional<int> grad_nodes;
  /// Optional (`wrapped_number_bytes`, written where not 0): the Python
  /// numbers its eager autograd node keeps, each a 0-dim host tensor
  /// (`x * 0.5` saves the 0.5 as an 8-byte double to scale the gradient;
  /// mul and div). saved_tensors_hooks never see them, so
  /// torch.utils.checkpoint does not drop them: kept from the op's forward
  /// to its backward whether or not its module is wrapped. Not in
  /// saved_bytes (PyTorch's hook count); counted on the CPU only (on a GPU
  /// they are host memory).
  int64_t wrapped_number_bytes = 0;
};

/// A parameter of the model (optional in the contract: profiles made before
/// it lack the list). Used by the distributed memory model (FSDP shards each
/// parameter along its first dimension).
struct ParameterRecord {
  std::string name;            ///< `layer1.0.conv1.weight`, as in named_parameters()
  std::vector<int64_t> shape;
  int64_t bytes = 0;           ///< of the tensor (numel x element size)
  /// Optional (`requires_grad`, written where false): a frozen parameter (a
  /// fine-tuning job's base weights, a frozen backbone) has no gradient, no
  /// optimizer state and no update; it is held all the same.
  bool requires_grad = true;
};

/// The parameters that train (requires_grad): those with a gradient,
/// optimizer state and an update.
std::vector<ParameterRecord> TrainableParameters(const std::vector<ParameterRecord>& parameters);
/// Their bytes.
int64_t TrainableBytes(const std::vector<ParameterRecord>& parameters);

struct ProfileTotals {
  int64_t param_bytes = 0;
  int64_t buffer_bytes = 0;
  int64_t input_bytes = 0;
  int64_t saved_bytes = 0;  ///< kept for backward, parameters and inputs excluded, storages once
  int64_t output_bytes = 0;
  double fwd_ms = 0;
  double bwd_ms = 0;
  int64_t peak_bytes = 0;   ///< measured peak of the whole forward+backward
  /// Optional (written where not 0): under autocast, what its cache of the
  /// trainable weights' low-precision casts held when the forward and loss
  /// ended that nothing else did (a linear's bias cast: its backward needs no
  /// bias), freed as the region exits.
  int64_t autocast_cache_bytes = 0;
  /// Optional: one optimizer update of every trainable parameter, per
  /// optimizer name (sgd, momentum, adam); empty when not measured.
  std::map<std::string, double> optimizer_step_ms;
  /// Optional: a whole forward, loss and backward timed without per-op
  /// timers (median).
  std::optional<double> step_ms;
  /// Optional: how far the op times' samples lay from the times written,
  /// in percent (PoolSamples, planner/cost/same_work.h: ops that do the
  /// same work are timed together); a plan's choice between plans whose
  /// times differ by less is a tie. Unset where not measured.
  std::optional<double> time_noise_pct;
};

/// How a recomputation and a step cost as `ckplan run` runs them, measured
/// by the profiler on the stages of the chain it cut (libtorch/profiler/
/// calibration.h): what the chain's stage times are scaled by. The profile's
/// optional `calibration` object; a profile made before it was one has the
/// six figures under `totals`, and reads the same. Each figure is optional
/// (unset when not measured). They are per stage run or per ms of the ops'
/// forward without autograd, so they price whatever stages a planner cuts.
struct Calibration {
  /// The stages the figures were measured on, as the build that made the
  /// profile cut them ([first_op, last_op] each, in order); empty when not
  /// recorded (older profiles).
  std::vector<OpRange> stages;
  /// What `ckplan run`'s executor spends on one stage run beyond the
  /// stage's ops (binding the values at the cut, restoring the random state
  /// and buffers around a recomputation), ms per stage run; each recomputed
  /// stage run costs it on top of its ops' forward without autograd.
  std::optional<double> stage_run_ms;
  /// What running every stage once more without autograd adds to a
  /// training step (a step with every stage checkpointed less a step
  /// without recomputation, adam's update in both, paired and the median
  /// taken), less the stage runs' stage_run_ms, over the sum of the ops'
  /// fwd_nograd_ms (timed op by op right after another forward): what a
  /// recomputation's ops cost in a step, the backward's gain from fresh
  /// caches included, per ms of their fwd_nograd_ms (1 stands for it).
  std::optional<double> nograd_scale;
  /// A step without recomputation as `ckplan run` runs it (stage by stage,
  /// in a loop of steps, adam's update included; median).
  std::optional<double> run_step_ms;
  /// For the PyTorch target: a step as `ckplan run` runs a PyTorch-target
  /// plan's baseline (eagerly, node by node, nothing wrapped, in a loop of
  /// steps, adam's update included; median).
  std::optional<double> module_step_ms;
  /// For the PyTorch target: what a module wrapped in
  /// torch.utils.checkpoint adds to that step, as `ckplan run` runs it,
  /// beyond a fixed checkpoint_call_ms per wrapped module: per ms of its
  /// ops' fwd_nograd_ms. From steps with two sets of the modules a plan can
  /// wrap (the single-stage ones; the outermost ones), each less the step
  /// nothing wrapped (paired, medians).
  std::optional<double> module_nograd_scale;
  /// For the PyTorch target: the fixed cost of one wrapped module (its
  /// autograd function, its nested backward) in that step; unset where no
  /// module spans several stages (module_nograd_scale holds it).
  std::optional<double> checkpoint_call_ms;
  bool empty() const {
    return stages.empty() && !stage_run_ms && !nograd_scale && !run_step_ms && !module_step_ms &&
           !module_nograd_scale && !checkpoint_call_ms;
  }
};

/// `model`: what was profiled. Every field is optional on reading (a
/// profile written by hand may have a path alone); the profiler writes
/// path, sha256, inputs, training and loss.
struct ModelRecord {
  std::optional<std::string> path;
  std::optional<std::string> sha256;         ///< of the model file: `ckplan run` refuses a plan made for another
  std::optional<std::vector<InputSpec>> inputs;  ///< as profiled; each one's `text` is what plan and run parse
  std::optional<bool> training;              ///< the module's mode (eval: dropout and batch norm as in eval)
  /// `model` (the model's own loss, back-propagated as it is), `loss_fn` (the job's
  /// own, exported with the model: ckplan_torch.export's loss_fn) or `outputs`
  std::optional<std::string> loss;
  std::optional<std::string> output_choice;  ///< what was taken from a dict or tuple output, as printed
  /// Module paths the forward never calls (nn.ModuleList, nn.ModuleDict):
  /// eager PyTorch calls their children, never them, so no plan wraps one.
  std::vector<std::string> containers;
};

/// `environment`: where and how the profile was measured. Every field is
/// optional on reading.
struct EnvironmentRecord {
  std::optional<std::string> libtorch;
  std::optional<int> threads;
  std::optional<std::string> device;  ///< `cpu`, `cuda:0 (NVIDIA H200)`, `meta`
  std::optional<int> reps;
  std::optional<int64_t> seed;
  std::optional<std::string> timer;   ///< how op times were taken
  std::optional<std::string> memory;  ///< how memory was measured
  std::optional<std::string> dtype;   ///< `--dtype`, as LibTorch names it
  /// The autocast the forward and the loss ran under (`--autocast`, or the
  /// archive's from ckplan_torch.export(autocast=...)): `bfloat16` or
  /// `float16`, torch.autocast's dtype on the profile's device, weights
  /// kept in their own dtype; absent: none.
  std::optional<std::string> autocast;
  /// `time_model` (`--gpu`): the cost model's figures, the device, its
  /// constants and what was measured before the model replaced the times
  /// (cost_model.cc writes it): a record for people, no reader takes its
  /// fields but `gpu` and `description`. Null when the times were measured.
  nlohmann::json time_model;
  /// `phase_seconds`: the wall time each phase of `ckplan profile` took
  /// (`load`, `warm_up`, `steps`, `optimizers`, `eager_peaks`,
  /// `calibration`): a record for people and benchmarks, read by no one.
  nlohmann::json phase_seconds;
  /// The device's name: `cpu` when not recorded.
  std::string DeviceName() const { return device.value_or("cpu"); }
};

struct Profile {
  ModelRecord model;
  EnvironmentRecord environment;
  ProfileTotals totals;
  Calibration calibration;            ///< empty when not measured (meta, --gpu, older profiles)
  std::vector<TensorRecord> tensors;  ///< indexed by id
  std::vector<OpRecord> ops;          ///< indexed by id, in execution order
  std::vector<int> inputs;            ///< tensor ids of the model inputs
  std::vector<int> outputs;           ///< tensor ids of the model outputs
  /// Optional: for a model that returns its own loss (`model.loss` =
  /// `model`), the tensor ids of its other outputs (a Hugging Face model's
  /// logits), which the training loop holds to the step's end.
  std::vector<int> held_outputs;
  /// Optional (`module_inputs`): per module path, the tensors it is called
  /// with, as an export that kept the modules' call signatures records them
  /// (ckplan_torch.export), those its ops never read included (a decoder
  /// layer's position ids); model inputs and weights are not listed. Empty
  /// when unknown (TorchScript models, older archives and profiles).
  std::map<std::string, std::vector<int>> module_inputs;
  /// Optional (`module_eager_peak_bytes`): per module path, the most bytes
  /// its forward holds at once beyond what was held when it was called, as
  /// eager PyTorch runs it with autograd (ckplan_torch.export measures it on
  /// the example inputs; the profiler keeps it when it profiles the same
  /// shapes on the CPU with the model's own dtype): Python locals that
  /// outlive their last use count there, which the graph frees. What a
  /// wrapped module's recomputation holds at least. Empty when unknown.
  std::map<std::string, int64_t> module_eager_peak_bytes;
  std::vector<ParameterRecord> parameters;  ///< optional: empty for older profiles
};

/// Reads and validates a `ckplan.profile/1` document (ids in range, ops in
/// execution order, producers before consumers). Throws BadInput naming the
/// file and field.
Profile ProfileFromJson(const nlohmann::json& doc, const std::string& file);

/// Writes the `ckplan.profile/1` document, with the op graph's edges.
nlohmann::json ProfileToJson(const Profile& profile);

}  // namespace ckplan
