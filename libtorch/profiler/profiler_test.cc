// LibTorch tests: `ckplan profile` on models made by tests/models/make_models.py
// agrees with PyTorch's own count of what is saved for backward.

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "planner/base/error.h"
#include "planner/cost/chain_from_profile.h"
#include "planner/cost/liveness.h"
#include "planner/cost/stage_cuts.h"
#include "libtorch/profiler/profiler.h"
#include "libtorch/runtime/device.h"

using namespace ckplan;

namespace {

std::string ModelPath(const std::string& name) { return std::string(CKPLAN_TEST_MODELS) + "/" + name + ".pt"; }

nlohmann::json Reference(const std::string& name) {
  std::ifstream in(std::string(CKPLAN_TEST_MODELS) + "/" + name + ".json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

// One profile of the model file `path` at the inputs of test model `name`.
Profile ProfileFile(const std::string& path, const std::string& name) {
  ProfileOptions options;
  options.model_path = path;
  const nlohmann::json reference = Reference(name);
  for (const auto& text : reference["inputs"]) options.inputs.push_back(ParseInputSpec(text.get<std::string>()));
  options.reps = 1;
  std::vector<std::string> warnings;
  Profile profile = ProfileModel(options, &warnings);
  CHECK(warnings.empty());
  return profile;
}

// Profiles are cached: each model is profiled once per test run.
const Profile& ProfileOf(const std::string& name) {
  static std::map<std::string, Profile> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  return cache.emplace(name, ProfileFile(ModelPath(name), name)).first->second;
}

int64_t ModuleSaved(const Profile& p, const std::string& prefix) {
  int64_t total = 0;
  for (const OpRecord& op : p.ops) {
    if (op.module == prefix || op.module.rfind(prefix + ".", 0) == 0) total += op.saved_bytes;
  }
  return total;
}

void CheckAgainstPyTorch(const std::string& name, const std::vector<std::string>& blocks) {
  const Profile& p = ProfileOf(name);
  nlohmann::json ref = Reference(name);
  const double expected = ref["saved_bytes"].get<double>();
  CAPTURE(name);
  CHECK(static_cast<double>(p.totals.saved_bytes) == doctest::Approx(expected).epsilon(0.01));
  for (const std::string& block : blocks) {
    CAPTURE(block);
    REQUIRE(ref["module_saved"].contains(block));
    const double block_expected = ref["module_saved"][block].get<double>();
    CHECK(static_cast<double>(ModuleSaved(p, block)) == doctest::Approx(block_expected).epsilon(0.01));
  }
  // Every op's backward is linked: the step's backward time is covered by ops.
  double bwd = 0;
  for (const OpRecord& op : p.ops) bwd += op.bwd_ms;
  CHECK(bwd > 0);
  CHECK(bwd <= p.totals.bwd_ms * 1.05 + 0.1);
}

std::vector<std::string> Numbered(const std::string& prefix, int count) {
  std::vector<std::string> out;
  for (int i = 0; i < count; ++i) out.push_back(prefix + std::to_string(i));
  return out;
}

std::vector<std::string> StageNames(const Profile& p) {
  std::vector<std::string> names;
  for (const StageCut& s : CutStages(p)) names.push_back(s.name);
  return names;
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

ProfileOptions OneRep(const std::string& model, const std::vector<std::string>& inputs) {
  ProfileOptions options;
  options.model_path = model;
  for (const auto& text : inputs) options.inputs.push_back(ParseInputSpec(text));
  options.reps = 1;
  return options;
}

std::string ProfileError(const std::string& model, const std::vector<std::string>& inputs) {
  ProfileOptions options = OneRep(model, inputs);
  std::vector<std::string> warnings;
  try {
    ProfileModel(options, &warnings);
  } catch (const Error& e) {
    CHECK(e.code() == ExitCode::kBadInput);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("mlp chain: saved bytes equal PyTorch's, per block too, and at least 16 stages") {
  CheckAgainstPyTorch("mlp_chain", Numbered("blocks.", 16));
  CHECK(CutStages(ProfileOf("mlp_chain")).size() >= 16);
}

TEST_CASE("resnet18: saved bytes equal PyTorch's per block, stages are stem parts, blocks, pool, fc") {
  CheckAgainstPyTorch("resnet18", {"layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1",
                                   "layer4.0", "layer4.1"});
  std::vector<std::string> names = StageNames(ProfileOf("resnet18"));
  CHECK(names.size() >= 10);
  for (const char* block : {"layer1.0", "layer1.1", "layer2.0", "layer2.1", "layer3.0", "layer3.1", "layer4.0",
                            "layer4.1", "maxpool", "avgpool", "fc"}) {
    CAPTURE(block);
    CHECK(Contains(names, block));
  }
}

TEST_CASE("mobilenet_v2: the hidden copies of in-place ReLU6 are counted") {
  CheckAgainstPyTorch("mobilenet_v2", Numbered("features.", 18));
}

TEST_CASE("gpt decoder: saved bytes equal PyTorch's, stages are embeddings, each block, final norm, head") {
  CheckAgainstPyTorch("gpt", Numbered("h.", 12));
  std::vector<std::string> names = StageNames(ProfileOf("gpt"));
  for (const std::string& block : Numbered("h.", 12)) {
    CAPTURE(block);
    CHECK(Contains(names, block));
  }
  CHECK(Contains(names, "ln_f"));
  CHECK(Contains(names, "lm_head"));
  CHECK(names.front() == "wte");  // token and position embeddings
}

TEST_CASE("u-net: cuts carry every live tensor, skip connections included") {
  CheckAgainstPyTorch("unet", {"inc", "down1", "down2", "down3", "up1", "up2", "up3"});
  const Profile& p = ProfileOf("unet");
  Chain chain = ChainFromProfile(p);
  // After down3 the three encoder outputs (x1, x2, x3) wait for the decoder:
  // the cut there carries them and down3's own output.
  std::vector<StageCut> cuts = CutStages(p);
  int after_down3 = -1;
  for (size_t i = 0; i < cuts.size(); ++i) {
    if (cuts[i].name.rfind("down3", 0) == 0) after_down3 = static_cast<int>(i);
  }
  REQUIRE(after_down3 >= 0);
  CutLoad load = CutLoadAt(p, cuts[static_cast<size_t>(after_down3)].last_op + 1);
  CHECK(load.tensors == 4);
  CHECK(chain.stages[static_cast<size_t>(after_down3)].out_bytes == load.bytes);
  // 2x8x64x64 + 2x16x32x32 + 2x32x16x16 + 2x64x8x8 floats
  CHECK(load.bytes == (2 * 8 * 64 * 64 + 2 * 16 * 32 * 32 + 2 * 32 * 16 * 16 + 2 * 64 * 8 * 8) * 4);
}

TEST_CASE("transformer encoder with dropout: masks are counted") {
  CheckAgainstPyTorch("transformer_encoder", Numbered("encoder.layers.", 4));
  CHECK(CutStages(ProfileOf("transformer_encoder")).size() >= 4);
}

TEST_CASE("seq-first nn.TransformerEncoder and nn.TransformerDecoder: saved bytes equal PyTorch's, a stage per layer") {
  // Traced, each layer starts with shape arithmetic that reads no
  // activation; the layer is still a stage, and a whole module.
  for (const auto& [name, prefix] : {std::pair<const char*, const char*>{"seq_first_encoder", "encoder.layers."},
                                     {"transformer_decoder", "decoder.layers."}}) {
    CAPTURE(name);
    CheckAgainstPyTorch(name, Numbered(prefix, 3));
    const std::vector<StageCut> stages = CutStages(ProfileOf(name));
    REQUIRE(stages.size() == 3);
    for (size_t i = 0; i < stages.size(); ++i) {
      const std::string layer = prefix + std::to_string(i);
      CHECK(stages[i].name == layer);
      CHECK(stages[i].modules == std::vector<std::string>{layer});
    }
  }
}

TEST_CASE("DenseNet: saved bytes equal PyTorch's, a stage per dense layer though each reads every earlier feature") {
  std::vector<std::string> layers;
  for (const char* block : {"features.denseblock1.denselayer", "features.denseblock2.denselayer"}) {
    for (int i = 1; i <= 3; ++i) layers.push_back(block + std::to_string(i));
  }
  CheckAgainstPyTorch("densenet", layers);
  const Profile& p = ProfileOf("densenet");
  const std::vector<std::string> names = StageNames(p);
  for (const std::string& layer : layers) {
    CAPTURE(layer);
    CHECK(Contains(names, layer));
  }
  // The cut before the third dense layer of a block carries the block's
  // input and the two new feature maps (2x16x8x8 + 2 x 2x8x8x8 floats).
  const std::vector<StageCut> stages = CutStages(p);
  for (const StageCut& stage : stages) {
    if (stage.name != "features.denseblock1.denselayer3") continue;
    const CutLoad load = CutLoadAt(p, stage.first_op);
    CHECK(load.tensors == 3);
    CHECK(load.bytes == (2 * 16 * 8 * 8 + 2 * 2 * 8 * 8 * 8) * 4);
  }
}

TEST_CASE("LSTM and GRU (one op each), and a model returning a tuple: saved bytes equal PyTorch's") {
  CheckAgainstPyTorch("recurrent", {"lstm", "gru", "head"});
  const std::vector<std::string> names = StageNames(ProfileOf("recurrent"));
  CHECK(Contains(names, "lstm"));
  CHECK(Contains(names, "gru"));
  CheckAgainstPyTorch("two_heads", Numbered("body.", 6));
  CHECK(ProfileOf("two_heads").outputs.size() == 2);
}

TEST_CASE("decoder with F.scaled_dot_product_attention: saved bytes equal PyTorch's, a stage per block") {
  CheckAgainstPyTorch("sdpa_decoder", Numbered("h.", 6));
  std::vector<std::string> names = StageNames(ProfileOf("sdpa_decoder"));
  for (const std::string& block : Numbered("h.", 6)) {
    CAPTURE(block);
    CHECK(Contains(names, block));
  }
  bool sdpa = false;
  for (const OpRecord& op : ProfileOf("sdpa_decoder").ops) sdpa = sdpa || op.kind == "aten::scaled_dot_product_attention";
  CHECK(sdpa);
}

TEST_CASE("the same decoder in bfloat16: activations are 2 bytes, saved bytes equal PyTorch's") {
  CheckAgainstPyTorch("bf16_decoder", Numbered("h.", 6));
  const Profile& p = ProfileOf("bf16_decoder");
  int bf16 = 0;
  for (const TensorRecord& t : p.tensors) bf16 += t.dtype == "BFloat16";
  CHECK(bf16 > static_cast<int>(p.tensors.size()) / 2);
  CHECK(p.totals.param_bytes * 2 == ProfileOf("sdpa_decoder").totals.param_bytes);
}

// Hugging Face models, built offline from small configs with random weights.
TEST_CASE("Hugging Face GPT-2: saved bytes equal PyTorch's per block, a stage per block") {
  CheckAgainstPyTorch("gpt2", Numbered("model.transformer.h.", 4));
  std::vector<std::string> names = StageNames(ProfileOf("gpt2"));
  for (const std::string& block : Numbered("model.transformer.h.", 4)) {
    CAPTURE(block);
    CHECK(Contains(names, block));
  }
}

TEST_CASE("Hugging Face Llama (RMSNorm, rotary, grouped-query attention, SwiGLU): per block, a stage per layer") {
  CheckAgainstPyTorch("llama", Numbered("model.model.layers.", 4));
  std::vector<std::string> names = StageNames(ProfileOf("llama"));
  for (const std::string& block : Numbered("model.model.layers.", 4)) {
    CAPTURE(block);
    CHECK(Contains(names, block));
  }
}

TEST_CASE("Hugging Face BERT and ViT encoders: saved bytes equal PyTorch's per layer") {
  const std::map<std::string, std::string> layers = {{"bert", "model.encoder.layer."}, {"vit", "model.layers."}};
  for (const auto& [name, prefix] : layers) {
    CheckAgainstPyTorch(name, Numbered(prefix, 4));
    std::vector<std::string> names = StageNames(ProfileOf(name));
    for (const std::string& block : Numbered(prefix, 4)) {
      CAPTURE(name);
      CAPTURE(block);
      CHECK(Contains(names, block));
    }
  }
}

TEST_CASE("no cut falls just before an op that writes an activation in place") {
  for (const char* name : {"resnet18", "mobilenet_v2", "unet"}) {
    const Profile& p = ProfileOf(name);
    for (const StageCut& s : CutStages(p)) {
      const OpRecord& first = p.ops[static_cast<size_t>(s.first_op)];
      if (first.inplace && !first.inputs.empty()) {
        CAPTURE(name);
        CAPTURE(first.kind);
        CHECK(p.tensors[static_cast<size_t>(first.inputs[0])].external);
      }
    }
  }
}

TEST_CASE("the profile JSON round-trips and records identity, inputs and edges") {
  const Profile& p = ProfileOf("resnet18");
  nlohmann::json doc = ProfileToJson(p);
  CHECK(doc["schema"] == "ckplan.profile/1");
  CHECK(doc["model"]["sha256"].get<std::string>().size() == 64);
  CHECK(doc["model"]["inputs"][0]["shape"] == nlohmann::json::array({2, 3, 64, 64}));
  // The LibTorch ckplan runs on is the torch that made the test models.
  std::ifstream version_file(std::string(CKPLAN_TEST_MODELS) + "/torch_version.json");
  REQUIRE(version_file);
  const std::string torch_version = nlohmann::json::parse(version_file)["torch"].get<std::string>();
  CHECK(doc["environment"]["libtorch"].get<std::string>() == torch_version);
  REQUIRE(doc["edges"].size() > 50);
  for (const auto& edge : doc["edges"]) {
    CHECK(edge["from"].get<int>() < edge["to"].get<int>());
    const auto& consumer = p.ops[edge["to"].get<size_t>()];
    CHECK(std::count(consumer.inputs.begin(), consumer.inputs.end(), edge["tensor"].get<int>()) >= 1);
  }
  Profile back = ProfileFromJson(doc, "resnet18.profile.json");
  CHECK(back.ops.size() == p.ops.size());
  CHECK(back.totals.saved_bytes == p.totals.saved_bytes);
  CHECK(back.ops[0].module == "conv1");
  CHECK(back.ops[0].kind == "aten::_convolution");
  CHECK(back.totals.param_bytes == 11181642 * 4);  // torchvision resnet18 with 10 classes
  // Every op's forward without autograd, and the update of each optimizer
  // the planner knows, are measured and read back; the chain carries them.
  for (size_t k = 0; k < p.ops.size(); ++k) {
    CHECK(p.ops[k].fwd_nograd_ms.has_value());
    CHECK(back.ops[k].fwd_nograd_ms == p.ops[k].fwd_nograd_ms);
  }
  for (const char* name : {"sgd", "momentum", "adam"}) {
    REQUIRE(p.totals.optimizer_step_ms.count(name) == 1);
    CHECK(p.totals.optimizer_step_ms.at(name) > 0);
    CHECK(back.totals.optimizer_step_ms.at(name) == p.totals.optimizer_step_ms.at(name));
  }
  for (const Stage& s : ChainFromProfile(back).stages) CHECK(s.fwd_nograd_ms.has_value());
  // What a recomputation costs as `ckplan run` runs it, measured on the
  // profile's own stages (calibration.h) and read back; each stage's
  // forward without autograd carries it.
  REQUIRE(p.calibration.stage_run_ms);
  REQUIRE(p.calibration.nograd_scale > 0);
  CHECK(back.calibration.stage_run_ms == p.calibration.stage_run_ms);
  CHECK(back.calibration.nograd_scale == p.calibration.nograd_scale);
  const Chain chain = ChainFromProfile(back);
  for (const Stage& s : chain.stages) {
    double ops_ms = 0;
    for (int k = s.ops->first; k <= s.ops->last; ++k) ops_ms += *p.ops[static_cast<size_t>(k)].fwd_nograd_ms;
    CHECK(*s.fwd_nograd_ms == doctest::Approx(*p.calibration.nograd_scale * ops_ms + *p.calibration.stage_run_ms));
  }
  // The step without recomputation as the executor runs it (adam's update
  // included), read back; the chain's step without recomputation, with
  // adam's update, is that step (its loss is what the ops leave of it).
  REQUIRE(p.calibration.run_step_ms > 0);
  CHECK(back.calibration.run_step_ms == p.calibration.run_step_ms);
  double chain_ms = chain.loss_bwd_ms + p.totals.optimizer_step_ms.at("adam");
  for (const Stage& s : chain.stages) chain_ms += s.fwd_ms + s.bwd_ms;
  if (chain.loss_bwd_ms > 0) CHECK(chain_ms == doctest::Approx(*p.calibration.run_step_ms));
  CHECK(chain_ms >= *p.calibration.run_step_ms * (1 - 1e-9));
  // The PyTorch target's step as `ckplan run` runs it (eagerly, nothing
  // wrapped; every stage wrapped; all as one), read back; the chain prices
  // a wrapped module's stages at module_nograd_scale x their ops, a fixed
  // checkpoint_call_ms per wrap, and its step without recomputation, with
  // adam's update, is the eager step.
  REQUIRE(p.calibration.module_step_ms > 0);
  REQUIRE(p.calibration.module_nograd_scale > 0);
  REQUIRE(p.calibration.checkpoint_call_ms);
  CHECK(back.calibration.module_step_ms == p.calibration.module_step_ms);
  CHECK(back.calibration.module_nograd_scale == p.calibration.module_nograd_scale);
  CHECK(back.calibration.checkpoint_call_ms == p.calibration.checkpoint_call_ms);
  CHECK(chain.pytorch.checkpoint_call_ms == p.calibration.checkpoint_call_ms);
  for (const Stage& s : chain.stages) {
    double ops_ms = 0;
    for (int k = s.ops->first; k <= s.ops->last; ++k) ops_ms += *p.ops[static_cast<size_t>(k)].fwd_nograd_ms;
    CHECK(*s.module_fwd_nograd_ms == doctest::Approx(*p.calibration.module_nograd_scale * ops_ms));
  }
  const double eager_ms = chain.ModuleNoRecomputeTimeMs() + p.totals.optimizer_step_ms.at("adam");
  CHECK(eager_ms == doctest::Approx(*p.calibration.module_step_ms));
}

TEST_CASE("bad models and inputs are one-line errors naming the file, op and module") {
  CHECK(ProfileError(ModelPath("missing"), {"4x16"}).find("missing.pt: cannot open") != std::string::npos);
  CHECK(ProfileError(ModelPath("not_a_model"), {"4x16"}).find("not a model archive") != std::string::npos);
  std::string newer = ProfileError(ModelPath("newer_version"), {"4x16"});
  CHECK(newer.find("saved by a newer PyTorch (file format version 99)") != std::string::npos);
  CHECK(newer.find("LibTorch 2.") != std::string::npos);
  CHECK(ProfileError(ModelPath("frozen"), {"4x16"}).find("no parameters that require gradients") != std::string::npos);
  CHECK(ProfileError(ModelPath("resnet18"), {"2x3x64x64", "5"}).find("forward takes 1 input(s), got 2") !=
        std::string::npos);
  std::string shape = ProfileError(ModelPath("resnet18"), {"2x5x64x64"});
  CHECK(shape.find("op aten::_convolution in module 'conv1'") != std::string::npos);
  CHECK(shape.find("2x5x64x64") != std::string::npos);
  std::string custom = ProfileError(ModelPath("custom_op"), {"4x16"});
  CHECK(custom.find("unknown op ckplan_test::scale") != std::string::npos);
  CHECK(custom.find("Scale") != std::string::npos);  // the module that calls it
  CHECK(std::count(custom.begin(), custom.end(), '\n') == 0);
  std::string untrainable = ProfileError(ModelPath("untrainable"), {"4x16"});
  CHECK(untrainable.find("its backward pass fails in PyTorch: one of the variables needed for gradient "
                         "computation has been modified by an inplace operation") != std::string::npos);
  CHECK(std::count(untrainable.begin(), untrainable.end(), '\n') == 0);
  // Inputs larger than the machine: refused before anything is allocated.
  std::string huge = ProfileError(ModelPath("resnet18"), {"10000000x3x224x224"});
  CHECK(huge.find("--input 10000000x3x224x224: the inputs alone need 5.48 TiB, more than this machine's") !=
        std::string::npos);
  const std::string dir = std::string(CKPLAN_TEST_MODELS) + "/";
  CHECK(ProfileError(dir + "zip_without_model.pt", {"4x16"}).find("not a model archive: a zip file with neither") !=
        std::string::npos);
  {
    // A .pt2 cut short (an interrupted copy).
    std::ifstream whole(dir + "small.pt2", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(whole)), std::istreambuf_iterator<char>());
    std::ofstream(dir + "truncated.pt2", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
    std::string truncated = ProfileError(dir + "truncated.pt2", {"4x16"});
    CHECK(truncated.find("truncated.pt2: not a readable model archive: the zip is truncated or corrupted "
                         "(failed finding central directory)") != std::string::npos);
  }
  std::string cond = ProfileError(dir + "control_flow.pt2", {"4x16"});
  CHECK(cond.find("node 'cond' (torch.ops.higher_order.cond) in the top-level module: a higher-order op") !=
        std::string::npos);
  std::string aoti = ProfileError(dir + "aoti_package.pt2", {"4x16"});
  CHECK(aoti.find("an AOTInductor package (compiled code, no graph)") != std::string::npos);
  std::string schema = ProfileError(dir + "newer_schema.pt2", {"4x16"});
  CHECK(schema.find("(export schema 99) newer than the LibTorch 2.") != std::string::npos);
  CHECK(std::count(schema.begin(), schema.end(), '\n') == 0);
  std::string dtype = ProfileError(ModelPath("gpt"), {"4x64:float32"});
  CHECK(dtype.find("module 'wte'") != std::string::npos);
  CHECK(std::count(dtype.begin(), dtype.end(), '\n') == 0);
}

TEST_CASE("a model in eval mode is profiled with a warning") {
  std::vector<std::string> warnings;
  Profile p = ProfileModel(OneRep(ModelPath("eval_mode"), {"4x16"}), &warnings);
  REQUIRE(warnings.size() == 1);
  CHECK(warnings[0].find("eval mode") != std::string::npos);
  CHECK(p.model.training == false);
}

TEST_CASE("profiles are repeatable: same sizes and graph on a second run") {
  std::vector<std::string> warnings;
  Profile again = ProfileModel(OneRep(ModelPath("gpt"), {"4x64:int64:0..512"}), &warnings);
  const Profile& first = ProfileOf("gpt");
  CHECK(again.totals.saved_bytes == first.totals.saved_bytes);
  REQUIRE(again.ops.size() == first.ops.size());
  for (size_t i = 0; i < again.ops.size(); ++i) {
    CHECK(again.ops[i].saved_bytes == first.ops[i].saved_bytes);
    CHECK(again.ops[i].inputs == first.ops[i].inputs);
  }
}

TEST_CASE("--device cuda: the same sizes as on the CPU where a GPU is, a one-line refusal where none is") {
  ProfileOptions options = OneRep(ModelPath("mlp_chain"), {Reference("mlp_chain")["inputs"][0].get<std::string>()});
  options.device = "cuda";
  std::vector<std::string> warnings;
  if (UsableCudaDevices() == 0) {
    try {
      ProfileModel(options, &warnings);
      FAIL("profiled on a GPU on a machine without one");
    } catch (const Error& e) {
      const std::string message = e.what();
      CHECK(e.code() == ExitCode::kBadInput);
      // A CUDA build says there is no GPU; a CPU-only build says it has no CUDA.
      CHECK((message.find("no usable CUDA GPU") != std::string::npos ||
             message.find("this build of ckplan is CPU only") != std::string::npos));
      CHECK(std::count(message.begin(), message.end(), '\n') == 0);
    }
  } else {
    Profile gpu = ProfileModel(options, &warnings);
    const Profile& cpu = ProfileOf("mlp_chain");
    CHECK(gpu.environment.DeviceName().rfind("cuda:0", 0) == 0);
    REQUIRE(gpu.ops.size() == cpu.ops.size());
    // PyTorch's count, and the CPU profile: same tensors kept on either device.
    CHECK(gpu.totals.saved_bytes == Reference("mlp_chain")["saved_bytes"].get<int64_t>());
    for (size_t i = 0; i < gpu.ops.size(); ++i) CHECK(gpu.ops[i].saved_bytes == cpu.ops[i].saved_bytes);
    CHECK(gpu.totals.peak_bytes >= gpu.totals.saved_bytes);
    CHECK(gpu.totals.fwd_ms > 0);
  }
  options.device = "tpu";
  try {
    ProfileModel(options, &warnings);
    FAIL("accepted --device tpu");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("invalid --device 'tpu'") != std::string::npos);
  }
}

TEST_CASE("no stage cut separates an activation from an op that writes it in place, even through a view") {
  // inplace_head: pool -> flatten (a view) -> dropout_ writes the pool's output.
  const Profile& p = ProfileOf("inplace_head");
  CHECK(p.totals.saved_bytes == Reference("inplace_head")["saved_bytes"].get<int64_t>());
  const std::vector<StageCut> stages = CutStages(p);
  CHECK(stages.size() >= 5);
  int written_in_place = 0;
  for (const StageCut& stage : stages) {
    for (int op = stage.first_op; op <= stage.last_op; ++op) {
      const OpRecord& record = p.ops[static_cast<size_t>(op)];
      if (!record.inplace) continue;
      ++written_in_place;
      const TensorRecord& written = p.tensors[static_cast<size_t>(record.inputs[0])];
      if (written.external) continue;
      // The written storage was made inside the same stage.
      int producer = -1;
      for (const TensorRecord& t : p.tensors) {
        if (t.storage == written.storage && !t.external && (producer < 0 || t.producer < producer)) producer = t.producer;
      }
      CAPTURE(record.kind);
      CHECK(producer >= stage.first_op);
    }
  }
  CHECK(written_in_place >= 6);  // 4 relu_, hardswish_, 2 dropout_
}

TEST_CASE("torch.export models (.pt2): saved bytes equal PyTorch's count on the exported program and on the eager model, "
          "on every test model") {
  for (const char* name : {"mlp_chain", "resnet18", "mobilenet_v2", "gpt", "unet", "transformer_encoder", "sdpa_decoder",
                           "bf16_decoder", "gpt2", "llama", "bert", "vit", "inplace_head", "mobilenet_v3_small",
                           "seq_first_encoder", "transformer_decoder", "densenet", "recurrent", "two_heads"}) {
    CAPTURE(name);
    const nlohmann::json reference = Reference(name);
    const Profile exported = ProfileFile(std::string(CKPLAN_TEST_MODELS) + "/" + name + ".pt2", name);
    CHECK(exported.totals.saved_bytes == reference["pt2_saved_bytes"].get<int64_t>());
    // ckplan_torch.export follows the eager model's code paths: PyTorch's
    // count on the eager model as users run it, unpatched (transformers'
    // Llama: no explicit causal mask, SDPA's enable_gqa).
    CHECK(exported.totals.saved_bytes == reference["eager_saved_bytes"].get<int64_t>());
    // Where the trace took the same paths (all but Llama, traced with an
    // explicit mask), both profiles agree.
    const Profile& traced = ProfileOf(name);
    if (reference["pt2_saved_bytes"] == reference["saved_bytes"]) {
      CHECK(exported.totals.saved_bytes == traced.totals.saved_bytes);
    }
    CHECK(exported.totals.param_bytes == traced.totals.param_bytes);
    // Module paths from the exported program's nn_module_stack: the same
    // stages along the module tree.
    CHECK(CutStages(exported).size() >= CutStages(traced).size() / 2);
    std::set<std::string> modules_exported, modules_traced;
    for (const OpRecord& op : exported.ops) modules_exported.insert(op.module);
    for (const OpRecord& op : traced.ops) modules_traced.insert(op.module);
    size_t shared = 0;
    for (const std::string& m : modules_exported) shared += modules_traced.count(m);
    CHECK(shared * 10 >= modules_traced.size() * 8);
  }
}

TEST_CASE("a .pt2 exported with a dynamic batch profiles at any batch size from one file") {
  ProfileOptions options;
  options.model_path = std::string(CKPLAN_TEST_MODELS) + "/gpt2.pt2";
  options.reps = 1;
  std::vector<std::string> warnings;
  options.inputs = {ParseInputSpec("2x64:int64:0..512")};
  const Profile two = ProfileModel(options, &warnings);
  options.inputs = {ParseInputSpec("6x64:int64:0..512")};
  const Profile six = ProfileModel(options, &warnings);
  CHECK(two.totals.saved_bytes == Reference("gpt2")["pt2_saved_bytes"].get<int64_t>());
  // Activations grow with the batch: three times the batch, about three times the bytes.
  const double ratio = static_cast<double>(six.totals.saved_bytes) / static_cast<double>(two.totals.saved_bytes);
  CHECK(ratio > 2.8);
  CHECK(ratio < 3.1);
  CHECK(six.model.inputs->at(0).shape == std::vector<int64_t>{6, 64});
  // Llama too (grouped-query attention, rotary tables sized from the input).
  options.model_path = std::string(CKPLAN_TEST_MODELS) + "/llama.pt2";
  options.inputs = {ParseInputSpec("2x64:int64:0..512")};
  const Profile llama_two = ProfileModel(options, &warnings);
  options.inputs = {ParseInputSpec("4x64:int64:0..512")};
  const Profile llama_four = ProfileModel(options, &warnings);
  CHECK(llama_two.totals.saved_bytes == Reference("llama")["pt2_saved_bytes"].get<int64_t>());
  const double llama_ratio =
      static_cast<double>(llama_four.totals.saved_bytes) / static_cast<double>(llama_two.totals.saved_bytes);
  CHECK(llama_ratio > 1.8);
  CHECK(llama_ratio < 2.1);
}
