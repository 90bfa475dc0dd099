#include "planner/cost/gradients.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "planner/cost/backward_replay.h"

namespace ckplan {

namespace {

// Per tensor: the tensor whose gradient its own is a view of (-1: none),
// and the op whose backward sums another gradient into it, a view until
// then (-1: none).
struct GradientViews {
  std::vector<int> root, until;
};

// The backward of stage `index` as PyTorch runs it (StageGradients::
// pytorch_bwd_peak_bytes): its ops in reverse, each at its measured transient on top
// of the gradients alive and the parameter gradients already made, less the
// saved storages already released. `storage_producer`: the op that made
// each activation storage; `differentiable`: the storages some tensor that
// requires grad lives in (the others get no gradient: a mask, rotary tables).
// `released`: per op, the bytes autograd frees as its backward runs (what
// it saved, or what later ops saved of it when no release was measured);
// `released_later`: those of the stage's own storages that the backward of
// later stages frees, gone before its own starts. `grad_views`: the
// gradients that are views of another's (ViewsOfGradients).
// `executor`: as `ckplan run`'s executor runs it (StageGradients::
// executor_bwd_peak_bytes): the gradient of the output held to the stage's end,
// the model output held (the caller passes `released` without the storages
// of the cuts, and no `released_later`).
int64_t StageBackwardPeak(const Chain& chain, const Profile& profile, int index,
                          const std::map<int, int>& storage_producer, const std::set<int64_t>& differentiable,
                          const std::vector<int64_t>& op_grads,
                          const std::vector<int64_t>& released, int64_t released_later,
                          const Liveness& liveness, const GradientViews& grad_views, bool executor = false,
                          const std::vector<int64_t>* cut_released = nullptr) {
  const Stage& stage = chain.stages[static_cast<size_t>(index)];
  const int first_op = stage.ops->first, last_op = stage.ops->last;
  // Gradients that are views of a larger one: alive per root, the bytes
  // of the root's beyond those of its views alive (counted as their own),
  // while the root's own gradient is gone and some view of it is not.
  std::map<int, std::set<int>> views;  // root -> its views alive
  auto root_of = [&](int t) { return grad_views.root[static_cast<size_t>(t)]; };
  auto nbytes = [&](int t) { return profile.tensors[static_cast<size_t>(t)].nbytes; };
  for (size_t t = 0; t < profile.tensors.size(); ++t) {
    const TensorRecord& rec = profile.tensors[t];
    if (grad_views.root[t] < 0 || !rec.requires_grad || rec.producer > last_op) continue;
    if (liveness.LastUse(static_cast<int>(t)) > last_op && grad_views.until[t] <= last_op) {
      views[grad_views.root[t]].insert(static_cast<int>(t));
    }
  }
  // The root's own gradient is alive while the backward has reached its
  // last reader (at or before `read`) and not its producer (after `made`).
  auto beyond_views = [&](int made, int read) {
    int64_t total = 0;
    for (const auto& [root, alive] : views) {
      const TensorRecord& r = profile.tensors[static_cast<size_t>(root)];
      const bool root_alive = r.producer <= made && liveness.LastUse(root) >= read;
      if (alive.empty() || root_alive) continue;  // the root's gradient counted whole
      int64_t counted = 0;
      for (int t : alive) counted += nbytes(t);
      total += std::max<int64_t>(0, nbytes(root) - counted);
    }
    return total;
  };
  int64_t beyond = beyond_views(last_op, last_op + 1);
  const bool last = index + 1 == chain.length();
  // The gradients of the stage's output storages: those it made are
  // consumed by the op that made them; those passed through (a skip
  // connection made earlier) stay.
  std::map<int, int64_t> made_out;
  std::set<int64_t> kept_out(stage.kept_out_storages.begin(), stage.kept_out_storages.end());
  int64_t extra = -released_later;
  for (const auto& [id, bytes] : stage.out_storages) {
    auto it = storage_producer.find(static_cast<int>(id));
    if (it == storage_producer.end() || it->second < first_op || it->second > last_op) continue;
    made_out[static_cast<int>(id)] = bytes;
    // The loss held the model's output until its own backward: released
    // then unless an op saves it.
    if (last && kept_out.count(id) == 0 && !executor) extra -= bytes;
  }
  std::set<int64_t> out_ids;
  for (const auto& entry : stage.out_storages) out_ids.insert(entry.first);
  // The gradient of the stage's output: of its differentiable storages.
  int64_t boundary = 0, held = 0;
  for (const auto& [id, bytes] : stage.out_storages) boundary += differentiable.count(id) != 0 ? bytes : 0;
  if (stage.out_storages.empty()) boundary = chain.StageInputBytes(index + 1);
  int64_t peak = boundary + extra + beyond;
  std::set<int> grads;
  for (int op = last_op; op >= first_op; --op) {
    const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
    // The executor's replay, where the profile measured the op's backward
    // over all its autograd nodes (OpRecord::bwd_span_peak_bytes): from the
    // memory when it starts, plus what the executor holds that the profiled
    // step may have freed during it (the gradients of the stage's outputs it
    // consumes, the cuts' storages it releases: `cut_released`). Both that
    // and the node-by-node bound below are never below what it needs: the
    // smaller counts (a GRU's layers release their saved values as the other
    // layer's gradients are made).
    int64_t span_peak = -1;
    if (executor && rec.bwd_span_peak_bytes) {
      span_peak = boundary + extra + held + beyond + *rec.bwd_span_peak_bytes +
                  (cut_released != nullptr ? (*cut_released)[static_cast<size_t>(op)] : 0);
      for (int t : rec.outputs) {
        const TensorRecord& out = profile.tensors[static_cast<size_t>(t)];
        auto it = made_out.find(out.storage);
        if (it != made_out.end() && out.producer == op) span_peak += it->second;
      }
    }
    int64_t op_peak = boundary + extra + rec.bwd_tmp_bytes + held + beyond;
    // In PyTorch too, an op of several nodes holds the first's gradients
    // while the second makes its own (cross-entropy: nll_loss's gradient,
    // then log_softmax's, both the logits' size): its measured span where
    // the profile has it.
    if (!executor && rec.bwd_span_peak_bytes) {
      op_peak = std::max(op_peak, boundary + extra + held + beyond + *rec.bwd_span_peak_bytes);
    }
    // What it makes: its parameters' gradients and its inputs'.
    held += op_grads[static_cast<size_t>(op)];
    for (int t : rec.inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (!in.requires_grad) continue;
      if (root_of(t) >= 0 && op == liveness.LastUse(t)) views[root_of(t)].insert(t);
      if (root_of(t) >= 0 && op == grad_views.until[static_cast<size_t>(t)]) views[root_of(t)].erase(t);
      // The gradient of a value read after the stage (or passed through
      // it) is held from the start; one an in-place op then overwrote
      // (conv's output under relu_) has its own.
      const bool read_after = liveness.LastUse(t) > last_op;
      if (out_ids.count(in.storage) != 0 && (read_after || in.producer < first_op)) continue;
      if (!grads.insert(t).second) continue;
      if (in.producer < first_op) {
        boundary += in.nbytes;  // the stage input's: held from now on
      } else {
        extra += in.nbytes;
      }
    }
    // All of it made, nothing released yet: an op of several backward nodes
    // (a Linear's addmm, then its bias's sum) has its transient measured
    // node by node, the first's gradients held during the second.
    beyond = beyond_views(op, op);
    op_peak = std::max(op_peak, boundary + extra + held + beyond);
    peak = std::max(peak, span_peak >= 0 ? std::min(op_peak, span_peak) : op_peak);
    // What it releases: the gradients of its outputs, what it saved.
    for (int t : rec.outputs) {
      const TensorRecord& out = profile.tensors[static_cast<size_t>(t)];
      if (root_of(t) >= 0) views[root_of(t)].erase(t);
      if (grads.erase(t)) extra -= out.nbytes;
      auto it = made_out.find(out.storage);
      if (it != made_out.end() && out.producer == op && !executor) {
        if (differentiable.count(it->first) != 0) boundary -= it->second;
        made_out.erase(it);
      }
    }
    extra -= released[static_cast<size_t>(op)];
    beyond = beyond_views(op - 1, op);
  }
  return peak;
}

// Gradients that are views of another's: cat's backward narrows its
// output's gradient into its inputs' (ViT's patches and CLS token: the
// patches' gradient, down to the patch convolution, holds the CLS token's
// slice too); a view op's backward views its output's. A tensor's gradient
// is one from the backward of its last reader, where that is such an op,
// until another reader's gradient is summed into it (`until`, or -1).
GradientViews ViewsOfGradients(const Profile& profile) {
  const size_t n = profile.tensors.size();
  GradientViews views{std::vector<int>(n, -1), std::vector<int>(n, -1)};
  std::vector<int>& root = views.root;
  std::vector<int> last(n, -1), reads(n, 0);  // last reader; times it reads the tensor
  for (const OpRecord& op : profile.ops) {
    for (int t : op.inputs) {
      const size_t at = static_cast<size_t>(t);
      if (last[at] >= 0 && last[at] != op.id) views.until[at] = last[at];
      if (last[at] != op.id) reads[at] = 0;
      last[at] = op.id;
      reads[at]++;
    }
  }
  for (int t : profile.outputs) last[static_cast<size_t>(t)] = static_cast<int>(profile.ops.size());
  static const std::set<std::string> kConcat = {"aten::cat", "aten::concat", "aten::concatenate"};
  static const std::set<std::string> kView = {"aten::view",      "aten::reshape",   "aten::_reshape_alias",
                                              "aten::flatten",   "aten::unflatten", "aten::transpose",
                                              "aten::t",         "aten::permute",   "aten::unsqueeze",
                                              "aten::squeeze",   "aten::alias",     "aten::_unsafe_view"};
  for (auto op = profile.ops.rbegin(); op != profile.ops.rend(); ++op) {
    if (op->inplace || op->outputs.size() != 1) continue;
    const int out = op->outputs[0];
    const TensorRecord& o = profile.tensors[static_cast<size_t>(out)];
    if (!o.requires_grad) continue;
    const bool concat = kConcat.count(op->kind) != 0;
    if (!concat && (kView.count(op->kind) == 0 || op->inputs.size() != 1)) continue;
    for (int t : op->inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (!in.requires_grad || last[static_cast<size_t>(t)] != op->id || reads[static_cast<size_t>(t)] != 1) continue;
      // A view's gradient is one while their sizes agree (a reshape may copy:
      // counted as the view, never less).
      if (!concat && (in.storage != o.storage || in.nbytes != o.nbytes)) continue;
      // Through a view of a view, while that one's gradient is one (read once).
      const bool chained = root[static_cast<size_t>(out)] >= 0 && views.until[static_cast<size_t>(out)] < 0;
      root[static_cast<size_t>(t)] = chained ? root[static_cast<size_t>(out)] : out;
    }
  }
  return views;
}

}  // namespace

// torch.get_rng_state(): the CPU generator's (mt19937) state; a CUDA
// device's: its seed and offset.
constexpr int64_t kCpuRngStateBytes = 5056;
constexpr int64_t kCudaRngStateBytes = 16;

StageGradients GradientsFromProfile(const Chain& chain, const Profile& profile, const Liveness& liveness) {
  const int length = chain.length();
  StageGradients out;
  out.bytes.assign(static_cast<size_t>(length), 0);
  out.held_at_bwd_peak_bytes.assign(static_cast<size_t>(length), 0);
  if (length == 0) return out;
  std::vector<int> stage_of(profile.ops.size(), -1);
  for (int i = 0; i < length; ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    if (!s.ops) continue;
    for (int op = std::max(s.ops->first, 0); op <= s.ops->last && op < static_cast<int>(stage_of.size()); ++op) {
      stage_of[static_cast<size_t>(op)] = i;
    }
  }
  auto module_of = [](const std::string& name) {
    const size_t dot = name.rfind('.');
    return dot == std::string::npos ? std::string() : name.substr(0, dot);
  };
  auto within = [](const std::string& path, const std::string& module) {
    return module.empty() || path == module || path.compare(0, module.size() + 1, module + ".") == 0;
  };
  // The op (in forward order) whose backward makes each parameter's gradient.
  std::vector<int> last_op(profile.parameters.size(), -1);
  for (size_t q = 0; q < profile.parameters.size(); ++q) {
    const std::string owner = module_of(profile.parameters[q].name);
    int own = -1, nested = -1;
    for (const OpRecord& op : profile.ops) {
      if (stage_of[static_cast<size_t>(op.id)] < 0) continue;
      if (op.module == owner) own = std::max(own, op.id);
      if (within(op.module, owner)) nested = std::max(nested, op.id);
    }
    last_op[q] = own >= 0 ? own : nested;
  }
  // Tied weights: an op's arguments other than its tensor inputs are
  // parameters (or buffers); one shaped like no parameter of the op's module
  // or its ancestors is one of another module (every one of that shape).
  for (const OpRecord& op : profile.ops) {
    if (stage_of[static_cast<size_t>(op.id)] < 0) continue;
    std::vector<std::vector<int64_t>> args;
    for (const ArgRecord& arg : op.args) args.push_back(arg.shape);
    for (int id : op.inputs) {
      if (id < 0 || id >= static_cast<int>(profile.tensors.size())) continue;
      auto it = std::find(args.begin(), args.end(), profile.tensors[static_cast<size_t>(id)].shape);
      if (it != args.end()) args.erase(it);
    }
    for (const std::vector<int64_t>& shape : args) {
      bool ours = false;
      for (const ParameterRecord& p : profile.parameters) {
        ours = ours || (p.shape == shape && within(op.module, module_of(p.name)));
      }
      if (ours) continue;
      // A parameter of a submodule whose own ops were inlined into this
      // one's (nn.MultiheadAttention's out_proj, used by the attention's op).
      bool inside = false;
      for (size_t q = 0; q < profile.parameters.size(); ++q) {
        const ParameterRecord& p = profile.parameters[q];
        if (p.shape == shape && within(module_of(p.name), op.module) && !op.module.empty()) {
          last_op[q] = std::max(last_op[q], op.id);
          inside = true;
        }
      }
      if (inside) continue;
      for (size_t q = 0; q < profile.parameters.size(); ++q) {
        if (profile.parameters[q].shape == shape) last_op[q] = std::max(last_op[q], op.id);
      }
    }
  }
  std::vector<int64_t> op_grads(profile.ops.size(), 0), unused_grads(static_cast<size_t>(length), 0);
  for (size_t q = 0; q < profile.parameters.size(); ++q) {
    if (!profile.parameters[q].requires_grad) continue;  // frozen: no gradient
    const int op = last_op[q];
    const int at = op >= 0 ? stage_of[static_cast<size_t>(op)] : length - 1;
    out.bytes[static_cast<size_t>(at)] += profile.parameters[q].bytes;
    if (op >= 0) {
      op_grads[static_cast<size_t>(op)] += profile.parameters[q].bytes;
    } else {
      out.held_at_bwd_peak_bytes[static_cast<size_t>(at)] += profile.parameters[q].bytes;  // for its whole backward
      unused_grads[static_cast<size_t>(at)] += profile.parameters[q].bytes;
    }
  }
  // Each stage's backward replayed as ChainFromProfile replays it for
  // bwd_tmp_bytes, with the gradients of the ops already back-propagated
  // held: what that adds to the stage's peak.
  for (int i = 0; i < length; ++i) {
    const Stage& stage = chain.stages[static_cast<size_t>(i)];
    if (!stage.ops || stage.ops->last >= static_cast<int>(profile.ops.size())) continue;
    const BackwardReplay replay = ReplayBackward(profile, stage.ops->first, stage.ops->last, &op_grads);
    out.held_at_bwd_peak_bytes[static_cast<size_t>(i)] +=
        std::max<int64_t>(0, replay.peak_with_held_bytes) - std::max<int64_t>(0, replay.peak_bytes);
  }
  std::map<int, int> storage_producer;
  for (const TensorRecord& t : profile.tensors) {
    if (t.external || t.producer < 0) continue;
    auto it = storage_producer.find(t.storage);
    if (it == storage_producer.end() || t.producer < it->second) storage_producer[t.storage] = t.producer;
  }
  std::set<int64_t> differentiable;
  for (const TensorRecord& t : profile.tensors) {
    if (t.requires_grad) differentiable.insert(t.storage);
  }
  // Saved storages are released as measured (TensorRecord::released_by)
  // where the profile has it, else by the op that made them (the latest an
  // op that saves them can run its backward).
  std::vector<int64_t> released(profile.ops.size(), 0), released_later(static_cast<size_t>(length), 0);
  // The executor (`ckplan run`) holds every value of a cut (the model's
  // inputs, each stage's output storages) until the stage's backward ends:
  // what it releases is the rest.
  std::set<int64_t> cut_storages;
  for (int t : profile.inputs) cut_storages.insert(profile.tensors[static_cast<size_t>(t)].storage);
  for (const Stage& s : chain.stages) {
    for (const auto& entry : s.out_storages) cut_storages.insert(entry.first >= 0 ? entry.first : -1000000 - entry.first);
  }
  std::vector<int64_t> released_by_run(profile.ops.size(), 0);
  bool measured = false;
  for (const TensorRecord& t : profile.tensors) measured = measured || t.released_by.has_value();
  if (measured) {
    // What an op saves of its own that is no tensor of the graph (a dropout
    // mask, a norm's statistics): released by its own backward.
    std::set<int> seen;
    for (const OpRecord& op : profile.ops) released[static_cast<size_t>(op.id)] = op.saved_bytes;
    for (const TensorRecord& t : profile.tensors) {
      if (t.kept && !t.external && t.producer >= 0 && seen.insert(t.storage).second) {
        released[static_cast<size_t>(t.producer)] -= t.bytes;
      }
    }
    for (int64_t& bytes : released) bytes = std::max<int64_t>(0, bytes);
    released_by_run = released;
    seen.clear();
    for (const TensorRecord& t : profile.tensors) {
      if (!t.released_by || !seen.insert(t.storage).second) continue;
      released[static_cast<size_t>(*t.released_by)] += t.bytes;
      if (cut_storages.count(t.storage) == 0) released_by_run[static_cast<size_t>(*t.released_by)] += t.bytes;
      auto made = storage_producer.find(t.storage);
      if (made == storage_producer.end()) continue;
      const int at = stage_of[static_cast<size_t>(made->second)];
      if (at >= 0 && *t.released_by > chain.stages[static_cast<size_t>(at)].ops->last) {
        released_later[static_cast<size_t>(at)] += t.bytes;
      }
    }
  } else {
    for (const OpRecord& op : profile.ops) released[static_cast<size_t>(op.id)] = op.saved_bytes;
  }
  const std::string device = profile.environment.DeviceName();
  out.checkpoint_state_bytes = kCpuRngStateBytes + (device.rfind("cuda", 0) == 0 ? kCudaRngStateBytes : 0);
  const GradientViews grad_views = ViewsOfGradients(profile);
  out.pytorch_bwd_peak_bytes.assign(static_cast<size_t>(length), std::nullopt);
  out.executor_bwd_peak_bytes.assign(static_cast<size_t>(length), std::nullopt);
  // Per op: the cuts' storages it released in the profiled step (the executor holds them).
  std::vector<int64_t> cut_released(profile.ops.size(), 0);
  for (size_t op = 0; measured && op < profile.ops.size(); ++op) cut_released[op] = released[op] - released_by_run[op];
  for (int i = 0; i < length; ++i) {
    const Stage& stage = chain.stages[static_cast<size_t>(i)];
    if (!stage.ops || stage.ops->last >= static_cast<int>(profile.ops.size())) continue;
    out.pytorch_bwd_peak_bytes[static_cast<size_t>(i)] =
        StageBackwardPeak(chain, profile, i, storage_producer, differentiable, op_grads, released,
                          released_later[static_cast<size_t>(i)], liveness, grad_views) +
        unused_grads[static_cast<size_t>(i)];
    // Releases not measured (an older profile): each op's saved bytes at
    // its backward, as for PyTorch.
    out.executor_bwd_peak_bytes[static_cast<size_t>(i)] =
        StageBackwardPeak(chain, profile, i, storage_producer, differentiable, op_grads,
                          measured ? released_by_run : released, 0,
                          liveness, grad_views, /*executor=*/true, &cut_released) +
        unused_grads[static_cast<size_t>(i)];
  }
  return out;
}

Chain WithoutParamGrads(Chain chain) {
  for (Stage& s : chain.stages) {
    s.param_grad_bytes = 0;
    s.param_grad_bwd_bytes.reset();
    s.pytorch_bwd_peak_bytes.reset();  // they count the stage's gradients
    s.executor_bwd_peak_bytes.reset();
  }
  return chain;
}

}  // namespace ckplan
