// LibTorch tests: `ckplan run` executes plans on real models with the
// verdict ok: peak within budget, gradients equal to the plain step's,
// predicted peak within 5% of the measured one.

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "planner/base/error.h"
#include "planner/contracts/plan_document.h"
#include "planner/plan/planner_input.h"
#include "planner/plan/plan.h"
#include "planner/plan/plan_to_document.h"
#include "planner/solvers/modules.h"
#include "libtorch/executor/executor.h"
#include "libtorch/profiler/profiler.h"

using namespace ckplan;

namespace {

// "gpt2" is the TorchScript file, "gpt2.pt2" the same model through torch.export.
bool Exported(const std::string& name) { return name.size() > 4 && name.substr(name.size() - 4) == ".pt2"; }
std::string BaseName(const std::string& name) { return Exported(name) ? name.substr(0, name.size() - 4) : name; }
std::string ModelPath(const std::string& name) {
  return std::string(CKPLAN_TEST_MODELS) + "/" + name + (Exported(name) ? "" : ".pt");
}

struct Prepared {
  Profile profile;
  Chain chain;
  FixedMemory fixed;
  PlanSource source;
};

const Prepared& Prepare(const std::string& name) {
  static std::map<std::string, Prepared> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  std::ifstream in(std::string(CKPLAN_TEST_MODELS) + "/" + BaseName(name) + ".json");
  nlohmann::json reference = nlohmann::json::parse(in);
  ProfileOptions options;
  options.model_path = ModelPath(name);
  for (const auto& text : reference["inputs"]) options.inputs.push_back(ParseInputSpec(text.get<std::string>()));
  options.reps = 1;
  std::vector<std::string> warnings;
  Prepared p;
  // As `ckplan solve` reads a profile: gradients on the chain's stages.
  PlannerInput input = PlannerInputFromProfile(ProfileModel(options, &warnings), name + ".profile.json", "adam");
  p.profile = std::move(input.profile);
  p.chain = std::move(input.chain);
  p.fixed = input.fixed;
  p.source = input.source;
  return cache.emplace(name, std::move(p)).first->second;
}

nlohmann::json PlanFor(const Prepared& p, Algorithm algorithm, int64_t budget) {
  PlanRequest request;
  request.algorithm = algorithm;
  request.budget.bytes = budget;
  Plan plan = MakePlan(p.chain, p.fixed, request);
  REQUIRE(plan.feasible);
  return PlanToJson(plan, p.chain, p.source);
}

// The plan as `ckplan run` reads it: through its contract, then run.
RunReport RunPlanJson(const RunOptions& options, const nlohmann::json& plan) {
  return RunPlan(options, PlanFromJson(plan, options.plan_path));
}

RunReport Run(const std::string& name, const nlohmann::json& plan) {
  RunOptions options;
  options.model_path = ModelPath(name);
  options.plan_path = name + ".plan.json";
  options.steps = 1;
  return RunPlanJson(options, plan);
}

int64_t NonePeak(const Prepared& p) {
  PlanRequest none;
  none.algorithm = Algorithm::kNone;
  none.budget.bytes = 1LL << 50;
  return MakePlan(p.chain, p.fixed, none).peak_bytes;
}

int64_t Halfway(const Prepared& p) {
  int64_t minimum = MinimumOptimalBudget(p.chain, p.fixed, 500);
  PlanRequest none;
  none.algorithm = Algorithm::kNone;
  none.budget.bytes = 1LL << 50;
  int64_t keep_all = MakePlan(p.chain, p.fixed, none).peak_bytes;
  return minimum + (keep_all - minimum) / 2;
}

void CheckOk(const std::string& name) {
  const Prepared& p = Prepare(name);
  const int64_t budget = Halfway(p);
  for (Algorithm algorithm : {Algorithm::kOptimal, Algorithm::kEvery}) {
    CAPTURE(name);
    CAPTURE(AlgorithmName(algorithm));
    nlohmann::json plan = PlanFor(p, algorithm, algorithm == Algorithm::kOptimal ? budget : 1LL << 50);
    RunReport r = Run(name, plan);
    CAPTURE(r.measured.peak_bytes);
    CAPTURE(r.predicted_peak_bytes);
    CAPTURE(r.peak_error_pct);
    CAPTURE(r.max_rel_grad_diff);
    CHECK(r.verdict == "ok");
    CHECK(r.max_rel_grad_diff == 0.0);
    CHECK(std::fabs(r.peak_error_pct) <= 5.0);
    CHECK(r.measured.peak_bytes <= r.budget_bytes);
    // Where the step's end (every gradient made, the update running) is its
    // peak, no checkpointing lowers it: the smallest budget is none's
    // (mlp_chain: 16 Linear layers of 256, 32 samples, adam).
    if (algorithm == Algorithm::kOptimal && budget < NonePeak(p)) {
      CHECK(!plan["checkpointed_stages"].empty());
      // Below what no checkpointing is predicted to need (the budget is
      // halfway to it). Not always below its measured peak: where the next op
      // does not save a stage's output (mlp_chain's Linear into ReLU) the
      // chain counts it kept, so none's prediction is a few percent high,
      // and the exact DP now uses the whole budget (mlp_chain: 17,769,632 B
      // under the plan, 17,736,872 B without, 18,26x,xxx B predicted for none).
      CHECK(r.measured.peak_bytes < NonePeak(p));
    }
  }
}

// Peaks of the every and none baselines.
std::pair<int64_t, int64_t> EveryAndNonePeaks(const Prepared& p) {
  PlanRequest request;
  request.budget.bytes = 1LL << 50;
  request.algorithm = Algorithm::kEvery;
  const int64_t every = MakePlan(p.chain, p.fixed, request).peak_bytes;
  request.algorithm = Algorithm::kNone;
  return {every, MakePlan(p.chain, p.fixed, request).peak_bytes};
}

// The optimal plan at the budget halfway between the every baseline's peak
// (or, `from_smallest`, the smallest budget) and no checkpointing, and its run.
struct HalfwayRun {
  int64_t budget = 0;
  nlohmann::json plan;
  RunReport report;
};
HalfwayRun RunOptimalHalfway(const std::string& name, bool from_smallest = false) {
  const Prepared& p = Prepare(name);
  const auto [every, none] = EveryAndNonePeaks(p);
  const int64_t lower = from_smallest ? MinimumOptimalBudget(p.chain, p.fixed, 500) : every;
  CAPTURE(name);
  CAPTURE(every);
  CAPTURE(none);
  CAPTURE(lower);
  REQUIRE(lower < none);
  HalfwayRun h;
  h.budget = lower + (none - lower) / 2;
  h.plan = PlanFor(p, Algorithm::kOptimal, h.budget);
  h.report = Run(name, h.plan);
  return h;
}

// The optimal plan at the budget halfway between the every baseline's peak
// and no checkpointing: verdict ok, gradients equal to the plain step's
// (to the bit, unless PyTorch's own kernels differ between a forward with
// and without autograd: then within `max_rel_grad_diff`). `from_smallest`:
// halfway between the smallest budget and none's peak instead, for a model
// whose every baseline keeps only what kernel workspaces leave (issue 25).
void CheckOkBetweenEveryAndNone(const std::string& name, double max_rel_grad_diff = 0.0, bool from_smallest = false) {
  const HalfwayRun h = RunOptimalHalfway(name, from_smallest);
  const int64_t budget = h.budget;
  const nlohmann::json& plan = h.plan;
  const RunReport& r = h.report;
  CAPTURE(name);
  CAPTURE(r.measured.peak_bytes);
  CAPTURE(r.predicted_peak_bytes);
  CAPTURE(r.peak_error_pct);
  CHECK(!plan["checkpointed_stages"].empty());
  CHECK(r.verdict == "ok");
  CHECK(r.max_rel_grad_diff <= max_rel_grad_diff);
  CHECK(r.measured.peak_bytes <= budget);
  CHECK(r.measured.peak_bytes < r.baseline.peak_bytes);
}

}  // namespace

TEST_CASE("run: decoder with scaled_dot_product_attention and dropout, halfway between every and none: ok") {
  CheckOkBetweenEveryAndNone("sdpa_decoder");
}

TEST_CASE("run: the decoder in bfloat16, halfway between every and none: ok") {
  CheckOkBetweenEveryAndNone("bf16_decoder");
}

TEST_CASE("run: seq-first nn.TransformerEncoder / Decoder and DenseNet, a stage per layer, halfway: ok") {
  CheckOkBetweenEveryAndNone("seq_first_encoder");
  CheckOkBetweenEveryAndNone("transformer_decoder");
  CheckOkBetweenEveryAndNone("densenet");
}

TEST_CASE("run: LSTM and GRU, and a model returning a tuple, halfway between the smallest budget and none: ok") {
  // PyTorch's CPU LSTM gives other last bits without autograd (a stage run
  // as a checkpoint) than with it: nn.LSTM(32, 32, num_layers=2) on an
  // 8x24x32 input differs by 4.5e-8 (GRU: 0). torch.utils.checkpoint does the same.
  // The step peaks in the LSTM's backward, where its own saved tensors and
  // its oneDNN transients (207 KB on an AMD EPYC: scratchpad and reorders,
  // sized by the kernels the processor gets) are live under any plan: every
  // keeps 19 KB (1.3%) less than none there, and nothing less where those
  // are 19 KB larger. The smallest budget stays below none's peak (1.5% to
  // 10% below, the transients doubled to halved): the budget is halfway from it.
  CheckOkBetweenEveryAndNone("recurrent", 1e-5, /*from_smallest=*/true);
  // Its stages are single Linear and GELU ops: every keeps as much as none.
  CheckOk("two_heads");
}

TEST_CASE("run: Hugging Face GPT-2 and Llama, halfway between every and none: ok") {
  CheckOkBetweenEveryAndNone("gpt2");
  CheckOkBetweenEveryAndNone("llama");
}

TEST_CASE("run: a Hugging Face mixture of experts (Mixtral, top-2 of 4 experts), traced and exported, halfway: runs") {
  // Traced, its experts are aten::_grouped_mm; exported, transformers'
  // custom grouped_mm_fallback, run as aten::_grouped_mm. Their routing
  // (topk, sort, histc, index_put_) changes as the steps train the router.
  // Its peak is predicted 5-6% high (the verdict: prediction_off), in the
  // experts' backward: the gradients of their 3-d weights are counted from
  // the experts module's last op on.
  for (const char* name : {"mixtral", "mixtral.pt2"}) {
    const HalfwayRun h = RunOptimalHalfway(name);
    const int64_t budget = h.budget;
    const nlohmann::json& plan = h.plan;
    const RunReport& r = h.report;
    CAPTURE(name);
    CAPTURE(r.measured.peak_bytes);
    CAPTURE(r.predicted_peak_bytes);
    CAPTURE(r.verdict);
    CHECK(!plan["checkpointed_stages"].empty());
    CHECK(r.max_rel_grad_diff == 0.0);
    CHECK(r.measured.peak_bytes <= budget);
    CHECK(r.measured.peak_bytes < r.baseline.peak_bytes);
    CHECK(std::fabs(r.peak_error_pct) <= 10.0);
  }
}

TEST_CASE("run: GPT-2's tied weights (lm_head = wte) are one parameter: prediction within 5% under every and optimal") {
  CheckOk("gpt2");
}

TEST_CASE("run: mobilenet_v3_small (in-place Hardswish, a classifier larger than the activations): ok") {
  // Its adam step once peaked above the plan: a temporary the size of the
  // largest parameter (the 576x1024 classifier).
  CheckOk("mobilenet_v3_small");
}

TEST_CASE("run: a head that writes in place into a view of a stage's input (dropout_ after flatten): ok") {
  // Every stage recomputed (every), and the optimal plan at the halfway
  // budget: the written input is copied, so the recomputed dropout_ reads
  // the values the first run read; gradients equal the plain step's.
  const Prepared& p = Prepare("inplace_head");
  for (Algorithm algorithm : {Algorithm::kEvery, Algorithm::kOptimal}) {
    CAPTURE(AlgorithmName(algorithm));
    nlohmann::json plan = PlanFor(p, algorithm, algorithm == Algorithm::kOptimal ? Halfway(p) : 1LL << 50);
    RunReport r = Run("inplace_head", plan);
    CAPTURE(r.measured.peak_bytes);
    CAPTURE(r.predicted_peak_bytes);
    CHECK(!plan["checkpointed_stages"].empty());
    CHECK(r.verdict == "ok");
    CHECK(r.max_rel_grad_diff == 0.0);
    CHECK(std::fabs(r.peak_error_pct) <= 5.0);
    CHECK(r.measured.peak_bytes <= r.budget_bytes);
  }
}

TEST_CASE("run: models exported with torch.export (.pt2), halfway between every and none: ok, gradients equal") {
  // Models whose activations dominate the step at their test inputs on any
  // processor (the transformers' attention and MLP activations).
  for (const char* name : {"gpt2.pt2", "llama.pt2", "bf16_decoder.pt2"}) {
    CheckOkBetweenEveryAndNone(name);
  }
  // The other test models (on some, every saves nothing over none): the
  // optimal plan at the budget halfway between the smallest and none's peak.
  // resnet18 at 2x3x64x64 is among them: its step peaks at the end (46 MB of
  // parameters, their gradients and adam's state), where checkpointing cannot
  // reach, and whether `every` lowers it at all depends on which convolution
  // kernels (and workspaces) the processor's oneDNN picks: on an Intel Xeon
  // every = none = 182,151,744 B. mobilenet_v3_small's step peaks at its
  // end too: adam's for-loop update of its 4 MB classifier weight (two of
  // its size and the previous parameter's denominator) above its activations.
  for (const char* name : {"resnet18.pt2", "mobilenet_v3_small.pt2", "mlp_chain.pt2", "mobilenet_v2.pt2", "gpt.pt2", "unet.pt2", "transformer_encoder.pt2",
                           "sdpa_decoder.pt2", "bert.pt2", "vit.pt2", "inplace_head.pt2"}) {
    const std::string model = name;
    CAPTURE(model);
    const Prepared& p = Prepare(name);
    RunReport r = Run(name, PlanFor(p, Algorithm::kOptimal, Halfway(p)));
    CHECK(r.verdict == "ok");
    CHECK(r.max_rel_grad_diff == 0.0);
  }
}

TEST_CASE("run: a chain of Linear+ReLU blocks, optimal at the halfway budget and every: verdict ok") {
  CheckOk("mlp_chain");
}

TEST_CASE("run: resnet18 with batch norm: verdict ok, running statistics not updated twice") {
  CheckOk("resnet18");
}

TEST_CASE("run: GPT-style decoder with dropout: recomputed masks are the same, verdict ok") { CheckOk("gpt"); }

TEST_CASE("run: U-Net with skip connections: verdict ok") { CheckOk("unet"); }

// The PyTorch-target plan (modules wrapped with torch.utils.checkpoint, what
// `ckplan solve` writes for a profile by default) at the budget halfway
// between the target's smallest and its peak with nothing wrapped: `ckplan
// run` runs it as PyTorch runs it (module_step.cc), within the budget and the
// plan's prediction, gradients equal to the plain step's.
void CheckPytorchTargetOk(const std::string& name) {
  const Prepared& p = Prepare(name);
  const std::vector<WrappableModule> modules = WrappableModules(p.chain, &p.profile);
  PlanRequest request;
  request.pytorch_modules = &modules;
  request.budget.bytes = 1LL << 50;
  const Plan loose = MakePlan(p.chain, p.fixed, request);
  REQUIRE(loose.feasible);
  request.budget.bytes = (loose.min_budget_bytes + loose.peak_bytes) / 2;
  const Plan plan = MakePlan(p.chain, p.fixed, request);
  REQUIRE(plan.feasible);
  const nlohmann::json doc = PlanToJson(plan, p.chain, p.source);
  CAPTURE(name);
  CAPTURE(doc["checkpoint_modules"].dump());
  REQUIRE(doc["target"] == "pytorch");
  RunReport r = Run(name, doc);
  CAPTURE(r.measured.peak_bytes);
  CAPTURE(r.predicted_peak_bytes);
  CAPTURE(r.budget_bytes);
  CHECK(r.verdict == "ok");
  CHECK(r.max_rel_grad_diff == 0.0);
  CHECK(r.measured.peak_bytes <= r.budget_bytes);
  CHECK(std::fabs(r.peak_error_pct) <= 2.0);
  if (!doc["checkpoint_modules"].empty()) CHECK(r.measured.peak_bytes < r.baseline.peak_bytes);
}

TEST_CASE("run: PyTorch-target plans at the halfway budget run as PyTorch runs them: verdict ok") {
  // gpt, two_heads: modules wrapped (decoder blocks, Linear+GELU pairs);
  // mlp_chain: none worth wrapping, the budget its peak to the byte (the
  // step's end: every gradient made, adam's update running).
  for (const char* name : {"gpt", "two_heads", "resnet18", "mlp_chain"}) CheckPytorchTargetOk(name);
}

TEST_CASE("run: ConvNeXt (layer scales and constants fetched before the ops using them): no deadlock, verdict ok") {
  // A wrap over its first ops once returned the tensors the tracer keeps
  // (read after it) as its own outputs: autograd made the wrap's node their
  // grad_fn, and the recomputation, reading them again, re-entered that
  // node and blocked on its mutex, in the profile (Prepare) and in the run.
  CheckPytorchTargetOk("convnext");
  // The schedule target: every stage recomputed, and the optimal plan at the
  // halfway budget. Its gradients are within assert_close's tolerance (the
  // verdict), not equal to the bit: LayerNorm2d's permuted convolutions take
  // other kernels without autograd (4e-10 of the largest gradient here).
  const Prepared& p = Prepare("convnext");
  for (Algorithm algorithm : {Algorithm::kEvery, Algorithm::kOptimal}) {
    CAPTURE(AlgorithmName(algorithm));
    const RunReport r = Run("convnext", PlanFor(p, algorithm, algorithm == Algorithm::kOptimal ? Halfway(p) : 1LL << 50));
    CAPTURE(r.measured.peak_bytes);
    CAPTURE(r.predicted_peak_bytes);
    CAPTURE(r.max_rel_grad_diff);
    CHECK(r.verdict == "ok");
    CHECK(r.measured.peak_bytes <= r.budget_bytes);
  }
}

TEST_CASE("run: each stage's backward replayed as the executor runs it: the schedule's peak predicted within 1%, never below") {
  // The simulator takes each stage's backward replay (Stage::executor_bwd_peak_bytes)
  // in place of its boundary gradients and transient each at their maximum.
  // recurrent: its LSTM and GRU are one op each, their layers replayed as one
  // (OpRecord::bwd_span_peak_bytes).
  for (const char* name : {"unet", "gpt", "llama", "recurrent"}) {
    const Prepared& p = Prepare(name);
    for (Algorithm algorithm : {Algorithm::kNone, Algorithm::kOptimal}) {
      CAPTURE(name);
      CAPTURE(AlgorithmName(algorithm));
      const RunReport r = Run(name, PlanFor(p, algorithm, algorithm == Algorithm::kNone ? 1LL << 50 : Halfway(p)));
      CAPTURE(r.predicted_peak_bytes);
      CAPTURE(r.measured.peak_bytes);
      CHECK(r.verdict == "ok");
      CHECK(r.measured.peak_bytes <= r.predicted_peak_bytes);
      CHECK(static_cast<double>(r.predicted_peak_bytes) <= 1.01 * static_cast<double>(r.measured.peak_bytes));
    }
  }
}

TEST_CASE("run: the measured peak falls as the budget falls") {
  const Prepared& p = Prepare("resnet18");
  int64_t minimum = MinimumOptimalBudget(p.chain, p.fixed, 500);
  int64_t halfway = Halfway(p);
  int64_t previous = INT64_MAX;
  for (int64_t budget : {halfway + (halfway - minimum), halfway, minimum + (halfway - minimum) / 4}) {
    RunReport r = Run("resnet18", PlanFor(p, Algorithm::kOptimal, budget));
    CAPTURE(budget);
    CHECK(r.verdict == "ok");
    CHECK(r.measured.peak_bytes <= previous);
    previous = r.measured.peak_bytes;
  }
}

TEST_CASE("run: plans for another model, or that do not match it, are refused") {
  const Prepared& p = Prepare("mlp_chain");
  nlohmann::json plan = PlanFor(p, Algorithm::kEvery, 1LL << 50);
  RunOptions options;
  options.model_path = ModelPath("unet");
  options.plan_path = "mlp.plan.json";
  options.steps = 1;
  CHECK_THROWS_WITH_AS(RunPlanJson(options, plan), doctest::Contains("made for another model"), Error);
  options.force = true;  // the op ranges still do not fit
  CHECK_THROWS_WITH_AS(RunPlanJson(options, plan), doctest::Contains("it was made for another model"), Error);
  options.model_path = ModelPath("mlp_chain");
  options.force = false;
  nlohmann::json wrong = plan;
  wrong["schema"] = "ckplan.plan/9";
  CHECK_THROWS_WITH_AS(RunPlanJson(options, wrong), doctest::Contains("field 'schema'"), Error);
  wrong = plan;
  wrong["stages"][3]["modules"] = {"blocks.99"};
  CHECK_THROWS_WITH_AS(RunPlanJson(options, wrong), doctest::Contains("names module 'blocks.99'"), Error);
  wrong = plan;
  wrong["stages"][2]["first_op"] = 7;
  CHECK_THROWS_WITH_AS(RunPlanJson(options, wrong), doctest::Contains("op ranges must follow one another"), Error);
}
