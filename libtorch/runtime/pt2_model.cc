// Models saved with torch.export (`.pt2` archives): the program's ATen graph,
// its signature, parameters, buffers and constants, read in C++ and turned
// into the same form a TorchScript model takes here (a module holding the
// weights and a `forward` graph of ATen operators), so that the interpreter,
// the profiler and the executor run either kind node by node alike.
//
// The archive (PT2 archive spec, version 0/1): `models/<name>.json` is the
// serialized ExportedProgram (torch/_export/serde/schema.py), weights are raw
// storages in `data/weights/`, described by `<name>_weights_config.json`;
// constants likewise in `data/constants/`.

#include "libtorch/runtime/pt2_model.h"

#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/ir/ir.h>
#include <torch/csrc/jit/runtime/operator.h>
#include <nlohmann/json.hpp>

#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <unordered_map>

#include "planner/base/error.h"
#include "libtorch/runtime/graph_program.h"

namespace ckplan {
namespace {

using nlohmann::json;
using torch::jit::Graph;
using torch::jit::Node;
using torch::jit::Value;

const c10::Symbol kModuleAttr = c10::Symbol::attr("ckplan_module");
const c10::Symbol kCallInputAttr = c10::Symbol::attr("ckplan_call_input_of");
const c10::Symbol kWrappedNumberAttr = c10::Symbol::attr("ckplan_wrapped_number_bytes");
const c10::Symbol kAutocastAttr = c10::Symbol::attr("ckplan_autocast");
// On the node making the program's first output when it is the job's loss
// (ckplan_torch.export's loss_fn): the graph's training loss, back-propagated as it is.
const c10::Symbol kJobLossAttr = c10::Symbol::attr("ckplan_job_loss");

// Eager PyTorch passes a Python number given for a Tensor argument as a
// 0-dim "wrapped number" host tensor (a double or an int64, 8 bytes), and
// the autograd nodes of these ops save it (`x * 0.5`: MulBackward0 keeps the
// 0.5 to scale the gradient); saved_tensors_hooks never see such a tensor.
// ckplan runs the Scalar overload, which keeps a number: the bytes eager
// keeps, by the exported target and the argument given as a number.
int64_t WrappedNumberBytes(const std::string& target, const json& inputs) {
  static const std::set<std::string> kSaveOther = {"torch.ops.aten.mul.Tensor", "torch.ops.aten.div.Tensor",
                                                   "torch.ops.aten.div.Tensor_mode"};
  if (kSaveOther.count(target) == 0) return 0;
  for (const json& input : inputs) {
    if (input.value("name", "") != "other") continue;
    const json& arg = input["arg"];
    if (arg.contains("as_float") || arg.contains("as_int")) return 8;
    if (arg.contains("as_bool")) return 1;
  }
  return 0;
}

// torch/_export/serde/schema.py ScalarType -> c10.
c10::ScalarType ScalarTypeOf(int code, const std::string& where) {
  switch (code) {
    case 1: return c10::ScalarType::Byte;
    case 2: return c10::ScalarType::Char;
    case 3: return c10::ScalarType::Short;
    case 4: return c10::ScalarType::Int;
    case 5: return c10::ScalarType::Long;
    case 6: return c10::ScalarType::Half;
    case 7: return c10::ScalarType::Float;
    case 8: return c10::ScalarType::Double;
    case 9: return c10::ScalarType::ComplexHalf;
    case 10: return c10::ScalarType::ComplexFloat;
    case 11: return c10::ScalarType::ComplexDouble;
    case 12: return c10::ScalarType::Bool;
    case 13: return c10::ScalarType::BFloat16;
    case 28: return c10::ScalarType::UInt16;
    case 29: return c10::ScalarType::Float8_e4m3fn;
    case 30: return c10::ScalarType::Float8_e5m2;
    case 31: return c10::ScalarType::Float8_e4m3fnuz;
    case 32: return c10::ScalarType::Float8_e5m2fnuz;
    case 34: return c10::ScalarType::UInt32;
    case 35: return c10::ScalarType::UInt64;
    default: throw BadInput(where + ": unknown scalar type code " + std::to_string(code));
  }
}

c10::MemoryFormat MemoryFormatOf(int code) {
  switch (code) {
    case 2: return c10::MemoryFormat::ChannelsLast;
    case 3: return c10::MemoryFormat::ChannelsLast3d;
    case 4: return c10::MemoryFormat::Preserve;
    default: return c10::MemoryFormat::Contiguous;
  }
}

c10::Layout LayoutOf(int code, const std::string& where) {
  if (code == 7 || code == 0) return c10::Layout::Strided;
  throw BadInput(where + ": a sparse or mkldnn layout (code " + std::to_string(code) + "): ckplan runs dense tensors");
}

std::vector<int64_t> Ints(const json& list, const std::string& where) {
  std::vector<int64_t> out;
  for (const json& item : list) {
    if (!item.contains("as_int")) throw BadInput(where + ": a symbolic size in a weight's metadata");
    out.push_back(item["as_int"].get<int64_t>());
  }
  return out;
}

// A float as torch.export writes it: a number, or "Infinity", "-Infinity", "NaN".
double Float(const json& value) {
  if (value.is_number()) return value.get<double>();
  const std::string text = value.get<std::string>();
  if (text == "Infinity" || text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-Infinity" || text == "-inf") return -std::numeric_limits<double>::infinity();
  if (text == "NaN" || text == "nan") return std::numeric_limits<double>::quiet_NaN();
  throw BadInput("unreadable float '" + text + "' in the exported program");
}

class Pt2Reader {
 public:
  explicit Pt2Reader(const std::string& path) : path_(path), reader_(path) {}

  torch::jit::Module Load() {
    if (!reader_.hasRecord("archive_format")) throw BadInput(path_ + ": not a torch.export archive (no archive_format)");
    std::vector<std::string> models;
    for (const std::string& record : reader_.getAllRecords()) {
      if (record.rfind("models/", 0) == 0 && record.size() > 12 && record.substr(record.size() - 5) == ".json") {
        models.push_back(record);
      }
    }
    if (models.empty()) {
      bool aoti = false;
      for (const std::string& record : reader_.getAllRecords()) aoti = aoti || record.rfind("data/aotinductor/", 0) == 0;
      if (aoti) {
        throw BadInput(path_ + ": an AOTInductor package (compiled code, no graph): export the model with "
                               "torch.export.export and save it with torch.export.save (or ckplan_torch.export)");
      }
      throw BadInput(path_ + ": the archive holds no exported program (no models/*.json)");
    }
    if (models.size() > 1) throw BadInput(path_ + ": the archive holds " + std::to_string(models.size()) + " programs; ckplan reads one");
    name_ = models[0].substr(7, models[0].size() - 7 - 5);
    doc_ = ReadJson(models[0]);
    CheckVersion();
    ReadCkplanRecord();
    ReadWeights("data/weights/" + name_ + "_weights_config.json", "data/weights/");
    ReadWeights("data/constants/" + name_ + "_constants_config.json", "data/constants/");
    return Build();
  }

 private:
  json ReadJson(const std::string& record) {
    auto [data, size] = reader_.getRecord(record);
    try {
      return json::parse(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + size);
    } catch (const json::exception&) {
      throw BadInput(path_ + ": " + record + " is not valid JSON");
    }
  }

  void CheckVersion() {
    // The torch that saved it: refuse a newer schema than this LibTorch's.
    const std::string saved_by = doc_.value("torch_version", std::string("unknown"));
    if (doc_.contains("schema_version") && doc_["schema_version"].contains("major")) {
      const int major = doc_["schema_version"]["major"].get<int>();
      if (major > kSchemaMajor) {
        throw BadInput(path_ + ": saved by torch " + saved_by + " (export schema " + std::to_string(major) +
                       ") newer than the LibTorch " + LibTorchVersion() + " ckplan was built with (schema " +
                       std::to_string(kSchemaMajor) + "); export with that torch version or rebuild ckplan");
      }
    }
  }

  // extra/ckplan.json, written by ckplan_torch.export: whether the archive
  // is shapes-only (a model on the meta device: weights without data) and
  // which weights are tied.
  void ReadCkplanRecord() {
    if (!reader_.hasRecord("extra/ckplan.json")) return;
    json record = ReadJson("extra/ckplan.json");
    shapes_only_ = record.value("shapes_only", false);
    job_loss_ = record.contains("loss") && record["loss"].is_object();
    if (record.contains("aliases") && record["aliases"].is_object()) {
      for (const auto& [name, target] : record["aliases"].items()) aliases_[name] = target.get<std::string>();
    }
  }

  // A weight of a shapes-only archive: a meta tensor (shape, strides, dtype).
  at::Tensor MetaWeight(const json& meta, c10::ScalarType type, const std::string& where) {
    const std::vector<int64_t> sizes = Ints(meta["sizes"], where), strides = Ints(meta["strides"], where);
    return at::empty_strided(sizes, strides, at::TensorOptions().dtype(type).device(c10::kMeta));
  }

  void ReadWeights(const std::string& config_record, const std::string& dir) {
    if (!reader_.hasRecord(config_record)) return;
    json config = ReadJson(config_record);
    if (!config.contains("config")) return;
    for (const auto& [name, entry] : config["config"].items()) {
      const std::string file = entry["path_name"].get<std::string>();
      if (entry.value("use_pickle", false)) {
        throw BadInput(path_ + ": weight '" + name + "' is pickled (a tensor subclass?): ckplan reads plain tensors");
      }
      const json& meta = entry["tensor_meta"];
      const std::string where = path_ + ": weight '" + name + "'";
      const c10::ScalarType type = ScalarTypeOf(meta["dtype"].get<int>(), where);
      LayoutOf(meta.value("layout", 7), where);
      const bool meta_weight = shapes_only_ || (meta.contains("device") && meta["device"].value("type", "") == "meta");
      auto found = tensors_.find(dir + file);
      at::Tensor t;
      if (meta_weight) {
        // Tied weights are one tensor, under the first name of the group.
        auto alias = aliases_.find(name);
        const std::string key = dir + "\n" + (alias == aliases_.end() ? name : alias->second);
        auto tied = tensors_.find(key);
        t = tied != tensors_.end() ? tied->second : MetaWeight(meta, type, where);
        tensors_[key] = t;
        shapes_only_ = true;
      } else if (found != tensors_.end()) {
        t = found->second;  // tied weights: one file, one tensor
      } else {
        auto [data, size] = reader_.getRecord(dir + file);
        const int64_t element = static_cast<int64_t>(c10::elementSize(type));
        at::Tensor storage = at::empty({static_cast<int64_t>(size) / element}, at::TensorOptions().dtype(type));
        std::memcpy(storage.data_ptr(), data.get(), static_cast<size_t>(storage.numel() * element));
        const std::vector<int64_t> sizes = Ints(meta["sizes"], where), strides = Ints(meta["strides"], where);
        const int64_t offset = meta["storage_offset"].value("as_int", int64_t{0});
        int64_t needed = offset + 1;
        for (size_t d = 0; d < sizes.size(); ++d) needed += (sizes[d] - 1) * strides[d];
        if (sizes.empty()) needed = offset + 1;
        if (needed > storage.numel()) throw BadInput(where + ": its file is shorter than its sizes say");
        // Its own storage, not a view of the file's: parameters are leaves.
        t = storage.as_strided(sizes, strides, offset).clone();
        tensors_[dir + file] = t;
      }
      const bool parameter = entry.value("is_param", false) || meta.value("requires_grad", false);
      // A parameter the job froze (requires_grad false: a fine-tuning job's
      // base weights) stays frozen: autograd then saves nothing for it, and
      // it gets no gradient, no optimizer state and no update.
      weights_[name] = {t, parameter, parameter && meta.value("requires_grad", true)};
    }
  }

  // The module holding the weights, one submodule per path component, as
  // `model.named_parameters()` names them.
  torch::jit::Module& ModuleFor(const std::vector<std::string>& parts, size_t depth) {
    std::string key;
    torch::jit::Module* current = &root_;
    for (size_t i = 0; i < depth; ++i) {
      key += (i ? "." : "") + parts[i];
      auto it = submodules_.find(key);
      if (it == submodules_.end()) {
        // A module no op ran in (nn.ModuleList, nn.ModuleDict: never
        // called, its children are) is named a container, as the profile
        // says (model.containers): no plan can wrap it.
        const std::string kind = called_.count(key) != 0 ? "M" : "Container";
        auto type = c10::ClassType::create(
            c10::QualifiedName("__torch__.ckplan_pt2." + kind + std::to_string(submodules_.size())), cu_, true);
        torch::jit::Module child(cu_, type);
        child.register_attribute("training", c10::BoolType::get(), true);
        current->register_module(parts[i], child);
        it = submodules_.emplace(key, torch::jit::Module(current->attr(parts[i]).toObject())).first;
      }
      current = &it->second;
    }
    return *current;
  }

  static std::vector<std::string> Parts(const std::string& name) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (size_t dot = name.find('.'); dot != std::string::npos; dot = name.find('.', start)) {
      parts.push_back(name.substr(start, dot - start));
      start = dot + 1;
    }
    parts.push_back(name.substr(start));
    return parts;
  }

  // The weight as an attribute of the module (parameters require grad
  // unless the exported model froze them).
  void Register(const std::string& name, bool parameter) {
    auto it = weights_.find(name);
    if (it == weights_.end()) throw BadInput(path_ + ": the program uses weight '" + name + "' the archive lacks");
    const std::vector<std::string> parts = Parts(name);
    torch::jit::Module& owner = ModuleFor(parts, parts.size() - 1);
    if (owner.hasattr(parts.back())) return;
    at::Tensor t = it->second.tensor;
    if (parameter) {
      t.set_requires_grad(it->second.requires_grad);
      owner.register_parameter(parts.back(), t, false);
    } else {
      owner.register_buffer(parts.back(), t);
    }
  }

  Value* WeightValue(Graph& graph, const std::string& name) {
    const std::vector<std::string> parts = Parts(name);
    Value* v = self_;
    for (const std::string& part : parts) v = graph.insertGetAttr(v, part);
    return v;
  }

  torch::jit::Module Build() {
    cu_ = std::make_shared<torch::jit::CompilationUnit>();
    auto type = c10::ClassType::create(c10::QualifiedName("__torch__.ckplan_pt2.Model"), cu_, true);
    root_ = torch::jit::Module(cu_, type);
    root_.register_attribute("training", c10::BoolType::get(), true);
    auto graph = std::make_shared<Graph>();
    graph_ = graph.get();
    Value* self = graph->addInput("self");
    self->setType(type);

    const json& module = doc_["graph_module"];
    const json& signature = module["signature"];
    const json& g = module["graph"];
    // Inputs: weights become attributes of the module, user inputs the
    // forward's inputs, in the signature's order.
    // A weight is read where it is used (a GetAttr before each use, as
    // TorchScript's traces do), never carried from the graph's start: a
    // value made early and read late would cross every stage cut.
    self_ = self;
    // The modules called: every path on an op's nn_module_stack ("key,path,type;...").
    for (const json& node : g["nodes"]) {
      if (!node.contains("metadata") || !node["metadata"].contains("nn_module_stack")) continue;
      const std::string stack = node["metadata"]["nn_module_stack"].get<std::string>();
      for (size_t start = 0; start < stack.size();) {
        const size_t end = std::min(stack.find(';', start), stack.size());
        const std::string entry = stack.substr(start, end - start);
        const size_t a = entry.find(',');
        const size_t b = a == std::string::npos ? std::string::npos : entry.find(',', a + 1);
        if (b != std::string::npos) called_.insert(entry.substr(a + 1, b - a - 1));
        start = end + 1;
      }
    }
    auto weight = [&](const json& arg, const std::string& name, bool parameter) {
      Register(name, parameter);
      weight_args_[arg["name"].get<std::string>()] = {name, parameter};
    };
    for (const json& spec : signature["input_specs"]) {
      if (spec.contains("parameter")) {
        weight(spec["parameter"]["arg"], spec["parameter"]["parameter_name"].get<std::string>(), true);
      } else if (spec.contains("buffer")) {
        weight(spec["buffer"]["arg"], spec["buffer"]["buffer_name"].get<std::string>(), false);
      } else if (spec.contains("tensor_constant")) {
        weight(spec["tensor_constant"]["arg"], spec["tensor_constant"]["tensor_constant_name"].get<std::string>(), false);
      } else if (spec.contains("user_input")) {
        const json& arg = spec["user_input"]["arg"];
        if (!arg.contains("as_tensor")) {
          throw BadInput(path_ + ": a model input that is not a tensor (" + arg.dump().substr(0, 80) +
                         "): export with tensor inputs only");
        }
        Value* v = graph->addInput(arg["as_tensor"]["name"].get<std::string>());
        v->setType(c10::TensorType::get());
        values_[arg["as_tensor"]["name"].get<std::string>()] = v;
      } else if (spec.contains("constant_input")) {
        // A Python value the model was called with (a bool option, an int):
        // torch.export specialized the program to it; no input at run time.
        continue;
      } else {
        throw BadInput(path_ + ": unsupported program input " + spec.begin().key() + " (custom objects, tokens)");
      }
    }
    for (const json& node : g["nodes"]) AddNode(*graph, node);
    TagModuleCallInputs(module);
    std::vector<Value*> outputs;
    for (const json& spec : signature["output_specs"]) {
      if (!spec.contains("user_output")) continue;  // buffer mutations are done in place by the ops
      const json& arg = spec["user_output"]["arg"];
      if (!arg.contains("as_tensor")) continue;
      outputs.push_back(Lookup(arg["as_tensor"]["name"].get<std::string>(), "the program's output"));
    }
    if (outputs.empty()) throw BadInput(path_ + ": the exported program returns no tensor");
    if (job_loss_) {
      if (outputs[0]->node()->kind() == c10::prim::Param) {
        throw BadInput(path_ + ": the job's loss (loss_fn) returns an input as it is: return a loss computed "
                       "from the model's output");
      }
      outputs[0]->node()->i_(kJobLossAttr, 1);
    }
    if (outputs.size() == 1) {
      graph->registerOutput(outputs[0]);
    } else {
      graph->registerOutput(graph->insertNode(graph->createTuple(outputs))->output());
    }
    auto fn = cu_->create_function(c10::QualifiedName(*type->name(), "forward"), graph);
    type->addMethod(fn);
    // Eval mode when every op that depends on the mode ran as in eval. Ops
    // of both kinds are training with parts kept in eval on purpose (a frozen
    // batch norm); a program with none runs alike in either mode.
    if (eval_mode_ops_ > 0 && train_mode_ops_ == 0) root_.train(false);
    return root_;
  }

  // The tensors each module was called with, where the export kept the
  // modules' call signatures (`module_call_graph`, ckplan_torch.export keeps
  // them): the node making each such value is tagged "OUTPUT_INDEX PATH"
  // (kCallInputAttr; ModuleCallInputs reads it back). A module called more
  // than once ("relu@1") counts every call under its path. Model inputs and
  // weights are left out: a step holds them anyway.
  void TagModuleCallInputs(const json& module) {
    if (!module.contains("module_call_graph") || !module["module_call_graph"].is_array()) return;
    std::map<Node*, std::set<std::string>> tags;
    auto tag = [&](const std::string& name, const std::string& path) {
      auto it = values_.find(name);
      if (it == values_.end() || it->second->node()->kind() == c10::prim::Param) return;
      tags[it->second->node()].insert(std::to_string(it->second->offset()) + " " + path);
    };
    for (const json& entry : module["module_call_graph"]) {
      if (!entry.contains("fqn") || !entry.contains("signature") || !entry["signature"].is_object()) continue;
      std::string path = entry["fqn"].get<std::string>();
      path = path.substr(0, path.find('@'));
      if (path.empty() || !entry["signature"].contains("inputs")) continue;
      for (const json& arg : entry["signature"]["inputs"]) {
        if (arg.contains("as_tensor")) tag(arg["as_tensor"]["name"].get<std::string>(), path);
        if (arg.contains("as_tensors")) {
          for (const json& t : arg["as_tensors"]) tag(t["name"].get<std::string>(), path);
        }
      }
    }
    for (auto& [node, entries] : tags) node->ss_(kCallInputAttr, std::vector<std::string>(entries.begin(), entries.end()));
  }

  // torch.export records no training flag: a program's mode shows in the ops
  // that depend on it, in their `train`/`training` argument (dropout, rrelu,
  // batch norm with running statistics: without them it uses the batch's
  // in either mode) or in batch norm's eval-only and train-only forms.
  void NoteMode(const std::string& qualified, const std::unordered_map<std::string, const json*>& given) {
    if (qualified == "aten::_native_batch_norm_legit_no_training" || qualified == "aten::_batch_norm_no_update") {
      ++eval_mode_ops_;
      return;
    }
    if (qualified == "aten::_batch_norm_with_update") {
      ++train_mode_ops_;
      return;
    }
    if (qualified.find("batch_norm") != std::string::npos) {
      auto stats = given.find("running_mean");
      const bool has_stats = stats != given.end() && (stats->second->contains("as_tensor") ||
                                                      (stats->second->contains("as_optional_tensor") &&
                                                       stats->second->at("as_optional_tensor").contains("as_tensor")));
      if (!has_stats) return;
    }
    for (const char* name : {"train", "training"}) {
      auto flag = given.find(name);
      if (flag == given.end() || !flag->second->contains("as_bool")) continue;
      if (flag->second->at("as_bool").get<bool>()) {
        ++train_mode_ops_;
      } else {
        ++eval_mode_ops_;
      }
    }
  }

  Value* Lookup(const std::string& name, const std::string& where) {
    auto weight = weight_args_.find(name);
    if (weight != weight_args_.end()) return WeightValue(*graph_, weight->second.first);
    auto it = values_.find(name);
    if (it == values_.end()) throw BadInput(path_ + ": " + where + " reads '" + name + "', which nothing made");
    return it->second;
  }

  // An argument of the serialized graph as a value of the jit graph.
  Value* ArgValue(Graph& graph, const json& arg, const std::string& where) {
    auto constant = [&](const c10::IValue& v) { return graph.insertConstant(v); };
    if (arg.contains("as_none")) return constant(c10::IValue());
    if (arg.contains("as_tensor")) return Lookup(arg["as_tensor"]["name"].get<std::string>(), where);
    if (arg.contains("as_optional_tensor")) {
      const json& o = arg["as_optional_tensor"];
      if (o.contains("as_tensor")) return Lookup(o["as_tensor"]["name"].get<std::string>(), where);
      return constant(c10::IValue());
    }
    if (arg.contains("as_tensors") || arg.contains("as_optional_tensors")) {
      const bool optional = arg.contains("as_optional_tensors");
      std::vector<Value*> items;
      for (const json& t : arg[optional ? "as_optional_tensors" : "as_tensors"]) {
        if (optional && !t.contains("as_tensor")) {
          items.push_back(constant(c10::IValue()));
        } else {
          items.push_back(Lookup((optional ? t["as_tensor"] : t)["name"].get<std::string>(), where));
        }
      }
      c10::TypePtr element = c10::TensorType::get();
      if (optional) element = c10::OptionalType::create(element);
      return graph.insertNode(graph.createList(element, items))->output();
    }
    if (arg.contains("as_int")) return constant(arg["as_int"].get<int64_t>());
    if (arg.contains("as_ints")) return constant(c10::IValue(arg["as_ints"].get<std::vector<int64_t>>()));
    if (arg.contains("as_float")) return constant(Float(arg["as_float"]));
    if (arg.contains("as_floats")) {
      std::vector<double> values;
      for (const json& f : arg["as_floats"]) values.push_back(Float(f));
      return constant(c10::IValue(values));
    }
    if (arg.contains("as_bool")) return constant(arg["as_bool"].get<bool>());
    if (arg.contains("as_bools")) {
      c10::List<bool> list;
      for (bool b : arg["as_bools"].get<std::vector<bool>>()) list.push_back(b);
      return constant(c10::IValue(list));
    }
    if (arg.contains("as_string")) return constant(arg["as_string"].get<std::string>());
    if (arg.contains("as_scalar_type")) {
      return constant(static_cast<int64_t>(ScalarTypeOf(arg["as_scalar_type"].get<int>(), where)));
    }
    if (arg.contains("as_memory_format")) {
      return constant(static_cast<int64_t>(MemoryFormatOf(arg["as_memory_format"].get<int>())));
    }
    if (arg.contains("as_layout")) return constant(static_cast<int64_t>(LayoutOf(arg["as_layout"].get<int>(), where)));
    if (arg.contains("as_device")) {
      const json& d = arg["as_device"];
      std::string text = d["type"].get<std::string>();
      if (d.contains("index") && !d["index"].is_null()) text += ":" + std::to_string(d["index"].get<int>());
      return constant(c10::Device(text));
    }
    if (arg.contains("as_sym_int")) return SymInt(graph, arg["as_sym_int"], where);
    if (arg.contains("as_sym_ints")) {
      std::vector<Value*> items;
      for (const json& s : arg["as_sym_ints"]) items.push_back(SymInt(graph, s, where));
      return graph.insertNode(graph.createList(c10::IntType::get(), items))->output();
    }
    if (arg.contains("as_sym_float")) {
      const json& s = arg["as_sym_float"];
      if (s.contains("as_float")) return constant(Float(s["as_float"]));
      return Lookup(s["as_name"].get<std::string>(), where);
    }
    if (arg.contains("as_sym_bool")) {
      const json& s = arg["as_sym_bool"];
      if (s.contains("as_bool")) return constant(s["as_bool"].get<bool>());
      return Lookup(s["as_name"].get<std::string>(), where);
    }
    throw BadInput(path_ + ": " + where + ": unsupported argument " + arg.begin().key());
  }

  Value* SymInt(Graph& graph, const json& s, const std::string& where) {
    if (s.contains("as_int")) return graph.insertConstant(s["as_int"].get<int64_t>());
    return Lookup(s["as_name"].get<std::string>(), where);
  }

  static std::string ModulePath(const json& node) {
    if (!node.contains("metadata") || !node["metadata"].contains("nn_module_stack")) return "";
    const std::string stack = node["metadata"]["nn_module_stack"].get<std::string>();
    // "key,path,type;key,path,type": the innermost module is the last entry.
    const size_t last = stack.rfind(';');
    const std::string entry = last == std::string::npos ? stack : stack.substr(last + 1);
    const size_t a = entry.find(',');
    const size_t b = a == std::string::npos ? std::string::npos : entry.find(',', a + 1);
    if (b == std::string::npos) return "";
    return entry.substr(a + 1, b - a - 1);
  }

  void AddNode(Graph& graph, const json& node) {
    const std::string target = node["target"].get<std::string>();
    const std::string path = ModulePath(node);
    const std::string where = "node '" + node.value("name", target) + "' (" + target + ") in " +
                              (path.empty() ? std::string("the top-level module") : "module '" + path + "'");
    if (target == "torch.ops.higher_order.wrap_with_autocast") {
      InlineAutocast(graph, node, where);
      return;
    }
    if (target.rfind("torch.ops.higher_order.", 0) == 0) {
      throw BadInput(path_ + ": " + where + ": a higher-order op (" + target.substr(23) +
                     ": control flow, checkpoint or another wrapped region); ckplan runs graphs of ATen "
                     "ops: export the model without it");
    }
    // A check of the dtype the export saw (`x.float()` records one): a no-op
    // that --dtype or --autocast would fail for nothing.
    if (target == "torch.ops.aten._assert_tensor_metadata.default") return;
    // Integer arithmetic on symbolic sizes: Python's operators.
    static const std::map<std::string, std::string> kIntOps = {
        {"_operator.add", "aten::add.int"},           {"_operator.sub", "aten::sub.int"},
        {"_operator.mul", "aten::mul.int"},           {"_operator.floordiv", "aten::floordiv.int"},
        {"_operator.mod", "aten::remainder.int"},     {"_operator.neg", "aten::neg.int"}};
    std::string qualified, overload;
    auto int_op = kIntOps.find(target);
    if (int_op != kIntOps.end()) {
      const size_t dot = int_op->second.find('.');
      qualified = int_op->second.substr(0, dot);
      overload = int_op->second.substr(dot + 1);
    } else if (target.rfind("torch.ops.", 0) == 0) {
      // torch.ops.<namespace>.<op>.<overload>
      const std::string rest = target.substr(10);
      const size_t first = rest.find('.');
      const size_t last = rest.rfind('.');
      if (first == std::string::npos || last == first) throw BadInput(path_ + ": " + where + ": unreadable target");
      qualified = rest.substr(0, first) + "::" + rest.substr(first + 1, last - first - 1);
      overload = rest.substr(last + 1);
      if (overload == "default") overload = "";
    } else {
      throw BadInput(path_ + ": " + where + ": unsupported node target");
    }
    // Custom ops of Python libraries, which LibTorch does not load, each run
    // as the ATen op it computes (its arguments: ATen's name -> the custom
    // op's). transformers' grouped_mm_fallback (transformers/integrations/
    // moe.py: a torch.mm per expert over its rows, registered for
    // torch.compile; torch.export records it for experts whose weights are
    // not bfloat16) is aten::_grouped_mm, which a trace of the same model
    // records: the same products, the same tensors saved for backward.
    struct Decomposed {
      std::string op;
      std::map<std::string, std::string> arguments;
    };
    static const std::map<std::string, Decomposed> kDecomposed = {
        {"transformers::grouped_mm_fallback",
         {"aten::_grouped_mm", {{"self", "input"}, {"mat2", "weight"}, {"offs", "offs"}}}}};
    const std::map<std::string, std::string>* renamed = nullptr;
    auto decomposed = kDecomposed.find(qualified);
    if (decomposed != kDecomposed.end() && overload.empty()) {
      qualified = decomposed->second.op;
      renamed = &decomposed->second.arguments;
    }
    const c10::Symbol symbol = c10::Symbol::fromQualString(qualified);
    std::shared_ptr<torch::jit::Operator> op;
    for (const auto& candidate : torch::jit::getAllOperatorsFor(symbol)) {
      if (candidate->schema().overload_name() == overload) op = candidate;
    }
    if (!op) {
      throw BadInput(path_ + ": unknown op " + qualified + (overload.empty() ? "" : "." + overload) + " at " + where +
                     ": LibTorch " + LibTorchVersion() + " does not have it (a custom or extension op?)");
    }
    const c10::FunctionSchema& schema = op->schema();
    // Arguments by name, in the schema's order; defaults where absent.
    std::unordered_map<std::string, const json*> given;
    size_t positional = 0;
    std::vector<const json*> by_position;
    for (const json& input : node["inputs"]) {
      given[input["name"].get<std::string>()] = &input["arg"];
      by_position.push_back(&input["arg"]);
    }
    NoteMode(qualified, given);
    std::vector<Value*> inputs;
    for (const c10::Argument& argument : schema.arguments()) {
      std::string name = argument.name();
      if (renamed) name = renamed->count(name) ? renamed->at(name) : std::string();
      auto it = given.find(name);
      const json* arg = it != given.end() ? it->second : nullptr;
      if (!arg && int_op != kIntOps.end() && positional < by_position.size()) arg = by_position[positional];
      ++positional;
      if (arg) {
        inputs.push_back(ArgValue(graph, *arg, where));
      } else if (argument.default_value()) {
        inputs.push_back(graph.insertConstant(*argument.default_value()));
      } else {
        throw BadInput(path_ + ": " + where + ": argument '" + argument.name() + "' is missing");
      }
    }
    const json& outputs = node["outputs"];
    const auto& returns = schema.returns();
    Node* n = graph.create(symbol, returns.size());
    for (Value* v : inputs) n->addInput(v);
    if (!path.empty()) n->s_(kModuleAttr, path);
    if (const int64_t bytes = WrappedNumberBytes(target, node["inputs"]); bytes > 0) n->i_(kWrappedNumberAttr, bytes);
    if (!autocast_.empty()) n->i_(kAutocastAttr, autocast_.back());
    graph.insertNode(n);
    for (size_t r = 0; r < returns.size(); ++r) n->output(r)->setType(returns[r].type());
    if (!n->maybeOperator()) {
      std::ostringstream text;
      text << schema;
      throw BadInput(path_ + ": " + where + ": its arguments do not match " + text.str());
    }
    // Outputs: one per return; a list return unpacked into its named tensors.
    for (size_t r = 0; r < returns.size() && r < outputs.size(); ++r) {
      const json& out = outputs[r];
      if (out.contains("as_tensor")) {
        values_[out["as_tensor"]["name"].get<std::string>()] = n->output(r);
      } else if (out.contains("as_sym_int")) {
        if (out["as_sym_int"].contains("as_name")) values_[out["as_sym_int"]["as_name"].get<std::string>()] = n->output(r);
      } else if (out.contains("as_tensors")) {
        const json& names = out["as_tensors"];
        Node* unpack = graph.insertNode(graph.create(c10::prim::ListUnpack, {n->output(r)}, names.size()));
        for (size_t k = 0; k < names.size(); ++k) {
          unpack->output(k)->setType(c10::TensorType::get());
          values_[names[k]["name"].get<std::string>()] = unpack->output(k);
        }
      } else if (out.contains("as_optional_tensors")) {
        const json& items = out["as_optional_tensors"];
        Node* unpack = graph.insertNode(graph.create(c10::prim::ListUnpack, {n->output(r)}, items.size()));
        for (size_t k = 0; k < items.size(); ++k) {
          unpack->output(k)->setType(c10::OptionalType::create(c10::TensorType::get()));
          if (items[k].contains("as_tensor")) values_[items[k]["as_tensor"]["name"].get<std::string>()] = unpack->output(k);
        }
      }
    }
  }

  // A region the model runs under `torch.autocast(...)` of its own
  // (torch.export's wrap_with_autocast: device, dtype, enabled,
  // cache_enabled, the region's graph, its operands): its nodes inlined,
  // each tagged with the region's autocast (kAutocastAttr: its dtype, or
  // kAutocastOff), which GraphProgram::RunNode sets for the op, as eager
  // PyTorch runs the region. Names the region defines are its own: those
  // of the graph around it are put back after.
  void InlineAutocast(Graph& graph, const json& node, const std::string& where) {
    const json& inputs = node["inputs"];
    if (!inputs.is_array() || inputs.size() < 5 || !inputs[4]["arg"].contains("as_graph")) {
      throw BadInput(path_ + ": " + where + ": an autocast region not as torch.export writes it");
    }
    const std::string device = inputs[0]["arg"].value("as_string", std::string("cpu"));
    const bool enabled = inputs[2]["arg"].value("as_bool", true);
    int mode = kAutocastOff;
    if (enabled) {
      const json& dtype = inputs[1]["arg"];
      mode = dtype.contains("as_scalar_type")
                 ? static_cast<int>(ScalarTypeOf(dtype["as_scalar_type"].get<int>(), where))
                 : static_cast<int>(device == "cuda" ? c10::ScalarType::Half : c10::ScalarType::BFloat16);
    }
    const json& sub = inputs[4]["arg"]["as_graph"]["graph"];
    std::unordered_map<std::string, Value*> shadowed;
    std::set<std::string> defined;
    auto define = [&](const std::string& name, Value* v) {
      if (defined.insert(name).second) {
        auto it = values_.find(name);
        if (it != values_.end()) shadowed[name] = it->second;
      }
      values_[name] = v;
    };
    const json& operands = sub["inputs"];
    for (size_t k = 0; k < operands.size(); ++k) {
      if (5 + k >= inputs.size()) throw BadInput(path_ + ": " + where + ": an autocast region missing an operand");
      const json& formal = operands[k];
      if (!formal.contains("as_tensor")) continue;
      const json& actual = inputs[5 + k]["arg"];
      Value* v = actual.contains("as_tensor") ? Lookup(actual["as_tensor"]["name"].get<std::string>(), where)
                                              : ArgValue(graph, actual, where);
      define(formal["as_tensor"]["name"].get<std::string>(), v);
    }
    autocast_.push_back(mode);
    for (const json& inner : sub["nodes"]) {
      AddNode(graph, inner);
      for (const json& out : inner["outputs"]) {  // the region's own names, to put back after
        if (out.contains("as_tensor")) defined.insert(out["as_tensor"]["name"].get<std::string>());
        if (out.contains("as_tensors")) {
          for (const json& t : out["as_tensors"]) defined.insert(t["name"].get<std::string>());
        }
      }
    }
    autocast_.pop_back();
    std::vector<Value*> results;
    for (const json& out : sub["outputs"]) {
      if (!out.contains("as_tensor")) throw BadInput(path_ + ": " + where + ": an autocast region returns a non-tensor");
      results.push_back(Lookup(out["as_tensor"]["name"].get<std::string>(), where));
    }
    for (const std::string& name : defined) {
      auto it = shadowed.find(name);
      if (it != shadowed.end()) values_[name] = it->second;
    }
    std::vector<std::string> names;
    for (const json& out : node["outputs"]) {
      if (out.contains("as_tensor")) names.push_back(out["as_tensor"]["name"].get<std::string>());
      if (out.contains("as_tensors")) {
        for (const json& t : out["as_tensors"]) names.push_back(t["name"].get<std::string>());
      }
    }
    for (size_t k = 0; k < names.size() && k < results.size(); ++k) values_[names[k]] = results[k];
  }

  // torch/_export/serde/schema.py's SCHEMA_VERSION of the build's torch.
  static constexpr int kSchemaMajor = CKPLAN_EXPORT_SCHEMA_MAJOR;

  std::string path_;
  bool shapes_only_ = false;
  bool job_loss_ = false;  // the program returns (the job's loss, the model's outputs...)
  int train_mode_ops_ = 0, eval_mode_ops_ = 0;  // ops that ran as in training, as in eval (NoteMode)
  std::vector<int> autocast_;  // the autocast regions the node being added is in, innermost last
  std::map<std::string, std::string> aliases_;
  caffe2::serialize::PyTorchStreamReader reader_;
  std::string name_;
  json doc_;
  struct Weight {
    at::Tensor tensor;
    bool parameter = false;
    bool requires_grad = true;
  };
  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, Weight> weights_;
  std::shared_ptr<torch::jit::CompilationUnit> cu_;
  torch::jit::Module root_;
  std::map<std::string, torch::jit::Module> submodules_;
  std::set<std::string> called_;  // module paths on some op's nn_module_stack
  std::unordered_map<std::string, Value*> values_;
  std::unordered_map<std::string, std::pair<std::string, bool>> weight_args_;  // placeholder -> (weight, parameter)
  Graph* graph_ = nullptr;
  Value* self_ = nullptr;
};

}  // namespace

bool IsExportArchive(const std::string& path) {
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    return reader.hasRecord("archive_format");
  } catch (const std::exception&) {
    return false;
  }
}

torch::jit::Module LoadExportedProgram(const std::string& path) {
  try {
    return Pt2Reader(path).Load();
  } catch (const Error&) {
    throw;
  } catch (const json::exception& e) {
    throw BadInput(path + ": the exported program's JSON is not as torch.export writes it (" +
                   std::string(e.what()).substr(0, 120) + ")");
  } catch (const c10::Error& e) {
    const std::string what = e.what_without_backtrace();
    throw BadInput(path + ": cannot read the torch.export archive: " + what.substr(0, what.find('\n')));
  }
}

std::string ExportModulePath(const torch::jit::Node* node) {
  return node->hasAttribute(kModuleAttr) ? node->s(kModuleAttr) : std::string();
}

namespace {

// extra/ckplan.json of an archive; null when it has none.
json CkplanRecord(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader reader(path);
  if (!reader.hasRecord("extra/ckplan.json")) return nullptr;
  auto [data, size] = reader.getRecord("extra/ckplan.json");
  return json::parse(static_cast<const char*>(data.get()), static_cast<const char*>(data.get()) + size);
}

}  // namespace

std::vector<std::string> ExportInputSpecs(const std::string& path) {
  std::vector<std::string> specs;
  try {
    const json record = CkplanRecord(path);
    if (!record.is_object() || !record.contains("inputs") || !record["inputs"].is_array()) return specs;
    for (const json& text : record["inputs"]) specs.push_back(text.get<std::string>());
  } catch (const std::exception&) {
    specs.clear();  // a record this reader does not understand: as if none
  }
  return specs;
}

std::map<std::string, int64_t> ExportEagerModulePeaks(const std::string& path, const std::vector<at::Tensor>& inputs) {
  std::map<std::string, int64_t> peaks;
  try {
    const json record = CkplanRecord(path);
    if (!record.is_object() || !record.contains("eager_module_peaks")) return peaks;
    const json& measured = record["eager_module_peaks"];
    const json& examples = measured.at("inputs");
    if (!examples.is_array() || examples.size() != inputs.size()) return peaks;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (examples[i].at("shape").get<std::vector<int64_t>>() != inputs[i].sizes().vec() ||
          examples[i].at("itemsize").get<int64_t>() != static_cast<int64_t>(inputs[i].element_size())) {
        return peaks;  // measured at other shapes: not these
      }
    }
    for (const auto& [module, bytes] : measured.at("bytes").items()) {
      if (bytes.is_number_integer() && bytes.get<int64_t>() >= 0) peaks[module] = bytes.get<int64_t>();
    }
  } catch (const std::exception&) {
    peaks.clear();  // a record this reader does not understand: a measurement only
  }
  return peaks;
}

int ExportAutocast(const torch::jit::Node* node) {
  return node->hasAttribute(kAutocastAttr) ? static_cast<int>(node->i(kAutocastAttr)) : kAutocastOuter;
}

std::optional<std::string> ExportAutocastDtype(const std::string& path) {
  try {
    if (!IsExportArchive(path)) return std::nullopt;
    const json record = CkplanRecord(path);
    if (!record.is_object() || !record.contains("autocast") || !record["autocast"].is_object()) return std::nullopt;
    const json& autocast = record["autocast"];
    if (!autocast.contains("dtype") || !autocast["dtype"].is_string()) return std::nullopt;
    return autocast["dtype"].get<std::string>();
  } catch (const std::exception&) {
    return std::nullopt;  // a record this reader does not understand: as if none
  }
}

int64_t ExportWrappedNumberBytes(const torch::jit::Node* node) {
  return node->hasAttribute(kWrappedNumberAttr) ? node->i(kWrappedNumberAttr) : 0;
}

std::vector<std::pair<std::string, const torch::jit::Value*>> ModuleCallInputs(const torch::jit::Node* node) {
  std::vector<std::pair<std::string, const torch::jit::Value*>> out;
  if (!node->hasAttribute(kCallInputAttr)) return out;
  for (const std::string& entry : node->ss(kCallInputAttr)) {
    const size_t space = entry.find(' ');
    if (space == std::string::npos) continue;
    const size_t offset = std::stoul(entry.substr(0, space));
    if (offset >= node->outputs().size()) continue;
    out.push_back({entry.substr(space + 1), node->outputs()[offset]});
  }
  return out;
}

}  // namespace ckplan
