#include "planner/solvers/modules.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string_view>

#include "planner/base/error.h"

namespace ckplan {

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
int64_t LossScalarBytes(ModuleAccounting accounting, const Chain& chain) {
  // Counted for a chain cut from a profile (one that counts what checkpoint
  // keeps beyond tensors): two float32 scalars.
  constexpr int64_t kLossScalarBytes = 8;
  return accounting == ModuleAccounting::kPyTorch && chain.pytorch.checkpoint_state_bytes > 0 ? kLossScalarBytes : 0;
}

// PyTorch's accounting: the model's output, which the training loop holds
// from the loss to the step's end (Chain::output_held_bytes).
int64_t OutputHeldBytes(ModuleAccounting accounting, const Chain& chain) {
  return accounting == ModuleAccounting::kPyTorch ? chain.output_held_bytes : 0;
}

// One step of the frontier walk: stage `first` run normally (wrapped < 0),
// or module `wrapped` (stages first..last). `need` is the largest memory it
// needs above what is held at its first stage's boundary, over its forward
// and its backward; `held` what it adds to the held memory.
struct FrontierStep {
  int first, last, wrapped;
  int64_t need, held;
  double time_ms;
  // PyTorch accounting: what its input holds that no op saves, alive while
  // the unit starts (and held by a wrapped module), on top of `need_input`:
  // its own storages, and those live across several cuts (bits: counted
  // once, however many wrapped modules hold them).
  int64_t need_input = 0, input_own = 0;
  uint32_t input_bits = 0;
  // Selective checkpointing: the shared storages (bits) its saved ops hold
  // (its output, held again as the next wrapped module's input), in `held`.
  uint32_t cache_bits = 0;
};

struct FrontierSteps {
  std::vector<std::vector<FrontierStep>> by_stage;
  std::vector<int64_t> bit_bytes;
};

// The storages of each cut (k = 0..L: the input of stage k, then the chain
// output) and each stage's own saved bytes, as the simulator counts them:
// with storages, each once; without, cut k is one value of x_k.
struct CutStorages {
  std::vector<std::vector<std::pair<int64_t, int64_t>>> storages;
  std::vector<int64_t> own_saved;
  std::set<int64_t> kept;  // PyTorch accounting: storages some op saves, and the model's inputs and outputs
};

CutStorages CutStoragesOf(const Chain& chain) {
  CutStorages cuts;
  const int length = chain.length();
  if (chain.has_storages()) {
    cuts.storages.push_back(chain.input_storages);
    for (const Stage& s : chain.stages) {
      cuts.storages.push_back(s.out_storages);
      cuts.own_saved.push_back(*s.private_saved_bytes);
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
// Per stage, the bytes CallInputsHeld's comment in FrontierStepsOf says:
// for each module of PyTorchModuleCosts::module_call_storages, its stages are those whose
// modules are it or inside it; in each of them after its first, its call
// storages that are not kept and not in the stage's input cut, each once.
std::vector<int64_t> CallInputsHeld(const Chain& chain, const CutStorages& cuts) {
  const int length = chain.length();
  std::vector<int64_t> held(static_cast<size_t>(length), 0);
  std::vector<std::set<int64_t>> counted(static_cast<size_t>(length));
  for (const auto& [path, storages] : chain.pytorch.module_call_storages) {
    int first = -1, last = -1;
    for (int i = 0; i < length; ++i) {
      for (const std::string& m : chain.stages[static_cast<size_t>(i)].modules) {
        if (m == path || (m.size() > path.size() && m.compare(0, path.size(), path) == 0 && m[path.size()] == '.')) {
          if (first < 0) first = i;
          last = i;
        }
      }
    }
    for (int i = first + 1; first >= 0 && i <= last; ++i) {
      const std::set<int64_t> input = Ids(cuts.storages[static_cast<size_t>(i)]);
      for (const auto& [id, bytes] : storages) {
        if (cuts.kept.count(id) != 0 || input.count(id) != 0) continue;
        if (counted[static_cast<size_t>(i)].insert(id).second) held[static_cast<size_t>(i)] += bytes;
      }
    }
  }
  return held;
}

FrontierSteps FrontierStepsOf(const Chain& chain, const std::vector<WrappableModule>& modules, ModuleAccounting accounting) {
  const int length = chain.length();
  // Parameter gradients (PyTorch allocates them in backward): grads_from[k],
  // those of stages k..L-1; in_bwd[k], held at stage k's backward peak on top
  // of its bwd_tmp_bytes: those of the stages after it and its own already made.
  std::vector<int64_t> grads_from(static_cast<size_t>(length) + 1, 0), in_bwd(static_cast<size_t>(length), 0);
  for (int k = length - 1; k >= 0; --k) {
    const size_t at = static_cast<size_t>(k);
    grads_from[at] = grads_from[at + 1] + chain.stages[at].param_grad_bytes;
    in_bwd[at] = grads_from[at + 1] + chain.GradsAtBackwardPeakBytes(k);
  }
  CutStorages cuts = CutStoragesOf(chain);
  if (accounting == ModuleAccounting::kSimulator) {
    for (const auto& c : cuts.storages) {
      for (const auto& entry : c) cuts.kept.insert(entry.first);
    }
  }
  // Storages no op saves that cross several cuts (a mask, rotary tables):
  // a bit each (beyond 30, counted as kept: more, never less).
  FrontierSteps result;
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
  // The tensors a module is called with that cross no cut into it (its ops
  // never read them: a decoder layer's position ids), held as its input
  // when it is wrapped: a bit each too, shared by every module called with
  // them (beyond 30 bits, counted per module: more, never less).
  std::vector<uint32_t> call_bits(modules.size(), 0);
  std::vector<int64_t> call_own(modules.size(), 0);
  if (accounting == ModuleAccounting::kPyTorch) {
    for (size_t m = 0; m < modules.size(); ++m) {
      auto found = chain.pytorch.module_call_storages.find(modules[m].path);
      if (found == chain.pytorch.module_call_storages.end() || modules[m].first_stage < 0 ||
          modules[m].first_stage > length) {
        continue;
      }
      const std::set<int64_t> input = Ids(cuts.storages[static_cast<size_t>(modules[m].first_stage)]);
      for (const auto& [id, bytes] : found->second) {
        if (input.count(id) != 0 || cuts.kept.count(id) != 0) continue;
        auto bit = bit_of.find(id);
        if (bit == bit_of.end()) {
          if (result.bit_bytes.size() >= 30) {
            call_own[m] += bytes;
            continue;
          }
          bit = bit_of.emplace(id, static_cast<int>(result.bit_bytes.size())).first;
          result.bit_bytes.push_back(bytes);
        }
        call_bits[m] |= 1u << bit->second;
      }
    }
  }
  // Selective checkpointing: a storage a module may save at its output cut
  // that no op saves (its last op's output) is held as the next wrapped
  // module's input too: a bit, counted once (beyond 30, counted by each).
  for (const WrappableModule& module : modules) {
    if (module.sac_candidates.empty() || module.last_stage + 1 > length) continue;
    std::set<int64_t> at_output;
    for (const auto& entry : cuts.storages[static_cast<size_t>(module.last_stage) + 1]) at_output.insert(entry.first);
    for (const SacCandidate& c : module.sac_candidates) {
      for (const auto& [id, bytes] : c.storages) {
        if (at_output.count(id) == 0 || cuts.kept.count(id) != 0 || bit_of.count(id) != 0) continue;
        if (result.bit_bytes.size() >= 30) continue;
        bit_of[id] = static_cast<int>(result.bit_bytes.size());
        result.bit_bytes.push_back(bytes);
      }
    }
  }
  // What its ops keep that checkpoint cannot drop (the Python numbers mul
  // and div save): held from its forward on, as its inputs are; in its
  // recomputation and backward its stages' own saved bytes count them (the
  // recomputed ones die with the recomputation's graph).
  std::vector<int64_t> numbers_held(modules.size(), 0);
  if (accounting == ModuleAccounting::kPyTorch) {
    for (size_t m = 0; m < modules.size(); ++m) {
      auto held = chain.pytorch.module_held_bytes.find(modules[m].path);
      if (held != chain.pytorch.module_held_bytes.end()) numbers_held[m] = held->second;
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
  // where known (StageGradients::pytorch_bwd_peak_bytes), else both its boundary
  // gradients and its transient at their maxima over the stage.
  // From the loss on: its scalars and the model's output held by the caller.
  const int64_t loss_held = LossScalarBytes(accounting, chain) + OutputHeldBytes(accounting, chain);
  // The outputs an op saves, held by the loop once that op's stage has
  // released them: through the backward of every stage before it, and
  // beside their recomputed copy where that stage is wrapped.
  auto loop_kept = [&](int k, bool wrapped) -> int64_t {
    if (accounting != ModuleAccounting::kPyTorch || !chain.output_kept_stage) return 0;
    return k < *chain.output_kept_stage || (wrapped && k == *chain.output_kept_stage) ? chain.output_kept_bytes : 0;
  };
  auto backward = [&](int k, bool wrapped) {
    const size_t at = static_cast<size_t>(k);
    const int64_t held = loss_held + loop_kept(k, wrapped);
    if (chain.stages[at].pytorch_bwd_peak_bytes) {
      return held + grads_from[at + 1] + *chain.stages[at].pytorch_bwd_peak_bytes;
    }
    const Stage& s = chain.stages[at];
    return held + grad(k + 1) + grad(k) + s.bwd_tmp_bytes + in_bwd[at];
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
  // Eager PyTorch holds the tensors a module is called with until it returns
  // (the caller's variable, the module's argument), where a graph frees them
  // at their last reader: a frozen ResNet's layer4 holds layer3's output
  // through layer4.1. Per stage, those of every module around it called in
  // an earlier stage that no op saves and no cut into the stage carries:
  // held through its forward when it runs unwrapped.
  const std::vector<int64_t> call_held =
      accounting == ModuleAccounting::kPyTorch ? CallInputsHeld(chain, cuts) : std::vector<int64_t>(length, 0);
  std::vector<std::vector<FrontierStep>> units(static_cast<size_t>(length));
  for (int i = 0; i < length; ++i) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    const int64_t own = cuts.own_saved[static_cast<size_t>(i)], out = fresh[static_cast<size_t>(i)];
    const int64_t kept = own + kept_fresh[static_cast<size_t>(i)];
    FrontierStep unit{i, i, -1, kept + backward(i, false), kept, s.fwd_ms + s.bwd_ms};
    unit.need_input = std::max(own + out, out + s.fwd_tmp_bytes);
    // A stage that is one whole module: eager PyTorch holds at least what its
    // forward held there (a Python local kept until the module returns, as
    // a block's input is through its downsample and its add, where a graph
    // frees it at its last reader). It decides the peak where nothing is
    // saved for backward (a frozen backbone).
    if (accounting == ModuleAccounting::kPyTorch && s.modules.size() == 1 && s.modules[0] == s.name) {
      auto eager = chain.pytorch.module_eager_peak_bytes.find(s.name);
      if (eager != chain.pytorch.module_eager_peak_bytes.end()) unit.need_input = std::max(unit.need_input, eager->second);
    }
    unit.need_input += call_held[static_cast<size_t>(i)];
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
    // Selective checkpointing: what its saved ops hold from its forward to
    // their place in its recomputation, per stage (storages its input or its
    // kept output hold anyway counted there), and the reruns they spare.
    std::vector<int64_t> cached(static_cast<size_t>(b - a + 1), 0);
    int64_t cached_total = 0;
    uint32_t cache_bits = 0;
    {
      std::set<int64_t> counted = input;
      for (const auto& entry : cut(b + 1)) {
        if (cuts.kept.count(entry.first) != 0) counted.insert(entry.first);
      }
      for (int i : modules[m].sac_saved) {
        const SacCandidate& c = modules[m].sac_candidates[static_cast<size_t>(i)];
        for (const auto& [id, bytes] : c.storages) {
          if (!counted.insert(id).second) continue;
          cached[static_cast<size_t>(c.stage - a)] += bytes;
          cached_total += bytes;
          auto bit = bit_of.find(id);
          if (bit != bit_of.end()) cache_bits |= 1u << bit->second;
        }
        time -= c.recompute_ms;
      }
      // The policy's dispatch mode, once it saves anything (a module that
      // saves nothing is wrapped plainly).
      if (!modules[m].sac_saved.empty()) time += modules[m].sac_dispatch_ms;
    }
    int64_t cached_before = 0;  // saved by the stages so far (forward) / not yet reached (recomputation)
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
      cached_before += cached[static_cast<size_t>(k - a)];
      need = std::max(need, inner + NewBytes(cut(k + 1), held) + s.fwd_tmp_bytes + cached_before);
      inner = NewBytes(cut(k + 1), input);
      time += s.ModuleNoGradFwdMs() + s.fwd_ms + s.bwd_ms;  // the first forward without autograd, the rerun with it
    }
    need += numbers_held[m];  // all of them made by its forward's end
    time += chain.pytorch.checkpoint_call_ms;  // the wrap's own: its autograd function, its nested backward
    // It holds its input (what no op saves too: added as the frontier
    // walks, the bits once), and its output as kept.
    const int64_t adds = kept_bytes(cut(b + 1), input, true);
    // Backward: the gradient of its output held, recomputed with autograd,
    // then back-propagated stage by stage.
    // torch.utils.checkpoint reruns it inside torch.random.fork_rng, which
    // holds a copy of the RNG state it restores afterwards.
    const int64_t forked = accounting == ModuleAccounting::kPyTorch ? chain.pytorch.checkpoint_state_bytes : 0;
    // The recomputation runs with autograd. In PyTorch's accounting what
    // its ops save stays to their backward, and a value no op saves lives
    // to its last reader in the module (a residual crossing several of its
    // stages), then is freed, as eager frees it, the module's output
    // included (checkpoint keeps none of its recomputed outputs). The
    // simulator's (ckplan run's executor) holds each stage's output.
    const bool as_pytorch = accounting == ModuleAccounting::kPyTorch;
    int64_t kept = 0;
    std::vector<int64_t> kept_after(static_cast<size_t>(b - a + 1));
    for (int k = a; k <= b; ++k) {
      const Stage& s = chain.stages[static_cast<size_t>(k)];
      const int64_t own = cuts.own_saved[static_cast<size_t>(k)], out = fresh[static_cast<size_t>(k)];
      const int64_t carried = as_pytorch && k > a ? kept_bytes(cut(k), input, false) : 0;  // made inside, saved by no op
      cached_before -= cached[static_cast<size_t>(k - a)];  // what the stages after it saved, still held
      need = std::max(need, loss_held + loop_kept(b, true) + grad(b + 1) + grads_from[static_cast<size_t>(b) + 1] +
                                kept + carried + forked + cached_before +
                                std::max(own + out, out + s.fwd_tmp_bytes));
      kept += own + (as_pytorch ? kept_fresh[static_cast<size_t>(k)] : out);
      kept_after[static_cast<size_t>(k - a)] = kept;
    }
    // Eager PyTorch may hold more in it than the graph does: a Python
    // local kept until the module returns (a graph frees it at its last
    // reader); measured on the eager model where known.
    if (accounting == ModuleAccounting::kPyTorch) {
      auto eager = chain.pytorch.module_eager_peak_bytes.find(modules[m].path);
      if (eager != chain.pytorch.module_eager_peak_bytes.end()) {
        need = std::max(need, loss_held + loop_kept(b, true) + grad(b + 1) + grads_from[static_cast<size_t>(b) + 1] + forked + eager->second);
      }
    }
    for (int k = b; k >= a; --k) {
      need = std::max(need, kept_after[static_cast<size_t>(k - a)] + backward(k, true));
    }
    // What checkpoint keeps beyond tensors (the RNG state), from its
    // forward to the end of its backward.
    need += chain.pytorch.checkpoint_state_bytes + call_own[m];
    FrontierStep unit{a, b, static_cast<int>(m), 0,
                      adds + chain.pytorch.checkpoint_state_bytes + call_own[m] + numbers_held[m] + cached_total, time};
    unit.need_input = need;
    unit.input_own = loose[static_cast<size_t>(a)];
    unit.input_bits = bits_at(a) | call_bits[m];
    unit.cache_bits = cache_bits;
    units[static_cast<size_t>(a)].push_back(unit);
  }
  result.by_stage = std::move(units);
  return result;
}

// The step's end: the inputs and every parameter gradient held, the
// optimizer's update running (its temporary, Chain::update_tmp_bytes), the
// activations gone.
// In PyTorch's accounting the training loop still holds the model's output
// and the loss (a float32 scalar: the gradient it started from is gone).
int64_t StepEndBytes(const Chain& chain, int64_t input_bytes, ModuleAccounting accounting) {
  const int64_t kept = accounting == ModuleAccounting::kPyTorch ? chain.output_kept_bytes : 0;
  return input_bytes + chain.update_tmp_bytes + chain.ParamGradBytes() + OutputHeldBytes(accounting, chain) + kept +
         LossScalarBytes(accounting, chain) / 2;
}

struct FrontierState {
  uint32_t bits;  // the storages of FrontierSteps::bit_bytes held by a wrapped module
  int64_t held;
  double time_ms;
  int first;  // the unit's first stage (its first boundary)
  int from;   // index in that boundary's frontier
  int unit;   // index in units[first]
  int64_t peak = 0;  // the most any unit on the way needed (the chain input included)
};

// Times that differ by no more than summing the same figures in another
// order does: the same time (identical layers timed alike, wrapped in
// another order).
bool SameTime(double a, double b) { return std::fabs(a - b) <= 1e-9 * std::max(std::fabs(a), std::fabs(b)); }

// The modules a state's path wraps, (first stage, last stage) in stage
// order, read back through the frontiers before it.
std::vector<std::pair<int, int>> PathWraps(const std::vector<std::vector<FrontierState>>& frontier,
                                           const std::vector<std::vector<FrontierStep>>& units,
                                           const FrontierState& end) {
  std::vector<std::pair<int, int>> wraps;
  for (const FrontierState* state = &end; state->first >= 0;) {
    const FrontierStep& unit = units[static_cast<size_t>(state->first)][static_cast<size_t>(state->unit)];
    if (unit.wrapped >= 0) wraps.push_back({unit.first, unit.last});
    state = &frontier[static_cast<size_t>(state->first)][static_cast<size_t>(state->from)];
  }
  std::reverse(wraps.begin(), wraps.end());
  return wraps;
}

// Whether `p` is preferred to `q` where their times tie: the larger peak
// (within the budget: the plan that saves less, which recomputes less and
// is the faster more often than not), then the earlier modules wrapped (the
// first that differs starts earlier, or spans less, or fewer wraps). Of the
// rules tried on two profiles of each test model at five budgets, the one
// that chose the same plan from both every time (docs/measurements.md):
// preferring the smaller peak chooses the plan furthest from the fastest,
// the one a noisier profile leaves out of the band.
bool PreferredOnTie(const std::vector<std::vector<FrontierState>>& frontier,
                    const std::vector<std::vector<FrontierStep>>& units, const FrontierState& p, int64_t p_peak,
                    const FrontierState& q, int64_t q_peak) {
  if (p_peak != q_peak) return p_peak > q_peak;
  const std::vector<std::pair<int, int>> a = PathWraps(frontier, units, p), b = PathWraps(frontier, units, q);
  return a < b;
}

// Keeps the states no other state beats on both held bytes and time. (Not
// those beaten within the band too: the larger set's edge moved with the
// noise, and two profiles' plans differed at 20 of 64 budgets, against 3.)
// Of the states with the same held bytes, the fastest, and where another is within
// `tie_ms` of it (or ties it: SameTime) and wraps earlier modules, that one too
// (so that a plan within the band, SolveModules' choice, is not lost to a
// faster one the noise favoured on the way).
void Prune(std::vector<FrontierState>* states, const std::vector<std::vector<FrontierState>>& frontier,
           const std::vector<std::vector<FrontierStep>>& units, double tie_ms) {
  std::sort(states->begin(), states->end(), [](const FrontierState& p, const FrontierState& q) {
    if (p.bits != q.bits) return p.bits < q.bits;
    return p.held != q.held ? p.held < q.held : p.time_ms < q.time_ms;
  });
  std::vector<FrontierState> kept;
  double pareto_ms = 0;  // the fastest kept so far with these bits (and less held)
  for (size_t i = 0; i < states->size();) {
    size_t end = i + 1;
    while (end < states->size() && (*states)[end].bits == (*states)[i].bits &&
           (*states)[end].held == (*states)[i].held) {
      ++end;
    }
    const FrontierState& fastest = (*states)[i];
    size_t tied = i;  // of those within the band, the preferred
    for (size_t j = i + 1; j < end; ++j) {
      const FrontierState& s = (*states)[j];
      if (s.time_ms > fastest.time_ms + tie_ms && !SameTime(s.time_ms, fastest.time_ms)) break;
      // The earlier modules: what peak a path comes to is known at its end.
      if (PreferredOnTie(frontier, units, s, 0, (*states)[tied], 0)) tied = j;
    }
    const bool new_bits = kept.empty() || fastest.bits != kept.back().bits;
    if (new_bits) pareto_ms = fastest.time_ms;
    // Exact ties keep the preferred alone (the same time, by any rule).
    const FrontierState& representative = SameTime((*states)[tied].time_ms, fastest.time_ms) ? (*states)[tied] : fastest;
    if (new_bits || (fastest.time_ms < pareto_ms && !SameTime(fastest.time_ms, pareto_ms))) {
      kept.push_back(representative);
      pareto_ms = fastest.time_ms;
    }
    const FrontierState& preferred = (*states)[tied];
    if (tied != i && !SameTime(preferred.time_ms, fastest.time_ms) && preferred.time_ms <= pareto_ms + tie_ms) {
      kept.push_back(preferred);
    }
    i = end;
  }
  *states = std::move(kept);
}

}  // namespace

namespace {

// A unit run from `state`: the memory it needs, and the state after it.
struct StepEffect {
  int64_t need, held;
  uint32_t bits;
};

StepEffect TakeStep(const FrontierSteps& units, const FrontierStep& unit, const FrontierState& state) {
  int64_t input = unit.input_own;
  const uint32_t fresh_bits = unit.input_bits & ~state.bits;
  for (size_t b = 0; b < units.bit_bytes.size(); ++b) {
    if (fresh_bits & (1u << b)) input += units.bit_bytes[b];
  }
  StepEffect step;
  step.need = state.held + std::max(unit.need, unit.need_input + input);
  step.held = state.held + unit.held + (unit.wrapped >= 0 ? input : 0);
  step.bits = unit.wrapped >= 0 ? state.bits | unit.input_bits | unit.cache_bits : state.bits;
  return step;
}

// Each selective module once per save set worth solving with (its
// sac_variants; the empty set is the module itself).
std::vector<WrappableModule> WithSacVariants(const std::vector<WrappableModule>& modules) {
  std::vector<WrappableModule> out;
  for (const WrappableModule& m : modules) {
    out.push_back(m);
    if (!m.selective) continue;
    for (const std::vector<int>& saved : m.sac_variants) {
      if (saved.empty()) continue;
      out.push_back(m);
      out.back().sac_saved = saved;
    }
  }
  return out;
}

}  // namespace

namespace {

// SolveModules' walk with a band of `tie_ms` (Prune's): the last
// boundary's frontier, or none where no plan fits.
struct FrontierWalk {
  std::vector<std::vector<FrontierState>> frontier;
  int best = -1;         // in frontier.back(): the plan chosen
  int fastest = -1;      // and the fastest
  int tied_plans = 0;    // others within tie_ms of the fastest
};

FrontierWalk WalkFrontier(const Chain& chain, const std::vector<WrappableModule>& modules, const FrontierSteps& all,
                          int64_t input, int64_t budget_bytes, ModuleAccounting accounting, double tie_ms) {
  const int length = chain.length();
  const std::vector<std::vector<FrontierStep>>& units = all.by_stage;
  FrontierWalk walk;
  std::vector<std::vector<FrontierState>>& frontier = walk.frontier;
  frontier.resize(static_cast<size_t>(length) + 1);
  frontier[0].push_back({0u, input, 0.0, -1, -1, -1, input});
  for (int k = 0; k < length; ++k) {
    std::vector<FrontierState>& here = frontier[static_cast<size_t>(k)];
    Prune(&here, frontier, units, tie_ms);
    for (size_t u = 0; u < units[static_cast<size_t>(k)].size(); ++u) {
      const FrontierStep& unit = units[static_cast<size_t>(k)][u];
      std::vector<FrontierState>& there = frontier[static_cast<size_t>(unit.last) + 1];
      for (size_t s = 0; s < here.size(); ++s) {
        const StepEffect step = TakeStep(all, unit, here[s]);
        if (step.need > budget_bytes) continue;
        there.push_back({step.bits, step.held, here[s].time_ms + unit.time_ms, k, static_cast<int>(s),
                         static_cast<int>(u), std::max(here[s].peak, step.need)});
      }
    }
  }
  std::vector<FrontierState>& last = frontier[static_cast<size_t>(length)];
  Prune(&last, frontier, units, tie_ms);
  const int64_t loss_need =
      chain.StageInputBytes(length) + chain.loss_bwd_tmp_bytes + LossScalarBytes(accounting, chain);
  const int64_t end_need = StepEndBytes(chain, input, accounting);
  if (end_need > budget_bytes) return walk;
  auto peak_of = [&](const FrontierState& state) { return std::max({state.peak, state.held + loss_need, end_need}); };
  for (size_t s = 0; s < last.size(); ++s) {
    if (last[s].held + loss_need > budget_bytes) continue;
    if (walk.fastest < 0 || last[s].time_ms < last[static_cast<size_t>(walk.fastest)].time_ms) {
      walk.fastest = static_cast<int>(s);
    }
  }
  if (walk.fastest < 0) return walk;
  // Plans within the band of the fastest are tied: of them, the one
  // PreferredOnTie.
  const double fastest_ms = last[static_cast<size_t>(walk.fastest)].time_ms;
  walk.best = walk.fastest;
  for (size_t s = 0; s < last.size(); ++s) {
    const FrontierState& state = last[s];
    if (static_cast<int>(s) == walk.fastest || state.held + loss_need > budget_bytes) continue;
    if (state.time_ms > fastest_ms + tie_ms && !SameTime(state.time_ms, fastest_ms)) continue;
    ++walk.tied_plans;
    const FrontierState& chosen = last[static_cast<size_t>(walk.best)];
    if (PreferredOnTie(frontier, units, state, peak_of(state), chosen, peak_of(chosen))) walk.best = static_cast<int>(s);
  }
  return walk;
}

}  // namespace

ModuleSolution SolveModules(const Chain& chain, const std::vector<WrappableModule>& given, int64_t budget_bytes,
                            ModuleAccounting accounting) {
  ModuleSolution solution;
  const int length = chain.length();
  const std::vector<WrappableModule> modules = WithSacVariants(given);
  const FrontierSteps all = FrontierStepsOf(chain, modules, accounting);
  const std::vector<std::vector<FrontierStep>>& units = all.by_stage;
  int64_t input = 0;
  const CutStorages cuts = CutStoragesOf(chain);
  for (const auto& entry : cuts.storages[0]) input += entry.second;
  if (input > budget_bytes) return solution;
  // The fastest plan first; then, where the profile states its time noise,
  // the walk again with the band it makes: plans whose recomputation is
  // within that share of the fastest's are tied (which of them is faster is
  // the measurement's chance), and the one PreferredOnTie is chosen.
  FrontierWalk walk = WalkFrontier(chain, modules, all, input, budget_bytes, accounting, 0);
  if (walk.fastest < 0) return solution;
  // Not for selective checkpointing: its variants' peaks are priced less
  // exactly than whole modules' (the larger peak would favour one priced
  // too high); its ties between layers that do the same work stay exact.
  const bool selective = std::any_of(given.begin(), given.end(),
                                     [](const WrappableModule& m) { return !m.sac_variants.empty(); });
  if (chain.pytorch.time_noise_pct > 0 && !selective) {
    double plain_ms = 0;  // every stage run normally
    for (int k = 0; k < length; ++k) plain_ms += units[static_cast<size_t>(k)].front().time_ms;
    const double fastest_ms = walk.frontier.back()[static_cast<size_t>(walk.fastest)].time_ms;
    solution.tie_ms = std::max(0.0, fastest_ms - plain_ms) * chain.pytorch.time_noise_pct / 100;
    if (solution.tie_ms > 0) walk = WalkFrontier(chain, modules, all, input, budget_bytes, accounting, solution.tie_ms);
  }
  solution.tied_plans = walk.tied_plans;
  const std::vector<std::vector<FrontierState>>& frontier = walk.frontier;
  const std::vector<FrontierState>& last = frontier.back();
  const int best = walk.best;
  const int64_t loss_need =
      chain.StageInputBytes(length) + chain.loss_bwd_tmp_bytes + LossScalarBytes(accounting, chain);
  const int64_t end_need = StepEndBytes(chain, input, accounting);
  solution.feasible = true;
  solution.time_ms = last[static_cast<size_t>(best)].time_ms + chain.ModuleLossBwdMs();
  solution.kept_bytes = last[static_cast<size_t>(best)].held - input;  // less the checkpoints' states (below)
  solution.peak_bytes = std::max({input, last[static_cast<size_t>(best)].held + loss_need, end_need});
  for (int k = length, s = best; k > 0;) {
    const FrontierState& state = frontier[static_cast<size_t>(k)][static_cast<size_t>(s)];
    const int first = state.first;
    const FrontierStep& unit = units[static_cast<size_t>(first)][static_cast<size_t>(state.unit)];
    const FrontierState& before = frontier[static_cast<size_t>(first)][static_cast<size_t>(state.from)];
    solution.peak_bytes = std::max(solution.peak_bytes, TakeStep(all, unit, before).need);
    if (unit.wrapped >= 0) solution.wrapped.push_back(modules[static_cast<size_t>(unit.wrapped)]);
    k = first;
    s = state.from;
  }
  std::reverse(solution.wrapped.begin(), solution.wrapped.end());
  solution.kept_bytes -= static_cast<int64_t>(solution.wrapped.size()) * chain.pytorch.checkpoint_state_bytes;
  solution.schedule = ModuleSchedule(length, solution.wrapped);
  return solution;
}

int64_t MinimumModulesMemory(const Chain& chain, const std::vector<WrappableModule>& modules,
                             ModuleAccounting accounting) {
  // Feasibility only grows with the budget: bisect between a budget that
  // fails and the no-checkpointing peak, which fits.
  int64_t upper = 1;
  while (!SolveModules(chain, modules, upper, accounting).feasible) upper *= 2;
  int64_t lower = upper / 2;
  while (upper - lower > 1) {
    const int64_t middle = lower + (upper - lower) / 2;
    if (SolveModules(chain, modules, middle, accounting).feasible) {
      upper = middle;
    } else {
      lower = middle;
    }
  }
  return upper;
}

ModuleSolution EvaluateModules(const Chain& chain, const std::vector<WrappableModule>& wrapped,
                               ModuleAccounting accounting) {
  // The frontier walk of SolveModules along one path: the wrapped modules'
  // units where they start, single stages elsewhere.
  ModuleSolution solution;
  const int length = chain.length();
  const FrontierSteps all = FrontierStepsOf(chain, wrapped, accounting);
  int64_t input = 0;
  const CutStorages cuts = CutStoragesOf(chain);
  for (const auto& entry : cuts.storages[0]) input += entry.second;
  FrontierState state{0u, input, 0.0, -1, -1, -1};
  int64_t peak = input;
  for (int k = 0; k < length;) {
    const std::vector<FrontierStep>& here = all.by_stage[static_cast<size_t>(k)];
    const FrontierStep* unit = &here.front();  // the stage run normally
    for (const FrontierStep& u : here) {
      if (u.wrapped >= 0) unit = &u;
    }
    const StepEffect step = TakeStep(all, *unit, state);
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
                                      LossScalarBytes(accounting, chain),
                                  StepEndBytes(chain, input, accounting)});
  solution.schedule = ModuleSchedule(length, solution.wrapped);
  return solution;
}

}  // namespace ckplan
