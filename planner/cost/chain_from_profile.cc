#include "planner/cost/chain_from_profile.h"

#include <algorithm>
#include <map>
#include <set>

#include "planner/base/error.h"
#include "planner/cost/backward_replay.h"
#include "planner/cost/gradients.h"
#include "planner/cost/liveness.h"
#include "planner/cost/optimizer_memory.h"
#include "planner/cost/stage_cuts.h"

namespace ckplan {
namespace {

// Sets every stage's parameter gradients (GradientsFromProfile: each
// parameter once, a tied one at its first gradient) and its backward's
// peaks, and what torch.utils.checkpoint keeps per wrapped module. A
// profile without its `parameters` list leaves the chain as it is (the
// gradients then stay in the step's fixed part).
void AttachGradients(const Profile& profile, const Liveness& liveness, Chain* chain) {
  if (profile.parameters.empty()) return;
  const StageGradients grads = GradientsFromProfile(*chain, profile, liveness);
  for (size_t i = 0; i < chain->stages.size(); ++i) {
    Stage& s = chain->stages[i];
    s.param_grad_bytes = grads.bytes[i];
    s.param_grad_bwd_bytes = std::min(grads.held_at_bwd_peak_bytes[i], grads.bytes[i]);
    // Unset where the stage's backward could not be replayed.
    s.pytorch_bwd_peak_bytes = grads.pytorch_bwd_peak_bytes[i];
    s.executor_bwd_peak_bytes = grads.executor_bwd_peak_bytes[i];
  }
  chain->pytorch.checkpoint_state_bytes = grads.checkpoint_state_bytes;
}

}  // namespace

Chain ChainFromProfile(const Profile& profile, const std::string& file, const OptimizerChoice& optimizer) {
  if (profile.ops.empty()) throw BadInput("profile has no ops");
  Liveness liveness(profile);
  std::vector<StageCut> cuts = CutStages(profile, liveness);
  const int n = static_cast<int>(profile.ops.size());
  Chain chain;
  chain.input_bytes = profile.totals.input_bytes;
  {
    std::set<int> seen;
    int64_t storages_bytes = 0;
    for (int t : profile.inputs) {
      const TensorRecord& rec = profile.tensors[static_cast<size_t>(t)];
      // Model inputs get storage ids below any activation's.
      if (seen.insert(rec.storage).second) {
        chain.input_storages.push_back({int64_t{-1000000} - rec.storage, rec.bytes});
        storages_bytes += rec.bytes;
      }
    }
    // The chain input holds at least the inputs' storages (a profile whose
    // totals say less is inconsistent; the larger figure is the safe one).
    chain.input_bytes = std::max(chain.input_bytes, storages_bytes);
  }
  std::map<int, bool> storage_kept;
  for (const TensorRecord& t : profile.tensors) storage_kept[t.storage] = storage_kept[t.storage] || t.kept;

  for (const StageCut& cut : cuts) {
    Stage stage;
    stage.name = cut.name;
    stage.modules = cut.modules;
    stage.ops = OpRange{cut.first_op, cut.last_op};
    std::set<int> out;
    if (cut.last_op + 1 < n) {
      out = liveness.Crossing(cut.last_op + 1);
    } else {
      for (int t : profile.outputs) out.insert(profile.tensors[static_cast<size_t>(t)].storage);
    }
    stage.out_bytes = liveness.Bytes(out);
    int64_t produced_out = 0;
    for (int s : out) {
      int producer = liveness.StorageProducer(s);
      if (producer >= cut.first_op && producer <= cut.last_op) produced_out += liveness.StorageBytes(s);
    }
    int64_t saved = 0;
    double nograd_ms = 0;
    bool nograd_known = true;
    for (int op = cut.first_op; op <= cut.last_op; ++op) {
      const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
      stage.fwd_ms += rec.fwd_ms;
      stage.bwd_ms += rec.bwd_ms;
      nograd_ms += rec.fwd_nograd_ms.value_or(0);
      nograd_known = nograd_known && rec.fwd_nograd_ms.has_value();
      // The Python numbers its autograd node keeps are saved as the rest.
      saved += rec.saved_bytes + rec.wrapped_number_bytes;
    }
    // A stage run without autograd (a checkpointed forward, a recomputation)
    // costs its ops as a step runs them and the executor's own cost of a
    // stage run, where the profile measured them.
    const Calibration& calibration = profile.calibration;
    if (nograd_known) {
      const double scale = calibration.nograd_scale.value_or(0) > 0 ? *calibration.nograd_scale : 1.0;
      stage.fwd_nograd_ms = scale * nograd_ms + calibration.stage_run_ms.value_or(0);
    }
    // Inside a module wrapped in torch.utils.checkpoint, as `ckplan run`
    // runs a PyTorch-target plan: its ops at the scale measured there (the
    // wrapped module's fixed cost is the chain's checkpoint_call_ms).
    if (nograd_known && calibration.module_nograd_scale) {
      stage.module_fwd_nograd_ms = *calibration.module_nograd_scale * nograd_ms;
    }
    for (int s : out) {
      int producer = liveness.StorageProducer(s);
      if (producer >= cut.first_op && producer <= cut.last_op && !storage_kept[s]) saved += liveness.StorageBytes(s);
    }
    stage.saved_bytes = saved;
    // The storages at the cut, shared with the cuts around it, and the rest
    // of what the stage saves (its own).
    int64_t private_saved = saved;
    for (int s : out) {
      stage.out_storages.push_back({s, liveness.StorageBytes(s)});
      int producer = liveness.StorageProducer(s);
      if (producer >= cut.first_op && producer <= cut.last_op) {
        private_saved -= liveness.StorageBytes(s);
        if (storage_kept[s]) stage.kept_out_storages.push_back(s);
      }
    }
    stage.private_saved_bytes = std::max<int64_t>(0, private_saved);
    // What autograd keeps covers the stage's own part and the storages new
    // at its output (as ValidateChain checks): a profile whose ops save less
    // than the tensors they keep is counted at the larger figure.
    {
      const auto& before = chain.stages.empty() ? chain.input_storages : chain.stages.back().out_storages;
      std::set<int64_t> carried;
      for (const auto& entry : before) carried.insert(entry.first);
      int64_t made = 0;
      for (const auto& [id, bytes] : stage.out_storages) {
        if (!carried.count(id)) made += bytes;
      }
      stage.saved_bytes = std::max(stage.saved_bytes, *stage.private_saved_bytes + made);
    }

    // Transient peaks, replaying the stage's tensors' lifetimes: without
    // autograd storages die at their last use in the stage; with autograd
    // the kept ones stay.
    // With autograd, what each op saves beyond its outputs (attention's
    // probabilities, a norm's statistics, the numbers mul keeps) stays too:
    // a later op's transient comes on top of it.
    int64_t peak_above_out = 0;
    int64_t bwd_tmp = 0;
    int64_t internal_saved = 0;
    std::map<int, int64_t> live_nograd, live_grad;
    for (int op = cut.first_op; op <= cut.last_op; ++op) {
      const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
      int64_t kept_outputs = 0;
      for (int t : rec.outputs) {
        int s = profile.tensors[static_cast<size_t>(t)].storage;
        if (liveness.StorageProducer(s) != op) continue;  // in place or a view
        if (storage_kept[s] && live_grad.count(s) == 0) kept_outputs += liveness.StorageBytes(s);
        live_nograd[s] = liveness.StorageBytes(s);
        live_grad[s] = liveness.StorageBytes(s);
      }
      internal_saved += std::max<int64_t>(0, rec.saved_bytes + rec.wrapped_number_bytes - kept_outputs);
      int64_t sum_nograd = 0, sum_grad = internal_saved;
      for (const auto& kv : live_nograd) sum_nograd += kv.second;
      for (const auto& kv : live_grad) sum_grad += kv.second;
      peak_above_out = std::max(peak_above_out, std::max(sum_nograd, sum_grad) + rec.fwd_tmp_bytes - produced_out);
      for (auto it = live_nograd.begin(); it != live_nograd.end();) {
        bool dies = liveness.StorageLastUse(it->first) <= op && out.count(it->first) == 0;
        it = dies ? live_nograd.erase(it) : std::next(it);
      }
      for (auto it = live_grad.begin(); it != live_grad.end();) {
        bool dies = liveness.StorageLastUse(it->first) <= op && out.count(it->first) == 0 && !storage_kept[it->first];
        it = dies ? live_grad.erase(it) : std::next(it);
      }
    }
    // Backward: gradients of the stage's inputs are x_i in the chain model,
    // counted there: not here.
    bwd_tmp = std::max<int64_t>(0, ReplayBackward(profile, cut.first_op, cut.last_op).peak_bytes);
    stage.fwd_tmp_bytes = std::max<int64_t>(0, peak_above_out);
    stage.bwd_tmp_bytes = bwd_tmp;
    chain.stages.push_back(std::move(stage));
  }
  // The loss stands for what every step does once and no op owns: the
  // step's measured time beyond its ops' (the graph's other nodes, the loss,
  // the autograd engine, gradients accumulated into the parameters, a step
  // in a loop of steps running slower or faster than alone). From the step
  // as `ckplan run` runs it where the profile has it (less adam's update,
  // which it includes), else from the step timed whole, else from the timed
  // forward and backward.
  double ops_fwd = 0, ops_bwd = 0;
  for (const OpRecord& rec : profile.ops) {
    ops_fwd += rec.fwd_ms;
    ops_bwd += rec.bwd_ms;
  }
  const auto adam = profile.totals.optimizer_step_ms.find("adam");
  const Calibration& calibration = profile.calibration;
  if (calibration.run_step_ms && adam != profile.totals.optimizer_step_ms.end()) {
    chain.loss_bwd_ms = std::max(0.0, *calibration.run_step_ms - adam->second - ops_fwd - ops_bwd);
  } else if (profile.totals.step_ms) {
    chain.loss_bwd_ms = std::max(0.0, *profile.totals.step_ms - ops_fwd - ops_bwd);
  } else {
    chain.loss_bwd_ms = std::max(0.0, profile.totals.fwd_ms - ops_fwd) + std::max(0.0, profile.totals.bwd_ms - ops_bwd);
  }
  // The PyTorch target's step runs eagerly, node by node: its loss is what
  // that step leaves of its own (adam's update, which it includes, aside),
  // negative where the ops timed one by one take longer (DenseNet's): its
  // step without recomputation is that step, the overheads against it.
  if (calibration.module_step_ms && adam != profile.totals.optimizer_step_ms.end()) {
    const double ops_ms = ops_fwd + ops_bwd;
    chain.module_loss_bwd_ms = std::max(-ops_ms, *calibration.module_step_ms - adam->second - ops_ms);
  }
  chain.pytorch.checkpoint_call_ms = calibration.checkpoint_call_ms.value_or(0);
  chain.pytorch.time_noise_pct = profile.totals.time_noise_pct.value_or(0);
  // At the loss, beside what the forward keeps: autocast's cache of the
  // weights' casts that nothing saves, held from their first use to the
  // region's end after the loss (0 without autocast).
  chain.loss_bwd_tmp_bytes = profile.totals.autocast_cache_bytes;
  // Gradients appear during backward, stage by stage (gradients.h); the
  // optimizer's update runs at the step's end, every gradient made.
  AttachGradients(profile, liveness, &chain);
  chain.update_tmp_bytes = UpdateTmpBytes(optimizer, ResolvedImpl(optimizer, profile),
                                         TrainableParameters(profile.parameters));
  // The training loop holds the model's output to the step's end: each
  // output storage no op keeps for backward (one kept is counted anyway).
  std::set<int> kept_storages, held_storages;
  for (const TensorRecord& t : profile.tensors) {
    if (t.kept) kept_storages.insert(t.storage);
  }
  // A model returning its own loss: its other outputs too (the logits), as
  // the output object the loop holds keeps them.
  std::vector<int> held = profile.outputs;
  held.insert(held.end(), profile.held_outputs.begin(), profile.held_outputs.end());
  // One an op saves is counted in the stage that keeps it until that
  // stage's backward releases it; the loop holds it on to the step's end
  // (Chain::output_kept_bytes): the last stage that makes or reads it.
  int kept_last_op = -1;
  for (int id : held) {
    const TensorRecord& t = profile.tensors[static_cast<size_t>(id)];
    if (t.external || !held_storages.insert(t.storage).second) continue;
    if (kept_storages.count(t.storage) == 0) {
      chain.output_held_bytes += t.bytes;
    } else {
      chain.output_kept_bytes += t.bytes;
      kept_last_op = std::max({kept_last_op, liveness.StorageProducer(t.storage), liveness.StorageLastUse(t.storage)});
    }
  }
  if (chain.output_kept_bytes > 0) {
    chain.output_kept_stage = chain.length() - 1;
    for (int k = 0; k < chain.length(); ++k) {
      const Stage& s = chain.stages[static_cast<size_t>(k)];
      if (s.ops && kept_last_op >= s.ops->first && kept_last_op <= s.ops->last) chain.output_kept_stage = k;
    }
  }
  // The tensors each module is called with, by storage: checkpoint holds
  // them for a wrapped module (model inputs and weights are held anyway, and
  // a storage some op saves is counted where that op is).
  for (const auto& [path, ids] : profile.module_inputs) {
    std::set<int> seen;
    for (int id : ids) {
      const TensorRecord& t = profile.tensors[static_cast<size_t>(id)];
      if (t.external || storage_kept[t.storage] || !seen.insert(t.storage).second) continue;
      chain.pytorch.module_call_storages[path].push_back({t.storage, liveness.StorageBytes(t.storage)});
    }
  }
  // The Python numbers ops keep, which checkpoint cannot drop: held by
  // every module around the op that is wrapped.
  for (const OpRecord& op : profile.ops) {
    if (op.wrapped_number_bytes <= 0 || op.module.empty()) continue;
    for (size_t dot = 0; dot != std::string::npos;) {
      dot = op.module.find('.', dot + 1);
      chain.pytorch.module_held_bytes[op.module.substr(0, dot)] += op.wrapped_number_bytes;
    }
  }
  chain.pytorch.module_eager_peak_bytes = profile.module_eager_peak_bytes;
  ValidateChain(chain, file, "the chain cut from it");
  return chain;
}

}  // namespace ckplan
