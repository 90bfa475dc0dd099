#include "planner/contracts/profile.h"

#include <climits>
#include <set>
#include <utility>

#include "planner/base/error.h"
#include "planner/base/json_io.h"

namespace ckplan {

namespace {

std::vector<int> ReadIds(const JsonReader& array, int limit) {
  std::vector<int> ids;
  for (size_t i = 0; i < array.ArraySize(); ++i) {
    int64_t id = array.Item(i).Integer();
    if (id < 0 || id >= limit) array.Item(i).Fail("tensor id out of range");
    ids.push_back(static_cast<int>(id));
  }
  return ids;
}

// Storage ids: the profiler numbers them from 0, and untracked ones -1 - tensor.
constexpr int64_t kMaxStorageId = int64_t{1} << 30;

// A tensor's shape: sizes as non-negative integers (a tensor, an op's argument, a parameter).
std::vector<int64_t> ReadShape(const JsonReader& shape) {
  std::vector<int64_t> sizes;
  for (size_t d = 0; d < shape.ArraySize(); ++d) sizes.push_back(shape.Item(d).NonNegativeBytes());
  return sizes;
}

template <typename T>
void Put(nlohmann::json* doc, const char* key, const std::optional<T>& value) {
  if (value) (*doc)[key] = *value;
}

std::optional<std::string> OptionalString(const JsonReader& r, const char* key) {
  if (!r.Has(key)) return std::nullopt;
  return r.Field(key).String();
}

// `model`, its fields as the profiler writes them (profile.h).
ModelRecord ModelFromJson(const JsonReader& r) {
  r.ExpectObject();
  ModelRecord m;
  m.path = OptionalString(r, "path");
  m.sha256 = OptionalString(r, "sha256");
  if (r.Has("inputs")) {
    const JsonReader inputs = r.Field("inputs");
    m.inputs.emplace();
    for (size_t k = 0; k < inputs.ArraySize(); ++k) m.inputs->push_back(InputSpecFromJson(inputs.Item(k)));
  }
  if (r.Has("training")) m.training = r.Field("training").Bool();
  m.loss = OptionalString(r, "loss");
  m.output_choice = OptionalString(r, "output_choice");
  if (r.Has("containers")) {
    const JsonReader containers = r.Field("containers");
    for (size_t k = 0; k < containers.ArraySize(); ++k) m.containers.push_back(containers.Item(k).String());
  }
  return m;
}

nlohmann::json ModelToJson(const ModelRecord& m) {
  nlohmann::json doc = nlohmann::json::object();
  Put(&doc, "path", m.path);
  Put(&doc, "sha256", m.sha256);
  if (m.inputs) {
    doc["inputs"] = nlohmann::json::array();
    for (const InputSpec& spec : *m.inputs) doc["inputs"].push_back(InputSpecToJson(spec));
  }
  Put(&doc, "training", m.training);
  Put(&doc, "loss", m.loss);
  Put(&doc, "output_choice", m.output_choice);
  if (!m.containers.empty()) doc["containers"] = m.containers;
  return doc;
}

EnvironmentRecord EnvironmentFromJson(const JsonReader& r) {
  r.ExpectObject();
  EnvironmentRecord e;
  e.libtorch = OptionalString(r, "libtorch");
  if (r.Has("threads")) e.threads = r.Field("threads").IntegerIn(0, INT32_MAX);
  e.device = OptionalString(r, "device");
  if (r.Has("reps")) e.reps = r.Field("reps").IntegerIn(0, INT32_MAX);
  if (r.Has("seed")) e.seed = r.Field("seed").Integer();
  e.timer = OptionalString(r, "timer");
  e.memory = OptionalString(r, "memory");
  e.dtype = OptionalString(r, "dtype");
  e.autocast = OptionalString(r, "autocast");
  if (r.Has("time_model")) {
    r.Field("time_model").ExpectObject();
    e.time_model = r.Field("time_model").node();
  }
  if (r.Has("phase_seconds")) {
    r.Field("phase_seconds").ExpectObject();
    e.phase_seconds = r.Field("phase_seconds").node();
  }
  return e;
}

nlohmann::json EnvironmentToJson(const EnvironmentRecord& e) {
  nlohmann::json doc = nlohmann::json::object();
  Put(&doc, "libtorch", e.libtorch);
  Put(&doc, "threads", e.threads);
  Put(&doc, "device", e.device);
  Put(&doc, "reps", e.reps);
  Put(&doc, "seed", e.seed);
  Put(&doc, "timer", e.timer);
  Put(&doc, "memory", e.memory);
  Put(&doc, "dtype", e.dtype);
  Put(&doc, "autocast", e.autocast);
  if (!e.time_model.is_null()) doc["time_model"] = e.time_model;
  if (!e.phase_seconds.is_null()) doc["phase_seconds"] = e.phase_seconds;
  return doc;
}

// The calibration's figures, by their keys.
constexpr std::pair<const char*, std::optional<double> Calibration::*> kCalibrationFigures[] = {
    {"stage_run_ms", &Calibration::stage_run_ms},     {"nograd_scale", &Calibration::nograd_scale},
    {"run_step_ms", &Calibration::run_step_ms},       {"module_step_ms", &Calibration::module_step_ms},
    {"module_nograd_scale", &Calibration::module_nograd_scale},
    {"checkpoint_call_ms", &Calibration::checkpoint_call_ms}};

// The calibration: the `calibration` object, or (older profiles) its six
// figures under `totals`.
Calibration CalibrationFromJson(const JsonReader& node) {
  Calibration c;
  if (node.Has("stages")) {
    const JsonReader stages = node.Field("stages");
    for (size_t k = 0; k < stages.ArraySize(); ++k) {
      const JsonReader range = stages.Item(k);
      if (range.ArraySize() != 2) range.Fail("expected [first_op, last_op]");
      const int first = range.Item(0).IntegerIn(0, INT32_MAX);
      c.stages.push_back({first, range.Item(1).IntegerIn(first, INT32_MAX)});
    }
  }
  for (const auto& [key, figure] : kCalibrationFigures) {
    if (node.Has(key)) c.*figure = node.Field(key).NonNegativeNumber();
  }
  return c;
}

nlohmann::json CalibrationToJson(const Calibration& c) {
  nlohmann::json doc = nlohmann::json::object();
  if (!c.stages.empty()) {
    doc["stages"] = nlohmann::json::array();
    for (const OpRange& r : c.stages) doc["stages"].push_back({r.first, r.last});
  }
  for (const auto& [key, figure] : kCalibrationFigures) Put(&doc, key, c.*figure);
  return doc;
}

}  // namespace

std::vector<ParameterRecord> TrainableParameters(const std::vector<ParameterRecord>& parameters) {
  std::vector<ParameterRecord> out;
  for (const ParameterRecord& p : parameters) {
    if (p.requires_grad) out.push_back(p);
  }
  return out;
}

int64_t TrainableBytes(const std::vector<ParameterRecord>& parameters) {
  int64_t bytes = 0;
  for (const ParameterRecord& p : parameters) bytes += p.requires_grad ? p.bytes : 0;
  return bytes;
}

Profile ProfileFromJson(const nlohmann::json& doc, const std::string& file) {
  JsonReader root(doc, file);
  root.ExpectObject();
  root.ExpectSchema("profile");
  Profile p;
  p.model = ModelFromJson(root.Field("model"));
  if (root.Has("environment") && !root.Field("environment").node().is_null()) {
    p.environment = EnvironmentFromJson(root.Field("environment"));
  }

  JsonReader totals = root.Field("totals");
  p.totals.param_bytes = totals.Field("param_bytes").NonNegativeBytes();
  p.totals.buffer_bytes = totals.Field("buffer_bytes").NonNegativeBytes();
  p.totals.input_bytes = totals.Field("input_bytes").NonNegativeBytes();
  p.totals.saved_bytes = totals.Field("saved_bytes").NonNegativeBytes();
  p.totals.output_bytes = totals.Field("output_bytes").NonNegativeBytes();
  p.totals.fwd_ms = totals.Field("fwd_ms").NonNegativeNumber();
  p.totals.bwd_ms = totals.Field("bwd_ms").NonNegativeNumber();
  p.totals.peak_bytes = totals.Field("peak_bytes").NonNegativeBytes();
  if (totals.Has("step_ms")) p.totals.step_ms = totals.Field("step_ms").NonNegativeNumber();
  if (totals.Has("time_noise_pct")) p.totals.time_noise_pct = totals.Field("time_noise_pct").NonNegativeNumber();
  if (totals.Has("autocast_cache_bytes")) {
    p.totals.autocast_cache_bytes = totals.Field("autocast_cache_bytes").NonNegativeBytes();
  }
  if (root.Has("calibration")) root.Field("calibration").ExpectObject();
  p.calibration = CalibrationFromJson(root.Has("calibration") ? root.Field("calibration") : totals);
  if (totals.Has("optimizer_step_ms")) {
    JsonReader steps = totals.Field("optimizer_step_ms");
    steps.ExpectObject();
    for (const char* name : {"sgd", "momentum", "adam"}) {
      if (steps.Has(name)) p.totals.optimizer_step_ms[name] = steps.Field(name).NonNegativeNumber();
    }
  }

  JsonReader tensors = root.Field("tensors");
  if (tensors.ArraySize() > static_cast<size_t>(kMaxStorageId)) tensors.Fail("too many tensors");
  const int tensor_count = static_cast<int>(tensors.ArraySize());
  JsonReader ops = root.Field("ops");
  if (ops.ArraySize() > static_cast<size_t>(kMaxStorageId)) ops.Fail("too many ops");
  const int op_count = static_cast<int>(ops.ArraySize());
  if (op_count == 0) ops.Fail("a profile needs at least one op");
  for (int t = 0; t < tensor_count; ++t) {
    JsonReader r = tensors.Item(static_cast<size_t>(t));
    TensorRecord rec;
    rec.id = r.Field("id").IntegerIn(0, tensor_count - 1);
    if (rec.id != t) r.Field("id").Fail("tensor ids must be 0.." + std::to_string(tensor_count - 1) + " in order");
    rec.shape = ReadShape(r.Field("shape"));
    rec.dtype = r.Field("dtype").String();
    rec.bytes = r.Field("bytes").NonNegativeBytes();
    rec.nbytes = r.Has("nbytes") ? r.Field("nbytes").NonNegativeBytes() : rec.bytes;
    rec.requires_grad = r.Has("requires_grad") ? r.Field("requires_grad").Bool() : false;
    rec.producer = r.Field("producer").IntegerIn(-1, op_count - 1);  // an op id, -1 for a model input
    rec.storage = r.Has("storage") ? r.Field("storage").IntegerIn(-kMaxStorageId, kMaxStorageId) : t;
    rec.kept = r.Has("kept") ? r.Field("kept").Bool() : false;
    rec.external = r.Has("external") ? r.Field("external").Bool() : rec.producer < 0;
    if (r.Has("released_by")) {
      const int op = r.Field("released_by").IntegerIn(-1, op_count - 1);
      if (op >= 0) rec.released_by = op;  // -1: not freed in the backward
    }
    p.tensors.push_back(std::move(rec));
  }
  for (int o = 0; o < op_count; ++o) {
    JsonReader r = ops.Item(static_cast<size_t>(o));
    OpRecord op;
    op.id = r.Field("id").IntegerIn(0, op_count - 1);
    if (op.id != o) r.Field("id").Fail("op ids must be 0.." + std::to_string(op_count - 1) + " in execution order");
    op.kind = r.Field("kind").String();
    op.module = r.Field("module").String();
    op.inputs = ReadIds(r.Field("inputs"), tensor_count);
    op.outputs = ReadIds(r.Field("outputs"), tensor_count);
    op.inplace = r.Has("inplace") ? r.Field("inplace").Bool() : false;
    op.saved_bytes = r.Field("saved_bytes").NonNegativeBytes();
    op.fwd_tmp_bytes = r.Field("fwd_tmp_bytes").NonNegativeBytes();
    op.bwd_tmp_bytes = r.Field("bwd_tmp_bytes").NonNegativeBytes();
    op.fwd_ms = r.Field("fwd_ms").NonNegativeNumber();
    op.bwd_ms = r.Field("bwd_ms").NonNegativeNumber();
    if (r.Has("args")) {
      JsonReader args = r.Field("args");
      for (size_t a = 0; a < args.ArraySize(); ++a) {
        JsonReader arg = args.Item(a);
        ArgRecord rec;
        rec.dtype = arg.Field("dtype").String();
        rec.shape = ReadShape(arg.Field("shape"));
        op.args.push_back(std::move(rec));
      }
    }
    if (r.Has("fwd_nograd_ms")) op.fwd_nograd_ms = r.Field("fwd_nograd_ms").NonNegativeNumber();
    if (r.Has("bwd_span_peak_bytes")) op.bwd_span_peak_bytes = r.Field("bwd_span_peak_bytes").NonNegativeBytes();
    if (r.Has("dropout_p")) op.dropout_p = r.Field("dropout_p").NonNegativeNumber();
    if (r.Has("approximate")) op.approximate = r.Field("approximate").String();
    if (r.Has("is_causal")) op.is_causal = r.Field("is_causal").Bool();
    if (r.Has("grad_nodes")) op.grad_nodes = r.Field("grad_nodes").IntegerIn(0, 1 << 30);
    if (r.Has("wrapped_number_bytes")) op.wrapped_number_bytes = r.Field("wrapped_number_bytes").NonNegativeBytes();
    if (r.Has("recurrent")) {
      JsonReader rnn = r.Field("recurrent");
      op.recurrent.batch_first = rnn.Field("batch_first").Bool();
      op.recurrent.num_layers = rnn.Field("num_layers").IntegerIn(1, 1 << 20);
      op.recurrent.bidirectional = rnn.Field("bidirectional").Bool();
    }
    // Every op reads only what earlier ops made (an in-place op its own
    // output): the op graph's edges all point forward, so it has no cycle.
    for (int t : op.inputs) {
      int producer = p.tensors[static_cast<size_t>(t)].producer;
      if (producer >= o && !(op.inplace && producer == o)) {
        r.Field("inputs").Fail("tensor " + std::to_string(t) + " is used before op " +
                               std::to_string(producer) + " makes it");
      }
    }
    p.ops.push_back(std::move(op));
  }
  if (root.Has("parameters")) {  // optional (distributed plans): name, shape, bytes per parameter
    JsonReader params = root.Field("parameters");
    for (size_t k = 0; k < params.ArraySize(); ++k) {
      JsonReader r = params.Item(k);
      ParameterRecord rec;
      rec.name = r.Field("name").String();
      rec.shape = ReadShape(r.Field("shape"));
      rec.bytes = r.Field("bytes").NonNegativeBytes();
      if (r.Has("requires_grad")) rec.requires_grad = r.Field("requires_grad").Bool();
      p.parameters.push_back(std::move(rec));
    }
  }
  p.inputs = ReadIds(root.Field("inputs"), tensor_count);
  p.outputs = ReadIds(root.Field("outputs"), tensor_count);
  if (root.Has("held_outputs")) p.held_outputs = ReadIds(root.Field("held_outputs"), tensor_count);
  if (root.Has("module_inputs")) {  // optional: {module path: [tensor id, ...]}
    const JsonReader modules = root.Field("module_inputs");
    modules.ExpectObject();
    for (const auto& item : modules.node().items()) {
      p.module_inputs[item.key()] = ReadIds(modules.Field(item.key()), tensor_count);
    }
  }
  if (root.Has("module_eager_peak_bytes")) {  // optional: {module path: bytes}
    const JsonReader modules = root.Field("module_eager_peak_bytes");
    modules.ExpectObject();
    for (const auto& item : modules.node().items()) {
      p.module_eager_peak_bytes[item.key()] = modules.Field(item.key()).NonNegativeBytes();
    }
  }
  {
    std::set<int> seen;
    for (size_t i = 0; i < p.inputs.size(); ++i) {
      const int t = p.inputs[i];
      JsonReader item = root.Field("inputs").Item(i);
      if (!seen.insert(t).second) item.Fail("tensor " + std::to_string(t) + " is listed twice");
      if (p.tensors[static_cast<size_t>(t)].producer != -1) {
        item.Fail("tensor " + std::to_string(t) + " is made by op " +
                  std::to_string(p.tensors[static_cast<size_t>(t)].producer) + ": a model input is made by none");
      }
    }
  }
  // Every byte figure together: the planner's sums of them then fit in an int64.
  {
    int64_t total = 0;
    for (int64_t bytes : {p.totals.param_bytes, p.totals.buffer_bytes, p.totals.input_bytes, p.totals.saved_bytes,
                          p.totals.output_bytes, p.totals.peak_bytes}) {
      total = SaturatingAdd(total, bytes);
    }
    for (const TensorRecord& t : p.tensors) total = SaturatingAdd(SaturatingAdd(total, t.bytes), t.nbytes);
    for (const OpRecord& op : p.ops) {
      total = SaturatingAdd(SaturatingAdd(SaturatingAdd(total, op.saved_bytes), op.fwd_tmp_bytes), op.bwd_tmp_bytes);
    }
    if (total > kMaxTotalBytes) {
      throw BadInput(file + ": its byte figures add up to more than " + LimitText(kMaxTotalBytes) +
                     ", more than any model has");
    }
  }

  return p;
}

nlohmann::json ProfileToJson(const Profile& p) {
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorRecord& t : p.tensors) {
    tensors.push_back({{"id", t.id}, {"shape", t.shape}, {"dtype", t.dtype}, {"bytes", t.bytes}, {"nbytes", t.nbytes},
                       {"requires_grad", t.requires_grad},
                       {"producer", t.producer}, {"storage", t.storage}, {"kept", t.kept},
                       {"external", t.external}});
    if (t.released_by) tensors.back()["released_by"] = *t.released_by;
  }
  nlohmann::json ops = nlohmann::json::array();
  nlohmann::json edges = nlohmann::json::array();
  for (const OpRecord& op : p.ops) {
    ops.push_back({{"id", op.id}, {"kind", op.kind}, {"module", op.module}, {"inputs", op.inputs},
                   {"outputs", op.outputs}, {"inplace", op.inplace}, {"saved_bytes", op.saved_bytes},
                   {"fwd_tmp_bytes", op.fwd_tmp_bytes}, {"bwd_tmp_bytes", op.bwd_tmp_bytes},
                   {"fwd_ms", op.fwd_ms}, {"bwd_ms", op.bwd_ms}});
    if (!op.args.empty()) {
      nlohmann::json args = nlohmann::json::array();
      for (const ArgRecord& a : op.args) args.push_back({{"shape", a.shape}, {"dtype", a.dtype}});
      ops.back()["args"] = std::move(args);
    }
    if (op.fwd_nograd_ms) ops.back()["fwd_nograd_ms"] = *op.fwd_nograd_ms;
    if (op.bwd_span_peak_bytes) ops.back()["bwd_span_peak_bytes"] = *op.bwd_span_peak_bytes;
    if (op.dropout_p > 0) ops.back()["dropout_p"] = op.dropout_p;
    if (!op.approximate.empty()) ops.back()["approximate"] = op.approximate;
    if (op.is_causal) ops.back()["is_causal"] = true;
    if (op.grad_nodes) ops.back()["grad_nodes"] = *op.grad_nodes;
    if (op.wrapped_number_bytes > 0) ops.back()["wrapped_number_bytes"] = op.wrapped_number_bytes;
    if (op.recurrent.num_layers > 0) {
      ops.back()["recurrent"] = {{"batch_first", op.recurrent.batch_first}, {"num_layers", op.recurrent.num_layers},
                                 {"bidirectional", op.recurrent.bidirectional}};
    }
    for (int t : op.inputs) {
      int producer = p.tensors[static_cast<size_t>(t)].producer;
      edges.push_back({{"from", producer}, {"to", op.id}, {"tensor", t}});
    }
  }
  nlohmann::json totals = {{"param_bytes", p.totals.param_bytes}, {"buffer_bytes", p.totals.buffer_bytes},
                           {"input_bytes", p.totals.input_bytes}, {"saved_bytes", p.totals.saved_bytes},
                           {"output_bytes", p.totals.output_bytes}, {"fwd_ms", p.totals.fwd_ms},
                           {"bwd_ms", p.totals.bwd_ms}, {"peak_bytes", p.totals.peak_bytes}};
  if (!p.totals.optimizer_step_ms.empty()) totals["optimizer_step_ms"] = p.totals.optimizer_step_ms;
  if (p.totals.step_ms) totals["step_ms"] = *p.totals.step_ms;
  if (p.totals.time_noise_pct) totals["time_noise_pct"] = *p.totals.time_noise_pct;
  if (p.totals.autocast_cache_bytes > 0) totals["autocast_cache_bytes"] = p.totals.autocast_cache_bytes;
  nlohmann::json doc = {{"schema", "ckplan.profile/1"},
                        {"model", ModelToJson(p.model)},
                        {"environment", EnvironmentToJson(p.environment)},
                        {"totals", std::move(totals)},
                        {"inputs", p.inputs},
                        {"outputs", p.outputs},
                        {"tensors", std::move(tensors)},
                        {"ops", std::move(ops)},
                        {"edges", std::move(edges)}};
  if (!p.calibration.empty()) doc["calibration"] = CalibrationToJson(p.calibration);
  if (!p.module_inputs.empty()) doc["module_inputs"] = p.module_inputs;
  if (!p.held_outputs.empty()) doc["held_outputs"] = p.held_outputs;
  if (!p.module_eager_peak_bytes.empty()) doc["module_eager_peak_bytes"] = p.module_eager_peak_bytes;
  if (!p.parameters.empty()) {
    nlohmann::json params = nlohmann::json::array();
    for (const ParameterRecord& rec : p.parameters) {
      params.push_back({{"name", rec.name}, {"shape", rec.shape}, {"bytes", rec.bytes}});
      if (!rec.requires_grad) params.back()["requires_grad"] = false;
    }
    doc["parameters"] = std::move(params);
  }
  return doc;
}

}  // namespace ckplan
