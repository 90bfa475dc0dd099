#include "planner/solvers/modules.h"

#include <algorithm>
#include <random>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/test_chains.h"
#include "planner/solvers/baselines.h"
#include "planner/plan/plan.h"
#include "planner/cost/simulator.h"

using namespace ckplan;

namespace {

// A tensor of a hand-built profile: made by op `producer` (-1: a model
// input), requiring gradients unless it is an input.
void AddTensor(Profile* profile, int storage, int64_t bytes, int producer, bool kept) {
  TensorRecord t;
  t.id = static_cast<int>(profile->tensors.size());
  t.storage = storage;
  t.bytes = t.nbytes = bytes;
  t.producer = producer;
  t.requires_grad = producer >= 0;
  t.external = producer < 0;
  t.kept = kept;
  profile->tensors.push_back(t);
}

// Module ranges as a module tree gives them: every stage, and random
// nested spans over several stages.
std::vector<WrappableModule> RandomModules(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<WrappableModule> modules;
  for (int i = 0; i < length; ++i) modules.push_back({"s" + std::to_string(i), i, i});
  std::uniform_int_distribution<int> stage(0, length - 1);
  for (int k = 0; k < 4; ++k) {
    int a = stage(rng), b = stage(rng);
    if (a > b) std::swap(a, b);
    if (a == b) continue;
    modules.push_back({"m" + std::to_string(a) + "_" + std::to_string(b), a, b});
  }
  return modules;
}

struct Best {
  double time_ms = 1e300;
  int64_t smallest_peak = INT64_MAX;
};

// Every set of pairwise disjoint modules, each ordered by its first stage.
std::vector<std::vector<WrappableModule>> DisjointSets(const std::vector<WrappableModule>& modules, int length) {
  std::vector<std::vector<WrappableModule>> sets;
  const size_t n = modules.size();
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    std::vector<WrappableModule> set;
    std::vector<bool> used(static_cast<size_t>(length), false);
    bool disjoint = true;
    for (size_t m = 0; m < n && disjoint; ++m) {
      if (!(mask & (1u << m))) continue;
      for (int k = modules[m].first_stage; k <= modules[m].last_stage; ++k) {
        if (used[static_cast<size_t>(k)]) disjoint = false;
        used[static_cast<size_t>(k)] = true;
      }
      set.push_back(modules[m]);
    }
    if (!disjoint) continue;
    std::sort(set.begin(), set.end(), [](const auto& p, const auto& q) { return p.first_stage < q.first_stage; });
    sets.push_back(std::move(set));
  }
  return sets;
}

// Every set of disjoint modules, simulated.
Best BruteForce(const Chain& chain, const std::vector<WrappableModule>& modules, int64_t budget) {
  Best best;
  for (const auto& set : DisjointSets(modules, chain.length())) {
    SimulationResult r = Simulate(chain, ModuleSchedule(chain.length(), set));
    best.smallest_peak = std::min(best.smallest_peak, r.peak_bytes);
    if (r.peak_bytes <= budget) best.time_ms = std::min(best.time_ms, r.time_ms);
  }
  return best;
}

}  // namespace

TEST_CASE("the module solver equals brute force over every set of disjoint modules, in bytes") {
  int compared = 0, feasible = 0;
  for (int length = 1; length <= 7; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 500 * length + seed);
      std::vector<WrappableModule> modules = RandomModules(length, seed);
      const Best all = BruteForce(chain, modules, INT64_MAX);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      CAPTURE(length);
      CAPTURE(seed);
      CHECK(minimum == all.smallest_peak);
      for (int64_t budget = minimum - 2; budget <= minimum + 30; ++budget) {
        CAPTURE(budget);
        const Best brute = BruteForce(chain, modules, budget);
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        CHECK(solution.feasible == (brute.time_ms < 1e300));
        if (solution.feasible) {
          ++feasible;
          CHECK(solution.time_ms == doctest::Approx(brute.time_ms).epsilon(1e-12));
          SimulationResult r = Simulate(chain, solution.schedule);
          CHECK(r.peak_bytes <= budget);
          CHECK(r.time_ms == doctest::Approx(solution.time_ms).epsilon(1e-12));
        }
        ++compared;
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(feasible > 800);
}

// A chain whose cuts share storages: each cut its own value, plus skip
// connections live across several cuts (each counted once by the simulator).
Chain SharedStorageChain(int length, uint32_t seed) {
  Chain chain = testing::SmallIntegerChain(length, seed);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> cut(0, length), size(1, 5);
  std::vector<std::vector<std::pair<int64_t, int64_t>>> cuts(static_cast<size_t>(length) + 1);
  for (int k = 0; k <= length; ++k) cuts[static_cast<size_t>(k)].push_back({k, chain.StageInputBytes(k)});
  for (int s = 0; s < 2; ++s) {
    int from = cut(rng), to = cut(rng);
    if (from > to) std::swap(from, to);
    const int64_t bytes = size(rng);
    for (int k = from; k <= to; ++k) cuts[static_cast<size_t>(k)].push_back({100 + s, bytes});
  }
  chain.input_storages = cuts[0];
  for (int i = 0; i < length; ++i) {
    Stage& stage = chain.stages[static_cast<size_t>(i)];
    stage.out_storages = cuts[static_cast<size_t>(i) + 1];
    int64_t total = 0;
    for (const auto& entry : stage.out_storages) total += entry.second;
    stage.private_saved_bytes = stage.saved_bytes - stage.out_bytes + 1;
    stage.out_bytes = total;
    stage.saved_bytes = stage.private_saved_bytes + total;
  }
  return chain;
}

TEST_CASE("with shared storages (skip connections), the module solver still equals brute force by the simulator") {
  int compared = 0;
  for (int length = 2; length <= 7; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Chain chain = SharedStorageChain(length, 900 * length + seed);
      REQUIRE(chain.has_storages());
      std::vector<WrappableModule> modules = RandomModules(length, seed + 17);
      const Best all = BruteForce(chain, modules, INT64_MAX);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      CAPTURE(length);
      CAPTURE(seed);
      CHECK(minimum == all.smallest_peak);
      for (int64_t budget = minimum; budget <= minimum + 30; ++budget) {
        CAPTURE(budget);
        const Best brute = BruteForce(chain, modules, budget);
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        REQUIRE(solution.feasible);
        CHECK(solution.time_ms == doctest::Approx(brute.time_ms).epsilon(1e-12));
        CHECK(Simulate(chain, solution.schedule).peak_bytes <= budget);
        ++compared;
      }
    }
  }
  CHECK(compared > 500);
}

TEST_CASE("wrapping every stage on its own is every's schedule, and wrapping nothing is none's") {
  Chain chain = testing::RandomChain(12, 41);
  std::vector<WrappableModule> each;
  for (int i = 0; i < 12; ++i) each.push_back({"s" + std::to_string(i), i, i});
  CHECK(ModuleSchedule(12, each) == EveryNSchedule(12, 1));
  CHECK(ModuleSchedule(12, {}) == NoCheckpointSchedule(12));
  // With every stage wrappable, the solver is never slower than every or none where they fit.
  const int64_t every_peak = Simulate(chain, EveryNSchedule(12, 1)).peak_bytes;
  const int64_t none_peak = Simulate(chain, NoCheckpointSchedule(12)).peak_bytes;
  CHECK(MinimumModulesMemory(chain, each) <= every_peak);
  for (int64_t budget : {every_peak, (every_peak + none_peak) / 2, none_peak}) {
    ModuleSolution s = SolveModules(chain, each, budget);
    REQUIRE(s.feasible);
    CHECK(s.time_ms <= Simulate(chain, EveryNSchedule(12, 1)).time_ms + 1e-9);
    if (budget == none_peak) CHECK(s.wrapped.empty());
  }
}

namespace {

// The simulator's peak of a schedule with parameter gradients as PyTorch
// allocates them: none before the loss, those of stages k.. from stage k's
// backward on (its own: those held on top of its bwd_tmp_bytes), and those after a wrapped
// module while it is recomputed).
int64_t PeakWithGradients(const Chain& chain, const Schedule& schedule, const StageGradients& grads) {
  const SimulationResult r = Simulate(chain, schedule);
  const std::vector<int64_t>& stage_grads = grads.bytes;
  std::vector<int64_t> from(stage_grads.size() + 1, 0);
  for (size_t k = stage_grads.size(); k-- > 0;) from[k] = from[k + 1] + stage_grads[k];
  int64_t peak = 0;
  bool backward = false;
  size_t done = stage_grads.size();
  for (size_t j = 0; j < schedule.size(); ++j) {
    const ScheduleStep& op = schedule[j];
    if (op.kind == StepKind::kLoss) backward = true;
    int64_t alive = 0;
    if (op.kind == StepKind::kBackward) {
      done = static_cast<size_t>(op.stage);
      alive = from[done + 1] + grads.held_in_bwd[done];
    } else if (backward) {
      alive = from[done];
    }
    peak = std::max(peak, r.peak_during_bytes[j] + alive);
  }
  return peak;
}

}  // namespace

TEST_CASE("gradients allocated in backward: the module solver equals brute force over every set, in bytes") {
  int compared = 0, below = 0;
  for (int length = 1; length <= 7; ++length) {
    for (uint32_t seed = 0; seed < 5; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 700 * length + seed);
      std::vector<WrappableModule> modules = RandomModules(length, seed + 3);
      std::mt19937 rng(seed);
      StageGradients grads;
      int64_t total = 0;
      for (int k = 0; k < length; ++k) {
        grads.bytes.push_back(std::uniform_int_distribution<int64_t>(0, 6)(rng));
        grads.held_in_bwd.push_back(std::uniform_int_distribution<int64_t>(0, grads.bytes.back())(rng));
        total += grads.bytes.back();
      }
      // Every disjoint set: its peak with gradients, and its time.
      std::vector<std::pair<int64_t, double>> sets;
      for (const auto& set : DisjointSets(modules, length)) {
        const Schedule s = ModuleSchedule(length, set);
        sets.push_back({PeakWithGradients(chain, s, grads), Simulate(chain, s).time_ms});
      }
      int64_t smallest = INT64_MAX;
      for (const auto& entry : sets) smallest = std::min(smallest, entry.first);
      CAPTURE(length);
      CAPTURE(seed);
      const int64_t minimum = MinimumModulesMemory(chain, modules, ModuleAccounting::kPyTorch, grads);
      CHECK(minimum == smallest);
      // Counting them for the whole step instead needs more, never less.
      CHECK(MinimumModulesMemory(chain, modules) + total >= minimum);
      if (MinimumModulesMemory(chain, modules) + total > minimum) ++below;
      for (int64_t budget = minimum - 2; budget <= minimum + 30; ++budget) {
        CAPTURE(budget);
        double best = 1e300;
        for (const auto& entry : sets) {
          if (entry.first <= budget) best = std::min(best, entry.second);
        }
        const ModuleSolution solution = SolveModules(chain, modules, budget, ModuleAccounting::kPyTorch, grads);
        CHECK(solution.feasible == (best < 1e300));
        if (solution.feasible) {
          CHECK(solution.time_ms == doctest::Approx(best).epsilon(1e-12));
          CHECK(solution.peak_bytes == PeakWithGradients(chain, solution.schedule, grads));
          CHECK(solution.peak_bytes <= budget);
        }
        ++compared;
      }
    }
  }
  CHECK(compared > 1000);
  CHECK(below > 10);
}

TEST_CASE("each parameter's gradient goes to the last stage that uses it, a tied weight found by shape") {
  Profile profile;
  auto op = [&](const std::string& module, std::vector<std::vector<int64_t>> args) {
    OpRecord r;
    r.id = static_cast<int>(profile.ops.size());
    r.module = module;
    for (auto& shape : args) r.args.push_back({shape, "Float"});
    profile.ops.push_back(r);
  };
  op("wte", {{4}, {100, 8}});         // stage 0: the embedding
  op("h.0.fc", {{4, 8}, {8, 8}, {8}});  // stage 1
  op("h.1.fc", {{4, 8}, {8, 8}, {8}});  // stage 2
  op("", {{4, 8}, {8}});              // stage 2: the root's own op (bias `scale`)
  op("lm_head", {{4, 8}, {100, 8}});  // stage 3: owns no parameter, takes wte's weight
  profile.parameters = {{"wte.weight", {100, 8}, 3200}, {"h.0.fc.weight", {8, 8}, 256}, {"h.0.fc.bias", {8}, 32},
                        {"h.1.fc.weight", {8, 8}, 256}, {"h.1.fc.bias", {8}, 32}, {"scale", {8}, 32},
                        {"unused.weight", {3}, 12}};
  Chain chain;
  for (int i = 0; i < 4; ++i) chain.stages.push_back(Stage{});
  const int ranges[4][2] = {{0, 0}, {1, 1}, {2, 3}, {4, 4}};
  for (int i = 0; i < 4; ++i) {
    chain.stages[static_cast<size_t>(i)].first_op = ranges[i][0];
    chain.stages[static_cast<size_t>(i)].last_op = ranges[i][1];
  }
  const StageGradients grads = StageGradientBytes(chain, profile);
  // wte's weight is used last by lm_head (stage 3); `scale` by the root's op
  // in stage 2; a parameter no op is found to use counts from the start of backward.
  CHECK(grads.bytes == std::vector<int64_t>{0, 288, 288 + 32, 3200 + 12});
  // Held on top of a stage's measured backward transient: in stage 2, h.1.fc's
  // op runs its backward with `scale`'s gradient made; the unused one throughout.
  CHECK(grads.held_in_bwd == std::vector<int64_t>{0, 0, 32, 12});
}

TEST_CASE("a stage's backward as PyTorch runs it: boundary gradients as they live, saved storages as released") {
  // op 0 (stage 0): input -> t1 (saved by op 1); op 1, op 2 (stage 1): t1 ->
  // t2 -> t3, the model output, which no op saves; op 2 saves 8 B of its own.
  Profile profile;
  auto tensor = [&](int storage, int64_t bytes, int producer, bool kept) {
    AddTensor(&profile, storage, bytes, producer, kept);
  };
  tensor(100, 40, -1, false);
  tensor(1, 100, 0, true);
  tensor(2, 60, 1, false);
  tensor(3, 50, 2, false);
  auto op = [&](int in, int out, int64_t saved, int64_t bwd_tmp) {
    OpRecord r;
    r.id = static_cast<int>(profile.ops.size());
    r.inputs = {in};
    r.outputs = {out};
    r.saved_bytes = saved;
    r.bwd_tmp_bytes = bwd_tmp;  // the gradient of its input
    profile.ops.push_back(r);
  };
  op(0, 1, 100, 0);  // t1's storage, counted where it was made
  op(1, 2, 0, 100);
  op(2, 3, 8, 60);
  profile.inputs = {0};
  profile.outputs = {3};
  Chain chain;
  chain.input_bytes = 40;
  chain.stages.resize(2);
  chain.stages[0].first_op = chain.stages[0].last_op = 0;
  chain.stages[0].out_bytes = 100;
  chain.stages[0].out_storages = {{1, 100}};
  chain.stages[0].kept_out_storages = {1};
  chain.stages[1].first_op = 1;
  chain.stages[1].last_op = 2;
  chain.stages[1].out_bytes = 50;
  chain.stages[1].out_storages = {{3, 50}};
  // Above what the stage keeps (t3, 50 B, held by the loss until its
  // backward), stage 1: the loss has released t3 and its gradient (50) has
  // arrived; op 2 makes t2's gradient (60), then releases t3's and its own
  // 8 B; op 1 makes t1's (100, held on: stage 0's input) while t2's is alive:
  // -50 + 60 - 8 + 100 = 102 (the old bound: 50 + 100 + 60 + 8 = 218). Stage 0:
  // t1's gradient (100) until op 0 has back-propagated; t1 itself is in
  // stage 0's keep.
  CHECK(StageGradientBytes(chain, profile).bwd_peak_bytes == std::vector<int64_t>{100, 102});
  // Measured: op 1's backward released t1 (it saved it), so stage 0's
  // backward starts without it: its gradient alone, less its keep.
  profile.tensors[1].released_by = 1;
  CHECK(StageGradientBytes(chain, profile).bwd_peak_bytes == std::vector<int64_t>{0, 102});

  // As `ckplan run`'s executor runs it (run_bwd_peak_bytes): it holds the
  // cuts' values (t1, stage 0's output, though op 1 released it), the model
  // output t3 and its gradient (50 + 50 more for stage 1: 202).
  CHECK(StageGradientBytes(chain, profile).run_bwd_peak_bytes == std::vector<int64_t>{100, 202});
  // Op 1's backward measured over all its nodes (bwd_span_peak_bytes): 30 B
  // above what is live when it starts, plus t1 (a cut's storage the profiled
  // step released during it, which the executor holds), 232, above the
  // node-by-node bound: that counts. Without the release measured, 102 + 30
  // is below it: 132. PyTorch's replay does not take it.
  profile.ops[1].bwd_span_peak_bytes = 30;
  CHECK(StageGradientBytes(chain, profile).run_bwd_peak_bytes == std::vector<int64_t>{100, 202});
  profile.tensors[1].released_by = -1;
  CHECK(StageGradientBytes(chain, profile).run_bwd_peak_bytes == std::vector<int64_t>{100, 132});
  CHECK(StageGradientBytes(chain, profile).bwd_peak_bytes == std::vector<int64_t>{100, 102});
}

// A profile of one op per module path, each op a stage of the chain.
static std::pair<Profile, Chain> OneOpPerStage(const std::vector<std::string>& modules) {
  Profile profile;
  Chain chain;
  for (const std::string& module : modules) {
    OpRecord r;
    r.id = static_cast<int>(profile.ops.size());
    r.module = module;
    profile.ops.push_back(r);
    Stage stage;
    stage.first_op = stage.last_op = r.id;
    chain.stages.push_back(stage);
  }
  return {profile, chain};
}

TEST_CASE("wrappable modules of a path 100,000 parts deep: each prefix a module, the outermost per stage range") {
  // op 1 sits in a.a.(...).a, 100,000 parts; op 2 in the first 50,000 of
  // them and then `c`: the first 50,000 prefixes hold both ops, the deeper
  // ones op 1 alone.
  auto parts = [](int n) {
    std::string path = "a";
    for (int i = 1; i < n; ++i) path += ".a";
    return path;
  };
  const std::pair<Profile, Chain> built = OneOpPerStage({"embed", parts(100000), parts(50000) + ".c", "head"});
  const Profile& profile = built.first;
  const Chain& chain = built.second;
  const std::vector<WrappableModule> modules = WrappableModules(chain, &profile);
  REQUIRE(modules.size() == 5);
  auto check = [&](size_t k, const std::string& path, int first, int last) {
    CAPTURE(k);
    CHECK(modules[k].path.size() == path.size());
    CHECK(modules[k].path == path);
    CHECK(modules[k].first_stage == first);
    CHECK(modules[k].last_stage == last);
  };
  check(0, "embed", 0, 0);
  check(1, parts(50001), 1, 1);  // the outermost of those holding op 1 alone
  check(2, "a", 1, 2);
  check(3, parts(50000) + ".c", 2, 2);
  check(4, "head", 3, 3);
}

TEST_CASE("wrappable modules: a container the forward never calls (model.containers) is not one, its children are") {
  // body.layers is an nn.ModuleList over two blocks of one op each, between
  // an embedding and a head: without the list, `body.layers` (stages 1-2)
  // would be a module; with it, only its layers and `body` (which holds
  // nothing else, so the same stages: `body` is the outermost of that range).
  std::pair<Profile, Chain> built = OneOpPerStage({"embed", "body.layers.0", "body.layers.1", "head"});
  Profile& profile = built.first;
  const Chain& chain = built.second;
  auto paths = [&]() {
    std::vector<std::string> out;
    for (const WrappableModule& m : WrappableModules(chain, &profile)) out.push_back(m.path);
    return out;
  };
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body", "body.layers.1", "head"});
  // The body's ops only in the list: `body` is then a plain module and
  // stays; with `body` called too but the list not, the list never counts.
  profile.model = {{"containers", {"body.layers"}}};
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body", "body.layers.1", "head"});
  profile.model = {{"containers", {"body"}}};
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body.layers", "body.layers.1", "head"});
  profile.model = {{"containers", {"body", "body.layers"}}};
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body.layers.1", "head"});
}

TEST_CASE("a submodule's parameter used by its parent's op goes to that op, not to every layer's") {
  // nn.MultiheadAttention calls out_proj's weight from its own op: two
  // layers, each `h.k.attn` taking `h.k.attn.out_proj.weight` (same shape).
  Profile profile;
  for (int k = 0; k < 2; ++k) {
    OpRecord r;
    r.id = k;
    r.module = "h." + std::to_string(k) + ".attn";
    r.args = {{{4, 8}, "Float"}, {{8, 8}, "Float"}};
    profile.ops.push_back(r);
  }
  profile.parameters = {{"h.0.attn.out_proj.weight", {8, 8}, 256}, {"h.1.attn.out_proj.weight", {8, 8}, 256}};
  Chain chain;
  chain.stages.resize(2);
  for (int i = 0; i < 2; ++i) chain.stages[static_cast<size_t>(i)].first_op = chain.stages[static_cast<size_t>(i)].last_op = i;
  CHECK(StageGradientBytes(chain, profile).bytes == std::vector<int64_t>{256, 256});
}

TEST_CASE("a stage's backward: the input of an in-place op has a gradient of its own") {
  // Stage 0: op 0 makes t1, op 1 (relu_) writes it in place as t2, read by
  // stage 1's op 2. t1's gradient (100), made by op 1, is alive during op 0's
  // backward (150): 250, though t1 and t2 share one storage, the stage's output.
  Profile profile;
  auto tensor = [&](int storage, int64_t bytes, int producer, bool kept) {
    AddTensor(&profile, storage, bytes, producer, kept);
  };
  tensor(100, 40, -1, false);
  tensor(1, 100, 0, true);
  tensor(1, 100, 1, true);
  tensor(3, 50, 2, false);
  const int64_t saved[3] = {100, 0, 0}, bwd_tmp[3] = {150, 100, 100};
  for (int k = 0; k < 3; ++k) {
    OpRecord r;
    r.id = k;
    r.inputs = {k};
    r.outputs = {k + 1};
    r.inplace = k == 1;
    r.saved_bytes = saved[k];
    r.bwd_tmp_bytes = bwd_tmp[k];
    profile.ops.push_back(r);
  }
  profile.inputs = {0};
  profile.outputs = {3};
  Chain chain;
  chain.input_bytes = 40;
  chain.stages.resize(2);
  chain.stages[0].first_op = 0;
  chain.stages[0].last_op = 1;
  chain.stages[0].out_bytes = 100;
  chain.stages[0].out_storages = {{1, 100}};
  chain.stages[0].kept_out_storages = {1};
  chain.stages[1].first_op = chain.stages[1].last_op = 2;
  chain.stages[1].out_bytes = 50;
  chain.stages[1].out_storages = {{3, 50}};
  CHECK(StageGradientBytes(chain, profile).bwd_peak_bytes[0] == 250);
}

TEST_CASE("a stage's backward: a gradient cat's backward narrows holds the whole of its output's") {
  // ViT's embeddings: op 0 (the patch convolution) makes t1 (100 B), op 1
  // expands the CLS token (t2, 20 B), op 2 cats them (t3), op 3 reads t3.
  // cat's backward hands its inputs views of t3's gradient: t1's, alive
  // into op 0's backward (30), holds t3's whole (120): 150, not 130.
  Profile profile;
  auto tensor = [&](int storage, int64_t bytes, int producer) { AddTensor(&profile, storage, bytes, producer, false); };
  tensor(100, 40, -1);
  tensor(1, 100, 0);
  tensor(2, 20, 1);
  tensor(3, 120, 2);
  tensor(4, 120, 3);
  auto op = [&](const char* kind, std::vector<int> inputs, int out, int64_t bwd_tmp) {
    OpRecord r;
    r.id = static_cast<int>(profile.ops.size());
    r.kind = kind;
    r.inputs = std::move(inputs);
    r.outputs = {out};
    r.bwd_tmp_bytes = bwd_tmp;
    profile.ops.push_back(r);
  };
  op("aten::_convolution", {0}, 1, 30);
  op("aten::expand", {}, 2, 0);
  op("aten::cat", {2, 1}, 3, 0);
  op("aten::layer_norm", {3}, 4, 0);
  profile.inputs = {0};
  profile.outputs = {4};
  Chain chain;
  chain.input_bytes = 40;
  chain.stages.resize(3);
  chain.stages[0].first_op = chain.stages[0].last_op = 0;
  chain.stages[0].out_bytes = 100;
  chain.stages[0].out_storages = {{1, 100}};
  chain.stages[1].first_op = 1;
  chain.stages[1].last_op = 2;
  chain.stages[1].out_bytes = 120;
  chain.stages[1].out_storages = {{3, 120}};
  chain.stages[2].first_op = chain.stages[2].last_op = 3;
  chain.stages[2].out_bytes = 120;
  chain.stages[2].out_storages = {{4, 120}};
  CHECK(StageGradientBytes(chain, profile).bwd_peak_bytes[0] == 150);
  // Read by another op too, t1's gradient is a sum of its own: 130.
  profile.ops[1].inputs = {1};
  CHECK(StageGradientBytes(chain, profile).bwd_peak_bytes[0] == 130);
}

TEST_CASE("the PyTorch target prices a wrapped module at its stages' forward inside it plus one fixed cost") {
  const int length = 6;
  Chain chain = testing::WithNoGradForwards(testing::RandomChain(length, 77), 78);
  const WrappableModule middle{"m1_3", 1, 3};
  std::vector<WrappableModule> singles;
  for (int i = 1; i <= 3; ++i) singles.push_back({"s" + std::to_string(i), i, i});
  double nograd = 0;
  for (int i = 1; i <= 3; ++i) nograd += chain.stages[static_cast<size_t>(i)].fwd_nograd_ms;
  // Without the PyTorch target's own fields: its stages' fwd_nograd_ms, no
  // fixed cost, the schedule's loss, as before.
  CHECK(chain.ModuleNoRecomputeTimeMs() == chain.NoRecomputeTimeMs());
  CHECK(EvaluateModules(chain, {}).time_ms == doctest::Approx(chain.NoRecomputeTimeMs()).epsilon(1e-12));
  CHECK(EvaluateModules(chain, {middle}).time_ms == doctest::Approx(chain.NoRecomputeTimeMs() + nograd).epsilon(1e-12));
  CHECK(EvaluateModules(chain, singles).time_ms == doctest::Approx(chain.NoRecomputeTimeMs() + nograd).epsilon(1e-12));
  // With them: the forward inside a wrapped module, a fixed cost per wrapped
  // module (one wrap over three stages is cheaper than three), its own loss.
  Chain priced = chain;
  double module_nograd = 0;
  for (int i = 0; i < length; ++i) {
    Stage& s = priced.stages[static_cast<size_t>(i)];
    s.module_fwd_nograd_ms = 1.3 * s.fwd_nograd_ms + 0.01 * i;
    if (i >= 1 && i <= 3) module_nograd += s.module_fwd_nograd_ms;
  }
  priced.checkpoint_call_ms = 0.25;
  priced.module_loss_bwd_ms = chain.loss_bwd_ms + 1.5;
  const double base = priced.ModuleNoRecomputeTimeMs();
  CHECK(base == doctest::Approx(chain.NoRecomputeTimeMs() + 1.5).epsilon(1e-12));
  CHECK(priced.NoRecomputeTimeMs() == chain.NoRecomputeTimeMs());  // the schedule target's: unchanged
  CHECK(EvaluateModules(priced, {}).time_ms == doctest::Approx(base).epsilon(1e-12));
  CHECK(EvaluateModules(priced, {middle}).time_ms == doctest::Approx(base + module_nograd + 0.25).epsilon(1e-12));
  CHECK(EvaluateModules(priced, singles).time_ms == doctest::Approx(base + module_nograd + 3 * 0.25).epsilon(1e-12));
  // The plan: time, step without recomputation and overhead of the
  // PyTorch target by its prices; the schedule target's exactly as before.
  std::vector<WrappableModule> modules = singles;
  modules.push_back(middle);
  PlanRequest request;
  request.budget_bytes = int64_t{1} << 50;
  request.algorithm = Algorithm::kEvery;
  request.pytorch_modules = &modules;
  FixedMemory fixed;
  fixed.optimizer_step_ms = 0.75;
  const Plan every = MakePlan(priced, fixed, request);
  CHECK(every.no_recompute_ms == doctest::Approx(base + 0.75).epsilon(1e-12));
  double all_nograd = 0;
  for (int i = 1; i <= 3; ++i) all_nograd += priced.stages[static_cast<size_t>(i)].module_fwd_nograd_ms;
  CHECK(every.time_ms == doctest::Approx(base + 0.75 + all_nograd + 3 * 0.25).epsilon(1e-12));
  const nlohmann::json doc = PlanToJson(every, priced, PlanSource{});
  CHECK(doc["pytorch"]["predicted"]["time_ms"].get<double>() == doctest::Approx(every.time_ms).epsilon(1e-12));
  CHECK(doc["predicted"]["overhead_pct"].get<double>() == doctest::Approx(OverheadPct(every.time_ms, base + 0.75)));
  for (Algorithm algorithm : {Algorithm::kNone, Algorithm::kEvery, Algorithm::kOptimal}) {
    PlanRequest schedule;
    schedule.algorithm = algorithm;
    schedule.budget_bytes = request.budget_bytes;
    const Plan before = MakePlan(chain, fixed, schedule), after = MakePlan(priced, fixed, schedule);
    CHECK(after.time_ms == before.time_ms);
    CHECK(after.no_recompute_ms == before.no_recompute_ms);
  }
}

TEST_CASE("with a fixed cost per wrapped module, the module solver still equals brute force over every set") {
  int compared = 0, feasible = 0;
  for (int length = 2; length <= 6; ++length) {
    for (uint32_t seed = 0; seed < 4; ++seed) {
      Chain chain = testing::SmallIntegerChain(length, 700 * length + seed);
      for (Stage& s : chain.stages) s.module_fwd_nograd_ms = 0.5 * s.fwd_ms;
      chain.checkpoint_call_ms = 1.75;
      chain.module_loss_bwd_ms = 2;
      std::vector<WrappableModule> modules = RandomModules(length, seed);
      CAPTURE(length);
      CAPTURE(seed);
      const int64_t minimum = MinimumModulesMemory(chain, modules);
      for (int64_t budget = minimum; budget <= minimum + 20; ++budget) {
        CAPTURE(budget);
        double best = 1e300;
        for (const auto& set : DisjointSets(modules, length)) {
          const ModuleSolution r = EvaluateModules(chain, set);
          if (r.peak_bytes <= budget) best = std::min(best, r.time_ms);
        }
        const ModuleSolution solution = SolveModules(chain, modules, budget);
        CHECK(solution.feasible == (best < 1e300));
        if (!solution.feasible) continue;
        ++feasible;
        CHECK(solution.time_ms == doctest::Approx(best).epsilon(1e-12));
        CHECK(EvaluateModules(chain, solution.wrapped).time_ms == doctest::Approx(solution.time_ms).epsilon(1e-12));
        ++compared;
      }
    }
  }
  CHECK(compared > 200);
  CHECK(feasible == compared);
}
