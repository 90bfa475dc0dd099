#include "planner/cost/same_work.h"

#include <doctest/doctest.h>

using namespace ckplan;

namespace {

// Two linear layers of one shape and a third of another, then two layers
// whose module's weights are frozen.
Profile LayersProfile() {
  Profile p;
  auto tensor = [&p](std::vector<int64_t> shape, bool requires_grad, int producer) {
    TensorRecord t;
    t.id = static_cast<int>(p.tensors.size());
    t.shape = std::move(shape);
    t.dtype = "float32";
    t.requires_grad = requires_grad;
    t.producer = producer;
    p.tensors.push_back(t);
    return t.id;
  };
  auto op = [&p](const std::string& module, int in, int out, std::vector<int64_t> weight) {
    OpRecord o;
    o.id = static_cast<int>(p.ops.size());
    o.kind = "aten::linear";
    o.module = module;
    o.inputs = {in};
    o.outputs = {out};
    o.args = {{p.tensors[static_cast<size_t>(in)].shape, "Float"}, {weight, "Float"}};
    p.ops.push_back(o);
  };
  int x = tensor({8, 16}, true, -1);
  for (int i = 0; i < 5; ++i) {
    const bool wide = i == 2;
    const int y = tensor({8, wide ? 32 : 16}, true, i);
    op("layers." + std::to_string(i), x, y, {wide ? 32 : 16, 16});
    p.parameters.push_back({"layers." + std::to_string(i) + ".weight", {16, 16}, 1024, i < 3});
    x = wide ? tensor({8, 16}, true, i) : y;
  }
  return p;
}

}  // namespace

TEST_CASE("ops that do the same work share a group; another shape, or a frozen module in backward, does not") {
  const Profile p = LayersProfile();
  const std::vector<int> forward = SameWorkGroups(p, false);
  CHECK(forward[1] == forward[0]);
  CHECK(forward[2] != forward[0]);  // another weight shape
  CHECK(forward[4] == forward[0]);
  const std::vector<int> backward = SameWorkGroups(p, true);
  CHECK(backward[1] == backward[0]);
  CHECK(backward[3] != backward[0]);  // its module's weight frozen: no weight gradient
  CHECK(backward[4] == backward[3]);
}

TEST_CASE("pooled times: each op its group's median of every sample, and the samples' spread") {
  const std::vector<int> groups = {0, 0, 2, 0};
  const PooledTimes pooled = PoolSamples(groups, {{1.0}, {1.2}, {5.0}, {0.9}});
  CHECK(pooled.ms[0] == doctest::Approx(1.0));
  CHECK(pooled.ms[1] == doctest::Approx(1.0));
  CHECK(pooled.ms[3] == doctest::Approx(1.0));
  CHECK(pooled.ms[2] == doctest::Approx(5.0));  // alone: its own
  // Deviations 0, 20% and 10% (equal weights): the median is 10%.
  REQUIRE(pooled.noise_pct.has_value());
  CHECK(*pooled.noise_pct == doctest::Approx(10.0));
  // No group of two samples: no noise to state.
  CHECK_FALSE(PoolSamples({0, 1}, {{1.0}, {2.0}}).noise_pct.has_value());
}

TEST_CASE("an input that needs no gradient changes the backward's group, not the forward's") {
  Profile p = LayersProfile();
  p.tensors[0].requires_grad = false;  // the model's input: op 0 computes no input gradient
  CHECK(SameWorkGroups(p, false)[1] == SameWorkGroups(p, false)[0]);
  CHECK(SameWorkGroups(p, true)[1] != SameWorkGroups(p, true)[0]);
}
