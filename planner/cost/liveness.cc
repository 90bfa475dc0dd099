#include "planner/cost/liveness.h"

#include <algorithm>

namespace ckplan {

Liveness::Liveness(const Profile& p) {
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

std::set<int> Liveness::Crossing(int position) const {
  std::set<int> storages;
  for (const auto& [storage, producer] : storage_producer_) {
    if (producer < 0 || producer >= position) continue;
    if (storage_last_use_.at(storage) >= position) storages.insert(storage);
  }
  return storages;
}

int64_t Liveness::Bytes(const std::set<int>& storages) const {
  int64_t total = 0;
  for (int s : storages) total += storage_bytes_.at(s);
  return total;
}

CutLoad CutLoadAt(const Profile& profile, int position) {
  Liveness liveness(profile);
  std::set<int> crossing = liveness.Crossing(position);
  return {liveness.Bytes(crossing), static_cast<int>(crossing.size())};
}

}  // namespace ckplan
