// What a PyTorch job keeps when the loss starts under a plan's export
// (held_at_loss_bytes), on TwoBlockProfile (tests/test_profiles.h) whose
// storages are chosen by hand: torch-free, so that dropping a term of the
// export's count fails here and not only in the LibTorch tests.

#include "planner/plan/pytorch_export.h"

#include <doctest/doctest.h>

#include "tests/test_profiles.h"
#include "planner/contracts/profile.h"
#include "planner/cost/chain_from_profile.h"

using namespace ckplan;
using ckplan::testing::TwoBlockProfile;

TEST_CASE("the export counts what PyTorch keeps at the loss: own saved bytes plus shared storages, each once") {
  const Chain chain = ChainFromProfile(ProfileFromJson(TwoBlockProfile(), "two_blocks.json"));
  REQUIRE(chain.length() == 3);
  REQUIRE(chain.has_storages());
  // Nothing wrapped: tanh's t4 (800, b's own), relu's t2 (2000, the cut
  // a.act -> b, saved by relu and read by b) and the output t5 (800); fc's
  // output t1 is freed once relu has read it (no op saves it).
  CHECK(ExportForModules(chain, {}).held_at_loss_bytes == 800 + 2000 + 800);
  // b wrapped: its own t4 goes (recomputed); its input t2 stays (the
  // checkpoint holds it), and the output t5.
  CHECK(ExportForModules(chain, {{"b", 2, 2}}).held_at_loss_bytes == 2000 + 800);
  // a.act wrapped: t4 stays; the checkpoint holds its input t1 (2000), t2
  // is still read by b, t5: wrapping it keeps more, not less.
  CHECK(ExportForModules(chain, {{"a.act", 1, 1}}).held_at_loss_bytes == 800 + 2000 + 2000 + 800);
  // ExportForPyTorch leaves such a module out.
  const ModuleExport act = ExportForPyTorch(chain, {1});
  CHECK(act.checkpoint_modules.empty());
  CHECK(act.held_at_loss_bytes == 3600);
  const ModuleExport b = ExportForPyTorch(chain, {2});
  REQUIRE(b.checkpoint_modules.size() == 1);
  CHECK(b.checkpoint_modules[0] == "b");
  CHECK(b.held_at_loss_bytes == 2800);
}
