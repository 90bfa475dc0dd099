#pragma once
/// A chain of stages: the only thing profiling hands to planning.
///
/// Stages are numbered 0..L-1; the loss is stage L (no forward time). The
/// value x_k is the input of stage k (x_0 the chain input, x_{k+1} the output
/// of stage k); a stage run with autograd keeps `saved_bytes` (its output
/// included) until its backward.

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ckplan {

/// A range of a profile's ops, [first, last].
struct OpRange {
  int first = 0;
  int last = 0;
};

struct Stage {
  std::string name;
  double fwd_ms = 0;            ///< forward time with autograd (recording what backward needs)
  double bwd_ms = 0;            ///< backward time
  int64_t out_bytes = 0;        ///< the stage's output (the next stage's input)
  int64_t saved_bytes = 0;      ///< kept for backward when run with autograd, output included
  int64_t fwd_tmp_bytes = 0;    ///< transient peak above input and output during forward
  int64_t bwd_tmp_bytes = 0;    ///< transient peak above what backward holds and makes
  /// Optional: forward time without autograd (what a checkpointed forward or
  /// a recomputation costs); fwd_ms stands for it when unknown.
  std::optional<double> fwd_nograd_ms;
  double NoGradFwdMs() const { return fwd_nograd_ms.value_or(fwd_ms); }
  /// Optional, for the PyTorch target: the stage's forward without autograd
  /// inside a module wrapped in torch.utils.checkpoint, as `ckplan run` runs
  /// it eagerly (PyTorchModuleCosts::checkpoint_call_ms aside); NoGradFwdMs() stands for
  /// it when unknown.
  std::optional<double> module_fwd_nograd_ms;
  double ModuleNoGradFwdMs() const { return module_fwd_nograd_ms.value_or(NoGradFwdMs()); }
  /// For a chain cut from a profile: the module paths the stage covers and
  /// its ops; empty / unset for a plain chain.
  std::vector<std::string> modules;
  std::optional<OpRange> ops;
  /// Optional, for a chain cut from a profile: the storages (id, bytes) that
  /// cross the cut after this stage (skip connections are shared between
  /// cuts), and the part of saved_bytes that is the stage's own (not those).
  /// The simulator then counts each storage once. Empty / unset when unknown.
  std::vector<std::pair<int64_t, int64_t>> out_storages;
  std::optional<int64_t> private_saved_bytes;
  /// Those of out_storages made by this stage that backward needs anyway
  /// (saved by an op), as opposed to ones the model frees after their next use.
  std::vector<int64_t> kept_out_storages;
  /// Optional: the parameter gradients the stage's backward allocates (its
  /// first backward; they stay to the end of the step: gradients set to
  /// None before the step, as `zero_grad()` does); 0 when unknown. A tied
  /// parameter counts once, at the stage whose backward makes its gradient.
  int64_t param_grad_bytes = 0;
  /// Optional: of those, the bytes held at the backward's peak on top of
  /// bwd_tmp_bytes (an op's measured transient already counts the gradients
  /// it makes); all of them when unknown.
  std::optional<int64_t> param_grad_bwd_bytes;
  /// What the memory model adds to the backward's peak for the stage's own
  /// gradients: param_grad_bwd_bytes (param_grad_bytes when unknown), at
  /// least what keeps the state after the backward (its gradients made,
  /// saved values and the output's gradient freed) within that peak.
  int64_t GradsAtBackwardPeakBytes() const;
  /// Optional: the stage's backward peak as PyTorch runs it, above what it
  /// keeps and the gradients of later stages' parameters (its ops' backward
  /// replayed op by op: planner/cost/gradients.h); the PyTorch target takes
  /// it in place of its boundary gradients, transient and gradients each at
  /// their maximum over the stage. The chain file's `bwd_replay_peak_bytes`.
  std::optional<int64_t> pytorch_bwd_peak_bytes;
  /// Optional: the same replay as `ckplan run`'s executor runs the stage
  /// (the values of the stage's cuts and its output's gradient held to its
  /// end); the simulator and the schedule DPs take it
  /// (Chain::ExecutorBackwardBytes). The chain file's `bwd_run_peak_bytes`.
  std::optional<int64_t> executor_bwd_peak_bytes;
};

/// What the PyTorch target reads of the modules it wraps in
/// torch.utils.checkpoint, by module path where it depends on the module:
/// the model's, whatever stages a chain (or a pipeline stage's part of it,
/// SubChain) holds. All optional: 0 or empty when not counted.
struct PyTorchModuleCosts {
  /// What torch.utils.checkpoint keeps per wrapped module beyond tensors
  /// (StageGradients::checkpoint_state_bytes).
  int64_t checkpoint_state_bytes = 0;
  /// What each wrapped module costs a step beyond its stages' forward
  /// without autograd and their rerun with it (the autograd function, its
  /// nested backward).
  double checkpoint_call_ms = 0;
  /// Optional (`time_noise_pct`): how far the profile's op times' samples
  /// lay from the times (ProfileTotals::time_noise_pct): SolveModules takes
  /// plans whose recomputation is within it of the fastest's as tied, and
  /// chooses among them by memory; 0 where unknown (the fastest is chosen).
  double time_noise_pct = 0;
  /// Per module path, the storages (id, bytes, ids as in
  /// Stage::out_storages) of the tensors it is called with, model inputs,
  /// weights and storages some op saves aside (Profile::module_inputs):
  /// torch.utils.checkpoint holds each of them for a wrapped module, those
  /// its ops never read (a decoder layer's position ids) and so cross no cut
  /// included.
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> module_call_storages;
  /// Per module path, the bytes its ops' autograd nodes keep that
  /// torch.utils.checkpoint cannot drop (the Python numbers mul and div
  /// save, Profile's OpRecord::wrapped_number_bytes): held by a wrapped
  /// module from its forward to its backward, as its inputs are. Their
  /// stages' saved_bytes count them too (run normally, they are saved as
  /// the rest).
  std::map<std::string, int64_t> module_held_bytes;
  /// Per module path, the most bytes its forward holds at once in eager
  /// PyTorch beyond what it was called with (the profile's
  /// module_eager_peak_bytes): a wrapped module's recomputation holds at
  /// least this.
  std::map<std::string, int64_t> module_eager_peak_bytes;
};

struct Chain {
  int64_t input_bytes = 0;      ///< x_0, the chain input
  std::vector<Stage> stages;
  double loss_bwd_ms = 0;       ///< the loss's backward (its forward time is 0)
  int64_t loss_bwd_tmp_bytes = 0;
  /// Optional: the optimizer update's temporary, at the step's end (after
  /// the last backward, every gradient made); 0 when none.
  int64_t update_tmp_bytes = 0;
  /// Optional, for the PyTorch target: the model's output as the training
  /// loop holds it (`out = model(x); loss = loss_fn(out, y)`: `out` lives
  /// through `backward()` and `optimizer.step()`), from the loss to the
  /// step's end, where no op saves it (then it is kept anyway); 0 when not
  /// counted.
  int64_t output_held_bytes = 0;
  /// Optional, for the PyTorch target: the model's outputs (and a loss's
  /// other outputs the loop holds) that an op does save: counted in the
  /// stage that keeps them until that stage's backward releases them, then
  /// held by the loop to the step's end. `output_kept_stage` is the last
  /// stage whose ops make or read them (unset when none).
  int64_t output_kept_bytes = 0;
  std::optional<int> output_kept_stage;
  /// Optional, for the PyTorch target: the loss's part of a step run
  /// eagerly, nothing wrapped (what the step leaves beyond its stages'
  /// forward and backward, negative where their ops timed one by one take
  /// longer than that step; the stages and it at least 0); unset when
  /// unknown, then loss_bwd_ms stands for it.
  std::optional<double> module_loss_bwd_ms;
  double ModuleLossBwdMs() const { return module_loss_bwd_ms ? *module_loss_bwd_ms : loss_bwd_ms; }
  /// Optional: the storages of the chain input (see Stage::out_storages).
  std::vector<std::pair<int64_t, int64_t>> input_storages;
  /// Optional: what the PyTorch target reads of the modules it wraps (the
  /// chain file's checkpoint_state_bytes, checkpoint_call_ms and module_*).
  PyTorchModuleCosts pytorch;

  /// True when every stage knows its storages: the simulator shares them.
  bool has_storages() const;

  /// L, the number of stages without the loss.
  int length() const { return static_cast<int>(stages.size()); }
  /// x_k for k in 0..L+1: the input of stage k; x_{L+1} (the loss output) is 0.
  int64_t StageInputBytes(int k) const;
  /// True when some stage has parameter gradients (param_grad_bytes): the
  /// step's gradients are then counted as they appear in backward.
  bool has_param_grads() const;
  /// Parameter gradient bytes of all stages.
  int64_t ParamGradBytes() const;
  /// What stage i's own gradients add to its backward's peak:
  /// Stage::GradsAtBackwardPeakBytes, and for stage 0 (the step's last backward) at
  /// least what keeps the step's end, the update's temporary included,
  /// within that peak.
  int64_t GradsAtBackwardPeakBytes(int i) const;
  /// Stage i's backward priced by its replay as the executor runs it
  /// (Stage::executor_bwd_peak_bytes), for the simulator and the schedule DPs;
  /// -1 when the stage has none
  /// (they then charge x_i + x_{i+1} + bwd_tmp_bytes + GradsAtBackwardPeakBytes(i)).
  /// What the backward adds at its peak above the stage's saved values (its
  /// output included), its input and the later stages' gradients: the
  /// gradient of its output (held when it starts), its input's and its own
  /// parameter gradients as its ops make them, and its transients, as the
  /// replay counts them; at least what stays after it (x_i + the stage's
  /// parameter gradients, less its saved values; for stage 0 the update's
  /// temporary too) and at least 0.
  int64_t ExecutorBackwardBytes(int i) const;
  /// Time of one forward and one backward of every stage, plus the loss:
  /// the time of a step without recomputation.
  double NoRecomputeTimeMs() const;
  /// The same for the PyTorch target: a step run eagerly, nothing wrapped
  /// (its loss ModuleLossBwdMs()).
  double ModuleNoRecomputeTimeMs() const;
};

/// Reads a chain from a parsed `ckplan.chain/1` document. `file` names the
/// source in errors. Throws BadInput naming the field for a wrong schema,
/// missing fields, negative or non-finite numbers.
Chain ChainFromJson(const nlohmann::json& doc, const std::string& file);

/// Checks what the planner relies on beyond single fields: all byte figures
/// together within kMaxTotalBytes, and, where the chain lists storages,
/// distinct ids per cut adding up to at most the value, one size per id, the own
/// saved part within saved_bytes. Throws BadInput naming `file`, `what`
/// (for example "the chain cut from it"; may be empty) and the field.
void ValidateChain(const Chain& chain, const std::string& file, const std::string& what);

/// Writes the `ckplan.chain/1` document for `chain`.
nlohmann::json ChainToJson(const Chain& chain);

}  // namespace ckplan
