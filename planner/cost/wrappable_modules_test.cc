// The modules a plan can wrap, on hand-built profiles.

#include "planner/cost/wrappable_modules.h"

#include <string>
#include <utility>
#include <vector>

#include <doctest/doctest.h>

using namespace ckplan;

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
    stage.ops = OpRange{r.id, r.id};
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
  profile.model.containers = {"body.layers"};
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body", "body.layers.1", "head"});
  profile.model.containers = {"body"};
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body.layers", "body.layers.1", "head"});
  profile.model.containers = {"body", "body.layers"};
  CHECK(paths() == std::vector<std::string>{"embed", "body.layers.0", "body.layers.1", "head"});
}

TEST_CASE("wrappable modules: a frozen prefix (no op output requires grad) has nothing to recompute, never one") {
  // backbone.0 and backbone.1 frozen, whose input needs no gradient: their
  // outputs require none; the head trains.
  std::pair<Profile, Chain> built = OneOpPerStage({"backbone.0", "backbone.1", "head"});
  Profile& profile = built.first;
  const Chain& chain = built.second;
  for (OpRecord& op : profile.ops) {
    TensorRecord t;
    t.id = static_cast<int>(profile.tensors.size());
    t.producer = op.id;
    t.requires_grad = op.module == "head";
    op.outputs = {t.id};
    profile.tensors.push_back(t);
  }
  auto paths = [&]() {
    std::vector<std::string> out;
    for (const WrappableModule& m : WrappableModules(chain, &profile)) out.push_back(m.path);
    return out;
  };
  CHECK(paths() == std::vector<std::string>{"head"});
  // A backbone whose second module trains: it and the backbone around it are offered.
  profile.tensors[1].requires_grad = true;
  CHECK(paths() == std::vector<std::string>{"backbone", "backbone.1", "head"});
  // A profile that records no requires_grad (written by hand) says nothing: every module offered.
  for (TensorRecord& t : profile.tensors) t.requires_grad = false;
  CHECK(paths() == std::vector<std::string>{"backbone.0", "backbone", "backbone.1", "head"});
}
