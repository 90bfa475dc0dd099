#include "ckplan/planner/stages.h"

#include <algorithm>
#include <map>
#include <set>

#include "ckplan/planner/error.h"

namespace ckplan {
namespace {

std::vector<std::string> Split(const std::string& path) {
  std::vector<std::string> parts;
  if (path.empty()) return parts;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

std::string Join(const std::vector<std::string>& parts, size_t count) {
  std::string out;
  for (size_t i = 0; i < count && i < parts.size(); ++i) {
    if (i) out += ".";
    out += parts[i];
  }
  return out;
}

// Liveness of the op graph: for each tensor its last consumer (N for a model
// output), and for each cut position the storages crossing it.
class Liveness {
 public:
  explicit Liveness(const Profile& p) {
    const int n = static_cast<int>(p.ops.size());
    last_use_.assign(p.tensors.size(), -1);
    for (const OpRecord& op : p.ops) {
      for (int t : op.inputs) last_use_[static_cast<size_t>(t)] = std::max(last_use_[static_cast<size_t>(t)], op.id);
    }
    for (int t : p.outputs) last_use_[static_cast<size_t>(t)] = n;
    // A storage lives while any tensor on it is still to be used.
    for (const TensorRecord& t : p.tensors) {
      int& last = storage_last_use_[t.storage];
      last = std::max(last, last_use_[static_cast<size_t>(t.id)]);
      // Storages that existed before the forward (parameters, inputs) never cross a cut.
      int producer = t.external ? -1 : t.producer;
      auto first = storage_producer_.find(t.storage);
      if (first == storage_producer_.end() || producer < first->second) storage_producer_[t.storage] = producer;
      storage_bytes_[t.storage] = std::max(storage_bytes_[t.storage], t.bytes);
    }
  }

  // Storages produced before `position` (not model inputs) used at or after it.
  std::set<int> Crossing(int position) const {
    std::set<int> storages;
    for (const auto& [storage, producer] : storage_producer_) {
      if (producer < 0 || producer >= position) continue;
      if (storage_last_use_.at(storage) >= position) storages.insert(storage);
    }
    return storages;
  }

  int64_t Bytes(const std::set<int>& storages) const {
    int64_t total = 0;
    for (int s : storages) total += storage_bytes_.at(s);
    return total;
  }

  int64_t StorageBytes(int storage) const { return storage_bytes_.at(storage); }
  int StorageProducer(int storage) const { return storage_producer_.at(storage); }
  int StorageLastUse(int storage) const { return storage_last_use_.at(storage); }
  int LastUse(int tensor) const { return last_use_[static_cast<size_t>(tensor)]; }

 private:
  std::vector<int> last_use_;
  std::map<int, int> storage_last_use_;
  std::map<int, int> storage_producer_;
  std::map<int, int64_t> storage_bytes_;
};

struct Segment {
  int first;
  int last;
  size_t depth;  // module path components shared by all its ops
};

class Cutter {
 public:
  Cutter(const Profile& p, const Liveness& liveness) : profile_(p), liveness_(liveness) {
    for (const OpRecord& op : p.ops) paths_.push_back(Split(op.module));
    for (const TensorRecord& t : p.tensors) {
      if (t.kept) storage_kept_.insert(t.storage);
    }
    // Ops on the data path: those that read a model input or what such an
    // op made. The others (positions from arange, batch norm's counter)
    // are auxiliary and never start a stage.
    std::vector<bool> data_tensor(p.tensors.size(), false);
    for (int t : p.inputs) data_tensor[static_cast<size_t>(t)] = true;
    for (const OpRecord& op : p.ops) {
      bool data = false;
      for (int t : op.inputs) data = data || data_tensor[static_cast<size_t>(t)];
      data_op_.push_back(data);
      if (data) {
        for (int t : op.outputs) data_tensor[static_cast<size_t>(t)] = true;
      }
    }
    // An op that writes an activation in place (directly, or through a view:
    // `dropout_` after `flatten`) must be in the stage that made it: a cut in
    // between would hand a stage an input it modifies, which a recomputation
    // would then read modified. No cut after the storage's producer up to
    // the writer.
    no_cut_.assign(p.ops.size() + 1, false);
    for (size_t j = 0; j < p.ops.size(); ++j) {
      const OpRecord& op = p.ops[j];
      if (!op.inplace || op.inputs.empty()) continue;
      const TensorRecord& written = p.tensors[static_cast<size_t>(op.inputs[0])];
      if (written.external) continue;  // parameters, buffers (batch norm's counter), model inputs
      const int producer = liveness_.StorageProducer(written.storage);
      for (int position = std::max(producer, 0) + 1; position <= static_cast<int>(j); ++position) {
        no_cut_[static_cast<size_t>(position)] = true;
      }
    }
  }

  std::vector<StageCut> Run() {
    const int n = static_cast<int>(profile_.ops.size());
    Refine({0, n - 1, 0}, /*is_root=*/true);
    std::sort(cuts_.begin(), cuts_.end());
    cuts_.erase(std::unique(cuts_.begin(), cuts_.end()), cuts_.end());
    // A stage of auxiliary ops alone joins the next one.
    std::vector<int> kept;
    int stage_first = 0;
    for (int position : cuts_) {
      bool has_data = false;
      for (int op = stage_first; op < position; ++op) has_data = has_data || data_op_[static_cast<size_t>(op)];
      if (has_data) {
        kept.push_back(position);
        stage_first = position;
      }
    }
    cuts_ = kept;
    std::vector<StageCut> stages;
    int first = 0;
    for (int position : cuts_) {
      stages.push_back(MakeStage(first, position - 1));
      first = position;
    }
    stages.push_back(MakeStage(first, n - 1));
    return stages;
  }

 private:
  // Storages crossing a cut, those made by auxiliary ops left out: positions,
  // causal masks and rotary tables do not depend on the input, and cross
  // every cut between the blocks that read them alike.
  int CrossingCount(int position) const {
    if (position <= 0 || position >= static_cast<int>(profile_.ops.size())) return 1;
    int count = 0;
    for (int storage : liveness_.Crossing(position)) {
      if (data_op_[static_cast<size_t>(liveness_.StorageProducer(storage))]) ++count;
    }
    return count;
  }

  // The bytes of those, or of the model's inputs / outputs at either end.
  int64_t CrossingBytes(int position) const {
    if (position <= 0 || position >= static_cast<int>(profile_.ops.size())) {
      int64_t bytes = 0;  // the model's inputs or outputs
      for (int t : position <= 0 ? profile_.inputs : profile_.outputs) bytes += profile_.tensors[static_cast<size_t>(t)].bytes;
      return bytes;
    }
    int64_t bytes = 0;
    for (int storage : liveness_.Crossing(position)) {
      if (data_op_[static_cast<size_t>(liveness_.StorageProducer(storage))]) bytes += liveness_.StorageBytes(storage);
    }
    return bytes;
  }

  // The key of an op at `depth`: its path component there, "" if it sits
  // directly in the module at that depth.
  std::string Key(int op, size_t depth) const {
    const auto& parts = paths_[static_cast<size_t>(op)];
    return depth < parts.size() ? parts[depth] : std::string();
  }

  // Cuts inside `top` along the module tree. A work list, not recursion:
  // module paths can be as deep as the input makes them.
  //
  // A module is cut between its children unless that adds live tensors to
  // what crosses its own boundaries (the inside of a U-Net level, or of a
  // block whose skip connection would cross every cut). One exception: if
  // the children's cuts carry no more bytes than the module's boundaries
  // (DenseNet's dense layers, each reading every earlier feature map), they
  // are cut, and not refined further: inside a dense layer every earlier
  // feature map crosses every cut.
  void Refine(Segment top, bool top_is_root) {
    std::vector<std::pair<Segment, bool>> work = {{top, top_is_root}};
    while (!work.empty()) {
      auto [segment, is_root] = work.back();
      work.pop_back();
      if (segment.first == segment.last) continue;
      // Runs of consecutive ops with the same child key.
      std::vector<Segment> children;
      int start = segment.first;
      for (int op = segment.first + 1; op <= segment.last + 1; ++op) {
        if (op > segment.last || Key(op, segment.depth) != Key(start, segment.depth) ||
            Key(start, segment.depth).empty()) {
          children.push_back({start, op - 1, segment.depth + 1});
          start = op;
        }
      }
      if (children.size() == 1) {
        // A wrapper module: look one level down, unless the ops sit directly here.
        if (!Key(segment.first, segment.depth).empty()) work.push_back({children[0], is_root});
        continue;
      }
      bool by_bytes = false;
      if (!is_root) {
        const int own = std::max(CrossingCount(segment.first), CrossingCount(segment.last + 1));
        bool adds_live = false;
        for (size_t c = 1; c < children.size() && !adds_live; ++c) {
          adds_live = CrossingCount(children[c].first) > own;
        }
        if (adds_live) {
          const int64_t own_bytes = std::max(CrossingBytes(segment.first), CrossingBytes(segment.last + 1));
          adds_live = false;
          for (size_t c = 1; c < children.size() && !adds_live; ++c) {
            adds_live = CrossingBytes(children[c].first) > own_bytes;
          }
          by_bytes = !adds_live;
        }
        if (adds_live) continue;
      }
      for (size_t c = 1; c < children.size(); ++c) {
        if (CutAllowedBeforeChild(children[c])) cuts_.push_back(children[c].first);
      }
      if (by_bytes) continue;
      for (const Segment& child : children) {
        if (!Key(child.first, segment.depth).empty()) work.push_back({child, false});
      }
    }
  }

  // A cut before a child module: not before an op that writes an activation
  // in place (that would hand the stage a tensor it must not modify: a
  // checkpoint input), and only before a child with data ops. A child may
  // start with auxiliary ops of its own (a traced seq-first attention
  // computes its shape scalars first): they go with it. In-place updates of
  // buffers (batch norm's counter) do not matter.
  bool CutAllowedBeforeChild(const Segment& child) const {
    if (no_cut_[static_cast<size_t>(child.first)]) return false;
    for (int op = child.first; op <= child.last; ++op) {
      if (data_op_[static_cast<size_t>(op)]) return true;
    }
    return false;
  }

  StageCut MakeStage(int first, int last) const {
    StageCut stage{first, last, "", {}};
    // Modules covered: the distinct paths at the finest level that is whole
    // within the stage, in order.
    int first_data = first, last_data = last;
    while (first_data < last && !data_op_[static_cast<size_t>(first_data)]) ++first_data;
    while (last_data > first_data && !data_op_[static_cast<size_t>(last_data)]) --last_data;
    std::vector<std::string> prefix = paths_[static_cast<size_t>(first_data)];
    bool same_module = true;
    for (int op = first_data; op <= last_data; ++op) {
      const auto& parts = paths_[static_cast<size_t>(op)];
      if (data_op_[static_cast<size_t>(op)] && parts != paths_[static_cast<size_t>(first_data)]) same_module = false;
      size_t common = 0;
      while (common < prefix.size() && common < parts.size() && prefix[common] == parts[common]) ++common;
      prefix.resize(common);
    }
    if (!prefix.empty() && !same_module) {
      // Ops from several modules under one parent: name the range.
      const auto& a = paths_[static_cast<size_t>(first_data)];
      const auto& b = paths_[static_cast<size_t>(last_data)];
      bool whole_parent = true;
      for (size_t op = 0; op < paths_.size() && whole_parent; ++op) {
        if (static_cast<int>(op) >= first && static_cast<int>(op) <= last) continue;
        const auto& parts = paths_[op];
        if (parts.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), parts.begin())) whole_parent = false;
      }
      if (!whole_parent) {
        stage.name = Join(a, a.size()) + ".." + Join(b, b.size());
        for (int op = first; op <= last; ++op) {
          const auto& parts = paths_[static_cast<size_t>(op)];
          if (parts.size() > prefix.size()) {
            std::string child = Join(parts, prefix.size() + 1);
            if (stage.modules.empty() || stage.modules.back() != child) stage.modules.push_back(child);
          }
        }
        return stage;
      }
    }
    if (!prefix.empty()) {
      stage.name = Join(prefix, prefix.size());
      // Whole module only if no op outside the stage belongs to it.
      bool whole = true;
      for (size_t op = 0; op < paths_.size() && whole; ++op) {
        if (static_cast<int>(op) >= first && static_cast<int>(op) <= last) continue;
        const auto& parts = paths_[op];
        if (parts.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), parts.begin())) whole = false;
      }
      if (whole) stage.modules.push_back(stage.name);
    } else {
      for (int op = first; op <= last; ++op) {
        const auto& parts = paths_[static_cast<size_t>(op)];
        std::string top = parts.empty() ? std::string() : parts[0];
        if (!top.empty() && (stage.modules.empty() || stage.modules.back() != top)) stage.modules.push_back(top);
      }
      std::string first_name = paths_[static_cast<size_t>(first)].empty() ? profile_.ops[static_cast<size_t>(first)].kind
                                                                          : Join(paths_[static_cast<size_t>(first)], 1);
      std::string last_name = paths_[static_cast<size_t>(last)].empty() ? profile_.ops[static_cast<size_t>(last)].kind
                                                                        : Join(paths_[static_cast<size_t>(last)], 1);
      stage.name = first_name == last_name ? first_name : first_name + ".." + last_name;
    }
    return stage;
  }

  const Profile& profile_;
  const Liveness& liveness_;
  std::vector<std::vector<std::string>> paths_;
  std::vector<bool> data_op_;
  std::set<int> storage_kept_;
  std::vector<bool> no_cut_;  // by position: a later op writes in place into a storage crossing it
  std::vector<int> cuts_;
};

}  // namespace

CutLoad CutLoadAt(const Profile& profile, int position) {
  Liveness liveness(profile);
  std::set<int> crossing = liveness.Crossing(position);
  return {liveness.Bytes(crossing), static_cast<int>(crossing.size())};
}

std::vector<StageCut> CutStages(const Profile& profile) {
  if (profile.ops.empty()) throw BadInput("profile has no ops");
  Liveness liveness(profile);
  return Cutter(profile, liveness).Run();
}

BackwardReplay ReplayBackward(const Profile& profile, int first_op, int last_op,
                              const std::vector<int64_t>* held_after) {
  BackwardReplay replay;
  int64_t extra = 0, held = 0;
  std::set<int> grads;
  for (int op = last_op; op >= first_op; --op) {
    const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
    int64_t input_grads = 0;
    for (int t : rec.inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (in.requires_grad && in.producer < first_op && grads.insert(t).second) input_grads += in.nbytes;
    }
    replay.peak_bytes = std::max(replay.peak_bytes, extra + rec.bwd_tmp_bytes - input_grads);
    replay.peak_with_held_bytes = std::max(replay.peak_with_held_bytes, extra + rec.bwd_tmp_bytes - input_grads + held);
    if (held_after != nullptr) held += (*held_after)[static_cast<size_t>(op)];  // in its own transient, then held
    for (int t : rec.outputs) {
      if (grads.erase(t)) extra -= profile.tensors[static_cast<size_t>(t)].nbytes;
    }
    for (int t : rec.inputs) {
      const TensorRecord& in = profile.tensors[static_cast<size_t>(t)];
      if (in.requires_grad && in.producer >= first_op && grads.insert(t).second) extra += in.nbytes;
    }
    extra -= rec.saved_bytes;
  }
  return replay;
}

Chain ChainFromProfile(const Profile& profile) {
  if (profile.ops.empty()) throw BadInput("profile has no ops");
  Liveness liveness(profile);
  std::vector<StageCut> cuts = Cutter(profile, liveness).Run();
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
    stage.first_op = cut.first_op;
    stage.last_op = cut.last_op;
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
      nograd_ms += rec.fwd_nograd_ms;
      nograd_known = nograd_known && rec.fwd_nograd_ms >= 0;
      saved += rec.saved_bytes;
    }
    if (nograd_known) stage.fwd_nograd_ms = nograd_ms;  // else unknown: fwd_ms stands for it
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
      stage.saved_bytes = std::max(stage.saved_bytes, stage.private_saved_bytes + made);
    }

    // Transient peaks, replaying the stage's tensors' lifetimes: without
    // autograd storages die at their last use in the stage; with autograd
    // the kept ones stay.
    int64_t peak_above_out = 0;
    int64_t bwd_tmp = 0;
    std::map<int, int64_t> live_nograd, live_grad;
    for (int op = cut.first_op; op <= cut.last_op; ++op) {
      const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
      for (int t : rec.outputs) {
        int s = profile.tensors[static_cast<size_t>(t)].storage;
        if (liveness.StorageProducer(s) != op) continue;  // in place or a view
        live_nograd[s] = liveness.StorageBytes(s);
        live_grad[s] = liveness.StorageBytes(s);
      }
      int64_t sum_nograd = 0, sum_grad = 0;
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
  // the autograd engine, gradients accumulated into the parameters); from
  // the step timed whole where the profile has it, else from the timed
  // forward and backward.
  double ops_fwd = 0, ops_bwd = 0;
  for (const OpRecord& rec : profile.ops) {
    ops_fwd += rec.fwd_ms;
    ops_bwd += rec.bwd_ms;
  }
  chain.loss_bwd_ms = profile.totals.step_ms >= 0
                          ? std::max(0.0, profile.totals.step_ms - ops_fwd - ops_bwd)
                          : std::max(0.0, profile.totals.fwd_ms - ops_fwd) + std::max(0.0, profile.totals.bwd_ms - ops_bwd);
  chain.loss_bwd_tmp_bytes = 0;
  return chain;
}

}  // namespace ckplan
