// Benchmark: the chain solver as a user meets it. On heterogeneous chains
// (stage times and sizes drawn over two orders of magnitude, fixed seeds),
// budget halfway between the smallest feasible one and no recomputation:
//  - whole processes: `ckplan solve chain.json --budget B --slots S` against
//    the plain recurrence (SolveOptimalReference) run by this program as a
//    separate process on the same file (`bench_solver --reference ...`), on
//    the grid `ckplan solve` ended on (it halves the slots where rounding to
//    them costs over 0.5% of the budget; its plan's `slots`);
//  - the solvers alone, in this process, one thread;
// and whether the optima are the same to the last bit (for the exact solver:
// also the schedule and the whole curve), or, for the banded solver, the
// proven bound on its gap. Prints a Markdown table. Not a test.
//
//   bench_solver [--lengths 50,100,200,400,1000,2000,5000] [--slots 500,1000,2000] [--runs 3]
//                [--max-plain-work 6e9] [--ckplan DIR_OF_THIS_PROGRAM/ckplan]
//   bench_solver --reference CHAIN BUDGET_BYTES SLOTS    (prints the optimum, %a)
//   bench_solver --write-chain L S PATH   (the chain of row L, S and its budget)

#include <fcntl.h>
#include <malloc.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "planner/contracts/chain.h"
#include "planner/plan/plan.h"
#include "planner/solvers/recurrence.h"

using namespace ckplan;
using Clock = std::chrono::steady_clock;

namespace {

Chain MakeChain(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> two_decades(0.0, 2.0);
  auto draw = [&](double scale) { return scale * std::pow(10.0, two_decades(rng)); };
  Chain c;
  c.input_bytes = static_cast<int64_t>(draw(1e6));
  for (int i = 0; i < length; ++i) {
    Stage s;
    s.name = "s" + std::to_string(i);
    s.fwd_ms = draw(0.1);
    s.bwd_ms = 2 * s.fwd_ms * (0.5 + two_decades(rng) / 2);
    s.out_bytes = static_cast<int64_t>(draw(1e6));
    s.saved_bytes = s.out_bytes + static_cast<int64_t>(draw(2e6));
    s.fwd_tmp_bytes = static_cast<int64_t>(draw(2e5));
    s.bwd_tmp_bytes = static_cast<int64_t>(draw(4e5));
    c.stages.push_back(s);
  }
  c.loss_bwd_ms = 0.05;
  return c;
}

std::vector<int> ParseList(const char* text) {
  std::vector<int> out;
  std::stringstream s(text);
  std::string item;
  while (std::getline(s, item, ',')) out.push_back(std::atoi(item.c_str()));
  return out;
}

double Seconds(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

template <typename F>
double MedianSeconds(int runs, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < runs; ++r) {
    auto start = Clock::now();
    f();
    t.push_back(Seconds(start));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The slot grid `ckplan solve` uses for a chain (no fixed part).
DiscreteChain GridChain(const Chain& chain, int64_t budget_bytes, int slots) {
  return Discretize(chain, budget_bytes < slots ? 1 : budget_bytes / slots);
}

struct ProcessResult {
  double seconds = NAN;
  long peak_rss_mb = 0;
  int status = -1;
  std::string out;
};

// `bench_solver --launch LINE`: runs `sh -c LINE` in a forked child and
// prints its wall time and peak RSS. The launcher is small, so the child's
// peak counts only itself: a process this benchmark spawned directly would
// count this one's memory too (Linux carries the spawning memory's peak over
// exec).
int LaunchMain(const char* line) {
  auto start = Clock::now();
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", line, static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage usage;
  if (pid < 0 || wait4(pid, &status, 0, &usage) != pid) return 1;
  std::printf("%.6f %ld %d\n", Seconds(start), usage.ru_maxrss, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `command` (shell words) with stdout to a file, through the launcher:
// wall time and peak RSS.
ProcessResult RunProcess(const std::string& self, const std::string& command, const std::string& out_path) {
  ProcessResult r;
  const std::string line = "exec " + command + " >" + out_path + " 2>/dev/null </dev/null";
  const std::string launch_path = out_path + ".launch";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, launch_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const char* child_argv[] = {self.c_str(), "--launch", line.c_str(), nullptr};
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, self.c_str(), &actions, nullptr, const_cast<char* const*>(child_argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return r;
  int status = 0;
  waitpid(pid, &status, 0);
  long rss_kb = 0;
  std::istringstream launch(ReadText(launch_path));
  if (launch >> r.seconds >> rss_kb >> r.status) r.peak_rss_mb = rss_kb / 1024;
  std::remove(launch_path.c_str());
  r.out = ReadText(out_path);
  return r;
}

int ReferenceMain(const char* chain_path, const char* budget, const char* slots) {
  std::ifstream in(chain_path);
  Chain chain = ChainFromJson(nlohmann::json::parse(in), chain_path);
  const int s = std::atoi(slots);
  DiscreteChain c = GridChain(chain, std::atoll(budget), s);
  OptimalSolution plain = SolveOptimalReference(c, s);
  std::printf("%a\n", plain.time_ms);
  return 0;
}

// The chain of the row (length, slots) and the budget the table uses for it.
Chain RowChain(int length, int slots, int64_t* budget) {
  Chain chain = MakeChain(length, 1000u * static_cast<uint32_t>(length) + static_cast<uint32_t>(slots));
  DiscreteChain bytes = Discretize(chain, 1);
  const SolverMethod method = ChooseSolver(length, slots);
  *budget = (SolverMinimumMemory(bytes, method) + NoRecomputeMemory(bytes)) / 2;
  return chain;
}

int WriteChainMain(const char* length, const char* slots, const char* path) {
  int64_t budget = 0;
  Chain chain = RowChain(std::atoi(length), std::atoi(slots), &budget);
  std::ofstream(path) << ChainToJson(chain).dump() << "\n";
  std::printf("%lld\n", static_cast<long long>(budget));
  return 0;
}

std::string Fmt(const char* format, double v) {
  if (std::isnan(v)) return "-";
  char buffer[64];
  std::snprintf(buffer, sizeof(buffer), format, v);
  return buffer;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && !std::strcmp(argv[1], "--launch")) return LaunchMain(argv[2]);
  if (argc == 5 && !std::strcmp(argv[1], "--reference")) return ReferenceMain(argv[2], argv[3], argv[4]);
  if (argc == 5 && !std::strcmp(argv[1], "--write-chain")) return WriteChainMain(argv[2], argv[3], argv[4]);
  std::vector<int> lengths = {50, 100, 200, 400, 1000, 2000, 5000}, slots = {500, 1000, 2000};
  double max_plain_work = 6e9;  // (L^3 / 6) * S: the plain DP is skipped beyond this
  int runs = 3;
  std::string ckplan;  // by default the one built beside this program
  // Freed memory stays in the process: fresh mappings fault page by page,
  // which on virtual machines adds noise to the in-process times.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--lengths")) lengths = ParseList(argv[i + 1]);
    if (!std::strcmp(argv[i], "--slots")) slots = ParseList(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-plain-work")) max_plain_work = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--runs")) runs = std::max(1, std::atoi(argv[i + 1]));
    if (!std::strcmp(argv[i], "--ckplan")) ckplan = argv[i + 1];
  }
  // This program, for the launcher and the reference process.
  char self_path[4096] = {0};
  const ssize_t self_length = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
  const std::string self = self_length > 0 ? std::string(self_path, static_cast<size_t>(self_length)) : argv[0];
  if (ckplan.empty()) ckplan = self.substr(0, self.rfind('/') + 1) + "ckplan";
  char dir_pattern[] = "/tmp/bench_solver_XXXXXX";
  const std::string dir = mkdtemp(dir_pattern);
  std::printf("| L | S | solver | plain, process | ckplan solve, process | speed-up | plain, solver alone | solver alone "
              "| speed-up | table | ckplan peak RSS | optimum | same optimum / proven gap |\n");
  std::printf("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
  for (int length : lengths) {
    for (int s : slots) {
      int64_t budget = 0;
      Chain chain = RowChain(length, s, &budget);
      const SolverMethod method = ChooseSolver(length, s);
      DiscreteChain c = GridChain(chain, budget, s);
      const int solver_runs = length >= 1000 ? 1 : runs;

      OptimalSolution fast;
      const double fast_s = MedianSeconds(solver_runs, [&] { fast = SolveChain(c, s); });
      const bool plain_runs = std::pow(length, 3) / 6.0 * s <= max_plain_work;
      double plain_s = NAN;
      std::string same = "-";
      if (plain_runs) {
        OptimalSolution plain;
        plain_s = MedianSeconds(1, [&] { plain = SolveOptimalReference(c, s); });
        const bool identical = plain.time_ms == fast.time_ms && plain.schedule == fast.schedule &&
                               plain.curve_ms == fast.curve_ms;
        same = identical ? "yes (and schedule, curve)" : "NO";
      }
      // The banded solver: its proven gap.
      const std::string before = plain_runs ? same + ", " : "";
      if (!fast.proven_optimal) {
        same = before + Fmt("gap <= %.3g%%", OverheadPct(fast.time_ms, fast.lower_bound_ms));
      } else if (fast.band > 0) {
        same = before + "proven optimal";
      }

      // Whole processes on the same chain file.
      const std::string chain_path = dir + "/chain.json";
      {
        std::ofstream out(chain_path);
        out << ChainToJson(chain).dump();
      }
      std::vector<double> ckplan_t;
      ProcessResult solve;
      for (int r = 0; r < solver_runs; ++r) {
        solve = RunProcess(self, ckplan + " solve " + chain_path + " --budget " + std::to_string(budget) + " --slots " +
                               std::to_string(s) + " -o -",
                           dir + "/plan.json");
        ckplan_t.push_back(solve.seconds);
      }
      std::sort(ckplan_t.begin(), ckplan_t.end());
      const double ckplan_s = ckplan_t[ckplan_t.size() / 2];
      // `ckplan solve` halves the slots where rounding to them would cost
      // over 0.5% of the budget (its plan says on which grid it ended): the
      // plain recurrence runs on that grid, so that the optima compare.
      double plain_process_s = NAN;
      int final_slots = s;
      double plan_ms = NAN;
      if (solve.status == 0) {
        const nlohmann::json plan = nlohmann::json::parse(solve.out);
        final_slots = plan.value("slots", s);
        plan_ms = plan["predicted"]["time_ms"].get<double>();
      }
      if (final_slots != s) same += "; ckplan refined to S = " + std::to_string(final_slots) + Fmt(" (%.2f ms)", plan_ms);
      if (solve.status == 0 && std::pow(length, 3) / 6.0 * final_slots <= max_plain_work) {
        const std::string final_args = " " + chain_path + " " + std::to_string(budget) + " " + std::to_string(final_slots);
        ProcessResult reference = RunProcess(self, self + " --reference" + final_args, dir + "/reference.txt");
        plain_process_s = reference.seconds;
        same += std::strtod(reference.out.c_str(), nullptr) == plan_ms ? "; process: same optimum"
                                                                        : "; process optimum DIFFERS";
      }
      if (solve.status != 0) same += "; ckplan exit " + std::to_string(solve.status);
      const double table_mb = static_cast<double>(FastSolverTableBytes(c, s)) / 1e6;
      std::printf("| %d | %d | %s | %s | %s | %s | %s | %s | %s | %s MB | %ld MB | %.2f ms | %s |\n", length, s,
                  method == SolverMethod::kExact ? "exact" : "banded", Fmt("%.3f s", plain_process_s).c_str(),
                  Fmt("%.3f s", ckplan_s).c_str(), Fmt("%.0fx", plain_process_s / ckplan_s).c_str(),
                  Fmt("%.3f s", plain_s).c_str(), Fmt("%.3f s", fast_s).c_str(), Fmt("%.0fx", plain_s / fast_s).c_str(),
                  Fmt("%.0f", table_mb).c_str(), solve.peak_rss_mb, fast.time_ms, same.c_str());
      std::fflush(stdout);
    }
  }
  std::remove((dir + "/chain.json").c_str());
  std::remove((dir + "/plan.json").c_str());
  std::remove((dir + "/reference.txt").c_str());
  rmdir(dir.c_str());
  return 0;
}
