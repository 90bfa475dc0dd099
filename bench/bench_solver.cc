// Benchmark: the optimal chain solver, plain recurrence against the fast
// solver, on heterogeneous chains (stage times and sizes drawn over two
// orders of magnitude, fixed seeds). Checks that the optima are identical
// (time to the last bit, schedule, whole memory/time curve); prints times,
// ratios and the fast solver's table memory. Not a test.
//
//   bench_solver [--lengths 50,100,200,400] [--slots 500,1000,2000] [--max-plain-work N] [--runs N]

#include <malloc.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ckplan/planner/chain.h"
#include "ckplan/planner/solver.h"

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

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> lengths = {50, 100, 200, 400}, slots = {500, 1000, 2000};
  double max_plain_work = 3e10;  // (L^3 / 6) * S: the plain DP is skipped beyond this
  int runs = 5;
  // Freed memory stays in the process: fresh mappings fault page by page,
  // which on virtual machines adds noise to both solvers' times.
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--lengths")) lengths = ParseList(argv[i + 1]);
    if (!std::strcmp(argv[i], "--slots")) slots = ParseList(argv[i + 1]);
    if (!std::strcmp(argv[i], "--max-plain-work")) max_plain_work = std::atof(argv[i + 1]);
    if (!std::strcmp(argv[i], "--runs")) runs = std::max(1, std::atoi(argv[i + 1]));
  }
  std::printf("budget halfway between the smallest feasible and no recomputation; fast: median of %d runs\n", runs);
  std::printf("%5s %5s %9s %9s %9s %8s %8s %9s %12s %s\n", "L", "S", "plain_s", "fast1_s", "fast2_s", "x1", "x2",
              "table_MB", "optimum_ms", "identical");
  for (int length : lengths) {
    for (int s : slots) {
      Chain chain = MakeChain(length, 1000u * static_cast<uint32_t>(length) + static_cast<uint32_t>(s));
      DiscreteChain exact = Discretize(chain, 1);
      const int64_t budget = (MinimumMemory(exact) + NoRecomputeMemory(exact)) / 2;
      DiscreteChain c = Discretize(chain, budget / s);

      OptimalSolution fast1, fast2;
      const double fast1_s = MedianSeconds(runs, [&] { fast1 = SolveOptimal(c, s, 1); });
      const double fast2_s = MedianSeconds(runs, [&] { fast2 = SolveOptimal(c, s, 2); });
      double plain_s = NAN;
      std::string identical = "skipped";
      if (std::pow(length, 3) / 6.0 * s <= max_plain_work) {
        OptimalSolution plain;
        plain_s = MedianSeconds(1, [&] { plain = SolveOptimalReference(c, s); });
        bool same = plain.time_ms == fast1.time_ms && plain.time_ms == fast2.time_ms &&
                    plain.schedule == fast1.schedule && plain.schedule == fast2.schedule &&
                    plain.curve_ms == fast1.curve_ms && plain.curve_ms == fast2.curve_ms;
        identical = same ? "yes" : "NO";
      }
      const double table_mb = static_cast<double>(FastSolverTableBytes(c, s)) / 1e6;
      std::printf("%5d %5d %9.3f %9.4f %9.4f %8.1f %8.1f %9.1f %12.4f %s\n", length, s, plain_s, fast1_s, fast2_s,
                  plain_s / fast1_s, plain_s / fast2_s, table_mb, fast1.time_ms, identical.c_str());
      std::fflush(stdout);
    }
  }
  struct rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  std::printf("peak resident memory of this process: %ld MB\n", usage.ru_maxrss / 1024);
  return 0;
}
