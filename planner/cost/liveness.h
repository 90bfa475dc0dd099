#pragma once
/// Liveness of a profile's op graph (the stage cuts, the chain's costs and
/// its gradients read it): for each tensor its last consumer (N for a model
/// output), and for each cut position the storages crossing it.

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "planner/contracts/profile.h"

namespace ckplan {

class Liveness {
 public:
  explicit Liveness(const Profile& p);

  // Storages produced before `position` (not model inputs) used at or after it.
  std::set<int> Crossing(int position) const;

  int64_t Bytes(const std::set<int>& storages) const;

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

/// Live storages crossing the cut just before op `position` (1..N-1), model
/// inputs excluded: their total bytes and count.
struct CutLoad {
  int64_t bytes = 0;
  int tensors = 0;
};
CutLoad CutLoadAt(const Profile& profile, int position);

}  // namespace ckplan
