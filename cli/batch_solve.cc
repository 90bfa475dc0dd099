// `ckplan solve MODEL --batch auto`: profiles at the batches the search asks
// for, solved at the budget; the table, the answers, the chosen profile.

#include "cli/batch_solve.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <numeric>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "planner/base/error.h"
#include "planner/base/json_io.h"
#include "planner/contracts/batch_table.h"
#include "planner/contracts/input_spec.h"
#include "planner/contracts/profile.h"
#include "planner/solvers/batch_search.h"
#include "cli/terminal.h"

namespace ckplan {
namespace {

namespace fs = std::filesystem;

// The input specs with dimension `dim` set to `value`: the first of every
// input (the batch), or the second of every integer input with two or more
// (the sequence of token ids, labels and masks). Others stay.
std::vector<std::string> AtValue(const std::vector<std::string>& specs, int value, int dim) {
  std::vector<std::string> out;
  for (const std::string& text : specs) {
    const InputSpec spec = ParseInputSpec(text);
    if (static_cast<int>(spec.shape.size()) <= dim || (dim == 1 && !IsIntegerDtype(spec.dtype))) {
      out.push_back(text);
      continue;
    }
    std::vector<int64_t> shape = spec.shape;
    shape[static_cast<size_t>(dim)] = value;
    std::string dims;
    for (int64_t d : shape) dims += (dims.empty() ? "" : "x") + std::to_string(d);
    const size_t end = text.find(':');
    out.push_back(dims + (end == std::string::npos ? "" : text.substr(end)));
  }
  return out;
}

// This program, to run `profile` in: `ckplan` hands it to ckplan-torch,
// ckplan-torch runs it.
std::string SelfPath() {
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) throw Error(ExitCode::kInternal, "cannot find this program's path (/proc/self/exe) to run ckplan profile");
  self[n] = '\0';
  return self;
}

// Runs `args` with stdout discarded and stderr into `log`; the exit code.
int RunChild(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid < 0) throw Error(ExitCode::kInternal, std::string("cannot start ckplan profile: ") + std::strerror(errno));
  if (pid == 0) {
    const int out = ::open("/dev/null", O_WRONLY);
    const int err = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out >= 0) ::dup2(out, 1);
    if (err >= 0) ::dup2(err, 2);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "ckplan: error: cannot start %s: %s\n", argv[0], std::strerror(errno));
    ::_exit(1);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw Error(ExitCode::kInternal, std::string("waiting for ckplan profile: ") + std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

// The last `ckplan: error:` line of a child's stderr, without the prefix.
std::string ChildError(const std::string& log) {
  std::ifstream in(log);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  const std::string prefix = "ckplan: error: ";
  return last.rfind(prefix, 0) == 0 ? last.substr(prefix.size()) : last;
}

struct Profiled {
  BatchPoint point;
  BatchPlans plans;
  std::string profile_path;
};

// With accumulation over `steps` micro-batches, the gradients of the earlier
// ones are held from the step's start: all of them counted in the fixed part
// (the stages' own still appear in backward: an upper bound).
PlannerInput InputAt(const std::string& path, const OptimizerChoice& optimizer, int steps) {
  PlannerInput input = PlannerInputFromProfile(ProfileFromJson(ReadJsonFile(path), path), path, optimizer);
  if (steps > 1) input.fixed.backward_grad_bytes = 0;
  return input;
}

class BatchProfiler {
 public:
  BatchProfiler(const BatchOptions& o, std::string model, std::string gpu, std::string dir, const ByteQuantity& budget,
                const OptimizerChoice& optimizer, const SolveAtBatch& solve)
      : o_(o), model_(std::move(model)), gpu_(std::move(gpu)), dir_(std::move(dir)), budget_(budget),
        optimizer_(optimizer), solve_(solve), self_(SelfPath()) {}

  // The profile at the model's own example inputs (no --input): the specs
  // to vary, and its batch measured on the way.
  void ProfileDefault() {
    const std::string path = dir_ + "/example.json";
    RunProfile(path, {});
    const Profile profile = ProfileFromJson(ReadJsonFile(path), path);
    if (!profile.model.inputs || profile.model.inputs->empty() || profile.model.inputs->front().shape.empty()) {
      throw BadInput(model_ + ": --batch needs inputs with a batch dimension: give them with --input (the first "
                     "dimension of each is the batch)");
    }
    std::vector<std::string> specs;
    for (const InputSpec& spec : *profile.model.inputs) specs.push_back(spec.text);
    SetSpecs(specs);
    const int value = Value(*profile.model.inputs);
    if (value <= 0) {
      throw BadInput(model_ + ": --seq needs an integer input of two or more dimensions (token ids): give them "
                     "with --input");
    }
    fs::rename(path, PathFor(value));
    Record(value, PathFor(value), 0);
  }

  // The specs to vary; in seq mode the batch they keep, which turns
  // sequences per second into tokens per second.
  void SetSpecs(std::vector<std::string> specs) {
    specs_ = std::move(specs);
    std::vector<InputSpec> parsed;
    for (const std::string& text : specs_) parsed.push_back(ParseInputSpec(text));
    if (o_.dim == 1) {
      if (Value(parsed) <= 0) {
        throw BadInput("--seq varies the second dimension of the integer inputs (token ids): none among " +
                       specs_.front() + (specs_.size() > 1 ? ", ..." : ""));
      }
      per_value_ = static_cast<double>(parsed.front().shape.empty() ? 1 : parsed.front().shape.front());
    }
  }
  // Samples (batch) or tokens (seq) per second for `value`'s rate.
  double Rate(const BatchPoint& p, bool with_plan) const { return p.samples_per_s(with_plan) * per_value_; }

  BatchPoint Evaluate(int batch) {
    if (auto it = done_.find(batch); it != done_.end()) return it->second.point;
    const std::string path = PathFor(batch);
    const auto start = std::chrono::steady_clock::now();
    const std::string error = RunProfile(path, AtValue(specs_, batch, o_.dim));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!error.empty()) {
      Profiled& p = done_[batch];
      p.point.batch = batch;
      p.point.error = error;
      if (progress_) std::fprintf(stderr, "%s %d: not profiled (%.1f s): %s\n", o_.DimName(), batch, seconds, error.c_str());
      return p.point;
    }
    return Record(batch, path, seconds);
  }

  std::map<int, Profiled>& done() { return done_; }
  int profiles() const { return profiles_; }

 private:
  std::string PathFor(int value) const { return dir_ + "/" + o_.DimName() + "-" + std::to_string(value) + ".json"; }

  // The value of the dimension searched in these inputs: the first input's
  // batch, or the sequence of the first integer input with two dimensions
  // or more (0 if none).
  int Value(const std::vector<InputSpec>& inputs) const {
    for (const InputSpec& spec : inputs) {
      if (o_.dim == 0 && !spec.shape.empty()) return static_cast<int>(spec.shape.front());
      if (o_.dim == 1 && spec.shape.size() >= 2 && IsIntegerDtype(spec.dtype)) return static_cast<int>(spec.shape[1]);
    }
    return 0;
  }

  // Runs `ckplan profile`; empty on success, else its error.
  std::string RunProfile(const std::string& path, const std::vector<std::string>& specs) {
    std::vector<std::string> args = {self_, "profile", model_, "-o", path, "--device", o_.device};
    for (const std::string& s : specs) args.insert(args.end(), {"--input", s});
    if (!o_.dtype.empty()) args.insert(args.end(), {"--dtype", o_.dtype});
    if (!gpu_.empty()) args.insert(args.end(), {"--gpu", gpu_});
    if (o_.reps > 0) args.insert(args.end(), {"--reps", std::to_string(o_.reps)});
    ++profiles_;
    const std::string log = path + ".log";
    const int code = RunChild(args, log);
    std::string error = code == 0 ? "" : ChildError(log);
    if (code == 0) {
      fs::remove(log);
    } else if (specs.empty()) {
      // The example itself does not profile: the model, not a batch, is at fault.
      fs::remove(log);
      throw Error(code == 2 ? ExitCode::kBadInput : ExitCode::kInternal, error);
    }
    return error;
  }

  BatchPoint Record(int batch, const std::string& path, double seconds) {
    Profiled& p = done_[batch];
    p.profile_path = path;
    p.plans = solve_(InputAt(path, optimizer_, o_.global_batch > 0 ? o_.global_batch / batch : 1));
    p.point.batch = batch;
    p.point.none_peak_bytes = p.plans.none_peak_bytes;
    p.point.none_fits = p.plans.none_peak_bytes <= budget_.bytes;
    p.point.none_ms = p.plans.none_ms;
    p.point.plan_fits = p.plans.plan_fits;
    p.point.min_budget_bytes = p.plans.min_budget_bytes;
    p.point.plan_ms = p.plans.plan_ms;
    if (o_.global_batch > 0) {
      // Micro-batches accumulated to the global batch: the update once per
      // global batch. Only batches that divide it are trained so.
      const int steps = o_.global_batch / batch;
      auto per_global = [&](double ms) { return steps * (ms - p.plans.optimizer_ms) + p.plans.optimizer_ms; };
      const bool divides = o_.global_batch % batch == 0;
      p.point.none_ms = divides ? per_global(p.plans.none_ms) * batch / o_.global_batch : 0;
      p.point.plan_ms = divides ? per_global(p.plans.plan_ms) * batch / o_.global_batch : 0;
    }
    if (progress_) std::fprintf(stderr, "%s %d: profiled%s; no checkpointing %s (%s), best plan %s\n", o_.DimName(), batch,
                 seconds > 0 ? Format(" in %.1f s", seconds).c_str() : "",
                 FormatBytes(p.plans.none_peak_bytes, budget_.style).c_str(), p.point.none_fits ? "fits" : "over",
                 p.plans.plan_fits ? FormatBytes(p.plans.plan_peak_bytes, budget_.style).c_str()
                                   : ("needs " + FormatBytes(p.plans.min_budget_bytes, budget_.style)).c_str());
    return p.point;
  }

  const BatchOptions& o_;
  std::string model_, gpu_, dir_;
  ByteQuantity budget_;
  OptimizerChoice optimizer_;
  const SolveAtBatch& solve_;
  std::string self_;
  std::vector<std::string> specs_;
  std::map<int, Profiled> done_;
  double per_value_ = 1;
  // A line per batch on stderr as it is profiled, when it is a terminal (as a progress bar is).
  bool progress_ = StderrIsTerminal();
  int profiles_ = 0;
};

// A temporary folder for the profiles, removed when done (unless --profiles).
class ProfilesDir {
 public:
  explicit ProfilesDir(const std::string& keep) {
    if (!keep.empty()) {
      std::error_code error;
      fs::create_directories(keep, error);
      if (error || !fs::is_directory(keep)) throw BadInput("--profiles " + keep + ": cannot create the folder");
      path_ = keep;
      return;
    }
    std::string pattern = (fs::temp_directory_path() / "ckplan-batch-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw Error(ExitCode::kInternal, "cannot create a temporary folder for the profiles: " + std::string(std::strerror(errno)));
    }
    path_ = pattern;
    temporary_ = true;
  }
  ~ProfilesDir() {
    std::error_code ignored;
    if (temporary_) fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  bool temporary() const { return temporary_; }

 private:
  std::string path_;
  bool temporary_ = false;
};

std::string SamplesPerS(double value) { return value > 0 ? Format("%.1f", value) : "-"; }

BatchTable TableOf(const BatchOptions& o, const std::string& model, const ByteQuantity& budget,
                   const BatchSearch& search, const std::map<int, Profiled>& done, int chosen,
                   const std::function<double(const BatchPoint&, bool)>& rate) {
  BatchTable t;
  t.dimension = o.DimName();
  t.model = model;
  t.budget_bytes = budget.bytes;
  t.max_batch = o.max_batch;
  t.device = o.device;
  if (o.global_batch > 0) t.global_batch = o.global_batch;
  t.largest_none = search.largest_none;
  t.largest_plan = search.largest_plan;
  t.fastest_none = search.fastest_none;
  t.fastest_plan = search.fastest_plan;
  t.chosen = chosen;
  for (const auto& [batch, p] : done) {
    BatchRow row;
    row.batch = batch;
    row.error = p.point.error;
    if (row.error.empty()) {
      row.none_peak_bytes = p.plans.none_peak_bytes;
      row.none_ms = p.plans.none_ms;
      row.none_fits = p.point.none_fits;
      row.none_samples_per_s = p.point.none_fits ? rate(p.point, false) : 0;
      row.min_budget_bytes = p.plans.min_budget_bytes;
      if (p.plans.plan_fits) {
        row.plan = BatchPlanFit{p.plans.plan_peak_bytes, p.plans.plan_ms, p.plans.plan_overhead_pct, p.plans.plan_what,
                                rate(p.point, true)};
      }
    }
    t.rows.push_back(row);
  }
  return t;
}

}  // namespace

void AddBatchOptions(CLI::App* cmd, BatchOptions* o) {
  cmd->add_option("--batch", o->mode,
                  "with a MODEL (.pt2 or TorchScript) instead of a profile: auto profiles it at the batches needed to "
                  "find the largest batch that fits the budget with and without checkpointing, prints each batch's "
                  "peak, step time and samples per second, and plans the batch that trains the most samples per "
                  "second; largest: plan the largest batch that fits; N: plan batch N");
  cmd->add_option("--max-batch", o->max_batch, "with --batch: the largest batch tried (default 4096)");
  cmd->add_option("-i,--input", o->inputs,
                  "with --batch: the model's inputs as ckplan profile takes them (SHAPE[:DTYPE[:LO..HI]]); the first "
                  "dimension of each is the batch, replaced at each batch tried (default: the .pt2's example inputs)");
  cmd->add_option("--device", o->device, "with --batch: where to profile: cpu (default), meta (with --gpu), cuda");
  cmd->add_option("--dtype", o->dtype, "with --batch: bf16, fp16 or fp32 for the profiles");
  cmd->add_option("--reps", o->reps, "with --batch: measured repetitions per profile (default: profile's)");
  cmd->add_option("--profiles", o->profiles_dir, "with --batch: keep each batch's profile in this folder (batch-N.json)");
  cmd->add_option("--batch-table", o->table_out, "with --batch: write the table as JSON (ckplan.batches/1); - for stdout");
  cmd->add_option("--seq", o->seq,
                  "with a MODEL exported with a dynamic sequence (ckplan_torch.export(..., dynamic_seq=True)): the same "
                  "search over the sequence length, the second dimension of the integer inputs (token ids, labels, "
                  "masks), at the inputs' batch, in tokens per second: auto (the fastest), largest, or N");
  cmd->add_option("--max-seq", o->max_seq, "with --seq: the longest sequence tried (default 65536)");
  cmd->add_option("--global-batch", o->global_batch,
                  "with --batch: samples per optimizer step; each batch that divides it is trained by accumulating "
                  "gradients over global/batch micro-batches (the update runs once per global batch)");
}

BatchOptions BatchOptions::Normalized() const {
  BatchOptions o = *this;
  if (!seq.empty()) {
    o.mode = seq;
    o.max_batch = max_seq;
    o.dim = 1;
  }
  return o;
}

void CheckBatchOptions(const BatchOptions& given) {
  if (!given.mode.empty() && !given.seq.empty()) {
    throw BadInput("--batch and --seq search one dimension each: give one (--seq keeps the inputs' batch)");
  }
  if (!given.seq.empty() && given.global_batch != 0) throw BadInput("--global-batch is for --batch, not --seq");
  // --seq checked as the search runs it: its value in mode, --max-seq in max_batch.
  const BatchOptions o = given.Normalized();
  const std::string dim = o.DimName();
  if (!o.given()) {
    for (const auto& [set, name] : {std::pair{!o.inputs.empty(), "--input"}, {o.reps != 0, "--reps"},
                                    {!o.profiles_dir.empty(), "--profiles"}, {!o.table_out.empty(), "--batch-table"},
                                    {o.global_batch != 0, "--global-batch"}, {!o.dtype.empty(), "--dtype"}}) {
      if (set) throw BadInput(std::string(name) + " is for --batch (planning the batch from a model)");
    }
    return;
  }
  if (o.mode != "auto" && o.mode != "largest") {
    char* end = nullptr;
    const long n = std::strtol(o.mode.c_str(), &end, 10);
    if (end == o.mode.c_str() || *end != '\0' || n < 1 || n > (1 << 30)) {
      throw BadInput("invalid --" + dim + " '" + o.mode + "': use auto, largest or a " +
                     (o.dim == 1 ? "sequence length" : "batch size") + " (1 or more)");
    }
  }
  if (o.max_batch < 1 || o.max_batch > (1 << 30)) {
    throw BadInput("invalid --max-" + dim + " " + std::to_string(o.max_batch) + ": use 1 or more");
  }
  if (o.global_batch < 0 || o.global_batch > (1 << 30)) {
    throw BadInput("invalid --global-batch " + std::to_string(o.global_batch) + ": use 1 or more");
  }
  if (o.reps < 0 || o.reps > 1000) throw BadInput("invalid --reps " + std::to_string(o.reps) + ": use 1..1000");
  if (o.device != "cpu" && o.device != "meta" && o.device.rfind("cuda", 0) != 0) {
    throw BadInput("invalid --device '" + o.device + "': use cpu, meta or cuda[:N]");
  }
  for (const std::string& text : o.inputs) ParseInputSpec(text);
  CheckOutputPath(o.table_out);
}

PlannerInput SolveBatches(const BatchOptions& o, const std::string& model, const std::string& gpu,
                          const ByteQuantity& budget, const OptimizerChoice& optimizer, const SolveAtBatch& solve,
                          FILE* human) {
  if (!fs::is_regular_file(model)) throw BadInput(model + ": no such model file");
  {
    std::ifstream in(model);
    char first = 0;
    in >> first;
    if (first == '{') {  // a JSON document: a profile (at one batch) or a chain, not a model
      throw BadInput(model + ": --batch profiles the model at each batch, so it needs the model (.pt2 or TorchScript), "
                             "not a profile or chain; a profile names its model in model.path");
    }
  }
  if (o.device == "meta" && gpu.empty()) {
    throw BadInput("--batch with --device meta needs --gpu NAME: the step times come from its cost model");
  }
  const ProfilesDir dir(o.profiles_dir);
  BatchProfiler profiler(o, model, gpu, dir.path(), budget, optimizer, solve);
  if (o.inputs.empty()) {
    profiler.ProfileDefault();
  } else {
    profiler.SetSpecs(o.inputs);
  }
  const auto start = std::chrono::steady_clock::now();
  int max_batch = o.max_batch;
  if (o.global_batch > 0) max_batch = std::min(max_batch, o.global_batch);
  const int fixed_batch = o.mode == "auto" || o.mode == "largest" ? 0 : std::atoi(o.mode.c_str());
  BatchSearch search;
  if (fixed_batch > 0) {
    search.points.emplace(fixed_batch, profiler.Evaluate(fixed_batch));
  } else {
    search = SearchBatches(max_batch, budget.bytes, [&](int b) { return profiler.Evaluate(b); });
    // With accumulation, the divisors of the global batch below the largest
    // that fits are the batches it can train at: the largest few measured.
    if (o.global_batch > 0 && search.largest_plan > 0) {
      int added = 0;
      for (int b = search.largest_plan; b >= 1 && added < 3; --b) {
        if (o.global_batch % b != 0) continue;
        ++added;
        if (!search.points.count(b)) search.points.emplace(b, profiler.Evaluate(b));
      }
      SetAnswers(&search);  // with them
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::map<int, Profiled>& done = profiler.done();
  // No batch profiled: the model refuses the inputs (the error names them).
  // (Among the batches searched: the example's batch may lie beyond --max-batch.)
  auto measured = std::find_if(search.points.begin(), search.points.end(),
                               [](const auto& entry) { return entry.second.error.empty(); });
  if (measured == search.points.end()) {
    throw BadInput(Format("%s %d: ", o.DimName(), search.points.begin()->first) + search.points.begin()->second.error);
  }

  // The table: every batch profiled.
  const bool accumulate = o.global_batch > 0;
  std::vector<std::vector<std::string>> rows = {
      {o.DimName(), accumulate ? "steps" : "", "none: peak", "step", o.RateName(), "best plan", "peak", "step", "overhead",
       o.RateName()}};
  for (const auto& [batch, p] : done) {
    std::vector<std::string> row = {std::to_string(batch), accumulate ? (o.global_batch % batch == 0 ? std::to_string(o.global_batch / batch) : "-") : ""};
    if (!p.point.error.empty()) {
      row.insert(row.end(), {"not profiled", "", "", p.point.error.substr(0, 60), "", "", "", ""});
    } else {
      row.insert(row.end(), {FormatBytes(p.plans.none_peak_bytes, budget.style) + (p.point.none_fits ? "" : " (over)"),
                             FormatMs(p.plans.none_ms), p.point.none_fits ? SamplesPerS(profiler.Rate(p.point, false)) : "-"});
      if (p.plans.plan_fits) {
        row.insert(row.end(), {p.plans.plan_what, FormatBytes(p.plans.plan_peak_bytes, budget.style),
                               FormatMs(p.plans.plan_ms), FormatPct(p.plans.plan_overhead_pct),
                               SamplesPerS(profiler.Rate(p.point, true))});
      } else {
        row.insert(row.end(), {"does not fit", "needs " + FormatBytes(p.plans.min_budget_bytes, budget.style), "", "", "-"});
      }
    }
    if (!accumulate) row.erase(row.begin() + 1);
    rows.push_back(row);
  }
  if (!accumulate) rows[0].erase(rows[0].begin() + 1);
  std::vector<bool> right(rows[0].size(), true);
  right[rows[0].size() - 5] = false;  // the plan's description
  std::fprintf(human, "%s: %d %s profiled on %s in %.1f s, budget %s%s%s\n%s", model.c_str(), profiler.profiles(),
               o.dim == 1 ? "sequence lengths" : "batches", o.device.c_str(), seconds,
               FormatBytes(budget.bytes, budget.style).c_str(),
               o.scope.empty() ? "" : (std::string(", memory and ") + o.RateName() + " " + o.scope).c_str(),
               accumulate ? Format(", global batch %d (the update once per global batch)", o.global_batch).c_str() : "",
               FormatTable(rows, right).c_str());
  if (accumulate) {
    std::fprintf(human, "with accumulation the gradients of earlier micro-batches are held through the step: counted "
                        "whole on top of this micro-batch's own (an upper bound by up to their size)\n");
  }

  auto next_needs = [&](int batch, bool plan) -> std::string {
    auto it = done.find(batch + 1);
    if (it == done.end()) return batch >= max_batch ? Format("; --max-%s %d reached", o.DimName(), max_batch) : "";
    const Profiled& p = it->second;
    if (!p.point.error.empty()) return Format("; %d could not be profiled", batch + 1);
    return Format("; %d needs %s", batch + 1,
                  FormatBytes(plan ? p.plans.min_budget_bytes : p.plans.none_peak_bytes, budget.style).c_str());
  };
  if (fixed_batch == 0) {
    if (search.largest_none > 0) {
      std::fprintf(human, "largest %s without checkpointing: %d (peak %s%s)\n", o.DimName(), search.largest_none,
                   FormatBytes(done.at(search.largest_none).plans.none_peak_bytes, budget.style).c_str(),
                   next_needs(search.largest_none, false).c_str());
    } else {
      std::fprintf(human, "largest %s without checkpointing: none fits\n", o.DimName());
    }
    if (search.largest_plan > 0) {
      const Profiled& p = done.at(search.largest_plan);
      std::fprintf(human, "largest %s with checkpointing: %d (%s, peak %s, %s over no checkpointing%s)\n",
                   o.DimName(), search.largest_plan, p.plans.plan_what.c_str(), FormatBytes(p.plans.plan_peak_bytes, budget.style).c_str(),
                   FormatPct(p.plans.plan_overhead_pct).c_str(), next_needs(search.largest_plan, true).c_str());
    }
    if (search.fastest_plan > 0) {
      const Profiled& p = done.at(search.fastest_plan);
      std::fprintf(human, "fastest: %s %d, %s, %s %s", o.DimName(), search.fastest_plan, p.plans.plan_what.c_str(),
                   SamplesPerS(profiler.Rate(p.point, true)).c_str(), o.RateName());
      if (search.fastest_none > 0) {
        std::fprintf(human, " (without checkpointing at most %s, %s %d)",
                     SamplesPerS(profiler.Rate(done.at(search.fastest_none).point, false)).c_str(), o.DimName(),
                     search.fastest_none);
      }
      std::fprintf(human, "\n");
    }
  }
  const int chosen = fixed_batch > 0 ? fixed_batch : o.mode == "largest" ? search.largest_plan : search.fastest_plan;
  if (!o.table_out.empty()) {
    EmitOutput(o.table_out,
               BatchTableToJson(TableOf(o, model, budget, search, done, chosen,
                                        [&](const BatchPoint& p, bool plan) { return profiler.Rate(p, plan); }))
                       .dump(2) + "\n",
               human);
  }
  if (chosen == 0 || !done.at(chosen).point.error.empty() || !done.at(chosen).plans.plan_fits) {
    const Profiled& smallest = done.at(measured->first);  // the smallest batch searched that profiled
    throw Error(ExitCode::kInfeasible,
                fixed_batch > 0
                    ? Format("budget %s is below the minimum %s for %s %d of %s", budget.text.c_str(),
                             FormatLikeBudget(smallest.plans.min_budget_bytes, budget).c_str(), o.DimName(),
                             fixed_batch, model.c_str())
                    : Format("budget %s fits no %s of %s: %s %d needs at least %s", budget.text.c_str(), o.DimName(),
                             model.c_str(), o.DimName(), smallest.point.batch,
                             FormatLikeBudget(smallest.plans.min_budget_bytes, budget).c_str()));
  }
  std::fprintf(human, "\nthe plan for %s %d (%s):\n", o.DimName(), chosen,
               fixed_batch > 0 ? (o.dim == 1 ? "--seq" : "--batch") : o.mode == "largest" ? "the largest that fits" : "the fastest");
  PlannerInput input =
      InputAt(done.at(chosen).profile_path, optimizer, o.global_batch > 0 ? o.global_batch / chosen : 1);
  if (dir.temporary()) input.source.path = model + " (profiled at " + o.DimName() + " " + std::to_string(chosen) + ")";
  return input;
}

}  // namespace ckplan
