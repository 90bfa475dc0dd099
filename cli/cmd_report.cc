// `ckplan report`: strategies compared over budgets, for a person to read.

#include <cstdio>
#include <optional>

#include <CLI/CLI.hpp>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/cost/optimizer_memory.h"
#include "cli/commands.h"
#include "cli/optimizer_options.h"
#include "cli/report/report.h"
#include "cli/report/report_writers.h"
#include "cli/strategy_table.h"
#include "cli/terminal.h"

namespace ckplan {
namespace {

struct ReportOptions {
  std::string input;
  std::string output;
  std::string budget;
  std::string format;
  OptimizerOptions optimizer;
  int slots = 500;
  std::vector<int> every = {2, 4, 8};
  std::vector<std::string> runs;
  std::string plan;  // a distributed plan: per-rank memory
  std::string batches;  // solve --batch-table: samples per second by batch
};

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

int RunReportCommand(const ReportOptions& o) {
  const bool to_stdout = o.output.empty() || o.output == "-";
  std::string format = o.format;
  if (format.empty()) {
    if (to_stdout || EndsWith(o.output, ".html") || EndsWith(o.output, ".htm")) {
      format = "html";
    } else if (EndsWith(o.output, ".md")) {
      format = "md";
    } else if (EndsWith(o.output, ".json")) {
      format = "json";
    } else {
      throw BadInput(o.output + ": cannot tell the format from the name: use .html, .md or .json, or --format");
    }
  }
  // Options and the output folder first, so that a typo fails before any work.
  if (o.slots < 1 || o.slots > 100000) throw BadInput("invalid --slots " + std::to_string(o.slots) + ": use 1..100000");
  for (int n : o.every) {
    if (n < 1) throw BadInput("invalid --every " + std::to_string(n) + ": segment lengths must be at least 1");
  }
  CheckOutputPath(o.output);
  ByteQuantity budget;
  if (!o.budget.empty()) budget = ParseBytes(o.budget);
  DistributedSummary distributed;
  if (!o.plan.empty()) distributed = ReadDistributedPlan(o.plan);
  std::optional<BatchTable> batches;
  if (!o.batches.empty()) batches = BatchTableFromJson(ReadJsonFile(o.batches), o.batches);
  PlannerInput in = LoadPlannerInput(o.input, ChosenOptimizer(o.optimizer, false));
  Report report;
  {
    ProgressBar bar(Format("planning %d stages", in.chain.length()), StderrIsTerminal(), ProgressDelaySeconds());
    report = MakeReport(in, o.input, budget.bytes, o.budget.empty() ? UnitStyle::kBinary : budget.style, o.slots,
                        o.every, o.runs, [&bar](double fraction) { bar.Update(fraction); });
  }
  report.distributed = distributed;
  report.batches = batches;
  std::string text = format == "md" ? ReportMarkdown(report)
                     : format == "json" ? ReportJson(report).dump(2) + "\n"
                                        : ReportHtml(report);
  if (to_stdout) {
    WriteStdout(text);
    return 0;
  }
  WriteFileAtomic(o.output, text);
  std::printf("%s", StrategyTableText(report.strategies, report.style).c_str());
  std::printf("wrote %s (%s) for budget %s\n", o.output.c_str(), format.c_str(),
              FormatBytes(report.budget_bytes, report.style).c_str());
  return 0;
}

}  // namespace

void AddReportCommand(CLI::App& app, Action* action) {
  auto o = std::make_shared<ReportOptions>();
  CLI::App* cmd = app.add_subcommand(
      "report",
      "Compare checkpointing strategies over budgets: none, every, every-n, sqrt and optimal (one DP gives\n"
      "the optimal step time for every budget). Writes one self-contained HTML page with SVG figures (the\n"
      "memory/time trade-off, memory over the schedule, memory per module) and a table; or Markdown, or JSON.");
  cmd->add_option("input", o->input, "profile or chain JSON")->required();
  cmd->add_option("-o,--output", o->output,
                  "report file: .html, .md or .json (its format, unless --format); - or none for HTML on stdout");
  cmd->add_option("-b,--budget", o->budget,
                  "budget to mark and plan for (default: halfway between the smallest feasible and no checkpointing)");
  cmd->add_option("--format", o->format, "html, md or json (default: from the output's extension)")
      ->check(CLI::IsMember({"html", "md", "json"}));
  AddOptimizerOptions(cmd, &o->optimizer);
  cmd->add_option("--slots", o->slots, "memory slots of the dynamic program")->capture_default_str();
  cmd->add_option("--every", o->every, "segment lengths for the every-n baselines")->delimiter(',')->capture_default_str();
  cmd->add_option("--plan", o->plan, "a distributed plan (solve --data-parallel or --pipeline): per-rank memory");
  cmd->add_option("--batches", o->batches,
                  "the batch table from `ckplan solve MODEL --batch auto --batch-table FILE`: samples per second "
                  "against batch, with and without checkpointing");
  cmd->add_option("--runs", o->runs, "run reports from `ckplan run -o`: measured points beside predicted ones");
  cmd->callback([o, action] { *action = [o] { return RunReportCommand(*o); }; });
}

}  // namespace ckplan
