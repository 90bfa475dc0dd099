// CLI tests: run the ckplan binary, check outputs, files and exit codes.

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/cli_helpers.h"
#include "planner/contracts/chain.h"
#include "planner/contracts/report_document.h"
#include "planner/cost/simulator.h"
#include "planner/contracts/sweep_document.h"
#include "planner/base/units.h"
#include "tests/test_chains.h"

using namespace ckplan;
using namespace ckplan::testing;

namespace {

// A 20-stage chain with sizes of a few MB, written to dir/chain.json.
std::string WriteChain(const std::string& dir, uint32_t seed = 5) {
  std::string path = dir + "/chain.json";
  WriteText(path, ChainToJson(RandomChain(20, seed)).dump(2));
  return path;
}

int64_t NoCheckpointPeak(const std::string& dir, const std::string& chain) {
  CommandResult r = RunCkplan("solve " + chain + " --budget 1TB --algo none -o " + dir + "/none.json", dir);
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(ReadAll(dir + "/none.json"))["predicted"]["peak_bytes"].get<int64_t>();
}

}  // namespace

TEST_CASE("solve writes an optimal plan that fits its budget") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  int64_t none_peak = NoCheckpointPeak(dir, chain);
  int64_t budget = none_peak / 2;
  CommandResult r = RunCkplan("solve " + chain + " --budget " + std::to_string(budget) + " -o " + dir + "/plan.json", dir);
  CAPTURE(r.err);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("optimal plan: peak") != std::string::npos);
  CHECK(r.out.find("sqrt (n=4)") != std::string::npos);
  CHECK(r.out.find("wrote " + dir + "/plan.json") != std::string::npos);
  nlohmann::json plan = nlohmann::json::parse(ReadAll(dir + "/plan.json"));
  CHECK(plan["schema"] == "ckplan.plan/1");
  CHECK(plan["algorithm"] == "optimal");
  CHECK(plan["budget_bytes"] == budget);
  CHECK(plan["slots"] == 500);
  CHECK(plan["slot_bytes"] == budget / 500);
  CHECK(plan["predicted"]["peak_bytes"].get<int64_t>() <= budget);
  CHECK(plan["predicted"]["overhead_pct"].get<double>() > 0);
  CHECK(plan["min_budget_bytes"].get<int64_t>() <= budget);
  CHECK(!plan["checkpointed_stages"].empty());
  CHECK(plan["stages"].size() == 20);
  // The schedule in the file replays in the simulator to the predicted figures.
  Chain c = ChainFromJson(nlohmann::json::parse(ReadAll(chain)), chain);
  SimulationResult sim = Simulate(c, ScheduleFromJson(plan["schedule"], "plan.json", "schedule"));
  CHECK(sim.peak_bytes == plan["predicted"]["peak_bytes"].get<int64_t>());
  CHECK(sim.time_ms == doctest::Approx(plan["predicted"]["time_ms"].get<double>()));
}

TEST_CASE("a budget below the minimum exits 3 and gives the minimum in the same unit style") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  CommandResult r = RunCkplan("solve " + chain + " --budget 1MiB -o " + dir + "/plan.json", dir);
  CHECK(r.exit_code == 3);
  CHECK(r.out.empty());
  CHECK_FALSE(FileExists(dir + "/plan.json"));
  const std::string prefix = "ckplan: error: budget 1MiB is below the minimum ";
  REQUIRE(r.err.rfind(prefix, 0) == 0);
  std::string minimum = r.err.substr(prefix.size(), r.err.find(' ', prefix.size()) - prefix.size());
  CAPTURE(minimum);
  CHECK(minimum.find("MiB") != std::string::npos);
  // The minimum it names is itself enough.
  CommandResult ok = RunCkplan("solve " + chain + " --budget " + minimum, dir);
  CHECK(ok.exit_code == 0);
  // Decimal in, decimal out.
  CommandResult decimal = RunCkplan("solve " + chain + " --budget 1MB", dir);
  CHECK(decimal.exit_code == 3);
  CHECK(decimal.err.find("MB for this chain") != std::string::npos);
  // A baseline says its own peak.
  CommandResult none = RunCkplan("solve " + chain + " --budget 1MB --algo none", dir);
  CHECK(none.exit_code == 3);
  CHECK(none.err.find("(none)") != std::string::npos);
}

TEST_CASE("bad chain files are one-line errors naming the file and field, exit 2, no output") {
  std::string dir = TempDir();
  std::string good = ChainToJson(RandomChain(5, 1)).dump();
  struct Case {
    std::string text;
    std::string expected;
  };
  nlohmann::json negative = nlohmann::json::parse(good);
  negative["stages"][3]["saved_bytes"] = -100;
  nlohmann::json missing = nlohmann::json::parse(good);
  missing["stages"][2].erase("bwd_ms");
  nlohmann::json schema = nlohmann::json::parse(good);
  schema["schema"] = "ckplan.plan/1";
  nlohmann::json negative_time = nlohmann::json::parse(good);
  negative_time["loss"]["bwd_ms"] = -0.5;
  for (const Case& c : {Case{"{\"schema\": \"ckplan.chain/1\", ", "malformed JSON at byte"},
                        Case{negative.dump(), "field 'stages[3].saved_bytes': must not be negative"},
                        Case{missing.dump(), "field 'stages[2].bwd_ms': missing"},
                        Case{schema.dump(), "field 'schema': expected \"ckplan.chain/1\" or \"ckplan.profile/1\""},
                        Case{negative_time.dump(), "field 'loss.bwd_ms': must not be negative"}}) {
    std::string path = dir + "/bad.json";
    WriteText(path, c.text);
    CommandResult r = RunCkplan("solve " + path + " --budget 1GB -o " + dir + "/plan.json", dir);
    CAPTURE(c.expected);
    CAPTURE(r.err);
    CHECK(r.exit_code == 2);
    CHECK(r.err.rfind("ckplan: error: " + path + ": ", 0) == 0);
    CHECK(r.err.find(c.expected) != std::string::npos);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_FALSE(FileExists(dir + "/plan.json"));
  }
  CommandResult missing_file = RunCkplan("solve " + dir + "/nope.json --budget 1GB", dir);
  CHECK(missing_file.exit_code == 2);
  CHECK(missing_file.err.find(dir + "/nope.json: cannot open") != std::string::npos);
}

TEST_CASE("bad budgets quote the text and exit 2") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  for (std::string bad : {"24XB", "0", "-1GB", "lots", "0.0GiB"}) {
    CommandResult r = RunCkplan("solve " + chain + " --budget=" + bad, dir);
    CAPTURE(bad);
    CHECK(r.exit_code == 2);
    CHECK(r.err.find("'" + bad + "'") != std::string::npos);
  }
  CommandResult no_budget = RunCkplan("solve " + chain, dir);
  CHECK(no_budget.exit_code == 2);
  CHECK(no_budget.err.find("--budget is required") != std::string::npos);
  CommandResult bad_algo = RunCkplan("solve " + chain + " --budget 1GB --algo magic", dir);
  CHECK(bad_algo.exit_code == 2);
}

TEST_CASE("baselines write plans in the same format") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  for (std::string algo : {"none", "every", "sqrt", "every-n --every 3"}) {
    std::string out = dir + "/plan.json";
    CommandResult r = RunCkplan("solve " + chain + " --budget 1TB --algo " + algo + " -o " + out, dir);
    CAPTURE(algo);
    REQUIRE(r.exit_code == 0);
    nlohmann::json plan = nlohmann::json::parse(ReadAll(out));
    CHECK(plan["schema"] == "ckplan.plan/1");
    CHECK(plan["algorithm"] == algo.substr(0, algo.find(' ')));
    CHECK(plan["predicted"]["peak_bytes"].get<int64_t>() == plan["min_budget_bytes"].get<int64_t>());
  }
  CommandResult every3 = RunCkplan("solve " + chain + " --budget 1TB --every 3 -o -", dir);
  REQUIRE(every3.exit_code == 0);
  nlohmann::json plan = nlohmann::json::parse(every3.out);
  CHECK(plan["algorithm"] == "every-n");
  CHECK(plan["every_n"] == 3);
  CHECK(plan["checkpointed_stages"].size() == 20);
}

TEST_CASE("--sweep gives the whole memory/time curve, never slower with more memory") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  int64_t none_peak = NoCheckpointPeak(dir, chain);
  CommandResult r = RunCkplan("solve " + chain + " --budget " + std::to_string(none_peak * 2) + " --sweep " + dir + "/sweep.json", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("memory/time curve") != std::string::npos);
  // Through the contract's reader (sweep_document.h), as any consumer reads it.
  const SweepDocument sweep = SweepFromJson(nlohmann::json::parse(ReadAll(dir + "/sweep.json")), "sweep.json");
  REQUIRE(sweep.points.size() > 100);
  double previous = 1e300;
  for (const SweepPoint& point : sweep.points) {
    CHECK(point.time_ms <= previous);
    previous = point.time_ms;
  }
  CHECK(sweep.points.back().overhead_pct == doctest::Approx(0.0));
  CHECK(sweep.points.back().budget_bytes <= none_peak * 2);
}

TEST_CASE("report -o report.json reads back through its contract") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  CommandResult r = RunCkplan("report " + chain + " --slots 200 -o " + dir + "/report.json", dir);
  REQUIRE(r.exit_code == 0);
  const ReportDocument report = ReportFromJson(nlohmann::json::parse(ReadAll(dir + "/report.json")), "report.json");
  REQUIRE(!report.strategies.empty());
  CHECK(report.strategies.front().name == "none");
  CHECK(report.strategies.back().name == "optimal");
  CHECK(report.strategies.back().fits);
  CHECK(report.strategies.back().peak_bytes <= report.budget_bytes);
  REQUIRE(!report.optimal_curve.empty());
  CHECK(report.optimal_curve.front().budget_bytes <= report.budget_bytes);
  CHECK(report.runs.empty());
  CHECK(!report.distributed);
}

TEST_CASE("--show-stages lists the chain") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  CommandResult r = RunCkplan("solve " + chain + " --show-stages", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("20 stages") != std::string::npos);
  CHECK(r.out.find("s19") != std::string::npos);
}

TEST_CASE("--show-stages with a budget prints every size in the budget's unit style") {
  std::string dir = TempDir();
  std::string profile = std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json";
  CommandResult r = RunCkplan("solve " + profile + " --budget 9.5MB --show-stages", dir);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find(" KB") != std::string::npos);
  CHECK(r.out.find("budget 9.50 MB") != std::string::npos);
  CHECK(r.out.find("iB") == std::string::npos);
}

TEST_CASE("--help explains") {
  std::string dir = TempDir();
  CommandResult r = RunCkplan("solve --help", dir);
  CHECK(r.exit_code == 0);
  CHECK(r.out.find("--budget") != std::string::npos);
  CHECK(r.out.find("24GiB") != std::string::npos);
}

TEST_CASE("too few slots are refined until rounding costs at most 0.5% of the budget, not a hang nor an error") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  CommandResult r = RunCkplan("solve " + chain + " --budget 1GB --slots 1 -o -", dir);
  REQUIRE(r.exit_code == 0);
  nlohmann::json plan = nlohmann::json::parse(r.out);
  CHECK(plan["slots"].get<int>() > 1);
  CHECK(plan["predicted"]["peak_bytes"].get<int64_t>() <= 1000000000);
}

TEST_CASE("--chain-out writes the chain a profile is cut into, and solve reads it back") {
  std::string dir = TempDir();
  std::string profile = std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json";
  CommandResult r = RunCkplan("solve " + profile + " --chain-out " + dir + "/chain.json", dir);
  REQUIRE(r.exit_code == 0);
  nlohmann::json chain = nlohmann::json::parse(ReadAll(dir + "/chain.json"));
  CHECK(chain["schema"] == "ckplan.chain/1");
  CHECK(chain["stages"].size() >= 10);
  CommandResult again = RunCkplan("solve " + dir + "/chain.json --budget 8MiB", dir);
  CHECK(again.exit_code == 0);
}

TEST_CASE("the progress bar shows on a terminal only") {
  std::string dir = TempDir();
  std::string chain = dir + "/chain.json";
  WriteText(chain, ChainToJson(RandomChain(600, 11)).dump());
  // No delay before the bar shows, so that even this short solve would draw it.
  const std::string solve = std::string("CKPLAN_PROGRESS_AFTER_S=0 ") + CKPLAN_BINARY + " solve " + chain +
                            " --budget 20GB --slots 300 -o " + dir + "/plan.json";
  // stderr to a file: no bar, not even an erased one.
  REQUIRE(std::system((solve + " >" + dir + "/out.txt 2>" + dir + "/err.txt </dev/null").c_str()) == 0);
  const std::string err = ReadAll(dir + "/err.txt");
  CHECK(err.find('\r') == std::string::npos);
  CHECK(err.find("solving") == std::string::npos);
  // The same command on a terminal (script(1) gives it one) draws it.
  if (std::system("command -v script >/dev/null 2>&1") != 0) {
    MESSAGE("script(1) not found: the terminal half is skipped");
    return;
  }
  const std::string on_terminal = "script -qec '" + solve + "' /dev/null </dev/null >" + dir + "/tty.txt 2>&1";
  REQUIRE(std::system(on_terminal.c_str()) == 0);
  CHECK(ReadAll(dir + "/tty.txt").find("\rsolving 600 stages [") != std::string::npos);
  // report too.
  const std::string report = std::string("CKPLAN_PROGRESS_AFTER_S=0 ") + CKPLAN_BINARY + " report " + chain +
                             " --slots 300 -o " + dir + "/report.md";
  REQUIRE(std::system((report + " >/dev/null 2>" + dir + "/report_err.txt </dev/null").c_str()) == 0);
  CHECK(ReadAll(dir + "/report_err.txt").find('\r') == std::string::npos);
  REQUIRE(std::system(("script -qec '" + report + "' /dev/null </dev/null >" + dir + "/report_tty.txt 2>&1").c_str()) == 0);
  CHECK(ReadAll(dir + "/report_tty.txt").find("\rplanning 600 stages [") != std::string::npos);
}

TEST_CASE("a solver table that cannot fit in memory is refused up front, with the figure, exit 2") {
  std::string dir = TempDir();
  std::string chain = dir + "/chain.json";
  WriteText(chain, ChainToJson(RandomChain(10000, 12)).dump());
  CommandResult r = RunCkplan("solve " + chain + " --budget 300GB --slots 100000 -o " + dir + "/plan.json", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("ckplan: error: the solver's table for 10000 stages at 100000 memory slots needs ") !=
        std::string::npos);
  CHECK(r.err.find("GB, above the limit of 3.22 GB") != std::string::npos);
  CHECK_FALSE(FileExists(dir + "/plan.json"));
}

TEST_CASE("below the banded solver's minimum, the message also gives a proven lower bound on the exact one") {
  std::string dir = TempDir();
  std::string chain = dir + "/chain.json";
  WriteText(chain, ChainToJson(RandomChain(600, 13)).dump());
  CommandResult r = RunCkplan("solve " + chain + " --budget 1MB -o " + dir + "/plan.json", dir);
  CAPTURE(r.err);
  CHECK(r.exit_code == 3);
  CHECK(r.err.find("that is the banded solver's minimum (600 stages): the exact one is at least ") !=
        std::string::npos);
}

TEST_CASE("--target: an unknown value, or pytorch on a chain that names no modules, is bad input naming it") {
  std::string dir = TempDir();
  std::string chain = WriteChain(dir);
  CommandResult bad = RunCkplan("solve " + chain + " --budget 1GB --target nonsense", dir);
  CHECK(bad.exit_code == 2);
  CHECK(bad.err.find("--target 'nonsense'") != std::string::npos);
  CommandResult no_modules = RunCkplan("solve " + chain + " --budget 1GB --target pytorch", dir);
  CHECK(no_modules.exit_code == 2);
  CHECK(no_modules.err.find("needs module paths") != std::string::npos);
  CommandResult schedule = RunCkplan("solve " + chain + " --budget 1GB -o -", dir);
  REQUIRE(schedule.exit_code == 0);
  CHECK(nlohmann::json::parse(schedule.out)["target"] == "schedule");
}

TEST_CASE("a plan's predicted step prices recomputation at the no-grad forward and adds the optimizer's update") {
  std::string dir = TempDir();
  // The example profile, as profile writes it now: per-op forwards without
  // autograd (here half the forward with it) and the optimizers' updates.
  nlohmann::json doc = nlohmann::json::parse(ReadAll(std::string(CKPLAN_SOURCE_DIR) + "/data/example.profile.json"));
  // As profiles were before the no-grad forwards and the optimizers' updates.
  nlohmann::json old_doc = doc;
  for (auto& op : old_doc["ops"]) op.erase("fwd_nograd_ms");
  old_doc["totals"].erase("optimizer_step_ms");
  old_doc["totals"].erase("step_ms");
  std::string old_profile = dir + "/old.profile.json";
  WriteText(old_profile, old_doc.dump());
  for (auto& op : doc["ops"]) op["fwd_nograd_ms"] = op["fwd_ms"].get<double>() / 2;
  doc["totals"]["optimizer_step_ms"] = {{"sgd", 1.0}, {"momentum", 2.0}, {"adam", 5.0}};
  std::string profile = dir + "/profile.json";
  WriteText(profile, doc.dump());
  auto plan_for = [&](const std::string& input, const std::string& optimizer) {
    CommandResult r = RunCkplan("solve " + input + " --budget 1TB --algo every --target schedule --optimizer " + optimizer +
                                    " --chain-out " + dir + "/chain.json -o " + dir + "/plan.json", dir);
    CAPTURE(r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(ReadAll(dir + "/plan.json"));
  };
  nlohmann::json sgd = plan_for(profile, "sgd");
  nlohmann::json adam = plan_for(profile, "adam");
  Chain chain = ChainFromJson(nlohmann::json::parse(ReadAll(dir + "/chain.json")), "chain.json");
  Schedule schedule = ScheduleFromJson(adam["schedule"], "plan.json", "schedule");
  // The chain carries the no-grad forwards (each stage's ops' sum, half its forward).
  for (const Stage& s : chain.stages) CHECK(s.fwd_nograd_ms == doctest::Approx(s.fwd_ms / 2));
  // The step: the schedule over the chain plus the optimizer's update, against
  // the same without recomputation; every recomputes each stage once, at its
  // no-grad forward.
  double recompute = 0;
  for (const Stage& s : chain.stages) recompute += s.NoGradFwdMs();
  const double chain_ms = Simulate(chain, schedule).time_ms;
  CHECK(chain_ms == doctest::Approx(chain.NoRecomputeTimeMs() + recompute));
  CHECK(adam["predicted"]["time_ms"].get<double>() == doctest::Approx(chain_ms + 5.0));
  CHECK(sgd["predicted"]["time_ms"].get<double>() == doctest::Approx(chain_ms + 1.0));
  CHECK(adam["predicted"]["optimizer_step_ms"].get<double>() == 5.0);
  CHECK(adam["predicted"]["no_recompute_ms"].get<double>() == doctest::Approx(chain.NoRecomputeTimeMs() + 5.0));
  CHECK(adam["predicted"]["overhead_pct"].get<double>() ==
        doctest::Approx(recompute / (chain.NoRecomputeTimeMs() + 5.0) * 100));
  CHECK(adam["pytorch"]["predicted"]["time_ms"].get<double>() >= chain.NoRecomputeTimeMs() + 5.0);
  // A profile without the new fields plans as before: recomputation at the
  // forward with autograd, no optimizer time, no optimizer_step_ms field.
  nlohmann::json old = plan_for(old_profile, "adam");
  Chain old_chain = ChainFromJson(nlohmann::json::parse(ReadAll(dir + "/chain.json")), "chain.json");
  double forwards = 0;
  for (const Stage& s : old_chain.stages) {
    CHECK(!s.fwd_nograd_ms);
    forwards += s.fwd_ms;
  }
  CHECK(old["predicted"]["time_ms"].get<double>() == doctest::Approx(old_chain.NoRecomputeTimeMs() + forwards));
  CHECK_FALSE(old["predicted"].contains("optimizer_step_ms"));
  // The PyTorch target (a profile's default) where nothing needs wrapping:
  // the step without recomputation, the optimizer's update included.
  CommandResult all = RunCkplan("solve " + profile + " --budget 1TB --optimizer adam -o " + dir + "/all.json", dir);
  REQUIRE(all.exit_code == 0);
  nlohmann::json unwrapped = nlohmann::json::parse(ReadAll(dir + "/all.json"));
  CHECK(unwrapped["target"] == "pytorch");
  CHECK(unwrapped["predicted"]["time_ms"].get<double>() ==
        doctest::Approx(unwrapped["predicted"]["no_recompute_ms"].get<double>()));
  CHECK(unwrapped["predicted"]["overhead_pct"].get<double>() == 0.0);
}
