#include "planner/contracts/chain.h"

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "planner/base/error.h"
#include "planner/base/json_io.h"

namespace ckplan {

int64_t Chain::StageInputBytes(int k) const {
  if (k == 0) return input_bytes;
  if (k >= 1 && k <= length()) return stages[k - 1].out_bytes;
  return 0;  // the loss output
}

bool Chain::has_storages() const {
  if (stages.empty() || input_storages.empty()) return false;
  for (const Stage& s : stages) {
    if (!s.private_saved_bytes) return false;
  }
  return true;
}

int64_t Stage::GradsAtBackwardPeakBytes() const {
  const int64_t held = param_grad_bwd_bytes.value_or(param_grad_bytes);
  // After the backward the stage's gradients stay while what it saved and its
  // output's gradient are gone: never more than its peak.
  return std::max(held, param_grad_bytes - saved_bytes - out_bytes - bwd_tmp_bytes);
}

int64_t Chain::GradsAtBackwardPeakBytes(int i) const {
  const Stage& s = stages[static_cast<size_t>(i)];
  if (i != 0 || update_tmp_bytes == 0) return s.GradsAtBackwardPeakBytes();
  return std::max(s.GradsAtBackwardPeakBytes(),
                  s.param_grad_bytes + update_tmp_bytes - s.saved_bytes - s.out_bytes - s.bwd_tmp_bytes);
}

int64_t Chain::ExecutorBackwardBytes(int i) const {
  const Stage& s = stages[static_cast<size_t>(i)];
  if (!s.executor_bwd_peak_bytes) return -1;
  // What stays after the backward: the input's gradient and the stage's own
  // parameter gradients made, what it saved (its output in it) freed.
  int64_t after = StageInputBytes(i) + s.param_grad_bytes - s.saved_bytes;
  if (i == 0) after += update_tmp_bytes;  // the step's end: the update runs
  return std::max({*s.executor_bwd_peak_bytes, after, int64_t{0}});
}

bool Chain::has_param_grads() const {
  for (const Stage& s : stages) {
    if (s.param_grad_bytes > 0) return true;
  }
  return false;
}

int64_t Chain::ParamGradBytes() const {
  int64_t total = 0;
  for (const Stage& s : stages) total += s.param_grad_bytes;
  return total;
}

double Chain::NoRecomputeTimeMs() const {
  double total = 0;
  for (const Stage& s : stages) total += s.fwd_ms + s.bwd_ms;
  return total + loss_bwd_ms;
}

double Chain::ModuleNoRecomputeTimeMs() const {
  double total = 0;
  for (const Stage& s : stages) total += s.fwd_ms + s.bwd_ms;
  return total + ModuleLossBwdMs();
}

namespace {

// [id, bytes]
std::pair<int64_t, int64_t> ReadStorage(const JsonReader& entry) {
  if (entry.ArraySize() != 2) entry.Fail("expected [storage id, bytes]");
  return {entry.Item(0).Integer(), entry.Item(1).NonNegativeBytes()};
}

}  // namespace

void ValidateChain(const Chain& chain, const std::string& file, const std::string& what) {
  auto fail = [&](const std::string& field, const std::string& why) {
    throw BadInput(file + ": " + what + (what.empty() ? "" : ": ") + "field '" + field + "': " + why);
  };
  if (chain.stages.empty()) fail("stages", "a chain needs at least one stage");
  // Every byte figure together: the planner's sums of them then fit in an int64.
  int64_t total = SaturatingAdd(SaturatingAdd(SaturatingAdd(chain.input_bytes, chain.loss_bwd_tmp_bytes),
                                              chain.update_tmp_bytes),
                                chain.output_held_bytes);
  total = SaturatingAdd(total, chain.output_kept_bytes);
  if ((chain.output_kept_stage &&
       (*chain.output_kept_stage < 0 || *chain.output_kept_stage >= static_cast<int>(chain.stages.size()))) ||
      (chain.output_kept_bytes > 0) != chain.output_kept_stage.has_value()) {
    fail("output_kept", "a stage of the chain with bytes above 0, or neither");
  }
  for (const auto& entry : chain.input_storages) total = SaturatingAdd(total, entry.second);
  for (const Stage& s : chain.stages) {
    for (int64_t bytes : {s.out_bytes, s.saved_bytes, s.fwd_tmp_bytes, s.bwd_tmp_bytes, s.private_saved_bytes.value_or(0),
                          s.param_grad_bytes, s.pytorch_bwd_peak_bytes.value_or(0), s.executor_bwd_peak_bytes.value_or(0)}) {
      total = SaturatingAdd(total, std::max<int64_t>(bytes, 0));
    }
    for (const auto& entry : s.out_storages) total = SaturatingAdd(total, entry.second);
  }
  for (const auto& [path, storages] : chain.pytorch.module_call_storages) {
    for (const auto& entry : storages) total = SaturatingAdd(total, entry.second);
  }
  for (const auto& [path, bytes] : chain.pytorch.module_held_bytes) {
    if (bytes < 0) fail("module_held_bytes", "'" + path + "' holds " + std::to_string(bytes) + " B: must be at least 0");
    total = SaturatingAdd(total, bytes);
  }
  for (const auto& [path, bytes] : chain.pytorch.module_eager_peak_bytes) {
    if (bytes < 0 || bytes > kMaxTotalBytes) {
      fail("module_eager_peak_bytes", "'" + path + "' holds " + std::to_string(bytes) + " B: must be 0 to " +
                                          LimitText(kMaxTotalBytes));
    }
  }
  if (total > kMaxTotalBytes) {
    fail("stages", "its byte figures add up to more than " + LimitText(kMaxTotalBytes) + ", more than any model has");
  }
  // Storages (optional): each cut lists distinct ids that add up to the
  // value it carries, an id has one size, and a stage's own saved part is
  // within what it saves.
  std::map<int64_t, std::pair<int64_t, std::string>> size_of;
  auto check_cut = [&](const std::vector<std::pair<int64_t, int64_t>>& cut, const std::string& field,
                       int64_t value_bytes, const std::string& value_name) {
    std::set<int64_t> seen;
    int64_t sum = 0;
    for (size_t k = 0; k < cut.size(); ++k) {
      const auto& [id, bytes] = cut[k];
      const std::string entry = field + "[" + std::to_string(k) + "]";
      if (!seen.insert(id).second) fail(entry, "storage id " + std::to_string(id) + " is listed twice");
      auto [it, fresh] = size_of.insert({id, {bytes, entry}});
      if (!fresh && it->second.first != bytes) {
        fail(entry, "storage id " + std::to_string(id) + " has " + std::to_string(bytes) + " B here but " +
                        std::to_string(it->second.first) + " B in " + it->second.second);
      }
      sum += bytes;
    }
    if (sum > value_bytes) {
      fail(field, "its storages add up to " + std::to_string(sum) + " B, more than " + value_name + " " +
                      std::to_string(value_bytes) + " B");
    }
  };
  check_cut(chain.input_storages, "input_storages", chain.input_bytes, "input_bytes");
  for (size_t i = 0; i < chain.stages.size(); ++i) {
    const Stage& s = chain.stages[i];
    const std::string prefix = "stages[" + std::to_string(i) + "].";
    check_cut(s.out_storages, prefix + "out_storages", s.out_bytes, "out_bytes");
    if (s.param_grad_bwd_bytes && *s.param_grad_bwd_bytes > s.param_grad_bytes) {
      fail(prefix + "param_grad_bwd_bytes", "is above param_grad_bytes " + std::to_string(s.param_grad_bytes));
    }
    if (s.private_saved_bytes && *s.private_saved_bytes > s.saved_bytes) {
      fail(prefix + "private_saved_bytes", "is above saved_bytes " + std::to_string(s.saved_bytes));
    }
    // Run with autograd, the stage keeps its own part and the storages it
    // makes (those not already at its input): saved_bytes, which the solver
    // counts, must cover them, or the plan's peak could pass its budget.
    if (chain.has_storages()) {
      const auto& before = i == 0 ? chain.input_storages : chain.stages[i - 1].out_storages;
      std::set<int64_t> carried;
      for (const auto& entry : before) carried.insert(entry.first);
      int64_t made = 0;
      for (const auto& [id, bytes] : s.out_storages) {
        if (!carried.count(id)) made += bytes;
      }
      if (*s.private_saved_bytes + made > s.saved_bytes) {
        fail(prefix + "saved_bytes", std::to_string(s.saved_bytes) + " B is less than the stage's own part " +
                                         std::to_string(*s.private_saved_bytes) + " B and the storages it makes " +
                                         std::to_string(made) + " B");
      }
    }
    std::set<int64_t> own;
    for (const auto& entry : s.out_storages) own.insert(entry.first);
    for (size_t k = 0; k < s.kept_out_storages.size(); ++k) {
      if (!own.count(s.kept_out_storages[k])) {
        fail(prefix + "kept_out_storages[" + std::to_string(k) + "]", "not one of the stage's out_storages");
      }
    }
  }
}

Chain ChainFromJson(const nlohmann::json& doc, const std::string& file) {
  JsonReader root(doc, file);
  root.ExpectObject();
  root.ExpectSchema("chain");
  Chain chain;
  chain.input_bytes = root.Field("input_bytes").NonNegativeBytes();
  JsonReader stages = root.Field("stages");
  size_t count = stages.ArraySize();
  if (count == 0) stages.Fail("a chain needs at least one stage");
  for (size_t i = 0; i < count; ++i) {
    JsonReader s = stages.Item(i);
    s.ExpectObject();
    Stage stage;
    stage.name = s.Field("name").String();
    stage.fwd_ms = s.Field("fwd_ms").NonNegativeNumber();
    stage.bwd_ms = s.Field("bwd_ms").NonNegativeNumber();
    if (s.Has("fwd_nograd_ms")) stage.fwd_nograd_ms = s.Field("fwd_nograd_ms").NonNegativeNumber();
    if (s.Has("module_fwd_nograd_ms")) {
      stage.module_fwd_nograd_ms = s.Field("module_fwd_nograd_ms").NonNegativeNumber();
    }
    stage.out_bytes = s.Field("out_bytes").NonNegativeBytes();
    stage.saved_bytes = s.Field("saved_bytes").NonNegativeBytes();
    stage.fwd_tmp_bytes = s.Field("fwd_tmp_bytes").NonNegativeBytes();
    stage.bwd_tmp_bytes = s.Field("bwd_tmp_bytes").NonNegativeBytes();
    if (s.Has("param_grad_bytes")) stage.param_grad_bytes = s.Field("param_grad_bytes").NonNegativeBytes();
    if (s.Has("param_grad_bwd_bytes")) stage.param_grad_bwd_bytes = s.Field("param_grad_bwd_bytes").NonNegativeBytes();
    if (s.Has("bwd_replay_peak_bytes")) stage.pytorch_bwd_peak_bytes = s.Field("bwd_replay_peak_bytes").NonNegativeBytes();
    if (s.Has("bwd_run_peak_bytes")) stage.executor_bwd_peak_bytes = s.Field("bwd_run_peak_bytes").NonNegativeBytes();
    if (s.Has("modules")) {
      JsonReader modules = s.Field("modules");
      for (size_t k = 0; k < modules.ArraySize(); ++k) stage.modules.push_back(modules.Item(k).String());
    }
    if (s.Has("out_storages")) {
      JsonReader list = s.Field("out_storages");
      for (size_t k = 0; k < list.ArraySize(); ++k) stage.out_storages.push_back(ReadStorage(list.Item(k)));
      stage.private_saved_bytes = s.Field("private_saved_bytes").NonNegativeBytes();
      if (s.Has("kept_out_storages")) {
        JsonReader kept = s.Field("kept_out_storages");
        for (size_t k = 0; k < kept.ArraySize(); ++k) stage.kept_out_storages.push_back(kept.Item(k).Integer());
      }
    }
    if (s.Has("first_op") || s.Has("last_op")) {
      const int first = s.Field("first_op").IntegerIn(0, INT32_MAX);
      stage.ops = OpRange{first, s.Field("last_op").IntegerIn(first, INT32_MAX)};
    }
    chain.stages.push_back(std::move(stage));
  }
  JsonReader loss = root.Field("loss");
  chain.loss_bwd_ms = loss.Field("bwd_ms").NonNegativeNumber();
  chain.loss_bwd_tmp_bytes = loss.Field("bwd_tmp_bytes").NonNegativeBytes();
  if (loss.Has("module_bwd_ms")) {
    chain.module_loss_bwd_ms = loss.Field("module_bwd_ms").FiniteNumber();
    if (chain.ModuleNoRecomputeTimeMs() < 0) {
      loss.Field("module_bwd_ms").Fail("the step without recomputation it leaves is negative");
    }
  }
  if (root.Has("checkpoint_call_ms")) chain.pytorch.checkpoint_call_ms = root.Field("checkpoint_call_ms").NonNegativeNumber();
  if (root.Has("time_noise_pct")) chain.pytorch.time_noise_pct = root.Field("time_noise_pct").NonNegativeNumber();
  if (root.Has("update_tmp_bytes")) chain.update_tmp_bytes = root.Field("update_tmp_bytes").NonNegativeBytes();
  if (root.Has("output_held_bytes")) chain.output_held_bytes = root.Field("output_held_bytes").NonNegativeBytes();
  if (root.Has("output_kept")) {
    JsonReader kept = root.Field("output_kept");
    chain.output_kept_bytes = kept.Field("bytes").NonNegativeBytes();
    chain.output_kept_stage = kept.Field("stage").IntegerIn(0, 1 << 30);
  }
  if (root.Has("checkpoint_state_bytes")) {
    chain.pytorch.checkpoint_state_bytes = root.Field("checkpoint_state_bytes").NonNegativeBytes();
  }
  if (root.Has("input_storages")) {
    JsonReader list = root.Field("input_storages");
    for (size_t k = 0; k < list.ArraySize(); ++k) chain.input_storages.push_back(ReadStorage(list.Item(k)));
  }
  if (root.Has("module_call_storages")) {
    const JsonReader modules = root.Field("module_call_storages");
    modules.ExpectObject();
    for (const auto& item : modules.node().items()) {
      const JsonReader list = modules.Field(item.key());
      auto& storages = chain.pytorch.module_call_storages[item.key()];
      for (size_t k = 0; k < list.ArraySize(); ++k) storages.push_back(ReadStorage(list.Item(k)));
    }
  }
  if (root.Has("module_held_bytes")) {
    const JsonReader modules = root.Field("module_held_bytes");
    modules.ExpectObject();
    for (const auto& item : modules.node().items()) {
      chain.pytorch.module_held_bytes[item.key()] = modules.Field(item.key()).NonNegativeBytes();
    }
  }
  if (root.Has("module_eager_peak_bytes")) {
    const JsonReader modules = root.Field("module_eager_peak_bytes");
    modules.ExpectObject();
    for (const auto& item : modules.node().items()) {
      chain.pytorch.module_eager_peak_bytes[item.key()] = modules.Field(item.key()).NonNegativeBytes();
    }
  }
  ValidateChain(chain, file, "");
  return chain;
}

nlohmann::json ChainToJson(const Chain& chain) {
  nlohmann::json stages = nlohmann::json::array();
  for (const Stage& s : chain.stages) {
    nlohmann::json j = {{"name", s.name},
                        {"fwd_ms", s.fwd_ms},
                        {"bwd_ms", s.bwd_ms},
                        {"out_bytes", s.out_bytes},
                        {"saved_bytes", s.saved_bytes},
                        {"fwd_tmp_bytes", s.fwd_tmp_bytes},
                        {"bwd_tmp_bytes", s.bwd_tmp_bytes}};
    if (s.fwd_nograd_ms) j["fwd_nograd_ms"] = *s.fwd_nograd_ms;
    if (s.module_fwd_nograd_ms) j["module_fwd_nograd_ms"] = *s.module_fwd_nograd_ms;
    if (s.param_grad_bytes > 0) {
      j["param_grad_bytes"] = s.param_grad_bytes;
      if (s.param_grad_bwd_bytes) j["param_grad_bwd_bytes"] = *s.param_grad_bwd_bytes;
    }
    if (s.pytorch_bwd_peak_bytes) j["bwd_replay_peak_bytes"] = *s.pytorch_bwd_peak_bytes;
    if (s.executor_bwd_peak_bytes) j["bwd_run_peak_bytes"] = *s.executor_bwd_peak_bytes;
    if (!s.modules.empty()) j["modules"] = s.modules;
    if (s.ops) {
      j["first_op"] = s.ops->first;
      j["last_op"] = s.ops->last;
    }
    if (s.private_saved_bytes) {
      j["out_storages"] = s.out_storages;
      j["private_saved_bytes"] = *s.private_saved_bytes;
      j["kept_out_storages"] = s.kept_out_storages;
    }
    stages.push_back(std::move(j));
  }
  nlohmann::json doc = {{"schema", "ckplan.chain/1"},
                        {"input_bytes", chain.input_bytes},
                        {"stages", std::move(stages)},
                        {"loss", {{"bwd_ms", chain.loss_bwd_ms}, {"bwd_tmp_bytes", chain.loss_bwd_tmp_bytes}}}};
  if (!chain.input_storages.empty()) doc["input_storages"] = chain.input_storages;
  if (!chain.pytorch.module_call_storages.empty()) doc["module_call_storages"] = chain.pytorch.module_call_storages;
  if (!chain.pytorch.module_held_bytes.empty()) doc["module_held_bytes"] = chain.pytorch.module_held_bytes;
  if (!chain.pytorch.module_eager_peak_bytes.empty()) doc["module_eager_peak_bytes"] = chain.pytorch.module_eager_peak_bytes;
  if (chain.update_tmp_bytes > 0) doc["update_tmp_bytes"] = chain.update_tmp_bytes;
  if (chain.output_held_bytes > 0) doc["output_held_bytes"] = chain.output_held_bytes;
  if (chain.output_kept_bytes > 0) {
    doc["output_kept"] = {{"bytes", chain.output_kept_bytes}, {"stage", *chain.output_kept_stage}};
  }
  if (chain.pytorch.checkpoint_state_bytes > 0) doc["checkpoint_state_bytes"] = chain.pytorch.checkpoint_state_bytes;
  if (chain.module_loss_bwd_ms) doc["loss"]["module_bwd_ms"] = *chain.module_loss_bwd_ms;
  if (chain.pytorch.checkpoint_call_ms > 0) doc["checkpoint_call_ms"] = chain.pytorch.checkpoint_call_ms;
  if (chain.pytorch.time_noise_pct > 0) doc["time_noise_pct"] = chain.pytorch.time_noise_pct;
  return doc;
}

}  // namespace ckplan
