#pragma once
/// From a profile's op graph to a chain of stages, cut along the module tree.
///
/// The top-level module is split at its children; a child module is split
/// further at its own children only when that adds no live tensor at the
/// cuts (a plain chain of blocks is split, a residual block is not). A cut
/// carries every tensor live across it (skip connections included, each
/// storage once) and never falls just before an op that writes in place.

#include <string>
#include <vector>

#include "planner/contracts/chain.h"
#include "planner/contracts/profile.h"

namespace ckplan {

/// Op ranges [first, last] of the stages, in order, covering every op.
struct StageCut {
  int first_op;
  int last_op;
  std::string name;                  ///< `layer1.0`, or `conv1..maxpool`
  std::vector<std::string> modules;  ///< module paths the stage covers (whole modules)
};

std::vector<StageCut> CutStages(const Profile& profile);

/// The chain for a profile: per stage, times summed over its ops, output
/// bytes at its cut, saved bytes (what its ops keep for backward, plus its
/// output), transient peaks from the ops' tensors' lifetimes. The chain is
/// checked as a chain file is (ValidateChain) before it is returned: throws
/// BadInput naming `file` (the profile's, for messages) and the field.
Chain ChainFromProfile(const Profile& profile, const std::string& file = "profile");

/// Live storages crossing the cut just before op `position` (1..N-1), model
/// inputs excluded: their total bytes and count.
struct CutLoad {
  int64_t bytes = 0;
  int tensors = 0;
};
CutLoad CutLoadAt(const Profile& profile, int position);

/// The backward of ops [first_op, last_op], replayed op by op in reverse:
/// each op's measured transient on top of the gradients alive at that
/// point, less the saved tensors already released (gradients of the range's
/// inputs left out). `peak_bytes` is the largest such figure (may be
/// negative); with `held_after` (bytes each op's backward leaves held, by op
/// id), `peak_with_held_bytes` adds what the ops already back-propagated hold.
struct BackwardReplay {
  int64_t peak_bytes = 0;
  int64_t peak_with_held_bytes = 0;
};
BackwardReplay ReplayBackward(const Profile& profile, int first_op, int last_op,
                              const std::vector<int64_t>* held_after = nullptr);

}  // namespace ckplan
