// The optimal persistent schedule, fast: the same recurrence and the same
// arithmetic as SolveOptimalReference (so the same optimum to the last digit
// and the same schedule), computed
//  - cell by cell, column by column (l = 1..L, i = l-1 down to 0), each cell
//    for all its memories at once, so the scan over j runs over contiguous
//    memory and vectorises;
//  - only between the cell's smallest feasible memory and the memory above
//    which it needs no recomputation (its cost is then a constant);
//  - skipping, block by block of memories, the leaves that cannot win;
//  - with several threads, columns round-robin as a wavefront.
// The same class runs the banded programs (SolveBanded) for long chains:
// only the cells shorter than the band and the suffixes, longer left parts
// priced by a step function of memory.

#include <algorithm>
#include <cmath>
#include <sys/mman.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <memory>
#include <mutex>
#include <thread>

#include "planner/base/error.h"
#include "planner/solvers/recurrence.h"

namespace ckplan {
namespace {

constexpr int16_t kKeepStage = -1;  // what: choice (b)

// The inner loops: best = min(best, candidate) over k in [0, count). Only
// values are kept: which choice reaches the optimum is worked out again, the
// reference's way, for the few cells the schedule reads back. The candidate
// is always (sum + a) + b, as in the reference, so the optimum is the same to
// the last bit. Branch-free so that they vectorise; built for AVX2 and plain
// x86-64, picked at run time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CKPLAN_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CKPLAN_VECTOR_CLONES
#endif

// The table's memory: on transparent huge pages where the system allows (far
// fewer page faults when it is first written), and kept for the next solve
// in this process (a sweep or a report solves many times) while no larger
// than 4 GB.
class Arena {
 public:
  /// `fresh`: the memory was just allocated (its pages not yet faulted in).
  static double* Take(size_t count, bool* fresh) {
    std::lock_guard<std::mutex> lock(mutex_);
    *fresh = false;
    if (cached_ != nullptr && cached_count_ >= count) {
      double* p = cached_;
      cached_ = nullptr;
      return p;
    }
    std::free(cached_);
    cached_ = nullptr;
    *fresh = true;
    return Allocate(count);
  }

  /// Faults in a fresh table's pages on another thread while the solve
  /// writes it: in a new process the kernel's zeroing of those pages is
  /// about as long as the solve itself. Contents are left as they are
  /// (MADV_POPULATE_WRITE); where unsupported, nothing happens.
  class Populate {
   public:
    Populate(double* p, size_t count, bool fresh) {
      const size_t bytes = count * sizeof(double);
#ifdef MADV_POPULATE_WRITE
      if (!fresh || bytes < 4 * kHuge || std::thread::hardware_concurrency() < 2) return;
      thread_ = std::thread([this, p, bytes] {
        char* begin = reinterpret_cast<char*>(p);
        for (size_t offset = 0; offset < bytes && !stop_.load(std::memory_order_relaxed); offset += kHuge) {
          if (madvise(begin + offset, std::min(kHuge, bytes - offset), MADV_POPULATE_WRITE) != 0) break;
        }
      });
#else
      (void)p, (void)bytes, (void)fresh;
#endif
    }
    ~Populate() {
      stop_.store(true, std::memory_order_relaxed);
      if (thread_.joinable()) thread_.join();
    }
    Populate(const Populate&) = delete;
    Populate& operator=(const Populate&) = delete;

   private:
    std::atomic<bool> stop_{false};
    std::thread thread_;
  };
  static void Give(double* p, size_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ == nullptr && count * sizeof(double) <= (size_t{4} << 30)) {
      cached_ = p;
      cached_count_ = count;
    } else {
      std::free(p);
    }
  }

 private:
  static constexpr size_t kHuge = size_t{2} << 20;
  static double* Allocate(size_t count) {
    const size_t bytes = std::max<size_t>(count, 1) * sizeof(double);
    void* p = nullptr;
    if (bytes >= kHuge && posix_memalign(&p, kHuge, (bytes + kHuge - 1) / kHuge * kHuge) == 0) {
      madvise(p, bytes, MADV_HUGEPAGE);
    } else {
      p = std::malloc(bytes);
    }
    if (p == nullptr) throw Error(ExitCode::kInternal, "out of memory for the solver's table");
    return static_cast<double*>(p);
  }
  static std::mutex mutex_;
  static double* cached_;
  static size_t cached_count_;
};
std::mutex Arena::mutex_;
double* Arena::cached_ = nullptr;
size_t Arena::cached_count_ = 0;

inline double Min(double best, double v) { return v < best ? v : best; }

CKPLAN_VECTOR_CLONES void RelaxArrayArray(int64_t count, double sum, const double* __restrict a,
                                          const double* __restrict b, double* __restrict best) {
  for (int64_t k = 0; k < count; ++k) best[k] = Min(best[k], (sum + a[k]) + b[k]);
}

CKPLAN_VECTOR_CLONES void RelaxArrayConst(int64_t count, double sum, const double* __restrict a, double b,
                                          double* __restrict best) {
  for (int64_t k = 0; k < count; ++k) best[k] = Min(best[k], (sum + a[k]) + b);
}

// sum_a = sum + a, rounded once as the reference does per element.
CKPLAN_VECTOR_CLONES void RelaxConstArray(int64_t count, double sum_a, const double* __restrict b,
                                          double* __restrict best) {
  for (int64_t k = 0; k < count; ++k) best[k] = Min(best[k], sum_a + b[k]);
}

void RelaxConst(int64_t count, double v, double* __restrict best) {
  for (int64_t k = 0; k < count; ++k) best[k] = Min(best[k], v);
}

struct Cell {
  int64_t lo = 0;         // smallest feasible memory
  int64_t hi = 0;         // memories [lo, hi) are stored; from hi on the cost is `constant`
  double constant = kInfinity;
  size_t offset = 0;      // into the value arena
};

// Which recurrence a FastSolver computes over its cells (see SolveBanded).
enum class Program {
  kExact,    // band >= n: every cell, the reference's recurrence
  kUpper,    // long segments only without recomputation inside
  kLower,    // long segments at a lower bound of their cost
};

// Sums and running maxima over stages, for the long segments of the banded
// programs: O(1) per segment as j grows for a fixed i.
struct Segment {
  double cost = 0;        // sum of fwd + bwd over the segment's stages
  int64_t floor = 0;      // the recurrence's floor of the segment
  int64_t base_max = 0;   // the largest memory of its stages: kept ones i..l-1, then l's base
  int64_t kept_max = 0;   // the largest ChainMemory(k, l) of stages k = i..l-1 (grows with l)
  int64_t kept_rel = std::numeric_limits<int64_t>::min() / 4;  // kept_max less the gradients of stages < l+1
  double forward_min = kInfinity;  // cheapest forward without autograd among stages i..l-1
  int64_t running = 0;    // the floor's maximum over stages, without x_{l+1}
  // What running every stage with autograd needs (the recurrence's choice
  // (b) all the way down): the largest, over stages k, of what stages i..k-1
  // keep (P_k - P_i, P the prefix sums of saved sizes) plus stage k's floor
  // of (k, l) or base memory. Kept as running maxima of P_k + ..., without
  // P_i and, for the floors, without x_{l+1}.
  int64_t keep_floor = std::numeric_limits<int64_t>::min() / 2;
  int64_t keep_base = 0;
  int64_t keep_kept = std::numeric_limits<int64_t>::min() / 2;  // as keep_base, stages i..l-1 only
  int64_t keep_kept_rel = std::numeric_limits<int64_t>::min() / 4;  // keep_kept less the gradients of stages < l+1
};

class FastSolver {
 public:
  FastSolver(const DiscreteChain& c, int64_t top, int threads, int band, Program program,
             const SolverProgress& progress)
      : c_(c), top_(top), threads_(std::max(1, threads)), program_(program), progress_(progress) {
    n_ = c.length + 1;
    band_ = program == Program::kExact ? n_ : std::clamp(band, 1, n_);
    if (band_ >= n_) program_ = Program::kExact;
    if (program_ != Program::kExact) threads_ = 1;
    cells_.resize(static_cast<size_t>(n_) * band_ + (program_ == Program::kExact ? 0 : static_cast<size_t>(n_)));
    base_memory_.resize(static_cast<size_t>(n_));
    chain_need_.resize(static_cast<size_t>(n_));
    for (int k = 0; k < n_; ++k) {
      base_memory_[static_cast<size_t>(k)] = BaseMemory(c, k);
      chain_need_[static_cast<size_t>(k)] = KeptStageMemory(c, k);
    }
    saved_prefix_.assign(static_cast<size_t>(n_) + 1, 0);
    for (int k = 0; k < n_; ++k) {
      saved_prefix_[static_cast<size_t>(k) + 1] = saved_prefix_[static_cast<size_t>(k)] + c.xbar[static_cast<size_t>(k) + 1];
    }
  }
  ~FastSolver() {
    if (values_ != nullptr) Arena::Give(values_, stored_);
  }
  FastSolver(const FastSolver&) = delete;
  FastSolver& operator=(const FastSolver&) = delete;

  size_t PlanTable() {
    Bounds();
    size_t total = 0;
    work_.assign(static_cast<size_t>(n_), 0.0);
    total_work_ = 0;
    // Column by column, up from the diagonal: the order Solve writes them,
    // so that the table is written front to back (and Populate stays ahead).
    for (int l = 0; l < n_; ++l) {
      for (int i = l; i >= 0; --i) {
        if (!Stored(i, l)) break;  // nor any further up
        Cell& cell = at(i, l);
        cell.offset = total;
        const int64_t width = std::max<int64_t>(0, cell.hi - cell.lo);
        total += static_cast<size_t>(width);
        const double w = static_cast<double>(width) * (l - i + 1);
        work_[static_cast<size_t>(l)] += w;
        total_work_ += w;
      }
    }
    return total;
  }

  // The smallest memory (chain input excluded) of the whole chain.
  int64_t Minimum() {
    Bounds();
    return minimum_;
  }

  OptimalSolution Solve() {
    OptimalSolution solution;
    const size_t total = PlanTable();
    // Every stored entry is written by its cell before anything reads it.
    bool fresh = false;
    values_ = Arena::Take(total, &fresh);
    stored_ = total;
    Arena::Populate populate(values_, total, fresh);
    for (int i = 0; i < n_; ++i) FillBase(i);
    std::atomic<int64_t> done_work{0};
    auto report = [this, &done_work](int l) {
      if (!progress_ || total_work_ <= 0) return;
      const int64_t done = done_work.fetch_add(static_cast<int64_t>(work_[static_cast<size_t>(l)])) +
                           static_cast<int64_t>(work_[static_cast<size_t>(l)]);
      progress_(std::min(1.0, static_cast<double>(done) / total_work_));
    };
    // Column by column (l = 1..L), rows from the diagonal up (i = l-1..0):
    // cell (i, l) reads cells (j, l) of its own column, just made and still
    // in cache, and cells (i, <l) of its row, which lie one after another.
    // With several threads, columns go round-robin and each waits only for
    // the cell to its left: a wavefront.
    std::vector<std::atomic<int>> done_down_to(static_cast<size_t>(n_));
    for (int l = 0; l < n_; ++l) done_down_to[static_cast<size_t>(l)].store(l, std::memory_order_relaxed);
    auto column = [this, &done_down_to](int l) {
      for (int i = l - 1; i >= 0; --i) {
        if (!Stored(i, l)) break;
        if (threads_ > 1) {
          const std::atomic<int>& left = done_down_to[static_cast<size_t>(l) - 1];
          while (left.load(std::memory_order_acquire) > i) std::this_thread::yield();
        }
        FillCell(i, l);
        done_down_to[static_cast<size_t>(l)].store(i, std::memory_order_release);
      }
    };
    if (threads_ == 1) {
      for (int l = 1; l < n_; ++l) {
        column(l);
        report(l);
      }
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads_; ++t) {
        pool.emplace_back([this, t, &column, &report] {
          for (int l = 1 + t; l < n_; l += threads_) {
            column(l);
            report(l);
          }
        });
      }
      for (auto& thread : pool) thread.join();
    }
    const int64_t memory_slots = top_ + c_.x[0];
    solution.curve_ms.assign(static_cast<size_t>(std::max<int64_t>(memory_slots, 0)) + 1, kInfinity);
    for (int64_t m = 0; m <= top_; ++m) solution.curve_ms[static_cast<size_t>(m + c_.x[0])] = Value(0, c_.length, m);
    solution.time_ms = Value(0, c_.length, top_);
    solution.feasible = solution.time_ms < kInfinity;
    if (program_ == Program::kExact) {
      solution.lower_bound_ms = solution.time_ms;
      solution.proven_optimal = true;
    } else {
      solution.band = band_;
    }
    if (solution.feasible && program_ != Program::kLower) ReadBack(top_, 0, c_.length, &solution.schedule);
    return solution;
  }

  size_t TableBytes() { return PlanTable() * sizeof(double) + cells_.size() * sizeof(Cell); }

  // The table's bytes known before Bounds: the band's cells at their exact
  // widths are not known yet, so every stored cell counts S + 1 memories.
  static size_t TableBytesBound(int length, int64_t top, int band, bool exact) {
    const double n = length + 1.0;
    const double k = exact ? n : std::min<double>(band, n);
    const double cells = exact ? n * (n + 1) / 2 : n * k + n;
    return static_cast<size_t>(std::min(cells * (static_cast<double>(top) + 1) * sizeof(double) + cells * sizeof(Cell), 1e18));
  }

 private:
  bool Stored(int i, int l) const { return l - i < band_ || l == c_.length; }
  size_t Index(int i, int l) const {
    return l - i < band_ ? static_cast<size_t>(i) * band_ + static_cast<size_t>(l - i)
                         : static_cast<size_t>(n_) * band_ + static_cast<size_t>(i);
  }
  Cell& at(int i, int l) { return cells_[Index(i, l)]; }
  const Cell& at(int i, int l) const { return cells_[Index(i, l)]; }

  int64_t CachedBaseMemory(int i) const { return base_memory_[static_cast<size_t>(i)]; }
  // Choice (b) on (i, l): stage i's backward with the gradients of i+1..l held.
  int64_t ChainNeed(int i, int l) const { return chain_need_[static_cast<size_t>(i)] + c_.GradBytes(i + 1, l); }
  int64_t Grads(int a, int b) const { return c_.GradBytes(a, b); }

  // A long segment (i, l), l - i >= band, of the banded programs, with
  // `segment` its sums. Its cost as the programs see it, as a function of
  // memory: up to two steps, each {from memory, cost}.
  struct Steps {
    int count = 0;
    int64_t from[2];
    double cost[2];
    /// Below from[0] and never smaller for a longer segment from the same
    /// stage: once it reaches a memory, no longer segment fits there either.
    int64_t rising_floor;
  };
  Steps LongSegment(int i, int l, const Segment& segment) const {
    Steps steps;
    const int64_t need_low = std::max(segment.floor, segment.base_max);
    // Exactly the memory from which the recurrence runs the segment without
    // recomputation (as Bounds' nr), never below its smallest memory.
    const int64_t no_recompute = std::max(
        need_low, std::max(c_.x[static_cast<size_t>(l) + 1] + segment.keep_floor, segment.keep_base) -
                      saved_prefix_[static_cast<size_t>(i)]);
    if (program_ == Program::kUpper) {
      // Every stage with autograd, kept until its backward.
      steps.count = 1;
      steps.from[0] = no_recompute;
      steps.cost[0] = segment.cost;
      steps.rising_floor = segment.keep_kept - saved_prefix_[static_cast<size_t>(i)];
    } else {
      // At least every stage once; below what no recomputation needs, at
      // least one forward more; infinite below a floor or base memory.
      steps.count = 2;
      steps.from[0] = need_low;
      steps.cost[0] = segment.cost + segment.forward_min;
      steps.from[1] = no_recompute;
      steps.cost[1] = segment.cost;
      steps.rising_floor = segment.kept_max;
    }
    return steps;
  }
  // Extends `segment` (i, l-1) to (i, l); start with Start(i).
  Segment Start(int i) const {
    Segment s;
    s.cost = c_.fwd[static_cast<size_t>(i)] + c_.bwd[static_cast<size_t>(i)];
    s.base_max = CachedBaseMemory(i);
    s.running = c_.x[static_cast<size_t>(i) + 1] + c_.fwd_tmp[static_cast<size_t>(i)];
    s.keep_base = saved_prefix_[static_cast<size_t>(i)] + CachedBaseMemory(i);
    return s;
  }
  void Extend(Segment* s, int i, int l) const {
    s->cost += c_.fwd[static_cast<size_t>(l)] + c_.bwd[static_cast<size_t>(l)];
    // Stage k's backward holds the gradients of k+1..l: kept as running
    // maxima without the prefix sum of gradients up to l+1, added back here.
    const int64_t grads_to = c_.grad_hi[static_cast<size_t>(l) + 1];
    s->kept_rel = std::max(s->kept_rel, chain_need_[static_cast<size_t>(l) - 1] - c_.grad_lo[static_cast<size_t>(l)]);
    s->kept_max = std::max<int64_t>(0, s->kept_rel + grads_to);
    s->base_max = std::max(s->kept_max, CachedBaseMemory(l));
    s->forward_min = std::min(s->forward_min, c_.fwd_nograd[static_cast<size_t>(l) - 1]);
    if (l - 1 > i) {
      const size_t k = static_cast<size_t>(l) - 1;
      s->running = std::max(s->running, c_.x[k] + c_.x[k + 1] + c_.fwd_tmp[k]);
    }
    s->floor = c_.x[static_cast<size_t>(l) + 1] + s->running;
    // Stage l-1's floor of (l-1, l) and its term in the floors of (k, l) for
    // k < l-1 (largest with k = l-2, the most kept before it); stage l's base.
    const size_t k = static_cast<size_t>(l) - 1;
    s->keep_floor = std::max(s->keep_floor, saved_prefix_[k] + c_.x[k + 1] + c_.fwd_tmp[k]);
    if (l - 1 > i) s->keep_floor = std::max(s->keep_floor, saved_prefix_[k - 1] + c_.x[k] + c_.x[k + 1] + c_.fwd_tmp[k]);
    s->keep_kept_rel = std::max(s->keep_kept_rel, saved_prefix_[k] + chain_need_[k] - c_.grad_lo[k + 1]);
    s->keep_kept = s->keep_kept_rel + grads_to;
    s->keep_base = std::max(s->keep_kept, saved_prefix_[static_cast<size_t>(l)] + CachedBaseMemory(l));
  }

  // Per cell: the smallest feasible memory (as MinimumMemory), the memory
  // from which the sub-chain needs no recomputation, and the cost there.
  void Bounds() {
    if (bounds_done_) return;
    bounds_done_ = true;
    std::vector<int64_t> mm(cells_.size()), nr(cells_.size());
    std::vector<double> nr_cost(cells_.size());
    auto idx = [this](int i, int l) { return Index(i, l); };
    for (int i = 0; i < n_; ++i) {
      mm[idx(i, i)] = nr[idx(i, i)] = CachedBaseMemory(i);
      nr_cost[idx(i, i)] = c_.fwd[static_cast<size_t>(i)] + c_.bwd[static_cast<size_t>(i)];
    }
    // floor(i, l) = x_{l+1} + max(x_{i+1} + fwd_tmp_i, max_{i<k<l} x_k + x_{k+1} + fwd_tmp_k)
    auto fill_floors = [&](int i) {
      int64_t running = c_.x[static_cast<size_t>(i) + 1] + c_.fwd_tmp[static_cast<size_t>(i)];
      for (int l = i + 1; l < n_; ++l) {
        if (l - 1 > i) {
          const size_t k = static_cast<size_t>(l) - 1;
          running = std::max(running, c_.x[k] + c_.x[k + 1] + c_.fwd_tmp[k]);
        }
        if (Stored(i, l)) mm[idx(i, l)] = c_.x[static_cast<size_t>(l) + 1] + running;  // the floor, for now
      }
    };
    auto finish = [&](int i, int l, int64_t best) {
      const int64_t floor = mm[idx(i, l)];
      const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
      mm[idx(i, l)] = std::max(floor, best);
      nr[idx(i, l)] = std::max({floor, ChainNeed(i, l), xbar + nr[idx(i + 1, l)]});
      nr_cost[idx(i, l)] = nr_cost[idx(i, i)] + nr_cost[idx(i + 1, l)];
    };
    for (int i = 0; i < n_; ++i) fill_floors(i);
    // The band: every cell (i, l) with l - i < band, all its leaves short.
    for (int d = 1; d < std::min(band_, n_); ++d) {
      for (int i = 0; i + d < n_; ++i) {
        const int l = i + d;
        const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
        int64_t best = std::max(ChainNeed(i, l), xbar + mm[idx(i + 1, l)]);
        for (int j = i + 1; j <= l; ++j) {
          best = std::min(best, std::max(c_.x[static_cast<size_t>(j)] + mm[idx(j, l)], Grads(j, l) + mm[idx(i, j - 1)]));
        }
        finish(i, l, best);
      }
    }
    // The suffixes (i, L) beyond the band, from the end.
    if (program_ != Program::kExact) {
      const int l = c_.length;
      for (int i = l - band_; i >= 0; --i) {
        const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
        int64_t best = std::max(ChainNeed(i, l), xbar + mm[idx(i + 1, l)]);
        Segment segment = Start(i);
        for (int j = i + 1; j <= l; ++j) {
          const int64_t right = c_.x[static_cast<size_t>(j)] + mm[idx(j, l)];
          if (j - 1 > i) Extend(&segment, i, j - 1);
          int64_t left;
          if (j - i <= band_) {
            left = mm[idx(i, j - 1)];
          } else {
            const Steps steps = LongSegment(i, j - 1, segment);
            if (steps.rising_floor >= best) break;  // no later j can lower best
            left = steps.from[0];
          }
          best = std::min(best, std::max(right, Grads(j, l) + left));
        }
        finish(i, l, best);
      }
    }
    minimum_ = mm[idx(0, c_.length)];
    for (int i = 0; i < n_; ++i) {
      double total = 0, smallest = kInfinity;
      for (int l = i; l < n_; ++l) {
        if (l > i) {
          total += c_.fwd[static_cast<size_t>(l) - 1] + c_.bwd[static_cast<size_t>(l) - 1];
          smallest = std::min(smallest, c_.fwd_nograd[static_cast<size_t>(l) - 1]);
        }
        if (!Stored(i, l)) continue;
        Cell& cell = at(i, l);
        cell.lo = std::min(mm[idx(i, l)], top_ + 1);
        cell.hi = top_ + 1;
        // Above nr the cost is the constant of choice (b) all the way down,
        // provided every leaf choice costs strictly more: each pays at least
        // one forward, which must stand clear of rounding.
        const bool shortcut = l == i || smallest > 1e-9 * (total + c_.bwd[static_cast<size_t>(l)] + 1e-300);
        if (shortcut) {
          cell.hi = std::max(cell.lo, std::min(nr[idx(i, l)], top_ + 1));
          cell.constant = nr_cost[idx(i, l)];
        }
      }
    }
  }

  double Value(int i, int l, int64_t m) const {
    const Cell& cell = at(i, l);
    if (m < cell.lo) return kInfinity;
    if (m >= cell.hi) return cell.constant;
    return values_[cell.offset + static_cast<size_t>(m - cell.lo)];
  }

  // The reference's choice at (m, i, l), from the stored values: the first j
  // whose leaf candidate is smallest, taken if not above the chain choice.
  // kLong + j: a long segment (banded, upper program) at j, run without
  // recomputation inside.
  static constexpr int kLong = 1 << 20;
  int Choice(int i, int l, int64_t m) const {
    double best_leaf = kInfinity;
    int best_j = -1;
    double forward_sum = 0;
    Segment segment = Start(i);
    for (int j = i + 1; j <= l; ++j) {
      forward_sum += c_.fwd_nograd[static_cast<size_t>(j) - 1];
      if (j - 1 > i) Extend(&segment, i, j - 1);
      const int64_t xj = c_.x[static_cast<size_t>(j)];
      if (m < xj) continue;
      const int64_t grads = Grads(j, l);  // held while the left part runs
      if (m < grads) continue;
      double left;
      int what = j;
      if (Stored(i, j - 1)) {
        left = Value(i, j - 1, m - grads);
      } else {
        const Steps steps = LongSegment(i, j - 1, segment);
        left = m - grads >= steps.from[0] ? steps.cost[0] : kInfinity;
        what = kLong + j;
      }
      const double value = forward_sum + Value(j, l, m - xj) + left;
      if (best_j < 0 || value < best_leaf) {
        best_leaf = value;
        best_j = what;
      }
    }
    double chain_value = kInfinity;
    const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
    if (m >= xbar && m >= ChainNeed(i, l)) {
      chain_value = (c_.fwd[static_cast<size_t>(i)] + c_.bwd[static_cast<size_t>(i)]) + Value(i + 1, l, m - xbar);
    }
    return best_j >= 0 && best_leaf <= chain_value ? best_j : kKeepStage;
  }

  void FillBase(int i) {
    Cell& cell = at(i, i);
    const double cost = c_.fwd[static_cast<size_t>(i)] + c_.bwd[static_cast<size_t>(i)];
    for (int64_t m = cell.lo; m < cell.hi; ++m) values_[cell.offset + static_cast<size_t>(m - cell.lo)] = cost;
  }

  // A view of a cell's values as a function of the caller's memory m, read
  // at m - shift: infinity below, the constant above, the array between.
  struct Operand {
    int64_t begin, end;  // caller memories read from the array: [begin, end)
    const double* data;  // the cell's values: value(m) = data[m - begin]
    double constant;
  };
  Operand View(int i, int l, int64_t shift) const {
    const Cell& cell = at(i, l);
    return {cell.lo + shift, cell.hi + shift, values_ + cell.offset, cell.constant};
  }

  void FillCell(int i, int l) {
    Cell& cell = at(i, l);
    if (cell.hi <= cell.lo) return;
    const int64_t lo = cell.lo, hi = cell.hi;
    double* best = values_ + cell.offset;  // best[m - lo], m in [lo, hi)

    // Choice (b) first: stage i kept with autograd, the rest below it.
    {
      const double own = c_.fwd[static_cast<size_t>(i)] + c_.bwd[static_cast<size_t>(i)];
      const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
      const Operand rest = View(i + 1, l, xbar);
      const int64_t from = std::clamp(std::max({xbar, ChainNeed(i, l), rest.begin}), lo, hi);
      const int64_t middle = std::clamp(rest.end, from, hi);
      for (int64_t m = lo; m < from; ++m) best[m - lo] = kInfinity;
      const double* r = rest.data + (from - rest.begin);
      double* out = best + (from - lo);
      for (int64_t k = 0; k < middle - from; ++k) out[k] = own + r[k];
      for (int64_t m = middle; m < hi; ++m) best[m - lo] = own + rest.constant;
    }

    // Every schedule of stages i..l runs each forward and backward at least
    // once: a leaf at j costs at least its extra forwards plus that.
    double total = 0;
    for (int k = i; k <= l; ++k) total += c_.fwd[static_cast<size_t>(k)] + c_.bwd[static_cast<size_t>(k)];
    const double margin = 1e-9 * total;

    struct Leaf {
      double forward_sum;
      int64_t begin;  // below it the candidate is infinite
      Operand a, b;
    };
    thread_local std::vector<Leaf> leaf_store;
    if (leaf_store.size() < static_cast<size_t>(2 * (l - i))) leaf_store.resize(static_cast<size_t>(2 * (l - i)));
    Leaf* const leaves = leaf_store.data();
    size_t leaf_count = 0;
    double forward_sum = 0;
    Segment segment = Start(i);
    for (int j = i + 1; j <= l; ++j) {
      forward_sum += c_.fwd_nograd[static_cast<size_t>(j) - 1];
      const Operand a = View(j, l, c_.x[static_cast<size_t>(j)]);
      if (program_ != Program::kExact && j - 1 > i) Extend(&segment, i, j - 1);
      const int64_t grads = Grads(j, l);  // the left part runs with these held
      if (Stored(i, j - 1)) {
        const Operand b = View(i, j - 1, grads);
        const int64_t begin = std::max({lo, a.begin, b.begin});
        if (begin < hi) leaves[leaf_count++] = {forward_sum, begin, a, b};  // else infinite here
      } else {
        // A long segment: its cost is a step function of memory, operands
        // with no array.
        const Steps steps = LongSegment(i, j - 1, segment);
        if (steps.rising_floor >= hi) break;  // this and every later leaf infinite here
        for (int s = 0; s < steps.count; ++s) {
          const Operand b = {steps.from[s] + grads, steps.from[s] + grads, values_, steps.cost[s]};
          const int64_t begin = std::max({lo, a.begin, b.begin});
          if (begin < hi) leaves[leaf_count++] = {forward_sum, begin, a, b};
        }
      }
    }

    // Memories in blocks, upwards. The optimum never grows with memory, so
    // the finished optimum just below a block bounds every memory in it; and
    // a leaf at j costs at least its extra forwards plus its two parts at
    // the block's largest memory (they never grow with memory either). A
    // leaf whose bound is above the optimum below the block cannot win in it.
    constexpr int64_t kBlock = 32;
    for (int64_t m0 = lo; m0 < hi; m0 += kBlock) {
      const int64_t m1 = std::min(hi, m0 + kBlock);
      const double ceiling = m0 > lo ? best[m0 - 1 - lo] + margin : kInfinity;
      const int64_t last = m1 - 1;
      for (size_t n = 0; n < leaf_count; ++n) {
        const Leaf& leaf = leaves[n];
        if (leaf.forward_sum + total - margin > ceiling) break;  // no later leaf either
        // The bound reads two scattered cells: fetch the next leaf's early,
        // and this leaf's for the next block.
        if (n + 2 < leaf_count) {
          const Leaf& ahead = leaves[n + 2];
          if (last >= ahead.a.begin && last < ahead.a.end) __builtin_prefetch(ahead.a.data + (last - ahead.a.begin));
          if (last >= ahead.b.begin && last < ahead.b.end) __builtin_prefetch(ahead.b.data + (last - ahead.b.begin));
        }
        {
          const int64_t next_last = std::min(hi, m1 + kBlock) - 1;
          if (next_last >= leaf.a.begin && next_last < leaf.a.end) __builtin_prefetch(leaf.a.data + (next_last - leaf.a.begin));
          if (next_last >= leaf.b.begin && next_last < leaf.b.end) __builtin_prefetch(leaf.b.data + (next_last - leaf.b.begin));
        }
        const int64_t begin = std::max(m0, leaf.begin);
        if (begin >= m1) continue;
        const Operand& a = leaf.a;
        const Operand& b = leaf.b;
        const double a_low = last < a.end ? a.data[last - a.begin] : a.constant;
        const double b_low = last < b.end ? b.data[last - b.begin] : b.constant;
        if ((leaf.forward_sum + a_low) + b_low > ceiling) continue;
        // Split [begin, m1) where either operand turns constant.
        int64_t cuts[4] = {begin, std::clamp(a.end, begin, m1), std::clamp(b.end, begin, m1), m1};
        if (cuts[1] > cuts[2]) std::swap(cuts[1], cuts[2]);
        for (int piece = 0; piece < 3; ++piece) {
          const int64_t from = cuts[piece], to = cuts[piece + 1];
          if (from >= to) continue;
          const bool a_array = from < a.end, b_array = from < b.end;
          double* bestp = best + (from - lo);
          if (a_array && b_array) {
            RelaxArrayArray(to - from, leaf.forward_sum, a.data + (from - a.begin), b.data + (from - b.begin), bestp);
          } else if (a_array) {
            RelaxArrayConst(to - from, leaf.forward_sum, a.data + (from - a.begin), b.constant, bestp);
          } else if (b_array) {
            RelaxConstArray(to - from, leaf.forward_sum + a.constant, b.data + (from - b.begin), bestp);
          } else {
            RelaxConst(to - from, (leaf.forward_sum + a.constant) + b.constant, bestp);
          }
        }
      }
    }
  }

  // Stages i..l with autograd, one after another, then their backwards: no
  // recomputation (choice (b) all the way down).
  void ReadBackNoRecompute(int i, int l, Schedule* out) const {
    for (int k = i; k < l; ++k) out->push_back({StepKind::kForwardGrad, k});
    ReadBackBase(l, out);
    for (int k = l - 1; k >= i; --k) out->push_back({StepKind::kBackward, k});
  }

  void ReadBackBase(int i, Schedule* out) const {
    if (i == c_.length) {
      out->push_back({StepKind::kLoss, i});
    } else {
      out->push_back({StepKind::kForwardGrad, i});
      out->push_back({StepKind::kBackward, i});
    }
  }

  void ReadBack(int64_t m, int i, int l, Schedule* out) const {
    // Iterative along choice (b) chains and right parts (a chain of
    // thousands of stages would otherwise recurse thousands deep).
    std::vector<int> pending_backward;
    while (true) {
      if (i == l) {
        ReadBackBase(i, out);
        break;
      }
      const int choice = Choice(i, l, m);
      if (choice == kKeepStage) {
        out->push_back({StepKind::kForwardGrad, i});
        pending_backward.push_back(i);
        m -= c_.xbar[static_cast<size_t>(i) + 1];
        ++i;
        continue;
      }
      const bool long_segment = choice >= kLong;
      const int j = long_segment ? choice - kLong : choice;
      out->push_back({StepKind::kForwardNoGradKeep, i});
      for (int k = i + 1; k < j; ++k) out->push_back({StepKind::kForwardNoGrad, k});
      ReadBack(m - c_.x[static_cast<size_t>(j)], j, l, out);
      if (long_segment) {
        ReadBackNoRecompute(i, j - 1, out);
        break;
      }
      m -= Grads(j, l);  // the left part, with the right part's gradients held
      l = j - 1;
    }
    for (auto k = pending_backward.rbegin(); k != pending_backward.rend(); ++k) {
      out->push_back({StepKind::kBackward, *k});
    }
  }

  const DiscreteChain& c_;
  const int64_t top_;
  int threads_;
  Program program_;
  SolverProgress progress_;
  int n_ = 0;
  int band_ = 0;
  std::vector<Cell> cells_;
  std::vector<int64_t> saved_prefix_;  // sum of xbar_{k+1} over stages k < index
  std::vector<int64_t> base_memory_;     // BaseMemory of every stage
  std::vector<int64_t> chain_need_;    // KeptStageMemory of every stage
  bool bounds_done_ = false;
  int64_t minimum_ = 0;
  std::vector<double> work_;           // per column, for progress
  double total_work_ = 0;
  double* values_ = nullptr;  // from the Arena, given back when done
  size_t stored_ = 0;
};

constexpr int FastSolver::kLong;

OptimalSolution NoMemory(int64_t memory_slots) {
  OptimalSolution none;
  none.curve_ms.assign(static_cast<size_t>(std::max<int64_t>(memory_slots, 0)) + 1, kInfinity);
  return none;
}

void CheckLength(const DiscreteChain& chain) {
  if (chain.length > kMaxStages) {
    throw BadInput("the chain has " + std::to_string(chain.length) + " stages; at most " +
                   std::to_string(kMaxStages) + " are supported");
  }
}

}  // namespace

OptimalSolution SolveOptimal(const DiscreteChain& chain, int64_t memory_slots, int threads,
                             const SolverProgress& progress) {
  CheckLength(chain);
  const int64_t top = memory_slots - chain.x[0];
  if (top < 0) return NoMemory(memory_slots);
  return FastSolver(chain, top, threads, 0, Program::kExact, progress).Solve();
}

size_t FastSolverTableBytes(const DiscreteChain& chain, int64_t memory_slots) {
  const int64_t top = memory_slots - chain.x[0];
  if (top < 0) return 0;
  if (ChooseSolver(chain.length, memory_slots) == SolverMethod::kExact) {
    return FastSolver(chain, top, 1, 0, Program::kExact, {}).TableBytes();
  }
  return FastSolver(chain, top, 1, kDefaultBand, Program::kUpper, {}).TableBytes();
}

SolverMethod ChooseSolver(int length, int64_t memory_slots) {
  if (length > kExactMaxStages) return SolverMethod::kBanded;
  const size_t bound = FastSolver::TableBytesBound(length, std::max<int64_t>(memory_slots, 0), 0, true);
  return bound <= kSolverTableLimitBytes ? SolverMethod::kExact : SolverMethod::kBanded;
}

size_t SolverTableBytes(const DiscreteChain& chain, int64_t memory_slots) {
  const int64_t top = memory_slots - chain.x[0];
  if (top < 0) return 0;
  if (ChooseSolver(chain.length, memory_slots) == SolverMethod::kExact) {
    return FastSolver::TableBytesBound(chain.length, top, 0, true);
  }
  // The band's widths from its bounds (O(L band^2 + L^2) integer work); the
  // suffixes at their exact widths too.
  return FastSolver(chain, top, 1, kDefaultBand, Program::kUpper, {}).TableBytes();
}

int64_t SolverMinimumMemory(const DiscreteChain& chain, SolverMethod method) {
  CheckLength(chain);
  if (method == SolverMethod::kExact) return MinimumMemory(chain);
  const int64_t huge = int64_t{1} << 60;
  return chain.x[0] + FastSolver(chain, huge, 1, kDefaultBand, Program::kUpper, {}).Minimum();
}

int64_t MinimumMemoryLowerBound(const DiscreteChain& chain, int band) {
  CheckLength(chain);
  const int64_t huge = int64_t{1} << 60;
  return chain.x[0] + FastSolver(chain, huge, 1, band, Program::kLower, {}).Minimum();
}

OptimalSolution SolveBanded(const DiscreteChain& chain, int64_t memory_slots, int band, const SolverProgress& progress) {
  CheckLength(chain);
  const int64_t top = memory_slots - chain.x[0];
  if (top < 0) return NoMemory(memory_slots);
  // The upper program (the plan) for the first half of the progress, the
  // lower one (the bound) for the second.
  SolverProgress half;
  if (progress) half = [&progress](double f) { progress(0.5 * f); };
  OptimalSolution upper = FastSolver(chain, top, 1, band, Program::kUpper, half).Solve();
  if (upper.band == 0) return upper;  // band > L: exact
  if (progress) half = [&progress](double f) { progress(0.5 + 0.5 * f); };
  OptimalSolution lower = FastSolver(chain, top, 1, band, Program::kLower, half).Solve();
  upper.lower_bound_ms = std::min(lower.time_ms, upper.time_ms);
  upper.proven_optimal = upper.feasible && lower.time_ms >= upper.time_ms;
  return upper;
}

void CheckSolverFits(const DiscreteChain& chain, int64_t memory_slots) {
  CheckLength(chain);
  const size_t bytes = SolverTableBytes(chain, memory_slots);
  if (bytes <= kSolverTableLimitBytes) return;
  char message[256];
  std::snprintf(message, sizeof(message),
                "the solver's table for %d stages at %lld memory slots needs %.2f GB, above the limit of %.2f GB: "
                "use fewer --slots",
                chain.length, static_cast<long long>(memory_slots), static_cast<double>(bytes) / 1e9,
                static_cast<double>(kSolverTableLimitBytes) / 1e9);
  throw BadInput(message);
}

OptimalSolution SolveChain(const DiscreteChain& chain, int64_t memory_slots, const SolverOptions& options) {
  CheckSolverFits(chain, memory_slots);
  if (ChooseSolver(chain.length, memory_slots) == SolverMethod::kExact) {
    return SolveOptimal(chain, memory_slots, options.threads, options.progress);
  }
  return SolveBanded(chain, memory_slots, kDefaultBand, options.progress);
}

}  // namespace ckplan
