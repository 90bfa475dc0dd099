#include "planner/solvers/modules.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "planner/base/error.h"
#include "planner/cost/stages.h"

namespace ckplan {

std::vector<WrappableModule> WrappableModules(const Chain& chain, const Profile* profile) {
  std::vector<WrappableModule> out;
  const int length = chain.length();
  if (profile == nullptr) {
    for (int i = 0; i < length; ++i) {
      const Stage& s = chain.stages[static_cast<size_t>(i)];
      if (s.modules.size() == 1) out.push_back({s.modules[0], i, i});
    }
    return out;
  }
  // Stage of each cut: op -> stage starting / ending there.
  std::map<int, int> starts, ends;
  for (int i = 0; i < length; ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    if (s.first_op < 0) return WrappableModules(chain, nullptr);
    starts[s.first_op] = i;
    ends[s.last_op] = i;
  }
  // Every module path (with its ancestors) and the ops in it, as a tree of
  // path components: each node a prefix of an op's path, found from its
  // parent by one component, so that a path costs its length once (a copy
  // of each prefix costs a path of n parts n copies of up to its length).
  struct Span {
    int first = std::numeric_limits<int>::max(), last = -1, count = 0;
    std::string_view path;  // a prefix of an op's module ("": none, the root)
  };
  std::vector<Span> spans(1);
  std::map<std::pair<size_t, std::string_view>, size_t> child;  // (node, component) -> node
  for (const OpRecord& op : profile->ops) {
    const std::string_view module = op.module;
    size_t node = 0, start = 0;
    while (!module.empty()) {
      const size_t dot = std::min(module.find('.', start), module.size());
      auto [it, added] = child.emplace(std::make_pair(node, module.substr(start, dot - start)), spans.size());
      if (added) spans.push_back({std::numeric_limits<int>::max(), -1, 0, module.substr(0, dot)});
      node = it->second;
      Span& span = spans[node];
      if (!span.path.empty()) {  // ".a" has no ancestor "": an empty path is no module
        span.first = std::min(span.first, op.id);
        span.last = std::max(span.last, op.id);
        span.count++;
      }
      if (dot == module.size()) break;
      start = dot + 1;
    }
  }
  // Containers the forward never calls (the profile's model.containers:
  // nn.ModuleList, nn.ModuleDict): PyTorch runs their children, never them,
  // so wrapping one would checkpoint nothing.
  std::set<std::string, std::less<>> containers;
  if (profile->model.is_object() && profile->model.contains("containers") &&
      profile->model["containers"].is_array()) {
    for (const auto& c : profile->model["containers"]) {
      if (c.is_string()) containers.insert(c.get<std::string>());
    }
  }
  std::map<std::pair<int, int>, std::string_view> by_range;
  for (const Span& span : spans) {
    if (span.count == 0 || span.last - span.first + 1 != span.count) continue;  // not one contiguous run
    if (containers.count(span.path) != 0) continue;
    auto a = starts.find(span.first);
    auto b = ends.find(span.last);
    if (a == starts.end() || b == ends.end() || a->second > b->second) continue;
    auto key = std::make_pair(a->second, b->second);
    auto it = by_range.find(key);
    // The outermost: a range's paths are the same ops, each path a prefix of the others.
    if (it == by_range.end() || span.path.size() < it->second.size()) by_range[key] = span.path;
  }
  for (const auto& [range, path] : by_range) out.push_back({std::string(path), range.first, range.second});
  return out;
}

namespace {

// Per tensor: the tensor whose gradient its own is a view of (-1: none),
// and the op whose backward sums another gradient into it, a view until
// then (-1: none).
struct GradientViews {
  std::vector<int> root, until;
};

// The backward of stage `index` as PyTorch runs it (StageGradients::
// bwd_peak_bytes): its ops in reverse, each at its measured transient on top
// of the gradients alive and the parameter gradients already made, less the
// saved storages already released. `storage_producer`: the op that made
// each activation storage.
// `released`: per op, the bytes autograd frees as its backward runs (what
// it saved, or what later ops saved of it when no release was measured);
// `released_later`: those of the stage's own storages that the backward of
// later stages frees, gone before its own starts. `grad_views`: the
// gradients that are views of another's (ViewsOfGradients).
// `executor`: as `ckplan run`'s executor runs it (StageGradients::
// run_bwd_peak_bytes): the gradient of the output held to the stage's end,
// the model output held (the caller passes `released` without the storages
// of the cuts, and no `released_later`).
int64_t StageBackwardPeak(const Chain& chain, const Profile& profile, int index,
                          const std::map<int, int>& storage_producer, const std::vector<int64_t>& op_grads,
                          const std::vector<int64_t>& released, int64_t released_later,
                          const std::vector<int>& last_use, const GradientViews& grad_views, bool executor = false,
                          const std::vector<int64_t>* cut_released = nullptr) {
  const Stage& stage = chain.stages[static_cast<size_t>(index)];
  // Gradients that are views of a larger one: alive per root, the bytes
  // of the root's beyond those of its views alive (counted as their own),
  // while the root's own gradient is gone and some view of it is not.
  std::map<int, std::set<int>> views;  // root -> its views alive
  auto root_of = [&](int t) { return grad_views.root[static_cast<size_t>(t)]; };
  auto nbytes = [&](int t) { return profile.tensors[static_cast<size_t>(t)].nbytes; };
  for (size_t t = 0; t < profile.tensors.size(); ++t) {
    const TensorRecord& rec = profile.tensors[t];
    if (grad_views.root[t] < 0 || !rec.requires_grad || rec.producer > stage.last_op) continue;
    if (last_use[t] > stage.last_op && grad_views.until[t] <= stage.last_op) {
      views[grad_views.root[t]].insert(static_cast<int>(t));
    }
  }
  // The root's own gradient is alive while the backward has reached its
  // last reader (at or before `read`) and not its producer (after `made`).
  auto beyond_views = [&](int made, int read) {
    int64_t total = 0;
    for (const auto& [root, alive] : views) {
      const TensorRecord& r = profile.tensors[static_cast<size_t>(root)];
      const bool root_alive = r.producer <= made && last_use[static_cast<size_t>(root)] >= read;
      if (alive.empty() || root_alive) continue;  // the root's gradient counted whole
      int64_t counted = 0;
      for (int t : alive) counted += nbytes(t);
      total += std::max<int64_t>(0, nbytes(root) - counted);
    }
    return total;
  };
  int64_t beyond = beyond_views(stage.last_op, stage.last_op + 1);
  const bool last = index + 1 == chain.length();
  // The gradients of the stage's output storages: those it made are
  // consumed by the op that made them; those passed through (a skip
  // connection made earlier) stay.
  std::map<int, int64_t> made_out;
  std::set<int64_t> kept_out(stage.kept_out_storages.begin(), stage.kept_out_storages.end());
  int64_t extra = -released_later;
  for (const auto& [id, bytes] : stage.out_storages) {
    auto it = storage_producer.find(static_cast<int>(id));
    if (it == storage_producer.end() || it->second < stage.first_op || it->second > stage.last_op) continue;
    made_out[static_cast<int>(id)] = bytes;
    // The loss held the model's output until its own backward: released
    // then unless an op saves it.
    if (last && kept_out.count(id) == 0 && !executor) extra -= bytes;
  }
  std::set<int64_t> out_ids;
  for (const auto& entry : stage.out_storages) out_ids.insert(entry.first);
  int64_t boundary = chain.StageInputBytes(index + 1), held = 0;
  int64_t peak = boundary + extra + beyond;
  std::set<int> grads;
  for (int op = stage.last_op; op >= stage.first_op; --op) {
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
    if (executor && rec.bwd_span_peak_bytes >= 0) {
      span_peak = boundary + extra + held + beyond + rec.bwd_span_peak_bytes +
                  (cut_released != nullptr ? (*cut_released)[static_cast<size_t>(op)] : 0);
      for (int t : rec.outputs) {
        const TensorRecord& out = profile.tensors[static_cast<size_t>(t)];
        auto it = made_out.find(out.storage);
        if (it != made_out.end() && out.producer == op) span_peak += it->second;
      }
    }
    int64_t op_peak = boundary + extra + rec.bwd_tmp_bytes + held + beyond;
    // What it makes: its parameters' gradients and its inputs'.
    held += op_grads[static_cast<size_t>(op)];
    for (int t : rec.inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (!in.requires_grad) continue;
      if (root_of(t) >= 0 && op == last_use[static_cast<size_t>(t)]) views[root_of(t)].insert(t);
      if (root_of(t) >= 0 && op == grad_views.until[static_cast<size_t>(t)]) views[root_of(t)].erase(t);
      // The gradient of a value read after the stage (or passed through
      // it) is held from the start; one an in-place op then overwrote
      // (conv's output under relu_) has its own.
      const bool read_after = last_use[static_cast<size_t>(t)] > stage.last_op;
      if (out_ids.count(in.storage) != 0 && (read_after || in.producer < stage.first_op)) continue;
      if (!grads.insert(t).second) continue;
      if (in.producer < stage.first_op) {
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
        boundary -= it->second;
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

StageGradients StageGradientBytes(const Chain& chain, const Profile& profile) {
  const int length = chain.length();
  StageGradients out;
  out.bytes.assign(static_cast<size_t>(length), 0);
  out.held_in_bwd.assign(static_cast<size_t>(length), 0);
  if (length == 0) return out;
  std::vector<int> stage_of(profile.ops.size(), -1);
  for (int i = 0; i < length; ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    for (int op = std::max(s.first_op, 0); op <= s.last_op && op < static_cast<int>(stage_of.size()); ++op) {
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
    const int op = last_op[q];
    const int at = op >= 0 ? stage_of[static_cast<size_t>(op)] : length - 1;
    out.bytes[static_cast<size_t>(at)] += profile.parameters[q].bytes;
    if (op >= 0) {
      op_grads[static_cast<size_t>(op)] += profile.parameters[q].bytes;
    } else {
      out.held_in_bwd[static_cast<size_t>(at)] += profile.parameters[q].bytes;  // for its whole backward
      unused_grads[static_cast<size_t>(at)] += profile.parameters[q].bytes;
    }
  }
  // Each stage's backward replayed as ChainFromProfile replays it for
  // bwd_tmp_bytes, with the gradients of the ops already back-propagated
  // held: what that adds to the stage's peak.
  for (int i = 0; i < length; ++i) {
    const Stage& stage = chain.stages[static_cast<size_t>(i)];
    if (stage.first_op < 0 || stage.last_op >= static_cast<int>(profile.ops.size())) continue;
    const BackwardReplay replay = ReplayBackward(profile, stage.first_op, stage.last_op, &op_grads);
    out.held_in_bwd[static_cast<size_t>(i)] +=
        std::max<int64_t>(0, replay.peak_with_held_bytes) - std::max<int64_t>(0, replay.peak_bytes);
  }
  std::map<int, int> storage_producer;
  for (const TensorRecord& t : profile.tensors) {
    if (t.external || t.producer < 0) continue;
    auto it = storage_producer.find(t.storage);
    if (it == storage_producer.end() || t.producer < it->second) storage_producer[t.storage] = t.producer;
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
  for (const TensorRecord& t : profile.tensors) measured = measured || t.released_by >= 0;
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
      if (t.released_by < 0 || !seen.insert(t.storage).second) continue;
      released[static_cast<size_t>(t.released_by)] += t.bytes;
      if (cut_storages.count(t.storage) == 0) released_by_run[static_cast<size_t>(t.released_by)] += t.bytes;
      auto made = storage_producer.find(t.storage);
      if (made == storage_producer.end()) continue;
      const int at = stage_of[static_cast<size_t>(made->second)];
      if (at >= 0 && t.released_by > chain.stages[static_cast<size_t>(at)].last_op) {
        released_later[static_cast<size_t>(at)] += t.bytes;
      }
    }
  } else {
    for (const OpRecord& op : profile.ops) released[static_cast<size_t>(op.id)] = op.saved_bytes;
  }
  const std::string device = profile.environment.is_object() && profile.environment.contains("device") &&
                                     profile.environment["device"].is_string()
                                 ? profile.environment["device"].get<std::string>()
                                 : "cpu";
  out.checkpoint_state_bytes = kCpuRngStateBytes + (device.rfind("cuda", 0) == 0 ? kCudaRngStateBytes : 0);
  out.loss_scalar_bytes = kLossScalarBytes;
  std::vector<int> last_use(profile.tensors.size(), -1);  // the last op reading each tensor
  for (const OpRecord& op : profile.ops) {
    for (int t : op.inputs) last_use[static_cast<size_t>(t)] = std::max(last_use[static_cast<size_t>(t)], op.id);
  }
  for (int t : profile.outputs) last_use[static_cast<size_t>(t)] = static_cast<int>(profile.ops.size());
  const GradientViews grad_views = ViewsOfGradients(profile);
  out.bwd_peak_bytes.assign(static_cast<size_t>(length), -1);
  out.run_bwd_peak_bytes.assign(static_cast<size_t>(length), -1);
  // Per op: the cuts' storages it released in the profiled step (the executor holds them).
  std::vector<int64_t> cut_released(profile.ops.size(), 0);
  for (size_t op = 0; measured && op < profile.ops.size(); ++op) cut_released[op] = released[op] - released_by_run[op];
  for (int i = 0; i < length; ++i) {
    const Stage& stage = chain.stages[static_cast<size_t>(i)];
    if (stage.first_op < 0 || stage.last_op >= static_cast<int>(profile.ops.size())) continue;
    out.bwd_peak_bytes[static_cast<size_t>(i)] =
        StageBackwardPeak(chain, profile, i, storage_producer, op_grads, released,
                          released_later[static_cast<size_t>(i)], last_use, grad_views) +
        unused_grads[static_cast<size_t>(i)];
    // Releases not measured (an older profile): each op's saved bytes at
    // its backward, as for PyTorch.
    out.run_bwd_peak_bytes[static_cast<size_t>(i)] =
        StageBackwardPeak(chain, profile, i, storage_producer, op_grads, measured ? released_by_run : released, 0,
                          last_use, grad_views, /*executor=*/true, &cut_released) +
        unused_grads[static_cast<size_t>(i)];
  }
  return out;
}

Schedule ModuleSchedule(int length, const std::vector<WrappableModule>& wrapped) {
  std::vector<int> end_of(static_cast<size_t>(length), -1);  // first stage -> last stage of a wrapped module
  for (const WrappableModule& m : wrapped) end_of[static_cast<size_t>(m.first_stage)] = m.last_stage;
  Schedule s;
  std::vector<std::pair<int, int>> units;
  for (int i = 0; i < length;) {
    const int end = end_of[static_cast<size_t>(i)];
    if (end < 0) {
      s.push_back({StepKind::kForwardGrad, i});
      units.push_back({i, -1});
      ++i;
      continue;
    }
    s.push_back({StepKind::kForwardNoGradKeep, i});
    for (int k = i + 1; k <= end; ++k) s.push_back({StepKind::kForwardNoGrad, k});
    units.push_back({i, end});
    i = end + 1;
  }
  s.push_back({StepKind::kLoss, length});
  for (auto it = units.rbegin(); it != units.rend(); ++it) {
    const auto [first, end] = *it;
    if (end < 0) {
      s.push_back({StepKind::kBackward, first});
      continue;
    }
    for (int k = first; k <= end; ++k) s.push_back({StepKind::kForwardGrad, k});
    for (int k = end; k >= first; --k) s.push_back({StepKind::kBackward, k});
  }
  return s;
}

namespace {

// PyTorch's accounting: the loss and the gradient its backward starts from,
// held by the caller from the loss to the backward's end.
int64_t LossScalarBytes(ModuleAccounting accounting, const StageGradients& grads) {
  return accounting == ModuleAccounting::kPyTorch ? grads.loss_scalar_bytes : 0;
}

// One step of the frontier walk: stage `first` run normally (wrapped < 0),
// or module `wrapped` (stages first..last). `need` is the largest memory it
// needs above what is held at its first stage's boundary, over its forward
// and its backward; `held` what it adds to the held memory.
struct Unit {
  int first, last, wrapped;
  int64_t need, held;
  double time_ms;
  // PyTorch accounting: what its input holds that no op saves, alive while
  // the unit starts (and held by a wrapped module), on top of `need_input`:
  // its own storages, and those live across several cuts (bits: counted
  // once, however many wrapped modules hold them).
  int64_t need_input = 0, input_own = 0;
  uint32_t input_bits = 0;
};

struct Units {
  std::vector<std::vector<Unit>> by_stage;
  std::vector<int64_t> bit_bytes;
};

// The storages of each cut (k = 0..L: the input of stage k, then the chain
// output) and each stage's own saved bytes, as the simulator counts them:
// with storages, each once; without, cut k is one value of x_k.
struct Cuts {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> storages;
  std::vector<int64_t> own_saved;
  std::set<int64_t> kept;  // PyTorch accounting: storages some op saves, and the model's inputs and outputs
};

Cuts CutsOf(const Chain& chain) {
  Cuts cuts;
  const int length = chain.length();
  if (chain.has_storages()) {
    cuts.storages.push_back(chain.input_storages);
    for (const Stage& s : chain.stages) {
      cuts.storages.push_back(s.out_storages);
      cuts.own_saved.push_back(s.private_saved_bytes);
      cuts.kept.insert(s.kept_out_storages.begin(), s.kept_out_storages.end());
    }
    for (const auto& entry : chain.input_storages) cuts.kept.insert(entry.first);
    for (const auto& entry : chain.stages.back().out_storages) cuts.kept.insert(entry.first);
    return cuts;
  }
  for (int k = 0; k <= length; ++k) {
    cuts.storages.emplace_back();
    cuts.storages.back().emplace_back(k, chain.StageInputBytes(k));
  }
  for (const Stage& s : chain.stages) cuts.own_saved.push_back(s.saved_bytes - s.out_bytes);
  for (int k = 0; k <= length; ++k) cuts.kept.insert(k);
  return cuts;
}

// Bytes of the storages of `cut` not in `held`.
int64_t NewBytes(const std::vector<std::pair<int64_t, int64_t>>& cut, const std::set<int64_t>& held) {
  int64_t total = 0;
  for (const auto& [id, bytes] : cut) {
    if (held.count(id) == 0) total += bytes;
  }
  return total;
}

std::set<int64_t> Ids(const std::vector<std::pair<int64_t, int64_t>>& cut) {
  std::set<int64_t> ids;
  for (const auto& entry : cut) ids.insert(entry.first);
  return ids;
}

// Every storage of cut a is held when a unit starts at a (stage a's input),
// and a storage live across two cuts is live across every cut between: so
// what a unit needs and adds does not depend on the units before it.
//
// PyTorch's accounting differs in one way: a stage output no op saves (a
// Linear's output read by ReLU) is freed once the next stage has read it,
// unless a wrapped module holds it as its input.
Units UnitsByStage(const Chain& chain, const std::vector<WrappableModule>& modules, ModuleAccounting accounting,
                   const StageGradients& grads) {
  const int length = chain.length();
  // Parameter gradients (PyTorch allocates them in backward): grads_from[k],
  // those of stages k..L-1; in_bwd[k], held at stage k's backward peak on top
  // of its bwd_tmp_bytes: those of the stages after it and its own already made.
  std::vector<int64_t> grads_from(static_cast<size_t>(length) + 1, 0), in_bwd(static_cast<size_t>(length), 0);
  for (int k = std::min<int>(length, static_cast<int>(grads.bytes.size())) - 1; k >= 0; --k) {
    grads_from[static_cast<size_t>(k)] = grads_from[static_cast<size_t>(k) + 1] + grads.bytes[static_cast<size_t>(k)];
    in_bwd[static_cast<size_t>(k)] = grads_from[static_cast<size_t>(k) + 1] +
                                     (static_cast<size_t>(k) < grads.held_in_bwd.size() ? grads.held_in_bwd[static_cast<size_t>(k)] : 0);
  }
  Cuts cuts = CutsOf(chain);
  if (accounting == ModuleAccounting::kSimulator) {
    for (const auto& c : cuts.storages) {
      for (const auto& entry : c) cuts.kept.insert(entry.first);
    }
  }
  // Storages no op saves that cross several cuts (a mask, rotary tables):
  // a bit each (beyond 30, counted as kept: more, never less).
  Units result;
  std::map<int64_t, int> crossings, bit_of;
  for (int k = 1; k <= length; ++k) {
    for (const auto& entry : cuts.storages[static_cast<size_t>(k)]) {
      if (cuts.kept.count(entry.first) == 0) crossings[entry.first]++;
    }
  }
  for (int k = 1; k <= length; ++k) {
    for (const auto& [id, bytes] : cuts.storages[static_cast<size_t>(k)]) {
      if (cuts.kept.count(id) != 0 || crossings[id] < 2 || bit_of.count(id) != 0) continue;
      if (result.bit_bytes.size() >= 30) {
        cuts.kept.insert(id);
        continue;
      }
      bit_of[id] = static_cast<int>(result.bit_bytes.size());
      result.bit_bytes.push_back(bytes);
    }
  }
  auto bits_at = [&](int k) {
    uint32_t bits = 0;
    for (const auto& entry : cuts.storages[static_cast<size_t>(k)]) {
      auto it = bit_of.find(entry.first);
      if (it != bit_of.end()) bits |= 1u << it->second;
    }
    return bits;
  };
  auto kept_bytes = [&](const std::vector<std::pair<int64_t, int64_t>>& cut, const std::set<int64_t>& held, bool kept) {
    int64_t total = 0;
    for (const auto& [id, bytes] : cut) {
      if (held.count(id) == 0 && cuts.kept.count(id) == (kept ? 1u : 0u)) total += bytes;
    }
    return total;
  };
  auto cut = [&](int k) -> const std::vector<std::pair<int64_t, int64_t>>& { return cuts.storages[static_cast<size_t>(k)]; };
  auto grad = [&](int k) { return chain.StageInputBytes(k); };
  // Stage k's backward above what it keeps: replayed as PyTorch runs it
  // where known (StageGradients::bwd_peak_bytes), else both its boundary
  // gradients and its transient at their maxima over the stage.
  const int64_t loss_held = LossScalarBytes(accounting, grads);
  auto backward = [&](int k) {
    const size_t at = static_cast<size_t>(k);
    if (at < grads.bwd_peak_bytes.size() && grads.bwd_peak_bytes[at] >= 0) {
      return loss_held + grads_from[at + 1] + grads.bwd_peak_bytes[at];
    }
    const Stage& s = chain.stages[at];
    return loss_held + grad(k + 1) + grad(k) + s.bwd_tmp_bytes + in_bwd[at];
  };
  // fresh[k]: bytes of cut k+1 not in cut k, what stage k's output adds.
  std::vector<int64_t> fresh(static_cast<size_t>(length)), kept_fresh(static_cast<size_t>(length));
  std::vector<int64_t> loose(static_cast<size_t>(length) + 1, 0);  // not kept at cut k: alive until read
  for (int k = 0; k < length; ++k) {
    fresh[static_cast<size_t>(k)] = NewBytes(cut(k + 1), Ids(cut(k)));
    kept_fresh[static_cast<size_t>(k)] = kept_bytes(cut(k + 1), Ids(cut(k)), true);
  }
  for (int k = 0; k <= length; ++k) {
    std::set<int64_t> shared;
    for (const auto& entry : cut(k)) {
      if (bit_of.count(entry.first) != 0) shared.insert(entry.first);
    }
    loose[static_cast<size_t>(k)] = kept_bytes(cut(k), shared, false);  // its own: without the bits
  }
  std::vector<std::vector<Unit>> units(static_cast<size_t>(length));
  for (int i = 0; i < length; ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    const int64_t own = cuts.own_saved[static_cast<size_t>(i)], out = fresh[static_cast<size_t>(i)];
    const int64_t kept = own + kept_fresh[static_cast<size_t>(i)];
    Unit unit{i, i, -1, kept + backward(i), kept, s.fwd_ms + s.bwd_ms};
    unit.need_input = std::max(own + out, out + s.fwd_tmp_bytes);
    unit.input_own = loose[static_cast<size_t>(i)];
    unit.input_bits = bits_at(i);
    units[static_cast<size_t>(i)].push_back(unit);
  }
  for (size_t m = 0; m < modules.size(); ++m) {
    const int a = modules[m].first_stage, b = modules[m].last_stage;
    if (a < 0 || b >= length || a > b) throw Error(ExitCode::kInternal, "module stage range out of the chain");
    const std::set<int64_t> input = Ids(cut(a));
    int64_t need = 0;
    double time = 0;
    // Forward without autograd: its input held (counted at the boundary),
    // each inner value dropped once the next stage has read it.
    int64_t inner = 0;  // the current inner value, beyond the input
    for (int k = a; k <= b; ++k) {
      const Stage& s = chain.stages[static_cast<size_t>(k)];
      std::set<int64_t> held = input;
      if (k > a) {
        const std::set<int64_t> ids = Ids(cut(k));
        held.insert(ids.begin(), ids.end());
      }
      need = std::max(need, inner + NewBytes(cut(k + 1), held) + s.fwd_tmp_bytes);
      inner = NewBytes(cut(k + 1), input);
      time += s.ModuleNoGradFwdMs() + s.fwd_ms + s.bwd_ms;  // the first forward without autograd, the rerun with it
    }
    time += chain.checkpoint_call_ms;  // the wrap's own: its autograd function, its nested backward
    // It holds its input (what no op saves too: added as the frontier
    // walks, the bits once), and its output as kept.
    const int64_t adds = kept_bytes(cut(b + 1), input, true);
    // Backward: the gradient of its output held, recomputed with autograd,
    // then back-propagated stage by stage.
    int64_t kept = 0;
    std::vector<int64_t> kept_after(static_cast<size_t>(b - a + 1));
    for (int k = a; k <= b; ++k) {
      const Stage& s = chain.stages[static_cast<size_t>(k)];
      const int64_t own = cuts.own_saved[static_cast<size_t>(k)], out = fresh[static_cast<size_t>(k)];
      need = std::max(need, loss_held + grad(b + 1) + grads_from[static_cast<size_t>(b) + 1] + kept +
                                std::max(own + out, out + s.fwd_tmp_bytes));
      kept += own + out;
      kept_after[static_cast<size_t>(k - a)] = kept;
    }
    for (int k = b; k >= a; --k) {
      need = std::max(need, kept_after[static_cast<size_t>(k - a)] + backward(k));
    }
    // What checkpoint keeps beyond tensors (the RNG state), from its
    // forward to the end of its backward.
    need += grads.checkpoint_state_bytes;
    Unit unit{a, b, static_cast<int>(m), 0, adds + grads.checkpoint_state_bytes, time};
    unit.need_input = need;
    unit.input_own = loose[static_cast<size_t>(a)];
    unit.input_bits = bits_at(a);
    units[static_cast<size_t>(a)].push_back(unit);
  }
  result.by_stage = std::move(units);
  return result;
}

// The step's end: the inputs and every parameter gradient held, the
// optimizer's update running (its temporary, Chain::update_tmp_bytes), the
// activations gone.
int64_t StepEndBytes(const Chain& chain, const StageGradients& grads, int64_t input_bytes) {
  int64_t total = input_bytes + chain.update_tmp_bytes;
  for (int64_t bytes : grads.bytes) total += bytes;
  return total;
}

struct State {
  uint32_t bits;  // the storages of Units::bit_bytes held by a wrapped module
  int64_t held;
  double time_ms;
  int first;  // the unit's first stage (its first boundary)
  int from;   // index in that boundary's frontier
  int unit;   // index in units[first]
};

// Keeps the states no other state beats on both held bytes and time.
void Prune(std::vector<State>* states) {
  std::sort(states->begin(), states->end(), [](const State& p, const State& q) {
    if (p.bits != q.bits) return p.bits < q.bits;
    return p.held != q.held ? p.held < q.held : p.time_ms < q.time_ms;
  });
  std::vector<State> kept;
  for (const State& s : *states) {
    if (kept.empty() || s.bits != kept.back().bits || s.time_ms < kept.back().time_ms) kept.push_back(s);
  }
  *states = std::move(kept);
}

}  // namespace

namespace {

// A unit run from `state`: the memory it needs, and the state after it.
struct Step {
  int64_t need, held;
  uint32_t bits;
};

Step Walk(const Units& units, const Unit& unit, const State& state) {
  int64_t input = unit.input_own;
  const uint32_t fresh_bits = unit.input_bits & ~state.bits;
  for (size_t b = 0; b < units.bit_bytes.size(); ++b) {
    if (fresh_bits & (1u << b)) input += units.bit_bytes[b];
  }
  Step step;
  step.need = state.held + std::max(unit.need, unit.need_input + input);
  step.held = state.held + unit.held + (unit.wrapped >= 0 ? input : 0);
  step.bits = unit.wrapped >= 0 ? state.bits | unit.input_bits : state.bits;
  return step;
}

}  // namespace

ModuleSolution SolveModules(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget_bytes,
                            ModuleAccounting accounting, const StageGradients& grads) {
  ModuleSolution solution;
  const int length = chain.length();
  const Units all = UnitsByStage(chain, modules, accounting, grads);
  const std::vector<std::vector<Unit>>& units = all.by_stage;
  std::vector<std::vector<State>> frontier(static_cast<size_t>(length) + 1);
  int64_t input = 0;
  const Cuts cuts = CutsOf(chain);
  for (const auto& entry : cuts.storages[0]) input += entry.second;
  if (input > budget_bytes) return solution;
  frontier[0].push_back({0u, input, 0.0, -1, -1, -1});
  for (int k = 0; k < length; ++k) {
    std::vector<State>& here = frontier[static_cast<size_t>(k)];
    Prune(&here);
    for (size_t u = 0; u < units[static_cast<size_t>(k)].size(); ++u) {
      const Unit& unit = units[static_cast<size_t>(k)][u];
      std::vector<State>& there = frontier[static_cast<size_t>(unit.last) + 1];
      for (size_t s = 0; s < here.size(); ++s) {
        const Step step = Walk(all, unit, here[s]);
        if (step.need > budget_bytes) continue;
        there.push_back({step.bits, step.held, here[s].time_ms + unit.time_ms, k, static_cast<int>(s),
                         static_cast<int>(u)});
      }
    }
  }
  std::vector<State>& last = frontier[static_cast<size_t>(length)];
  Prune(&last);
  const int64_t loss_need =
      chain.StageInputBytes(length) + chain.loss_bwd_tmp_bytes + LossScalarBytes(accounting, grads);
  const int64_t end_need = StepEndBytes(chain, grads, input);
  if (end_need > budget_bytes) return solution;
  int best = -1;
  for (size_t s = 0; s < last.size(); ++s) {
    if (last[s].held + loss_need > budget_bytes) continue;
    if (best < 0 || last[s].time_ms < last[static_cast<size_t>(best)].time_ms) best = static_cast<int>(s);
  }
  if (best < 0) return solution;
  solution.feasible = true;
  solution.time_ms = last[static_cast<size_t>(best)].time_ms + chain.ModuleLossBwdMs();
  solution.kept_bytes = last[static_cast<size_t>(best)].held - input;  // less the checkpoints' states (below)
  solution.peak_bytes = std::max({input, last[static_cast<size_t>(best)].held + loss_need, end_need});
  for (int k = length, s = best; k > 0;) {
    const State& state = frontier[static_cast<size_t>(k)][static_cast<size_t>(s)];
    const int first = state.first;
    const Unit& unit = units[static_cast<size_t>(first)][static_cast<size_t>(state.unit)];
    const State& before = frontier[static_cast<size_t>(first)][static_cast<size_t>(state.from)];
    solution.peak_bytes = std::max(solution.peak_bytes, Walk(all, unit, before).need);
    if (unit.wrapped >= 0) solution.wrapped.push_back(modules[static_cast<size_t>(unit.wrapped)]);
    k = first;
    s = state.from;
  }
  std::reverse(solution.wrapped.begin(), solution.wrapped.end());
  solution.kept_bytes -= static_cast<int64_t>(solution.wrapped.size()) * grads.checkpoint_state_bytes;
  solution.schedule = ModuleSchedule(length, solution.wrapped);
  return solution;
}

int64_t MinimumModulesMemory(const Chain& chain, const std::vector<WrappableModule>& modules,
                             ModuleAccounting accounting, const StageGradients& grads) {
  // Feasibility only grows with the budget: bisect between a budget that
  // fails and the no-checkpointing peak, which fits.
  int64_t upper = 1;
  while (!SolveModules(chain, modules, upper, accounting, grads).feasible) upper *= 2;
  int64_t lower = upper / 2;
  while (upper - lower > 1) {
    const int64_t middle = lower + (upper - lower) / 2;
    if (SolveModules(chain, modules, middle, accounting, grads).feasible) {
      upper = middle;
    } else {
      lower = middle;
    }
  }
  return upper;
}

ModuleSolution EvaluateModules(const Chain& chain, const std::vector<WrappableModule>& wrapped,
                               ModuleAccounting accounting, const StageGradients& grads) {
  // The frontier walk of SolveModules along one path: the wrapped modules'
  // units where they start, single stages elsewhere.
  ModuleSolution solution;
  const int length = chain.length();
  const Units all = UnitsByStage(chain, wrapped, accounting, grads);
  int64_t input = 0;
  const Cuts cuts = CutsOf(chain);
  for (const auto& entry : cuts.storages[0]) input += entry.second;
  State state{0u, input, 0.0, -1, -1, -1};
  int64_t peak = input;
  for (int k = 0; k < length;) {
    const std::vector<Unit>& here = all.by_stage[static_cast<size_t>(k)];
    const Unit* unit = &here.front();  // the stage run normally
    for (const Unit& u : here) {
      if (u.wrapped >= 0) unit = &u;
    }
    const Step step = Walk(all, *unit, state);
    peak = std::max(peak, step.need);
    state = {step.bits, step.held, state.time_ms + unit->time_ms, k, -1, -1};
    if (unit->wrapped >= 0) solution.wrapped.push_back(wrapped[static_cast<size_t>(unit->wrapped)]);
    k = unit->last + 1;
  }
  solution.feasible = true;
  solution.time_ms = state.time_ms + chain.ModuleLossBwdMs();
  solution.kept_bytes = state.held - input;
  solution.peak_bytes = std::max({peak,
                                  state.held + chain.StageInputBytes(length) + chain.loss_bwd_tmp_bytes +
                                      LossScalarBytes(accounting, grads),
                                  StepEndBytes(chain, grads, input)});
  solution.schedule = ModuleSchedule(length, solution.wrapped);
  return solution;
}

}  // namespace ckplan
