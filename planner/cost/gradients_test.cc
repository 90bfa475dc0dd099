// Parameter gradients and stage backward peaks from a profile, on
// hand-built profiles.

#include "planner/cost/gradients.h"

#include <doctest/doctest.h>

#include "planner/cost/liveness.h"

using namespace ckplan;

namespace {

// Per stage, a backward replay's peak (StageGradients), unset where unknown.
using Replayed = std::vector<std::optional<int64_t>>;

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

// Two stages: op 0 (stage 0): input -> t1 (saved by op 1); op 1, op 2
// (stage 1): t1 -> t2 -> t3, the model output, which no op saves; op 2 saves
// 8 B of its own. With `mask`, op 0 also makes a 16 B mask (no gradient: a
// causal mask, the rotary tables) that op 2 reads.
struct TwoStages {
  Profile profile;
  Chain chain;
};

TwoStages TwoStageModel(bool mask) {
  TwoStages m;
  AddTensor(&m.profile, 100, 40, -1, false);
  AddTensor(&m.profile, 1, 100, 0, true);
  AddTensor(&m.profile, 2, 60, 1, false);
  AddTensor(&m.profile, 3, 50, 2, false);
  auto op = [&](std::vector<int> in, std::vector<int> out, int64_t saved, int64_t bwd_tmp) {
    OpRecord r;
    r.id = static_cast<int>(m.profile.ops.size());
    r.inputs = std::move(in);
    r.outputs = std::move(out);
    r.saved_bytes = saved;
    r.bwd_tmp_bytes = bwd_tmp;  // the gradient of its input
    m.profile.ops.push_back(r);
  };
  op({0}, {1}, 100, 0);  // t1's storage, counted where it was made
  op({1}, {2}, 0, 100);
  op({2}, {3}, 8, 60);
  m.profile.inputs = {0};
  m.profile.outputs = {3};
  m.chain.input_bytes = 40;
  m.chain.stages.resize(2);
  m.chain.stages[0].ops = OpRange{0, 0};
  m.chain.stages[0].out_bytes = 100;
  m.chain.stages[0].out_storages = {{1, 100}};
  m.chain.stages[0].kept_out_storages = {1};
  m.chain.stages[1].ops = OpRange{1, 2};
  m.chain.stages[1].out_bytes = 50;
  m.chain.stages[1].out_storages = {{3, 50}};
  if (mask) {
    AddTensor(&m.profile, 9, 16, 0, false);
    m.profile.tensors.back().requires_grad = false;
    m.profile.ops[0].outputs.push_back(4);
    m.profile.ops[2].inputs.push_back(4);
    m.chain.stages[0].out_bytes += 16;
    m.chain.stages[0].out_storages.push_back({9, 16});
  }
  return m;
}

StageGradients Gradients(const Chain& chain, const Profile& profile) {
  return GradientsFromProfile(chain, profile, Liveness(profile));
}

}  // namespace

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
    chain.stages[static_cast<size_t>(i)].ops = OpRange{ranges[i][0], ranges[i][1]};
  }
  const StageGradients grads = Gradients(chain, profile);
  // wte's weight is used last by lm_head (stage 3); `scale` by the root's op
  // in stage 2; a parameter no op is found to use counts from the start of backward.
  CHECK(grads.bytes == std::vector<int64_t>{0, 288, 288 + 32, 3200 + 12});
  // Held on top of a stage's measured backward transient: in stage 2, h.1.fc's
  // op runs its backward with `scale`'s gradient made; the unused one throughout.
  CHECK(grads.held_at_bwd_peak_bytes == std::vector<int64_t>{0, 0, 32, 12});
}

TEST_CASE("a stage's backward as PyTorch runs it: boundary gradients as they live, saved storages as released") {
  TwoStages m = TwoStageModel(false);
  Profile& profile = m.profile;
  const Chain& chain = m.chain;
  // Above what the stage keeps (t3, 50 B, held by the loss until its
  // backward), stage 1: the loss has released t3 and its gradient (50) has
  // arrived; op 2 makes t2's gradient (60), then releases t3's and its own
  // 8 B; op 1 makes t1's (100, held on: stage 0's input) while t2's is alive:
  // -50 + 60 - 8 + 100 = 102 (the old bound: 50 + 100 + 60 + 8 = 218). Stage 0:
  // t1's gradient (100) until op 0 has back-propagated; t1 itself is in
  // stage 0's keep.
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes == Replayed{100, 102});
  // Measured: op 1's backward released t1 (it saved it), so stage 0's
  // backward starts without it: its gradient alone, less its keep.
  profile.tensors[1].released_by = 1;
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes == Replayed{0, 102});

  // As `ckplan run`'s executor runs it (executor_bwd_peak_bytes): it holds the
  // cuts' values (t1, stage 0's output, though op 1 released it), the model
  // output t3 and its gradient (50 + 50 more for stage 1: 202).
  CHECK(Gradients(chain, profile).executor_bwd_peak_bytes == Replayed{100, 202});
  // Op 1's backward measured over all its nodes (bwd_span_peak_bytes): 30 B
  // above what is live when it starts, plus t1 (a cut's storage the profiled
  // step released during it, which the executor holds), 232, above the
  // node-by-node bound: that counts. Without the release measured, 102 + 30
  // is below it: 132. PyTorch's replay takes it too, from what is live when
  // op 1 starts (t3's gradient released, t2's made: 2 B net): 32, below 102.
  profile.ops[1].bwd_span_peak_bytes = 30;
  CHECK(Gradients(chain, profile).executor_bwd_peak_bytes == Replayed{100, 202});
  profile.tensors[1].released_by.reset();
  CHECK(Gradients(chain, profile).executor_bwd_peak_bytes == Replayed{100, 132});
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes == Replayed{100, 102});
  // A span above the node-by-node bound (cross-entropy's two nodes, each
  // gradient the logits' size, alive together): PyTorch holds it as well.
  profile.ops[1].bwd_span_peak_bytes = 300;
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes == Replayed{100, 302});
}

TEST_CASE("a stage's backward: no gradient for a value passed along that autograd does not differentiate") {
  // The mask crosses the cut, but no gradient of it is made or held: stage
  // 0's backward holds t1's gradient alone (100), not 116.
  const TwoStages m = TwoStageModel(true);
  CHECK(Gradients(m.chain, m.profile).pytorch_bwd_peak_bytes == Replayed{100, 102});
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
  for (int i = 0; i < 2; ++i) chain.stages[static_cast<size_t>(i)].ops = OpRange{i, i};
  CHECK(Gradients(chain, profile).bytes == std::vector<int64_t>{256, 256});
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
  chain.stages[0].ops = OpRange{0, 1};
  chain.stages[0].out_bytes = 100;
  chain.stages[0].out_storages = {{1, 100}};
  chain.stages[0].kept_out_storages = {1};
  chain.stages[1].ops = OpRange{2, 2};
  chain.stages[1].out_bytes = 50;
  chain.stages[1].out_storages = {{3, 50}};
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes[0] == 250);
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
  chain.stages[0].ops = OpRange{0, 0};
  chain.stages[0].out_bytes = 100;
  chain.stages[0].out_storages = {{1, 100}};
  chain.stages[1].ops = OpRange{1, 2};
  chain.stages[1].out_bytes = 120;
  chain.stages[1].out_storages = {{3, 120}};
  chain.stages[2].ops = OpRange{3, 3};
  chain.stages[2].out_bytes = 120;
  chain.stages[2].out_storages = {{4, 120}};
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes[0] == 150);
  // Read by another op too, t1's gradient is a sum of its own: 130.
  profile.ops[1].inputs = {1};
  CHECK(Gradients(chain, profile).pytorch_bwd_peak_bytes[0] == 130);
}
