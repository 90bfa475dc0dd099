// The optimal persistent schedule, fast: the same recurrence and the same
// arithmetic as SolveOptimalReference (so the same optimum to the last digit
// and the same schedule), computed
//  - cell by cell, (i, l) by growing l - i, each cell for all its memories at
//    once, so the scan over j runs over contiguous memory and vectorises;
//  - only between the cell's smallest feasible memory and the memory above
//    which it needs no recomputation (its cost is then a constant);
//  - cells of one l - i in parallel (they do not depend on each other).

#include <algorithm>
#include <cmath>
#include <sys/mman.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>

#include "ckplan/planner/error.h"
#include "ckplan/planner/solver.h"

namespace ckplan {
namespace {

constexpr int16_t kChain = -1;  // what: choice (b)

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
  static double* Take(size_t count) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (cached_ != nullptr && cached_count_ >= count) {
      double* p = cached_;
      cached_ = nullptr;
      return p;
    }
    std::free(cached_);
    cached_ = nullptr;
    return Allocate(count);
  }
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
  static double* Allocate(size_t count) {
    constexpr size_t kHuge = size_t{2} << 20;
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

class FastSolver {
 public:
  FastSolver(const DiscreteChain& c, int64_t top, int threads) : c_(c), top_(top), threads_(std::max(1, threads)) {
    n_ = c.length + 1;
    cells_.resize(static_cast<size_t>(n_) * n_);
  }
  ~FastSolver() {
    if (values_ != nullptr) Arena::Give(values_, stored_);
  }
  FastSolver(const FastSolver&) = delete;
  FastSolver& operator=(const FastSolver&) = delete;

  size_t PlanTable() {
    Bounds();
    size_t total = 0;
    for (int i = 0; i < n_; ++i) {
      for (int l = i; l < n_; ++l) {
        Cell& cell = at(i, l);
        cell.offset = total;
        total += static_cast<size_t>(std::max<int64_t>(0, cell.hi - cell.lo));
      }
    }
    return total;
  }

  OptimalSolution Solve() {
    OptimalSolution solution;
    const size_t total = PlanTable();
    // Every stored entry is written by its cell before anything reads it.
    values_ = Arena::Take(total);
    stored_ = total;
    for (int i = 0; i < n_; ++i) FillBase(i);
    // Column by column (l = 1..L), rows from the diagonal up (i = l-1..0):
    // cell (i, l) reads cells (j, l) of its own column, just made and still
    // in cache, and cells (i, <l) of its row, which lie one after another.
    // With several threads, columns go round-robin and each waits only for
    // the cell to its left: a wavefront.
    std::vector<std::atomic<int>> done_down_to(static_cast<size_t>(n_));
    for (int l = 0; l < n_; ++l) done_down_to[static_cast<size_t>(l)].store(l, std::memory_order_relaxed);
    auto column = [this, &done_down_to](int l) {
      for (int i = l - 1; i >= 0; --i) {
        if (threads_ > 1) {
          const std::atomic<int>& left = done_down_to[static_cast<size_t>(l) - 1];
          while (left.load(std::memory_order_acquire) > i) std::this_thread::yield();
        }
        FillCell(i, l);
        done_down_to[static_cast<size_t>(l)].store(i, std::memory_order_release);
      }
    };
    if (threads_ == 1) {
      for (int l = 1; l < n_; ++l) column(l);
    } else {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads_; ++t) {
        pool.emplace_back([this, t, &column] {
          for (int l = 1 + t; l < n_; l += threads_) column(l);
        });
      }
      for (auto& thread : pool) thread.join();
    }
    const int64_t memory_slots = top_ + c_.x[0];
    solution.curve_ms.assign(static_cast<size_t>(std::max<int64_t>(memory_slots, 0)) + 1, kInfinity);
    for (int64_t m = 0; m <= top_; ++m) solution.curve_ms[static_cast<size_t>(m + c_.x[0])] = Value(0, c_.length, m);
    solution.time_ms = Value(0, c_.length, top_);
    solution.feasible = solution.time_ms < kInfinity;
    if (solution.feasible) ReadBack(top_, 0, c_.length, &solution.schedule);
    return solution;
  }

  size_t TableBytes() { return PlanTable() * sizeof(double) + cells_.size() * sizeof(Cell); }

 private:
  Cell& at(int i, int l) { return cells_[static_cast<size_t>(i) * n_ + l]; }
  const Cell& at(int i, int l) const { return cells_[static_cast<size_t>(i) * n_ + l]; }

  int64_t BaseNeed(int i) const { return BaseMemory(c_, i); }

  // Per cell: the smallest feasible memory (as MinimumMemory), the memory
  // from which the sub-chain needs no recomputation, and the cost there.
  void Bounds() {
    std::vector<int64_t> mm(cells_.size()), nr(cells_.size());
    std::vector<double> nr_cost(cells_.size());
    auto idx = [this](int i, int l) { return static_cast<size_t>(i) * n_ + l; };
    for (int i = 0; i < n_; ++i) {
      mm[idx(i, i)] = nr[idx(i, i)] = BaseNeed(i);
      nr_cost[idx(i, i)] = c_.fwd[static_cast<size_t>(i)] + c_.bwd[static_cast<size_t>(i)];
    }
    for (int i = 0; i < n_; ++i) {
      // floor(i, l) = x_{l+1} + max(x_{i+1} + fwd_tmp_i, max_{i<k<l} x_k + x_{k+1} + fwd_tmp_k)
      int64_t running = c_.x[static_cast<size_t>(i) + 1] + c_.fwd_tmp[static_cast<size_t>(i)];
      for (int l = i + 1; l < n_; ++l) {
        if (l - 1 > i) {
          const size_t k = static_cast<size_t>(l) - 1;
          running = std::max(running, c_.x[k] + c_.x[k + 1] + c_.fwd_tmp[k]);
        }
        mm[idx(i, l)] = c_.x[static_cast<size_t>(l) + 1] + running;  // the floor, for now
      }
    }
    for (int d = 1; d < n_; ++d) {
      for (int i = 0; i + d < n_; ++i) {
        const int l = i + d;
        const int64_t floor = mm[idx(i, l)];
        const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
        int64_t best = std::max(BaseNeed(i), xbar + mm[idx(i + 1, l)]);
        for (int j = i + 1; j <= l; ++j) {
          best = std::min(best, std::max(c_.x[static_cast<size_t>(j)] + mm[idx(j, l)], mm[idx(i, j - 1)]));
        }
        mm[idx(i, l)] = std::max(floor, best);
        nr[idx(i, l)] = std::max({floor, BaseNeed(i), xbar + nr[idx(i + 1, l)]});
        nr_cost[idx(i, l)] = nr_cost[idx(i, i)] + nr_cost[idx(i + 1, l)];
      }
    }
    for (int i = 0; i < n_; ++i) {
      double total = 0, smallest = kInfinity;
      for (int l = i; l < n_; ++l) {
        Cell& cell = at(i, l);
        cell.lo = std::min(mm[idx(i, l)], top_ + 1);
        cell.hi = top_ + 1;
        if (l > i) {
          total += c_.fwd[static_cast<size_t>(l) - 1] + c_.bwd[static_cast<size_t>(l) - 1];
          smallest = std::min(smallest, c_.fwd[static_cast<size_t>(l) - 1]);
        }
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
  int Choice(int i, int l, int64_t m) const {
    double best_leaf = kInfinity;
    int best_j = -1;
    double forward_sum = 0;
    for (int j = i + 1; j <= l; ++j) {
      forward_sum += c_.fwd[static_cast<size_t>(j) - 1];
      const int64_t xj = c_.x[static_cast<size_t>(j)];
      if (m < xj) continue;
      const double value = forward_sum + Value(j, l, m - xj) + Value(i, j - 1, m);
      if (best_j < 0 || value < best_leaf) {
        best_leaf = value;
        best_j = j;
      }
    }
    double chain_value = kInfinity;
    const int64_t xbar = c_.xbar[static_cast<size_t>(i) + 1];
    if (m >= xbar) chain_value = Value(i, i, m) + Value(i + 1, l, m - xbar);
    return best_j >= 0 && best_leaf <= chain_value ? best_j : kChain;
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
      const int64_t from = std::clamp(std::max({xbar, BaseNeed(i), rest.begin}), lo, hi);
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
    thread_local std::vector<Leaf> leaves;
    leaves.clear();
    double forward_sum = 0;
    for (int j = i + 1; j <= l; ++j) {
      forward_sum += c_.fwd[static_cast<size_t>(j) - 1];
      const Operand a = View(j, l, c_.x[static_cast<size_t>(j)]);
      const Operand b = View(i, j - 1, 0);
      leaves.push_back({forward_sum, std::max({lo, a.begin, b.begin}), a, b});
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
      for (size_t n = 0; n < leaves.size(); ++n) {
        const Leaf& leaf = leaves[n];
        if (leaf.forward_sum + total - margin > ceiling) break;  // no later leaf either
        // The bound reads two scattered cells: fetch the next leaf's early.
        if (n + 2 < leaves.size()) {
          const Leaf& ahead = leaves[n + 2];
          if (last >= ahead.a.begin && last < ahead.a.end) __builtin_prefetch(ahead.a.data + (last - ahead.a.begin));
          if (last >= ahead.b.begin && last < ahead.b.end) __builtin_prefetch(ahead.b.data + (last - ahead.b.begin));
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
          const double* ap = a.data + (from - a.begin);
          const double* bp = b.data + (from - b.begin);
          double* bestp = best + (from - lo);
          if (a_array && b_array) {
            RelaxArrayArray(to - from, leaf.forward_sum, ap, bp, bestp);
          } else if (a_array) {
            RelaxArrayConst(to - from, leaf.forward_sum, ap, b.constant, bestp);
          } else if (b_array) {
            RelaxConstArray(to - from, leaf.forward_sum + a.constant, bp, bestp);
          } else {
            RelaxConst(to - from, (leaf.forward_sum + a.constant) + b.constant, bestp);
          }
        }
      }
    }
  }

  void ReadBack(int64_t m, int i, int l, Schedule* out) const {
    if (i == l) {
      if (i == c_.length) {
        out->push_back({OpKind::kLoss, i});
      } else {
        out->push_back({OpKind::kForwardGrad, i});
        out->push_back({OpKind::kBackward, i});
      }
      return;
    }
    const int choice = Choice(i, l, m);
    if (choice == kChain) {
      out->push_back({OpKind::kForwardGrad, i});
      ReadBack(m - c_.xbar[static_cast<size_t>(i) + 1], i + 1, l, out);
      out->push_back({OpKind::kBackward, i});
    } else {
      const int j = choice;
      out->push_back({OpKind::kForwardKeepInput, i});
      for (int k = i + 1; k < j; ++k) out->push_back({OpKind::kForwardNoGrad, k});
      ReadBack(m - c_.x[static_cast<size_t>(j)], j, l, out);
      ReadBack(m, i, j - 1, out);
    }
  }

  const DiscreteChain& c_;
  const int64_t top_;
  const int threads_;
  int n_ = 0;
  std::vector<Cell> cells_;
  double* values_ = nullptr;  // from the Arena, given back when done
  size_t stored_ = 0;
};

}  // namespace

OptimalSolution SolveOptimal(const DiscreteChain& chain, int64_t memory_slots, int threads) {
  if (chain.length + 1 > 32000) throw BadInput("chains of more than 32000 stages are not supported");
  const int64_t top = memory_slots - chain.x[0];
  if (top < 0) {
    OptimalSolution none;
    none.curve_ms.assign(static_cast<size_t>(std::max<int64_t>(memory_slots, 0)) + 1, kInfinity);
    return none;
  }
  return FastSolver(chain, top, threads).Solve();
}

size_t FastSolverTableBytes(const DiscreteChain& chain, int64_t memory_slots) {
  const int64_t top = memory_slots - chain.x[0];
  if (top < 0) return 0;
  return FastSolver(chain, top, 1).TableBytes();
}

}  // namespace ckplan
