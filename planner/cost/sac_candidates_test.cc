// Which ops a selective-checkpointing plan may save, on profiles written by
// hand: families and their order as a policy sees them, outputs written in
// place, attention's math path, what the dispatched op returns beyond its
// outputs.
#include "planner/cost/sac_candidates.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "planner/cost/chain_from_profile.h"
#include "tests/test_profiles.h"

using namespace ckplan;

namespace {

// One module `blk`: x -> linear (q) -> layer_norm -> [relu_ in place] ->
// attention (dropout 0.1) -> matmul -> add x -> out. Storages are the tensor
// ids, but the in-place relu's output shares the layer norm's.
Profile BlockProfile(const std::string& device, bool relu_in_place) {
  using testing::ProfileOp;
  using testing::ProfileTensor;
  nlohmann::json tensors = {ProfileTensor(0, 1000, -1, false), ProfileTensor(1, 1000, 0, false),
                            ProfileTensor(2, 1000, 1, true),   ProfileTensor(3, 1000, 2, true),
                            ProfileTensor(4, 1000, 3, true),   ProfileTensor(5, 1000, 4, false),
                            ProfileTensor(6, 1000, 5, false)};
  tensors[3]["storage"] = relu_in_place ? 2 : 3;
  nlohmann::json ops = {ProfileOp(0, "aten::linear", "blk.q", {0}, 1, 0, 0, 0, 2.0, 4.0),
                        ProfileOp(1, "aten::layer_norm", "blk.ln", {1}, 2, 1064, 0, 0, 0.5, 1.0),
                        ProfileOp(2, relu_in_place ? "aten::relu_" : "aten::relu", "blk", {2}, 3,
                                  relu_in_place ? 0 : 1000, 0, 0, 0.25, 0.25),
                        ProfileOp(3, "aten::scaled_dot_product_attention", "blk.attn", {3}, 4, 1500, 0, 0, 3.0, 6.0),
                        ProfileOp(4, "aten::matmul", "blk", {4}, 5, 0, 0, 0, 1.0, 2.0),
                        ProfileOp(5, "aten::add", "blk", {5, 0}, 6, 0, 0, 0, 0.25, 0.25)};
  ops[2]["inplace"] = relu_in_place;
  ops[3]["dropout_p"] = 0.1;
  for (auto& op : ops) op["fwd_nograd_ms"] = op["fwd_ms"];
  nlohmann::json doc = {{"schema", "ckplan.profile/1"},
                        {"model", {{"path", "block.pt2"}}},
                        {"environment", {{"device", device}}},
                        {"totals",
                         {{"param_bytes", 0}, {"buffer_bytes", 0}, {"input_bytes", 1000}, {"saved_bytes", 3564},
                          {"output_bytes", 1000}, {"fwd_ms", 7.0}, {"bwd_ms", 13.5}, {"peak_bytes", 9000}}},
                        {"inputs", {0}},
                        {"outputs", {6}},
                        {"tensors", tensors},
                        {"ops", ops}};
  return ProfileFromJson(doc, "block.json");
}

// The module `blk` of BlockProfile(device, relu_in_place), with its candidates.
WrappableModule Block(const std::string& device, bool relu_in_place) {
  const Profile profile = BlockProfile(device, relu_in_place);
  const Chain chain = ChainFromProfile(profile);
  std::vector<WrappableModule> modules = WrappableModules(chain, &profile);
  AddSacCandidates(profile, chain, &modules);
  for (const WrappableModule& m : modules) {
    if (m.path == "blk") return m;
  }
  FAIL("no wrappable module blk");
  return {};
}

}  // namespace

TEST_CASE("sac candidates: a policy's families in order; outputs written in place and attention's math path excluded") {
  const WrappableModule blk = Block("cpu", true);
  CHECK(blk.selective);
  // linear, then attention's two products on the CPU path with dropout, then matmul.
  CHECK(blk.sac_family_counts == std::map<std::string, int>{{"layer_norm", 1}, {"mm", 4}});
  REQUIRE(blk.sac_candidates.size() == 2);
  CHECK(blk.sac_candidates[0].op == 0);
  CHECK(blk.sac_candidates[0].family == "mm");
  CHECK(blk.sac_candidates[0].occurrence == 0);
  CHECK(blk.sac_candidates[0].recompute_ms == 2.0);
  CHECK(blk.sac_candidates[0].storages == std::vector<std::pair<int64_t, int64_t>>{{1, 1000}});
  CHECK(blk.sac_candidates[1].op == 4);
  CHECK(blk.sac_candidates[1].occurrence == 3);
  // Every subset of two candidates is on the frontier (each saves bytes and time).
  CHECK(blk.sac_variants.size() == 4);
  CHECK(blk.sac_variants.front().empty());
}

TEST_CASE("sac candidates: off the CPU attention is one fused kernel; a layer norm holds its mean and rstd too") {
  const WrappableModule blk = Block("cuda:0 (NVIDIA H200)", false);
  CHECK(blk.sac_family_counts == std::map<std::string, int>{{"layer_norm", 1}, {"mm", 2}, {"sdpa", 1}});
  REQUIRE(blk.sac_candidates.size() == 4);
  CHECK(blk.sac_candidates[1].family == "layer_norm");
  // Its output (kept, 1000 B) and what it saved beyond it (64 B).
  CHECK(blk.sac_candidates[1].storages == std::vector<std::pair<int64_t, int64_t>>{{2, 1000}, {-2, 64}});
  CHECK(blk.sac_candidates[2].family == "sdpa");
  CHECK(blk.sac_candidates[2].storages == std::vector<std::pair<int64_t, int64_t>>{{4, 1000}, {-4, 500}});
  CHECK(blk.sac_candidates[3].family == "mm");
  CHECK(blk.sac_candidates[3].occurrence == 1);
}

TEST_CASE("sac variants: beyond the exact size, the frontier of bytes and time saved, within its cap") {
  WrappableModule m("m", 0, 0);
  m.selective = true;
  for (int i = 0; i < 20; ++i) {
    SacCandidate c;
    c.op = i;
    c.storages = {{i, 100 + 7 * i}};
    c.recompute_ms = 1.0 + (i % 5);
    m.sac_candidates.push_back(c);
  }
  bool exact = true;
  const std::vector<std::vector<int>> variants = SacVariants(m, &exact);
  CHECK_FALSE(exact);
  CHECK(variants.size() <= static_cast<size_t>(kMaxSacVariants));
  CHECK(variants.front().empty());
  CHECK(variants.back().size() == 20);  // saving everything saves the most time
  // Along the frontier, more bytes buy more time saved.
  double last_ms = -1;
  int64_t last_bytes = -1;
  for (const std::vector<int>& v : variants) {
    int64_t bytes = 0;
    double ms = 0;
    for (int i : v) {
      bytes += m.sac_candidates[static_cast<size_t>(i)].storages[0].second;
      ms += m.sac_candidates[static_cast<size_t>(i)].recompute_ms;
    }
    CHECK(bytes > last_bytes);
    CHECK(ms > last_ms);
    last_bytes = bytes;
    last_ms = ms;
  }
}

TEST_CASE("sac dispatched ops: attention's math path on the CPU, one fused kernel elsewhere; the module's sum priced") {
  // linear without recorded shapes 2 (t, addmm), layer norm 1, relu 2
  // (relu, detach), attention 26 (math path with dropout) or 2, matmul 1,
  // add 1.
  const WrappableModule cpu = Block("cpu", false);
  const WrappableModule gpu = Block("cuda:0", false);
  CHECK(cpu.sac_dispatched_ops == 33);
  CHECK(gpu.sac_dispatched_ops == 9);
  CHECK(cpu.sac_dispatch_ms == doctest::Approx(33 * kDefaultSacDispatchUs * 1e-3));
  OpRecord linear;
  linear.kind = "aten::linear";
  linear.args = {{{4, 16, 32}, "Float"}, {{8, 32}, "Float"}};
  CHECK(SacDispatchedOps(BlockProfile("cpu", false), linear, "cpu") == 4);  // view, t, addmm, _unsafe_view
  linear.args[0].shape = {16, 32};
  CHECK(SacDispatchedOps(BlockProfile("cpu", false), linear, "cpu") == 2);  // t, addmm
}
