#include "planner/cost/wrappable_modules.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>

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
    if (!s.ops) return WrappableModules(chain, nullptr);
    starts[s.ops->first] = i;
    ends[s.ops->last] = i;
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
  const std::set<std::string, std::less<>> containers(profile->model.containers.begin(),
                                                      profile->model.containers.end());
  // Ops no gradient flows through (every output without requires_grad: a
  // frozen prefix, whose input needs no gradient): a module of such ops has
  // nothing for backward, so wrapping it would recompute nothing and save
  // nothing.
  // A profile that records no tensor requiring grad (written by hand) says nothing of it.
  bool recorded = false;
  for (const TensorRecord& t : profile->tensors) recorded = recorded || t.requires_grad;
  std::vector<int> differentiable_before(profile->ops.size() + 1, 0);  // prefix counts
  for (const OpRecord& op : profile->ops) {
    bool differentiable = false;
    for (int id : op.outputs) {
      differentiable = differentiable || (id >= 0 && id < static_cast<int>(profile->tensors.size()) &&
                                          profile->tensors[static_cast<size_t>(id)].requires_grad);
    }
    const size_t k = static_cast<size_t>(op.id);
    if (k < profile->ops.size()) differentiable_before[k + 1] = differentiable_before[k] + (differentiable ? 1 : 0);
  }
  std::map<std::pair<int, int>, std::string_view> by_range;
  for (const Span& span : spans) {
    if (span.count == 0 || span.last - span.first + 1 != span.count) continue;  // not one contiguous run
    if (containers.count(span.path) != 0) continue;
    if (recorded && static_cast<size_t>(span.last) < profile->ops.size() &&
        differentiable_before[static_cast<size_t>(span.last) + 1] == differentiable_before[static_cast<size_t>(span.first)]) {
      continue;  // nothing to recompute for backward
    }
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

}  // namespace ckplan
