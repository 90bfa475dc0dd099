// CLI tests of the LibTorch commands (`ckplan profile`, `ckplan run`) on the
// bundled example model: units, progress bars, memory refusals.

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "cli_helpers.h"

#if CKPLAN_WITH_TORCH_BUILD

using namespace ckplan::testing;

namespace {

const std::string kModel = std::string(CKPLAN_SOURCE_DIR) + "/data/example.pt";
const std::string kProfile = std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json";

std::string Plan(const std::string& dir, const std::string& budget) {
  const std::string plan = dir + "/plan.json";
  CommandResult r = RunCkplan("solve " + kProfile + " --budget " + budget + " -o " + plan, dir);
  REQUIRE(r.exit_code == 0);
  return plan;
}

bool OneLineError(const CommandResult& r) {
  return r.err.rfind("ckplan: error: ", 0) == 0 && r.err.find('\n') == r.err.size() - 1;
}

}  // namespace

TEST_CASE("run prints bytes in the unit style the plan's budget was written in") {
  const std::string dir = TempDir();
  // Decimal: MB and KB throughout, no MiB or KiB anywhere.
  const std::string decimal = Plan(dir, "9.5MB");
  CHECK(nlohmann::json::parse(ReadAll(decimal))["unit_style"] == "decimal");
  CommandResult r = RunCkplan("run " + kModel + " --plan " + decimal + " --steps 1", dir);
  CAPTURE(r.out);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("budget 9.50 MB") != std::string::npos);
  CHECK(r.out.find(" MB") != std::string::npos);
  CHECK(r.out.find("iB") == std::string::npos);
  // Binary: MiB throughout.
  const std::string binary = Plan(dir, "9.5MiB");
  CHECK(nlohmann::json::parse(ReadAll(binary))["unit_style"] == "binary");
  r = RunCkplan("run " + kModel + " --plan " + binary + " --steps 1", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("budget 9.50 MiB") != std::string::npos);
  CHECK(r.out.find(" MB") == std::string::npos);
  CHECK(r.out.find(" KB") == std::string::npos);
  // A plan from before the field: binary; a bad value: exit 2 naming the field.
  nlohmann::json plan = nlohmann::json::parse(ReadAll(binary));
  plan.erase("unit_style");
  WriteText(dir + "/old.json", plan.dump());
  r = RunCkplan("run " + kModel + " --plan " + dir + "/old.json --steps 1", dir);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find(" MiB") != std::string::npos);
  plan["unit_style"] = "metric";
  WriteText(dir + "/bad.json", plan.dump());
  r = RunCkplan("run " + kModel + " --plan " + dir + "/bad.json --steps 1", dir);
  CHECK(r.exit_code == 2);
  CHECK(OneLineError(r));
  CHECK(r.err.find("unit_style") != std::string::npos);
}

TEST_CASE("profile and run draw a progress bar on a terminal only") {
  const std::string dir = TempDir();
  const std::string plan = Plan(dir, "9.5MiB");
  const std::string env = "CKPLAN_PROGRESS_AFTER_S=0 ";
  const std::string profile = env + CKPLAN_BINARY + " profile " + kModel + " --input 8x3x32x32 -o " + dir + "/p.json";
  const std::string run = env + CKPLAN_BINARY + " run " + kModel + " --plan " + plan + " --steps 1";
  for (const auto& [command, label] :
       {std::pair{profile, std::string("\rprofiling ")}, std::pair{run, std::string("\rrunning ")}}) {
    CAPTURE(command);
    // stderr to a file: nothing of a bar, not even an erased one.
    REQUIRE(std::system((command + " >" + dir + "/out.txt 2>" + dir + "/err.txt </dev/null").c_str()) == 0);
    const std::string err = ReadAll(dir + "/err.txt");
    CHECK(err.find('\r') == std::string::npos);
    CHECK(err.find("[#") == std::string::npos);
    if (std::system("command -v script >/dev/null 2>&1") != 0) {
      MESSAGE("script(1) not found: the terminal half is skipped");
      continue;
    }
    // On a terminal (script(1) gives it one): the bar is drawn, then erased.
    REQUIRE(std::system(("script -qec '" + command + "' /dev/null </dev/null >" + dir + "/tty.txt 2>&1").c_str()) == 0);
    const std::string tty = ReadAll(dir + "/tty.txt");
    CHECK(tty.find(label) != std::string::npos);
    CHECK(tty.find("\r\033[K") != std::string::npos);
  }
}

TEST_CASE("activations that outgrow the memory a step may use are refused in one line, exit 2, no file") {
  const std::string dir = TempDir();
  // The example's step needs about 8 MiB; CKPLAN_MEMORY_LIMIT lowers the cap
  // (by default: this machine's available memory, less a margin).
  CommandResult r = RunCkplan("profile " + kModel + " --input 8x3x32x32 -o " + dir + "/p.json", dir);
  REQUIRE(r.exit_code == 0);
  const std::string limited = "CKPLAN_MEMORY_LIMIT=3MiB ";
  CommandResult refused;
  const std::string command =
      limited + CKPLAN_BINARY + " profile " + kModel + " --input 8x3x32x32 -o " + dir + "/p3.json";
  {
    int status = std::system((command + " >" + dir + "/o.txt 2>" + dir + "/e.txt </dev/null").c_str());
    refused.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    refused.err = ReadAll(dir + "/e.txt");
  }
  CAPTURE(refused.err);
  CHECK(refused.exit_code == 2);
  CHECK(OneLineError(refused));
  CHECK(refused.err.find("the step needs more memory than this machine can give it: at least ") != std::string::npos);
  CHECK(refused.err.find("above 3.00 MiB from CKPLAN_MEMORY_LIMIT=3MiB") != std::string::npos);
  CHECK_FALSE(FileExists(dir + "/p3.json"));
  // Meta tensors take no memory: the same step on meta is not refused, and
  // its saved bytes are the CPU's (Llama-3-8B's step is 70 GiB on meta).
  {
    const std::string meta = limited + CKPLAN_BINARY + " profile " + kModel +
                             " --input 8x3x32x32 --device meta --gpu h100-sxm-80gb -o " + dir + "/meta.json";
    int status = std::system((meta + " >" + dir + "/o.txt 2>" + dir + "/e.txt </dev/null").c_str());
    CAPTURE(ReadAll(dir + "/e.txt"));
    REQUIRE((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 0);
    CHECK(nlohmann::json::parse(ReadAll(dir + "/meta.json"))["totals"]["saved_bytes"] ==
          nlohmann::json::parse(ReadAll(dir + "/p.json"))["totals"]["saved_bytes"]);
  }
  // The same for run, and a bad limit is a bad input too.
  const std::string plan = Plan(dir, "9.5MiB");
  const std::string run = limited + CKPLAN_BINARY + " run " + kModel + " --plan " + plan + " -o " + dir + "/run.json";
  int status = std::system((run + " >" + dir + "/o.txt 2>" + dir + "/e.txt </dev/null").c_str());
  const std::string err = ReadAll(dir + "/e.txt");
  CAPTURE(err);
  CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 2);
  CHECK(err.find("the step needs more memory than this machine can give it") != std::string::npos);
  CHECK(err.find('\n') == err.size() - 1);
  CHECK_FALSE(FileExists(dir + "/run.json"));
  status = std::system(("CKPLAN_MEMORY_LIMIT=lots " + std::string(CKPLAN_BINARY) + " profile " + kModel +
                        " --input 8x3x32x32 >/dev/null 2>" + dir + "/e.txt </dev/null")
                           .c_str());
  CHECK((WIFEXITED(status) ? WEXITSTATUS(status) : -1) == 2);
  CHECK(ReadAll(dir + "/e.txt").find("CKPLAN_MEMORY_LIMIT") != std::string::npos);
}

TEST_CASE("a forward taking a list, a dict or a number is refused in one line naming the input, exit 2") {
  const std::string dir = TempDir();
  // Scripted by the environment's PyTorch (as a user would save them).
  WriteText(dir + "/make.py",
            "import sys, torch\n"
            "from typing import Dict, List\n"
            "class L(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__(); self.lin = torch.nn.Linear(4, 4)\n"
            "    def forward(self, xs: List[torch.Tensor]):\n        return self.lin(xs[0])\n"
            "class D(L):\n"
            "    def forward(self, xs: Dict[str, torch.Tensor]):\n        return self.lin(xs['a'])\n"
            "class N(L):\n"
            "    def forward(self, x, n: int):\n        return self.lin(x) * n\n"
            "for name, cls in (('list', L), ('dict', D), ('int', N)):\n"
            "    torch.jit.script(cls().train()).save(sys.argv[1] + '/' + name + '_input.pt')\n");
  REQUIRE(std::system((std::string(CKPLAN_PYTHON) + " " + dir + "/make.py " + dir + " >/dev/null 2>&1").c_str()) == 0);
  const std::pair<std::string, std::string> cases[] = {{"list", "input 1 ('xs') as List[Tensor]"},
                                                       {"dict", "input 1 ('xs') as Dict[str, Tensor]"},
                                                       {"int", "input 2 ('n') as int"}};
  for (const auto& [name, what] : cases) {
    const std::string inputs = name == "int" ? " --input 2x4 --input 3" : " --input 2x4";
    CommandResult r = RunCkplan("profile " + dir + "/" + name + "_input.pt" + inputs, dir);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(OneLineError(r));
    CHECK(r.err.find("the model's forward takes " + what) != std::string::npos);
    CHECK(r.err.find("ckplan gives each input one tensor (--input)") != std::string::npos);
    CHECK(r.err.find("INTERNAL ASSERT") == std::string::npos);
  }
}

TEST_CASE("profile and run refuse an output into a missing folder before any work") {
  const std::string dir = TempDir();
  CommandResult r = RunCkplan("profile " + kModel + " --input 8x3x32x32 -o " + dir + "/missing/p.json", dir);
  CHECK(r.exit_code == 2);
  CHECK(OneLineError(r));
  CHECK(r.err.find("missing/p.json: cannot write: folder ") != std::string::npos);
  CHECK(r.out.empty());  // nothing profiled
  const std::string plan = Plan(dir, "9.5MiB");
  r = RunCkplan("run " + kModel + " --plan " + plan + " -o " + dir + "/missing/r.json", dir);
  CHECK(r.exit_code == 2);
  CHECK(OneLineError(r));
  CHECK(r.err.find("missing/r.json: cannot write: folder ") != std::string::npos);
  CHECK(r.out.empty());  // nothing run
}

#endif  // CKPLAN_WITH_TORCH_BUILD
