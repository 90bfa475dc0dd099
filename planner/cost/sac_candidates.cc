#include "planner/cost/sac_candidates.h"

#include <algorithm>
#include <map>
#include <set>

#include "planner/base/dtype.h"
#include "planner/cost/liveness.h"

namespace ckplan {

const std::vector<SacFamily>& SacFamilies() {
  static const std::vector<SacFamily> kFamilies = {
      {"mm", {"mm", "addmm", "bmm", "baddbmm"}},
      {"convolution", {"convolution"}},
      {"sdpa",
       {"_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_fused_attention_overrideable"}},
      {"layer_norm", {"native_layer_norm"}},
      {"group_norm", {"native_group_norm"}},
  };
  return kFamilies;
}

SacDispatch SacDispatchOf(const OpRecord& op, const std::string& device) {
  static const std::set<std::string> kMatmul = {"aten::addmm", "aten::mm",     "aten::bmm",
                                                "aten::baddbmm", "aten::linear", "aten::matmul"};
  static const std::set<std::string> kConv = {"aten::conv1d",        "aten::conv2d",         "aten::conv3d",
                                              "aten::convolution",   "aten::conv_transpose1d", "aten::conv_transpose2d",
                                              "aten::conv_transpose3d"};
  if (kMatmul.count(op.kind) != 0) {
    // A vector operand makes dot or mv, no family op.
    const bool vector = !op.args.empty() && (op.args[0].shape.size() < 2 || (op.args.size() > 1 && op.args[1].shape.size() < 2));
    if (vector && op.kind != "aten::addmm") return {};
    return {"mm", 1, true, false};
  }
  if (op.kind == "aten::einsum") return {"mm", 1, false};
  if (kConv.count(op.kind) != 0) return {"convolution", 1, true, false};
  if (op.kind == "aten::layer_norm") return {"layer_norm", 1, true, true};
  if (op.kind == "aten::group_norm") return {"group_norm", 1, true, true};
  if (op.kind == "aten::scaled_dot_product_attention") {
    // On the CPU, dropout takes the math path: q k^T and its product with v.
    const bool cpu = device.rfind("cpu", 0) == 0;
    if (cpu && op.dropout_p > 0) return {"mm", 2, false};
    return {"sdpa", 1, true, true};
  }
  return {};
}

int SacDispatchedOps(const Profile& profile, const OpRecord& op, const std::string& device) {
  const SacDispatch dispatch = SacDispatchOf(op, device);
  const auto rank = [&](size_t i) { return i < op.args.size() ? op.args[i].shape.size() : 0; };
  if (op.kind == "aten::scaled_dot_product_attention") {
    if (dispatch.count != 2) return 2;  // the fused kernel, detach
    // The math path, computed in float32 for bf16 or half inputs (three casts in, one out).
    const Dtype* dtype = op.args.empty() ? nullptr : FindLibTorchDtype(op.args[0].dtype);
    const bool low = dtype != nullptr && dtype->floating && dtype->bytes == 2;
    return 26 + (low ? 4 : 0);
  }
  // An activation that saves its output (detach) or, in place, its input (clone).
  static const std::set<std::string> kTwo = {"aten::relu",       "aten::relu_",  "aten::hardtanh_", "aten::leaky_relu_",
                                             "aten::hardswish_", "aten::elu_",   "aten::sigmoid",   "aten::sigmoid_",
                                             "aten::batch_norm", "aten::threshold_"};
  if (kTwo.count(op.kind) != 0) return 2;  // batch_norm: empty, native_batch_norm
  if (op.kind == "aten::linear") return rank(0) > 2 ? 4 : 2;
  if (op.kind == "aten::matmul") return rank(0) > 2 && rank(1) > 2 ? 7 : rank(0) > 2 ? 4 : 1;
  if (op.kind == "aten::einsum") return 13;
  if (op.kind == "aten::dropout" || op.kind == "aten::feature_dropout") return op.saved_bytes > 0 ? 4 : 0;
  if (op.kind == "aten::softmax" || op.kind == "aten::log_softmax") return 2;
  if (op.kind == "aten::to" || op.kind == "aten::contiguous" || op.kind == "aten::type_as") {
    // A copy, unless its output is its input.
    if (op.inputs.empty() || op.outputs.empty()) return 1;
    const auto storage = [&](int t) { return profile.tensors[static_cast<size_t>(t)].storage; };
    return storage(op.inputs[0]) == storage(op.outputs[0]) ? 0 : 1;
  }
  return 1;
}

namespace {

// What one module's candidates are, op by op, and how many ops its forward
// dispatches.
void AddCandidates(const Profile& profile, const Chain& chain, const Liveness& liveness,
                   const std::map<int, bool>& storage_kept, WrappableModule* m) {
  const int first = chain.stages[static_cast<size_t>(m->first_stage)].ops->first;
  const int last = chain.stages[static_cast<size_t>(m->last_stage)].ops->last;
  const std::string device = profile.environment.DeviceName();
  const Calibration& calibration = profile.calibration;
  const double scale = calibration.module_nograd_scale.value_or(
      calibration.nograd_scale.value_or(0) > 0 ? *calibration.nograd_scale : 1.0);
  std::map<int, int> stage_of;
  for (int k = m->first_stage; k <= m->last_stage; ++k) {
    const OpRange& r = *chain.stages[static_cast<size_t>(k)].ops;
    for (int op = r.first; op <= r.last; ++op) stage_of[op] = k;
  }
  // Storages some later op of the module writes in place.
  std::map<int, int> last_write;  // storage -> last in-place op writing it
  for (int op = first; op <= last; ++op) {
    const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
    if (rec.inplace && !rec.inputs.empty()) last_write[profile.tensors[static_cast<size_t>(rec.inputs[0])].storage] = op;
  }
  m->sac_dispatched_ops = 0;
  for (int op = first; op <= last; ++op) {
    const OpRecord& rec = profile.ops[static_cast<size_t>(op)];
    m->sac_dispatched_ops += SacDispatchedOps(profile, rec, device);
    const SacDispatch dispatch = SacDispatchOf(rec, device);
    if (dispatch.family.empty()) continue;
    const int occurrence = m->sac_family_counts[dispatch.family];
    m->sac_family_counts[dispatch.family] += dispatch.count;
    if (!dispatch.carries_output || rec.outputs.empty() || rec.inplace) continue;
    SacCandidate c;
    c.op = op;
    c.kind = rec.kind;
    c.family = dispatch.family;
    c.occurrence = occurrence;
    c.stage = stage_of.at(op);
    c.recompute_ms = scale * rec.fwd_nograd_ms.value_or(rec.fwd_ms);
    c.shape = profile.tensors[static_cast<size_t>(rec.outputs[0])].shape;
    bool own = true;
    int64_t kept_visible = 0;
    std::set<int> seen;
    for (int t : rec.outputs) {
      const int s = profile.tensors[static_cast<size_t>(t)].storage;
      if (!seen.insert(s).second) continue;
      auto write = last_write.find(s);
      if (liveness.StorageProducer(s) != op || (write != last_write.end() && write->second > op)) own = false;
      c.storages.push_back({s, liveness.StorageBytes(s)});
      auto kept = storage_kept.find(s);
      if (kept != storage_kept.end() && kept->second) kept_visible += liveness.StorageBytes(s);
    }
    if (!own) continue;
    // What the dispatched op returns beyond the visible outputs
    // (native_layer_norm's mean and rstd, attention's logsumexp), which
    // saving it holds too: what the op allocated and autograd kept beyond
    // them. A matrix product or convolution returns its output alone (what
    // else it keeps is a copy of a non-contiguous input, made by another op).
    const int64_t hidden = dispatch.returns_more ? rec.saved_bytes - kept_visible : 0;
    if (hidden > 0) c.storages.push_back({-1 - static_cast<int64_t>(op), hidden});
    m->sac_candidates.push_back(std::move(c));
  }
}

struct Variant {
  std::vector<int> saved;
  int64_t bytes = 0;
  double saved_ms = 0;
  std::vector<int64_t> prefix;  // bytes saved up to each stage of the module
};

}  // namespace

std::vector<std::vector<int>> SacVariants(const WrappableModule& module, bool* exact) {
  const std::vector<SacCandidate>& cands = module.sac_candidates;
  const int n = static_cast<int>(cands.size());
  const int stages = module.last_stage - module.first_stage + 1;
  if (exact != nullptr) *exact = n <= kExactSacCandidates;
  std::vector<std::vector<int>> out;
  if (n <= kExactSacCandidates) {
    // Every subset, then those no other beats: held bytes at every stage of
    // the forward (prefix) and of the recomputation (suffix), and time.
    std::vector<Variant> all;
    for (uint32_t mask = 0; mask < (1u << n); ++mask) {
      Variant v;
      v.prefix.assign(static_cast<size_t>(stages), 0);
      for (int i = 0; i < n; ++i) {
        if ((mask & (1u << i)) == 0) continue;
        v.saved.push_back(i);
        const int64_t bytes = cands[static_cast<size_t>(i)].bytes();
        v.bytes += bytes;
        v.saved_ms += cands[static_cast<size_t>(i)].recompute_ms;
        for (int k = cands[static_cast<size_t>(i)].stage - module.first_stage; k < stages; ++k) {
          v.prefix[static_cast<size_t>(k)] += bytes;
        }
      }
      all.push_back(std::move(v));
    }
    std::stable_sort(all.begin(), all.end(), [](const Variant& a, const Variant& b) {
      return a.bytes != b.bytes ? a.bytes < b.bytes : a.saved_ms > b.saved_ms;
    });
    std::vector<const Variant*> kept;
    for (const Variant& v : all) {
      bool beaten = false;
      for (const Variant* k : kept) {
        if (k->bytes > v.bytes || k->saved_ms < v.saved_ms) continue;
        bool all_below = true;
        for (int s = 0; s < stages && all_below; ++s) {
          const int64_t kp = k->prefix[static_cast<size_t>(s)], vp = v.prefix[static_cast<size_t>(s)];
          all_below = kp <= vp && k->bytes - kp <= v.bytes - vp;
        }
        if (all_below) {
          beaten = true;
          break;
        }
      }
      if (!beaten) kept.push_back(&v);
    }
    for (const Variant* v : kept) out.push_back(v->saved);
    return out;
  }
  // The Pareto frontier of (bytes, time saved), item by item.
  std::vector<Variant> front(1);
  for (int i = 0; i < n; ++i) {
    const int64_t bytes = cands[static_cast<size_t>(i)].bytes();
    std::vector<Variant> merged = front;
    for (const Variant& v : front) {
      Variant w = v;
      w.saved.push_back(i);
      w.bytes += bytes;
      w.saved_ms += cands[static_cast<size_t>(i)].recompute_ms;
      merged.push_back(std::move(w));
    }
    std::stable_sort(merged.begin(), merged.end(), [](const Variant& a, const Variant& b) {
      return a.bytes != b.bytes ? a.bytes < b.bytes : a.saved_ms > b.saved_ms;
    });
    front.clear();
    for (Variant& v : merged) {
      if (front.empty() || v.saved_ms > front.back().saved_ms) front.push_back(std::move(v));
    }
    if (static_cast<int>(front.size()) > kMaxSacVariants) {  // evenly thinned, both ends kept
      std::vector<Variant> thin;
      const size_t size = front.size();
      for (int k = 0; k < kMaxSacVariants; ++k) {
        thin.push_back(front[static_cast<size_t>(k) * (size - 1) / static_cast<size_t>(kMaxSacVariants - 1)]);
      }
      front = std::move(thin);
    }
  }
  for (const Variant& v : front) out.push_back(v.saved);
  return out;
}

void AddSacCandidates(const Profile& profile, const Chain& chain, std::vector<WrappableModule>* modules,
                      double dispatch_us) {
  for (const Stage& s : chain.stages) {
    if (!s.ops) return;  // a chain not cut from this profile
  }
  const Liveness liveness(profile);
  std::map<int, bool> storage_kept;
  for (const TensorRecord& t : profile.tensors) storage_kept[t.storage] = storage_kept[t.storage] || t.kept;
  for (WrappableModule& m : *modules) {
    m.sac_candidates.clear();
    m.sac_family_counts.clear();
    m.sac_variants.clear();
    AddCandidates(profile, chain, liveness, storage_kept, &m);
    m.sac_variants = SacVariants(m);
    m.selective = true;
    m.sac_dispatch_ms = m.sac_dispatched_ops * dispatch_us * 1e-3;
  }
}

std::vector<HandWrittenSacPolicy> HandWrittenSacPolicies() {
  std::vector<std::string> all;
  for (const SacFamily& family : SacFamilies()) all.push_back(family.name);
  return {{"sac: save matmuls, each layer", {"mm"}}, {"sac: all but pointwise, each layer", all}};
}

std::vector<WrappableModule> LayersSaving(const std::vector<WrappableModule>& modules, const Profile& profile,
                                          const std::vector<std::string>& families) {
  const std::set<std::string> containers(profile.model.containers.begin(), profile.model.containers.end());
  const std::set<std::string> saved(families.begin(), families.end());
  std::vector<WrappableModule> layers;
  for (const WrappableModule& m : modules) {
    const size_t dot = m.path.rfind('.');
    if (dot != std::string::npos && containers.count(m.path.substr(0, dot)) != 0) layers.push_back(m);
  }
  if (layers.empty()) {
    for (const WrappableModule& m : modules) {
      if (m.first_stage == m.last_stage) layers.push_back(m);
    }
  }
  for (WrappableModule& m : layers) {
    m.sac_saved.clear();
    for (size_t i = 0; i < m.sac_candidates.size(); ++i) {
      if (saved.count(m.sac_candidates[i].family) != 0) m.sac_saved.push_back(static_cast<int>(i));
    }
  }
  return layers;
}

}  // namespace ckplan
