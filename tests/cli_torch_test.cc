// CLI tests of the LibTorch commands (`ckplan profile`, `ckplan run`) on the
// bundled example model: units, progress bars, memory refusals; on the test
// models: an eval-mode export, integer inputs' ranges.

#include <fstream>

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "tests/cli_helpers.h"

#if CKPLAN_WITH_TORCH_BUILD

using namespace ckplan::testing;

namespace {

const std::string kModel = std::string(CKPLAN_SOURCE_DIR) + "/data/example.pt";
const std::string kProfile = std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json";

std::string Plan(const std::string& dir, const std::string& budget, const std::string& profile = kProfile) {
  const std::string plan = dir + "/plan.json";
  CommandResult r = RunCkplan("solve " + profile + " --budget " + budget + " -o " + plan, dir);
  REQUIRE(r.exit_code == 0);
  return plan;
}

// The example profiled on this machine (one rep: only its bytes matter), for
// a run whose verdict must be ok. data/example.profile.json is a file
// measured once, and oneDNN's convolutions take other workspaces on other
// processors (7 of its 15 differ on an AMD EPYC, its prediction 0.7% high
// there): with them half as large again the step peaks 7.5% above that
// profile's prediction, over a 9.5 MB budget: prediction_off or over_budget,
// exit 4 (issue 25).
std::string ProfileHere(const std::string& dir) {
  const std::string profile = dir + "/example.profile.json";
  CommandResult r = RunCkplan("profile " + kModel + " --input 8x3x32x32 --reps 1 -o " + profile, dir);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  return profile;
}

bool OneLineError(const CommandResult& r) {
  return r.err.rfind("ckplan: error: ", 0) == 0 && r.err.find('\n') == r.err.size() - 1;
}

}  // namespace

TEST_CASE("run prints bytes in the unit style the plan's budget was written in") {
  const std::string dir = TempDir();
  // Decimal: MB and KB throughout, no MiB or KiB anywhere.
  const std::string here = ProfileHere(dir);
  const std::string decimal = Plan(dir, "9.5MB", here);
  CHECK(nlohmann::json::parse(ReadAll(decimal))["unit_style"] == "decimal");
  CommandResult r = RunCkplan("run " + kModel + " --plan " + decimal + " --steps 1", dir);
  CAPTURE(r.out);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("budget 9.50 MB") != std::string::npos);
  CHECK(r.out.find(" MB") != std::string::npos);
  CHECK(r.out.find("iB") == std::string::npos);
  // Binary: MiB throughout.
  const std::string binary = Plan(dir, "9.5MiB", here);
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
  const std::string plan = Plan(dir, "9.5MiB", ProfileHere(dir));
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

TEST_CASE("a trace whose loop over torch.nonzero rows no longer matches the data is refused in one line, exit 2") {
  // As a mixture of experts' eager routing: traced with every row picked
  // (the loop unrolled three times), profiled with none. The unpacked list
  // was read past its end: a crash, or an error naming a garbage tag.
  const std::string dir = TempDir();
  WriteText(dir + "/make.py",
            "import sys, warnings, torch\n"
            "warnings.filterwarnings('ignore')\n"
            "class Rows(torch.nn.Module):\n"
            "    def __init__(self):\n        super().__init__(); self.lin = torch.nn.Linear(4, 4)\n"
            "    def forward(self, x):\n"
            "        y = torch.zeros_like(x)\n"
            "        for row in torch.nonzero(x[:, 0] > 0):\n            y = y + self.lin(x[row[0]])\n"
            "        return y\n"
            "torch.jit.trace(Rows().train(), (torch.ones(3, 4),), check_trace=False).save(sys.argv[1] + '/rows.pt')\n");
  REQUIRE(std::system((std::string(CKPLAN_PYTHON) + " " + dir + "/make.py " + dir + " >/dev/null 2>&1").c_str()) == 0);
  CommandResult r = RunCkplan("profile " + dir + "/rows.pt --input 3x4:float32:-2..-1 --reps 1 -o " + dir + "/p.json", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 2);
  CHECK(OneLineError(r));
  CHECK(r.err.find("the model's graph unpacks the list made by aten::unbind into 3 values, but this run's list has 0: "
                   "its trace fixed a length that depends on the data") != std::string::npos);
  CHECK_FALSE(FileExists(dir + "/p.json"));
  // Every row picked, as when traced: profiled.
  r = RunCkplan("profile " + dir + "/rows.pt --input 3x4:float32:1..2 --reps 1 -o " + dir + "/p.json", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 0);
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

#ifdef CKPLAN_TEST_MODELS
TEST_CASE("a truncated .pt2 profiled without --input is refused as unreadable, not for lacking --input") {
  const std::string dir = TempDir();
  std::ifstream whole(std::string(CKPLAN_TEST_MODELS) + "/llama.pt2", std::ios::binary);
  std::string head(4096, '\0');
  whole.read(&head[0], static_cast<std::streamsize>(head.size()));
  std::ofstream(dir + "/cut.pt2", std::ios::binary) << head;
  CommandResult r = RunCkplan("profile " + dir + "/cut.pt2 -o " + dir + "/p.json", dir);
  CHECK(r.exit_code == 2);
  CHECK(OneLineError(r));
  CHECK(r.err.find("cut.pt2") != std::string::npos);
  CHECK(r.err.find("truncated or corrupted") != std::string::npos);
  CHECK(r.err.find("--input") == std::string::npos);
}

TEST_CASE("a .pt2 exported in eval mode is profiled with a one-line warning and training: false") {
  const std::string dir = TempDir();
  const std::string models = std::string(CKPLAN_TEST_MODELS) + "/";
  CommandResult r = RunCkplan("profile " + models + "eval_export.pt2 --input 4x16 --reps 1 -o " + dir + "/p.json", dir);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  const std::string warning = "ckplan: warning: " + models +
                              "eval_export.pt2: the program was exported in eval mode (dropout and batch norm run as "
                              "in inference); training uses train mode: export it with ckplan_torch.export(model, "
                              "inputs, path), or call model.train() before torch.export.export\n";
  CHECK(r.err == warning);
  CHECK(nlohmann::json::parse(ReadAll(dir + "/p.json"))["model"]["training"] == false);
  // Exported in train mode: no warning, training: true.
  r = RunCkplan("profile " + models + "small.pt2 --input 4x16 --reps 1 -o " + dir + "/q.json", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("eval mode") == std::string::npos);
  CHECK(nlohmann::json::parse(ReadAll(dir + "/q.json"))["model"]["training"] == true);
}

TEST_CASE("integer inputs without a range: ids from an embedding's vocabulary, others 0..2, each said in one line") {
  const std::string dir = TempDir();
  const std::string models = std::string(CKPLAN_TEST_MODELS) + "/";
  const std::string args = " --input 4x8:int64 --input 4x8:int64 --reps 1 -o ";
  CommandResult r = RunCkplan("profile " + models + "embedding_mask.pt2" + args + dir + "/p.json", dir);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("ckplan: warning: --input 4x8:int64 (input 1) indexes the embedding 'emb': ids drawn from its "
                   "vocabulary, 0..100 (choose others with --input 4x8:int64:LO..HI)\n") != std::string::npos);
  CHECK(r.err.find("ckplan: warning: --input 4x8:int64 (input 2): integers drawn from 0..2, zeros and ones (choose "
                   "others with --input 4x8:int64:LO..HI)\n") != std::string::npos);
  CHECK(r.out.find("with --input 4x8:int64:0..100, 4x8:int64;") != std::string::npos);
  const nlohmann::json inputs = nlohmann::json::parse(ReadAll(dir + "/p.json"))["model"]["inputs"];
  CHECK(inputs[0]["hi"] == 100);
  CHECK(inputs[0]["text"] == "4x8:int64:0..100");  // what `ckplan run` makes its inputs from
  CHECK(inputs[1]["hi"] == 2);
  // A TorchScript trace alike; a range given is kept, and nothing said.
  r = RunCkplan("profile " + models + "gpt.pt --input 2x64:int64 --reps 1 -o " + dir + "/g.json", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("indexes the embedding 'wte': ids drawn from its vocabulary, 0..512") != std::string::npos);
  r = RunCkplan("profile " + models + "gpt.pt --input 2x64:int64:0..7 --reps 1 -o " + dir + "/h.json", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.err.find("--input") == std::string::npos);
  CHECK(nlohmann::json::parse(ReadAll(dir + "/h.json"))["model"]["inputs"][0]["hi"] == 7);
}
#endif  // CKPLAN_TEST_MODELS

#endif  // CKPLAN_WITH_TORCH_BUILD
