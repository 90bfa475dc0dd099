// CLI tests for bad input and careless use (issue 13): each refusal is one
// line, exit 2 (3 for a budget below the minimum), no file left; nothing
// crashes, hangs or writes where it should not.

#include <sys/stat.h>
#include <sys/sysmacros.h>

#include <algorithm>
#include <cstdint>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/cli_helpers.h"
#include "planner/base/json_io.h"
#include "planner/contracts/chain.h"
#include "tests/test_chains.h"

using namespace ckplan;
using namespace ckplan::testing;

namespace {

constexpr int64_t kInt64Max = INT64_MAX;

std::string ExampleProfile() { return std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json"; }

// The chain the example profile is cut into: it lists storages.
nlohmann::json ProfileChain(const std::string& dir) {
  CommandResult r = RunCkplan("solve " + ExampleProfile() + " --chain-out " + dir + "/profile_chain.json", dir);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(ReadAll(dir + "/profile_chain.json"));
}

nlohmann::json ExampleProfileJson() { return nlohmann::json::parse(ReadAll(ExampleProfile())); }

std::string Write(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = dir + "/" + name;
  WriteText(path, text);
  return path;
}

// A one-line refusal with this exit code.
void CheckRefusal(const CommandResult& r, int code, const std::string& expected) {
  CAPTURE(r.err);
  CHECK(r.exit_code == code);
  CHECK(r.err.rfind("ckplan: error: ", 0) == 0);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.find(expected) != std::string::npos);
}

bool IsCharDevice(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 && S_ISCHR(info.st_mode);
}

int Shell(const std::string& command) {
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("byte fields near INT64_MAX are refused naming the field, in solve and report") {
  std::string dir = TempDir();
  nlohmann::json all = ProfileChain(dir);
  for (const char* field : {"out_bytes", "saved_bytes", "fwd_tmp_bytes", "bwd_tmp_bytes", "private_saved_bytes"}) {
    all["stages"][3][field] = kInt64Max;
  }
  nlohmann::json saved = ProfileChain(dir);
  saved["stages"][3]["saved_bytes"] = kInt64Max;
  nlohmann::json private_saved = ProfileChain(dir);
  private_saved["stages"][3]["private_saved_bytes"] = int64_t{1} << 62;
  struct Case {
    nlohmann::json doc;
    std::string expected;
  };
  for (const Case& c : {Case{all, "field 'stages[3].out_bytes': too large: 9223372036854775807 B is above 1 PiB"},
                        Case{saved, "field 'stages[3].saved_bytes': too large"},
                        Case{private_saved, "field 'stages[3].private_saved_bytes': too large"}}) {
    std::string path = Write(dir, "big.json", c.doc.dump());
    CheckRefusal(RunCkplan("solve " + path + " --budget 1MB -o " + dir + "/plan.json", dir), 2, c.expected);
    CHECK_FALSE(FileExists(dir + "/plan.json"));
    CheckRefusal(RunCkplan("report " + path + " -o " + dir + "/r.html", dir), 2, c.expected);
    CHECK_FALSE(FileExists(dir + "/r.html"));
  }
  // Every field within its limit, but together more than any model.
  Chain chain = RandomChain(100, 3);
  for (Stage& s : chain.stages) s.saved_bytes = int64_t{1} << 50;
  std::string path = Write(dir, "sum.json", ChainToJson(chain).dump());
  CheckRefusal(RunCkplan("solve " + path + " --budget 1MB", dir), 2, "add up to more than 64 PiB");
}

TEST_CASE("numbers out of range, deep nesting and deep module paths are one-line errors or work") {
  std::string dir = TempDir();
  std::string text = ChainToJson(RandomChain(5, 1)).dump();
  const size_t at = text.find("\"input_bytes\":") + std::string("\"input_bytes\":").size();
  std::string e400 = text.substr(0, at) + "1e400" + text.substr(text.find_first_of(",}", at));
  std::string path = Write(dir, "e400.json", e400);
  CheckRefusal(RunCkplan("solve " + path + " --budget 1GB", dir), 2,
               "field 'input_bytes': number out of the range of a double");
  CheckRefusal(RunCkplan("report " + path + " -o " + dir + "/r.md", dir), 2, "number out of the range of a double");

  // 100,000 nested objects in the profile's model: refused at 64 levels.
  std::string profile = ReadAll(ExampleProfile());
  const size_t model = profile.find("\"model\":");
  REQUIRE(model != std::string::npos);
  std::string deep = profile.substr(0, model) + "\"model\": {\"x\": " + std::string(100000, '[') +
                     std::string(100000, ']') + "}, \"unused\":" + profile.substr(model + 8);
  path = Write(dir, "deep.json", deep);
  CheckRefusal(RunCkplan("solve " + path + " --budget 1GB", dir), 2, "nested deeper than 64 levels");

  // A module path of 100,000 parts: cut without recursion.
  nlohmann::json long_path = ExampleProfileJson();
  std::string module;
  for (int k = 0; k < 100000; ++k) module += k ? ".m" : "m";
  long_path["ops"][5]["module"] = module;
  path = Write(dir, "long_path.json", long_path.dump());
  CommandResult r = RunCkplan("solve " + path + " --budget 64MiB", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 0);
}

TEST_CASE("times out of range are refused, and huge but valid ones end in report") {
  std::string dir = TempDir();
  nlohmann::json chain = ProfileChain(dir);
  chain["stages"][3]["fwd_ms"] = 16384;
  chain["stages"][3]["bwd_ms"] = 1e20;
  std::string path = Write(dir, "time.json", chain.dump());
  CheckRefusal(RunCkplan("report " + path + " -o " + dir + "/r.html", dir), 2, "field 'stages[3].bwd_ms': too large");
  // Ticks() once added a step below the rounding unit of the value: it never ended.
  chain["stages"][3]["bwd_ms"] = 1e9;
  path = Write(dir, "time.json", chain.dump());
  CommandResult r = RunCkplan("report " + path + " -o " + dir + "/r.html", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 0);
  CHECK(ReadAll(dir + "/r.html").size() < 1000000);
}

TEST_CASE("inputs that are not regular files are refused") {
  std::string dir = TempDir();
  CheckRefusal(RunCkplan("solve " + dir + " --budget 1GB", dir), 2, dir + ": is a directory, not a JSON file");
  CheckRefusal(RunCkplan("solve /dev/zero --budget 1GB", dir), 2, "/dev/zero: is a device, not a JSON file");
  // A FIFO nobody writes to: refused after a wait, not blocking forever.
  std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CheckRefusal(RunCkplan("solve " + fifo + " --budget 1GB", dir), 2, "nothing to read after 5 s");
  // A FIFO with a writer is read to its end.
  std::string chain = Write(dir, "chain.json", ChainToJson(RandomChain(5, 1)).dump());
  CHECK(Shell("(cat " + chain + " > " + fifo + " &) ; " + CKPLAN_BINARY + " solve " + fifo +
              " --budget 1TB >/dev/null 2>&1") == 0);
}

TEST_CASE("an output device is written to and never replaced, and write errors are not exit 0") {
  std::string dir = TempDir();
  std::string chain = Write(dir, "chain.json", ChainToJson(RandomChain(5, 1)).dump());
  // Device nodes of our own (null and full): a faulty ckplan must not be able
  // to replace the system's /dev/null, as the one of issue 13 would have.
  const std::string null_device = dir + "/null", full_device = dir + "/full";
  if (::mknod(null_device.c_str(), S_IFCHR | 0666, makedev(1, 3)) == 0 &&
      ::mknod(full_device.c_str(), S_IFCHR | 0666, makedev(1, 7)) == 0) {
    CommandResult null_out = RunCkplan("solve " + chain + " --budget 1TB -o " + null_device, dir);
    CHECK(null_out.exit_code == 0);
    CHECK(IsCharDevice(null_device));
    CommandResult full = RunCkplan("solve " + chain + " --budget 1TB -o " + full_device, dir);
    CheckRefusal(full, 1, full_device + ": write failed: No space left on device");
    CHECK(IsCharDevice(full_device));
    CheckRefusal(RunCkplan("report " + chain + " -o " + full_device + " --format md", dir), 1, "write failed");
    CHECK(IsCharDevice(full_device));
  } else {
    MESSAGE("cannot make device nodes here (not root): device outputs not tested");
  }
  // stdout on a full disk (the shell opens /dev/full; ckplan never names it).
  if (IsCharDevice("/dev/full")) {
    const std::string binary = CKPLAN_BINARY;
    CHECK(Shell(binary + " solve " + chain + " --budget 1TB -o - >/dev/full 2>" + dir + "/err.txt") == 1);
    CHECK(ReadAll(dir + "/err.txt").find("cannot write to stdout") != std::string::npos);
    CHECK(Shell(binary + " report " + chain + " --format md >/dev/full 2>" + dir + "/err.txt") == 1);
    CHECK(Shell(binary + " solve " + chain + " --budget 1TB >/dev/full 2>" + dir + "/err.txt") == 1);
  }
}

TEST_CASE("an output into a missing folder is refused before any work") {
  std::string dir = TempDir();
  std::string chain = Write(dir, "chain.json", ChainToJson(RandomChain(5, 1)).dump());
  const std::string missing = dir + "/missing/out.json";
  for (std::string option : {"-o", "--sweep", "--chain-out"}) {
    CAPTURE(option);
    CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB " + option + " " + missing, dir), 2,
                 missing + ": cannot write: folder " + dir + "/missing does not exist");
  }
  // Before the input is even read.
  CheckRefusal(RunCkplan("solve " + dir + "/nope.json --budget 1TB -o " + missing, dir), 2, "does not exist");
  CheckRefusal(RunCkplan("report " + dir + "/nope.json -o " + dir + "/missing/r.md", dir), 2, "does not exist");
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB -o " + dir, dir), 2, "is a directory");
}

TEST_CASE("inconsistent inputs exit 2 naming the field, and odd but consistent ones plan") {
  std::string dir = TempDir();
  nlohmann::json repeated = ProfileChain(dir);
  repeated["stages"][2]["out_storages"].push_back(repeated["stages"][2]["out_storages"][0]);
  nlohmann::json above = ProfileChain(dir);
  above["stages"][3]["private_saved_bytes"] = above["stages"][3]["saved_bytes"].get<int64_t>() + 1;
  nlohmann::json short_saved = ProfileChain(dir);
  short_saved["stages"][0]["saved_bytes"] = 16;
  short_saved["stages"][0]["private_saved_bytes"] = 0;
  struct Case {
    nlohmann::json doc;
    std::string expected;
  };
  for (const Case& c : {Case{repeated, "field 'stages[2].out_storages[1]': storage id"},
                        Case{above, "field 'stages[3].private_saved_bytes': is above saved_bytes"},
                        Case{short_saved, "field 'stages[0].saved_bytes': 16 B is less than the stage's own part"}}) {
    std::string path = Write(dir, "bad.json", c.doc.dump());
    CheckRefusal(RunCkplan("solve " + path + " --budget 1GB", dir), 2, c.expected);
    CheckRefusal(RunCkplan("report " + path + " --format md", dir), 2, c.expected);
  }
  // A profile whose inputs list a tensor an op makes.
  nlohmann::json profile = ExampleProfileJson();
  profile["inputs"] = {profile["ops"][0]["outputs"][0]};
  std::string path = Write(dir, "inputs.json", profile.dump());
  CheckRefusal(RunCkplan("solve " + path + " --budget 1GB", dir), 2, "field 'inputs[0]': tensor");
  // A profile whose ops save less than the tensors they keep: planned at the
  // larger figure, never an internal check failure.
  profile = ExampleProfileJson();
  for (auto& op : profile["ops"]) op["saved_bytes"] = 16384;
  path = Write(dir, "saves_less.json", profile.dump());
  CommandResult r = RunCkplan("solve " + path + " --budget 4482482 --optimizer none", dir);
  CHECK(r.exit_code != 4);
  CHECK((r.exit_code == 0 || r.exit_code == 3));
  // A chain repeating a stage, and one with every size 0: plans, not exit 4.
  nlohmann::json twice = ProfileChain(dir);
  twice["stages"].push_back(twice["stages"].back());
  nlohmann::json zeros = ProfileChain(dir);
  zeros["input_bytes"] = 0;
  for (auto& entry : zeros["input_storages"]) entry[1] = 0;
  for (auto& stage : zeros["stages"]) {
    for (const char* field : {"out_bytes", "saved_bytes", "fwd_tmp_bytes", "bwd_tmp_bytes", "private_saved_bytes"}) {
      stage[field] = 0;
    }
    for (auto& entry : stage["out_storages"]) entry[1] = 0;
  }
  for (const nlohmann::json& doc : {twice, zeros}) {
    std::string chain = Write(dir, "odd.json", doc.dump());
    CommandResult report = RunCkplan("report " + chain + " -o " + dir + "/r.html", dir);
    CAPTURE(report.err);
    CHECK(report.exit_code == 0);
    CommandResult solve = RunCkplan("solve " + chain + " --budget 64MiB", dir);
    CAPTURE(solve.err);
    CHECK(solve.exit_code == 0);
  }
}

TEST_CASE("the optimal solver refuses a request too large before allocating") {
  std::string dir = TempDir();
  Chain chain = RandomChain(40000, 2);
  std::string path = Write(dir, "long.json", ChainToJson(chain).dump());
  CheckRefusal(RunCkplan("solve " + path + " --budget 1GB", dir), 2,
               "the chain has 40000 stages; at most 32000 are supported");
  CheckRefusal(RunCkplan("report " + path + " --format md", dir), 2, "at most 32000 are supported");
  // A baseline needs no table.
  CHECK(RunCkplan("solve " + path + " --budget 1TB --algo sqrt", dir).exit_code == 0);
  chain.stages.resize(30000);
  path = Write(dir, "long.json", ChainToJson(chain).dump());
  CheckRefusal(RunCkplan("solve " + path + " --budget 1GB --slots 100000", dir), 2,
               "the solver's table for 30000 stages at ");
}

TEST_CASE("options: --every below 1, --threads out of range, unknown options, report's output name") {
  std::string dir = TempDir();
  std::string chain = Write(dir, "chain.json", ChainToJson(RandomChain(20, 1)).dump());
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB --every 0", dir), 2, "invalid --every 0: must be at least 1");
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB --every -3", dir), 2, "invalid --every -3");
  CheckRefusal(RunCkplan("report " + chain + " --every 0 --format md", dir), 2, "invalid --every 0");
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB --loss bogus", dir), 2, "--loss");
  // Thousands of solver threads once aborted the process (SIGABRT).
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB --threads 100000", dir), 2, "invalid --threads 100000: use 1..256");
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB --threads 0", dir), 2, "invalid --threads 0");
  CHECK(RunCkplan("solve " + chain + " --budget 1TB --threads 256", dir).exit_code == 0);
  CheckRefusal(RunCkplan("solve " + chain + " --budget 1TB --algo magic", dir), 2, "magic");
  CheckRefusal(RunCkplan("report " + chain + " -o " + dir + "/r.txt", dir), 2,
               dir + "/r.txt: cannot tell the format from the name");
  CHECK_FALSE(FileExists(dir + "/r.txt"));
  CommandResult md = RunCkplan("report " + chain + " -o " + dir + "/r.txt --format md", dir);
  CHECK(md.exit_code == 0);
  CHECK(md.out.find("wrote " + dir + "/r.txt (md)") != std::string::npos);
  CHECK(ReadAll(dir + "/r.txt").rfind("## ckplan report", 0) == 0);
}

TEST_CASE("report without --budget plans at a budget it can meet") {
  std::string dir = TempDir();
  std::vector<std::string> inputs = {ExampleProfile()};
  for (uint32_t seed : {1u, 2u, 3u}) {
    inputs.push_back(Write(dir, "chain" + std::to_string(seed) + ".json", ChainToJson(RandomChain(12, seed)).dump()));
  }
  for (const std::string& input : inputs) {
    for (int slots : {20, 50, 500}) {
      CommandResult r = RunCkplan("report " + input + " --format md --slots " + std::to_string(slots), dir);
      CAPTURE(input);
      CAPTURE(slots);
      CAPTURE(r.err);
      CHECK(r.exit_code != 3);
      CHECK(r.exit_code != 4);
    }
  }
}

TEST_CASE("sizes in petabytes print in a unit that parses back") {
  std::string dir = TempDir();
  Chain chain = RandomChain(5, 1);
  chain.stages[2].saved_bytes = 1000000000000000;  // 1e15 B: once "unknown unit 'pb'"
  std::string path = Write(dir, "pb.json", ChainToJson(chain).dump());
  CommandResult r = RunCkplan("solve " + path + " --budget 1MB", dir);
  CHECK(r.exit_code == 3);
  const std::string prefix = "ckplan: error: budget 1MB is below the minimum ";
  REQUIRE(r.err.rfind(prefix, 0) == 0);
  std::string minimum = r.err.substr(prefix.size(), r.err.find(' ', prefix.size()) - prefix.size());
  CAPTURE(minimum);
  CHECK(minimum.find("PB") != std::string::npos);
  CommandResult ok = RunCkplan("solve " + path + " --budget " + minimum, dir);
  CAPTURE(ok.err);
  CHECK(ok.exit_code == 0);
}

TEST_CASE("--budget gpu is the --gpu device's memory; unknown devices are listed in one line") {
  std::string dir = TempDir();
  std::string chain = Write(dir, "chain.json", ChainToJson(RandomChain(5, 1)).dump());
  CommandResult r = RunCkplan("solve " + chain + " --budget gpu --gpu a100-40gb", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("budget 40.0 GiB") != std::string::npos);  // 40,960 MiB
  CheckRefusal(RunCkplan("solve " + chain + " --budget gpu --gpu v100", dir), 2,
               "unknown --gpu 'v100': known devices are h100-sxm-80gb, h200-141gb, a100-40gb, a100-80gb, l4-24gb, "
               "rtx4090-24gb");
  CheckRefusal(RunCkplan("solve " + chain + " --budget gpu", dir), 2, "--budget gpu needs --gpu NAME");
}

#ifdef CKPLAN_TEST_MODELS
TEST_CASE("profile: unknown --gpu, --device meta without --gpu and a bad --dtype are one-line errors") {
  std::string dir = TempDir();
  const std::string model = std::string(CKPLAN_TEST_MODELS) + "/mlp_chain.pt2 --input 32x256";
  CheckRefusal(RunCkplan("profile " + model + " --gpu h800", dir), 2, "known devices are h100-sxm-80gb");
  CheckRefusal(RunCkplan("profile " + model + " --device meta", dir), 2, "--device meta measures no time");
  CheckRefusal(RunCkplan("profile " + model + " --device meta --gpu l4 --dtype int8", dir), 2,
               "invalid --dtype 'int8': use bf16, fp16 or fp32");
}
#endif

TEST_CASE("optimizer options that torch.optim refuses or that change nothing are one-line errors naming the fix") {
  std::string dir = TempDir();
  std::string path = Write(dir, "chain.json", ChainToJson(RandomChain(5, 1)).dump());
  struct Case {
    const char* options;
    const char* expected;
  };
  for (const Case& c : {Case{"--optimizer sgd --nesterov", "--nesterov needs SGD with momentum"},
                        Case{"--optimizer adam --nesterov", "--nesterov needs SGD with momentum"},
                        Case{"--optimizer sgd --momentum 0.9 --amsgrad", "--amsgrad is for --optimizer adam or adamw"},
                        Case{"--optimizer adam --weight-decay -0.1", "invalid --weight-decay"}}) {
    CAPTURE(c.options);
    CheckRefusal(RunCkplan("solve " + path + " --budget 1GB " + c.options + " -o " + dir + "/plan.json", dir), 2,
                 c.expected);
    CHECK_FALSE(FileExists(dir + "/plan.json"));
  }
}

TEST_CASE("--optimizer-groups: a file that names no parameter of the profile, another kind, or a distributed job "
          "is refused in one line; a good one is recorded in the plan") {
  std::string dir = TempDir();
  const nlohmann::json profile = ReadJsonFile(ExampleProfile());
  const std::string first = profile["parameters"][0]["name"], second = profile["parameters"][1]["name"];
  auto groups_file = [&](const std::string& name, const nlohmann::json& groups) {
    return Write(dir, name, nlohmann::json{{"schema", "ckplan.optimizer_groups/1"}, {"groups", groups}}.dump());
  };
  const std::string good = groups_file(
      "good.json", nlohmann::json::array({{{"params", {first}}, {"optimizer_options", {{"weight_decay", 0.1}}}},
                                          {{"params", {second}}, {"optimizer_impl", "foreach"}}}));
  struct Case {
    std::string options;
    const char* expected;
  };
  for (const Case& c :
       {Case{"--optimizer-groups " + groups_file("unknown.json", nlohmann::json::array({{{"params", {"nope.weight"}}}})),
             "names parameter 'nope.weight'"},
        Case{"--optimizer-groups " +
                 groups_file("kind.json", nlohmann::json::array({{{"params", {first}}, {"optimizer", "sgd"}}})),
             "of its kind"},
        Case{"--optimizer-groups " + Write(dir, "schema.json", R"({"schema": "ckplan.plan/1", "groups": []})"),
             "field 'schema'"},
        Case{"--optimizer-groups " + good + " --data-parallel 2", "--optimizer-groups is not available"}}) {
    CAPTURE(c.options);
    CheckRefusal(RunCkplan("solve " + ExampleProfile() + " --budget 1GB " + c.options + " -o " + dir + "/plan.json",
                           dir),
                 2, c.expected);
    CHECK_FALSE(FileExists(dir + "/plan.json"));
  }
  CommandResult r = RunCkplan("solve " + ExampleProfile() + " --budget 1GB --optimizer-groups " + good + " -o " + dir +
                                  "/plan.json",
                              dir);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json plan = ReadJsonFile(dir + "/plan.json");
  const nlohmann::json& recorded = plan["fixed"]["optimizer_groups"];
  REQUIRE(recorded.size() == 2);
  CHECK(recorded[0]["params"][0] == first);
  CHECK(recorded[0]["optimizer_options"]["weight_decay"] == 0.1);
  CHECK(recorded[1]["optimizer_impl"] == "foreach");
}
