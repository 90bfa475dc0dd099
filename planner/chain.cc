#include "ckplan/planner/chain.h"

#include <nlohmann/json.hpp>

#include "ckplan/planner/json_io.h"

namespace ckplan {

int64_t Chain::InputBytes(int k) const {
  if (k == 0) return input_bytes;
  if (k >= 1 && k <= length()) return stages[k - 1].out_bytes;
  return 0;  // the loss output
}

bool Chain::has_storages() const {
  if (stages.empty() || input_storages.empty()) return false;
  for (const Stage& s : stages) {
    if (s.private_saved_bytes < 0) return false;
  }
  return true;
}

double Chain::NoRecomputeTimeMs() const {
  double total = 0;
  for (const Stage& s : stages) total += s.fwd_ms + s.bwd_ms;
  return total + loss_bwd_ms;
}

Chain ChainFromJson(const nlohmann::json& doc, const std::string& file) {
  JsonReader root(doc, file);
  root.ExpectObject();
  std::string schema = root.Field("schema").String();
  if (schema != "ckplan.chain/1") {
    root.Field("schema").Fail("expected \"ckplan.chain/1\", got \"" + schema + "\"");
  }
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
    stage.out_bytes = s.Field("out_bytes").NonNegativeBytes();
    stage.saved_bytes = s.Field("saved_bytes").NonNegativeBytes();
    stage.fwd_tmp_bytes = s.Field("fwd_tmp_bytes").NonNegativeBytes();
    stage.bwd_tmp_bytes = s.Field("bwd_tmp_bytes").NonNegativeBytes();
    if (s.Has("modules")) {
      JsonReader modules = s.Field("modules");
      for (size_t k = 0; k < modules.ArraySize(); ++k) stage.modules.push_back(modules.Item(k).String());
    }
    if (s.Has("out_storages")) {
      JsonReader list = s.Field("out_storages");
      for (size_t k = 0; k < list.ArraySize(); ++k) {
        stage.out_storages.push_back({list.Item(k).Item(0).Integer(), list.Item(k).Item(1).NonNegativeBytes()});
      }
      stage.private_saved_bytes = s.Field("private_saved_bytes").NonNegativeBytes();
      if (s.Has("kept_out_storages")) {
        JsonReader kept = s.Field("kept_out_storages");
        for (size_t k = 0; k < kept.ArraySize(); ++k) stage.kept_out_storages.push_back(kept.Item(k).Integer());
      }
    }
    if (s.Has("first_op")) stage.first_op = static_cast<int>(s.Field("first_op").Integer());
    if (s.Has("last_op")) stage.last_op = static_cast<int>(s.Field("last_op").Integer());
    chain.stages.push_back(std::move(stage));
  }
  JsonReader loss = root.Field("loss");
  chain.loss_bwd_ms = loss.Field("bwd_ms").NonNegativeNumber();
  chain.loss_bwd_tmp_bytes = loss.Field("bwd_tmp_bytes").NonNegativeBytes();
  if (root.Has("input_storages")) {
    JsonReader list = root.Field("input_storages");
    for (size_t k = 0; k < list.ArraySize(); ++k) {
      chain.input_storages.push_back({list.Item(k).Item(0).Integer(), list.Item(k).Item(1).NonNegativeBytes()});
    }
  }
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
    if (!s.modules.empty()) j["modules"] = s.modules;
    if (s.first_op >= 0) {
      j["first_op"] = s.first_op;
      j["last_op"] = s.last_op;
    }
    if (s.private_saved_bytes >= 0) {
      j["out_storages"] = s.out_storages;
      j["private_saved_bytes"] = s.private_saved_bytes;
      j["kept_out_storages"] = s.kept_out_storages;
    }
    stages.push_back(std::move(j));
  }
  nlohmann::json doc = {{"schema", "ckplan.chain/1"},
                        {"input_bytes", chain.input_bytes},
                        {"stages", std::move(stages)},
                        {"loss", {{"bwd_ms", chain.loss_bwd_ms}, {"bwd_tmp_bytes", chain.loss_bwd_tmp_bytes}}}};
  if (!chain.input_storages.empty()) doc["input_storages"] = chain.input_storages;
  return doc;
}

}  // namespace ckplan
