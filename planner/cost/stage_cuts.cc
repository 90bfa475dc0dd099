// Cutting and naming: a profile's ops cut into stages along the module tree.

#include "planner/cost/stage_cuts.h"

#include <algorithm>
#include <map>
#include <set>

#include "planner/base/dtype.h"
#include "planner/base/error.h"

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
    for (size_t op = 0; op < p.ops.size(); ++op) {
      for (int t : p.ops[op].inputs) {
        std::vector<int>& readers = readers_[p.tensors[static_cast<size_t>(t)].storage];
        if (readers.empty() || readers.back() != static_cast<int>(op)) readers.push_back(static_cast<int>(op));
      }
    }
    // Ops on the data path: those that read a model input or what such an
    // op made. The others (positions from arange, batch norm's counter)
    // are auxiliary and never start a stage. An input that is not floating
    // point (ids, an attention mask, labels), and what ops make of it that
    // requires no gradient (ids reshaped, a mask cast), starts the data path
    // only through an op whose output requires one (an embedding): the
    // causal mask made from an attention mask is auxiliary, as the one made
    // from positions is.
    std::vector<bool> data_tensor(p.tensors.size(), false);
    index_tensor_.assign(p.tensors.size(), false);
    for (int t : p.inputs) {
      const Dtype* dtype = FindLibTorchDtype(p.tensors[static_cast<size_t>(t)].dtype);
      const bool floating = dtype != nullptr && dtype->floating;
      (floating ? data_tensor : index_tensor_)[static_cast<size_t>(t)] = true;
    }
    for (const OpRecord& op : p.ops) {
      bool data = false, reads_index = false, makes_grad = false;
      for (int t : op.inputs) {
        data = data || data_tensor[static_cast<size_t>(t)];
        reads_index = reads_index || index_tensor_[static_cast<size_t>(t)];
      }
      for (int t : op.outputs) makes_grad = makes_grad || p.tensors[static_cast<size_t>(t)].requires_grad;
      data = data || (reads_index && makes_grad);
      data_op_.push_back(data);
      for (int t : op.outputs) {
        if (data) data_tensor[static_cast<size_t>(t)] = true;
        if (!data && reads_index) index_tensor_[static_cast<size_t>(t)] = true;
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
    // A stage of auxiliary ops alone joins a neighbour: the next one when
    // its ops are inside the module the next stage's data path starts in
    // (a block's own mask), else the previous one, so that the next stage
    // is still exactly its module's ops (DeBERTa-v2's encoder makes its mask
    // before layer.0: joined to layer.0's stage, no plan could wrap layer.0).
    std::vector<int> kept;
    int stage_first = 0;
    for (int position : cuts_) {
      bool has_data = false;
      for (int op = stage_first; op < position; ++op) has_data = has_data || data_op_[static_cast<size_t>(op)];
      if (has_data) {
        kept.push_back(position);
        stage_first = position;
      } else if (!kept.empty() && kept.back() == stage_first && !InsideNextDataModule(stage_first, position)) {
        kept.back() = position;
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
  // Whether every op in [first, end) is in the module of the first data op
  // from `end` on (or in one inside it); false when there is none.
  bool InsideNextDataModule(int first, int end) const {
    const int n = static_cast<int>(profile_.ops.size());
    int next = end;
    while (next < n && !data_op_[static_cast<size_t>(next)]) ++next;
    if (next >= n) return false;
    const std::string& module = profile_.ops[static_cast<size_t>(next)].module;
    for (int op = first; op < end; ++op) {
      const std::string& path = profile_.ops[static_cast<size_t>(op)].module;
      const bool inside = path == module || (path.size() > module.size() && path.compare(0, module.size(), module) == 0 &&
                                             path[module.size()] == '.');
      if (!inside) return false;
    }
    return true;
  }

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

  // Of the data storages crossing the cut before children[c], those the
  // segment's module makes itself (an op of its own, in no child) and that
  // only the segment reads, two or more of its child modules among the
  // readers: handed by the module to several of its blocks.
  int BroadcastCount(const Segment& segment, const std::vector<Segment>& children, size_t c) const {
    const int position = children[c].first;
    int count = 0;
    for (int storage : liveness_.Crossing(position)) {
      const int producer = liveness_.StorageProducer(storage);
      // Made by the module's own code, outside its children.
      if (producer < segment.first || !data_op_[static_cast<size_t>(producer)] ||
          !Key(producer, segment.depth).empty()) {
        continue;
      }
      auto readers = readers_.find(storage);
      if (readers == readers_.end()) continue;
      std::set<size_t> reading;
      bool inside = true;
      for (int op : readers->second) {
        if (op > segment.last) {
          inside = false;
          break;
        }
        if (op < segment.first) continue;
        size_t k = 0;
        while (k + 1 < children.size() && children[k].last < op) ++k;
        if (!Key(children[k].first, segment.depth).empty()) reading.insert(k);  // a child module, not an op
      }
      if (inside && reading.size() >= 2) ++count;
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

  // The storages of the model inputs the segment's ops read, and of what
  // ops made of integer inputs before it without gradients (a decoder's
  // input ids shifted from the labels), where it does not start the model
  // (CrossingCount and CrossingBytes count the inputs there).
  std::set<int> InputsRead(const Segment& segment) const {
    std::set<int> storages;
    if (segment.first <= 0) return storages;
    std::set<int> inputs(profile_.inputs.begin(), profile_.inputs.end());
    for (int op = segment.first; op <= segment.last; ++op) {
      for (int t : profile_.ops[static_cast<size_t>(op)].inputs) {
        const TensorRecord& tensor = profile_.tensors[static_cast<size_t>(t)];
        const bool made_before = index_tensor_[static_cast<size_t>(t)] && tensor.producer < segment.first;
        if (inputs.count(t) != 0 || made_before) storages.insert(tensor.storage);
      }
    }
    return storages;
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
      std::vector<bool> allowed(children.size(), true);
      if (!is_root) {
        // Its start carries too the model inputs its first child reads (the
        // decoder of an encoder-decoder: the decoder's input ids, embedded
        // first, beside the encoder's output), which no cut counts: the
        // caller holds them anyway.
        const std::set<int> inputs = InputsRead(children.front());
        const int own = std::max(CrossingCount(segment.first) + static_cast<int>(inputs.size()),
                                 CrossingCount(segment.last + 1));
        bool adds_live = false;
        for (size_t c = 1; c < children.size() && !adds_live; ++c) {
          adds_live = CrossingCount(children[c].first) > own;
        }
        if (adds_live) {
          int64_t input_bytes = 0;
          for (int storage : inputs) input_bytes += liveness_.StorageBytes(storage);
          const int64_t own_bytes =
              std::max(CrossingBytes(segment.first) + input_bytes, CrossingBytes(segment.last + 1));
          adds_live = false;
          for (size_t c = 1; c < children.size() && !adds_live; ++c) {
            adds_live = CrossingBytes(children[c].first) > own_bytes;
          }
          by_bytes = !adds_live;
        }
        // What a module makes before its blocks and hands to several of
        // them (Gemma 4's per-layer inputs, read by every decoder layer)
        // crosses every cut between those blocks alike, as a causal mask
        // does: it does not count against cutting between them. Cut there,
        // where nothing else adds to what crosses.
        if (adds_live) {
          bool broadcast = false;
          for (size_t c = 1; c < children.size(); ++c) {
            const int shared = BroadcastCount(segment, children, c);
            allowed[c] = CrossingCount(children[c].first) - shared <= own;
            broadcast = broadcast || (shared > 0 && allowed[c]);
          }
          if (!broadcast) continue;
        }
      }
      for (size_t c = 1; c < children.size(); ++c) {
        if (allowed[c] && CutAllowedBeforeChild(children[c])) cuts_.push_back(children[c].first);
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
  std::vector<bool> index_tensor_;  // by tensor: an integer input, or made of one without gradients
  std::set<int> storage_kept_;
  std::map<int, std::vector<int>> readers_;  // by storage: the ops that read it, in order
  std::vector<bool> no_cut_;  // by position: a later op writes in place into a storage crossing it
  std::vector<int> cuts_;
};

}  // namespace

std::vector<StageCut> CutStages(const Profile& profile) {
  if (profile.ops.empty()) throw BadInput("profile has no ops");
  Liveness liveness(profile);
  return CutStages(profile, liveness);
}

std::vector<StageCut> CutStages(const Profile& profile, const Liveness& liveness) {
  return Cutter(profile, liveness).Run();
}

}  // namespace ckplan
