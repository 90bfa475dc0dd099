#include "planner/plan/pytorch_export.h"

#include <map>
#include <set>

namespace ckplan {
namespace {

// The export for a given set of wrapped modules (disjoint stage ranges).
ModuleExport ExportFor(const Chain& chain, const std::vector<WrappableModule>& wrapped) {
  ModuleExport out;
  const int length = chain.length();
  std::vector<bool> wrap(static_cast<size_t>(length), false), holds_input(static_cast<size_t>(length), false);
  for (const WrappableModule& m : wrapped) {
    holds_input[static_cast<size_t>(m.first_stage)] = true;
    for (int k = m.first_stage; k <= m.last_stage; ++k) wrap[static_cast<size_t>(k)] = true;
  }
  out.schedule = ModuleSchedule(length, wrapped);
  out.simulation = Simulate(chain, out.schedule);
  out.peak_bytes = out.simulation.peak_bytes;
  out.time_ms = chain.ModuleNoRecomputeTimeMs();
  for (const WrappableModule& m : wrapped) {
    out.time_ms += chain.pytorch.checkpoint_call_ms;
    for (int k = m.first_stage; k <= m.last_stage; ++k) {
      out.time_ms += chain.stages[static_cast<size_t>(k)].ModuleNoGradFwdMs();
    }
  }
  out.held_at_loss_bytes = out.simulation.live_after_forward_bytes - chain.input_bytes;
  if (chain.has_storages()) {
    // What PyTorch keeps: the own saved tensors of stages run normally, the
    // stage outputs some op saves, the inputs of wrapped modules (held for
    // their recompute) and the model's outputs, each storage once.
    std::map<int64_t, int64_t> bytes_of;
    for (const Stage& s : chain.stages) {
      for (const auto& [id, bytes] : s.out_storages) bytes_of[id] = bytes;
    }
    std::set<int64_t> held;
    int64_t own = 0;
    for (int i = 0; i < length; ++i) {
      const Stage& s = chain.stages[static_cast<size_t>(i)];
      if (!wrap[static_cast<size_t>(i)]) own += *s.private_saved_bytes;
      held.insert(s.kept_out_storages.begin(), s.kept_out_storages.end());
      if (holds_input[static_cast<size_t>(i)] && i > 0) {
        for (const auto& entry : chain.stages[static_cast<size_t>(i) - 1].out_storages) held.insert(entry.first);
      }
    }
    for (const auto& entry : chain.stages.back().out_storages) held.insert(entry.first);
    // The tensors a wrapped module is called with that cross no cut into it.
    for (const WrappableModule& m : wrapped) {
      auto found = chain.pytorch.module_call_storages.find(m.path);
      if (found == chain.pytorch.module_call_storages.end()) continue;
      for (const auto& [id, bytes] : found->second) {
        bytes_of.emplace(id, bytes);
        held.insert(id);
      }
    }
    // What their ops keep that checkpoint cannot drop.
    for (const WrappableModule& m : wrapped) {
      auto found = chain.pytorch.module_held_bytes.find(m.path);
      if (found != chain.pytorch.module_held_bytes.end()) own += found->second;
    }
    int64_t shared = 0;
    for (int64_t id : held) shared += bytes_of[id];
    out.held_at_loss_bytes = own + shared;
  }
  for (const WrappableModule& m : wrapped) out.checkpoint_modules.push_back(m.path);
  out.wrapped = wrapped;
  return out;
}

// The single-stage modules of `wrap`.
std::vector<WrappableModule> StageModules(const Chain& chain, const std::vector<bool>& wrap) {
  std::vector<WrappableModule> out;
  for (int i = 0; i < chain.length(); ++i) {
    if (wrap[static_cast<size_t>(i)]) out.push_back({chain.stages[static_cast<size_t>(i)].modules[0], i, i});
  }
  return out;
}

}  // namespace

ModuleExport ExportForModules(const Chain& chain, const std::vector<WrappableModule>& wrapped) {
  return ExportFor(chain, wrapped);
}

ModuleExport ExportForPyTorch(const Chain& chain, const std::vector<int>& checkpointed) {
  const int length = chain.length();
  std::vector<bool> wrap(static_cast<size_t>(length), false);
  std::vector<std::string> skipped;
  for (int i : checkpointed) {
    const Stage& s = chain.stages[static_cast<size_t>(i)];
    if (s.modules.size() == 1) {
      wrap[static_cast<size_t>(i)] = true;
    } else {
      skipped.push_back(s.name);
    }
  }
  // Wrapping a module only pays when it keeps less than it would without
  // (its input is held instead of what it saves): drop the ones that don't.
  ModuleExport best = ExportFor(chain, StageModules(chain, wrap));
  for (int i = 0; i < length; ++i) {
    if (!wrap[static_cast<size_t>(i)]) continue;
    wrap[static_cast<size_t>(i)] = false;
    ModuleExport without = ExportFor(chain, StageModules(chain, wrap));
    if (without.held_at_loss_bytes <= best.held_at_loss_bytes) {
      best = std::move(without);
      skipped.push_back(chain.stages[static_cast<size_t>(i)].name + " (keeps no less)");
    } else {
      wrap[static_cast<size_t>(i)] = true;
    }
  }
  best.skipped_stages = skipped;
  return best;
}

}  // namespace ckplan
