#include "planner/solvers/pipeline.h"

#include <algorithm>
#include <functional>
#include <map>
#include <tuple>

#include "planner/base/error.h"
#include "planner/cost/simulator.h"

namespace ckplan {

const char* PipelineScheduleName(PipelineSchedule schedule) {
  return schedule == PipelineSchedule::kGPipe ? "gpipe" : "1f1b";
}

PipelineSchedule ParsePipelineSchedule(const std::string& name) {
  if (name == "1f1b") return PipelineSchedule::kOneFOneB;
  if (name == "gpipe") return PipelineSchedule::kGPipe;
  throw BadInput("unknown --schedule '" + name + "' (use 1f1b or gpipe)");
}

int MicrobatchesInFlight(PipelineSchedule schedule, int stage, int stages, int microbatches) {
  if (schedule == PipelineSchedule::kGPipe) return microbatches;
  return std::max(1, std::min(stages - stage, microbatches));
}

namespace {

size_t U(int64_t k) { return static_cast<size_t>(k); }

double LeafTime(const DiscreteChain& c, int i) { return c.fwd[U(i)] + c.bwd[U(i)]; }

// The plain recurrence's table over every (m, i, l), with its choices.
struct Table {
  int n = 0;
  int64_t top = -1;
  std::vector<double> opt;
  std::vector<int32_t> what;  // j > 0: leaf at j; -1: chain
  std::vector<int64_t> floor;  // FloorMemory(i, l) at i * n + l, computed once
  int64_t Floor(int i, int l) const { return floor[U(i) * U(n) + U(l)]; }
  size_t Index(int64_t m, int i, int l) const { return (U(m) * U(n) + U(i)) * U(n) + U(l); }
  double At(int64_t m, int i, int l) const { return m < 0 || m > top ? kInfinity : opt[Index(m, i, l)]; }
};

Table BuildTable(const DiscreteChain& c, int64_t top) {
  Table t;
  t.n = c.length + 1;
  t.top = top;
  const int n = t.n;
  t.floor.assign(U(n) * U(n), 0);
  for (int i = 0; i < n; ++i) {
    for (int l = i + 1; l < n; ++l) t.floor[U(i) * U(n) + U(l)] = FloorMemory(c, i, l);
  }
  if (top < 0) return t;
  t.opt.assign(U(top + 1) * U(n) * U(n), kInfinity);
  t.what.assign(t.opt.size(), 0);
  for (int64_t m = 0; m <= top; ++m) {
    for (int i = 0; i < n; ++i) {
      if (m >= BaseMemory(c, i)) t.opt[t.Index(m, i, i)] = LeafTime(c, i);
    }
    for (int d = 1; d < n; ++d) {
      for (int i = 0; i + d < n; ++i) {
        const int l = i + d;
        if (m < t.Floor(i, l)) continue;
        double best = kInfinity;
        int best_j = 0;
        double forward_sum = 0;
        for (int j = i + 1; j <= l; ++j) {
          forward_sum += c.fwd[U(j) - 1];
          if (m < c.x[U(j)]) continue;
          double value = forward_sum + t.opt[t.Index(m - c.x[U(j)], j, l)] + t.opt[t.Index(m, i, j - 1)];
          if (value < best) {
            best = value;
            best_j = j;
          }
        }
        const int64_t xbar = c.xbar[U(i) + 1];
        double chain_value = m >= xbar ? t.opt[t.Index(m, i, i)] + t.opt[t.Index(m - xbar, i + 1, l)] : kInfinity;
        if (best_j > 0 && best <= chain_value) {
          t.opt[t.Index(m, i, l)] = best;
          t.what[t.Index(m, i, l)] = best_j;
        } else {
          t.opt[t.Index(m, i, l)] = chain_value;
          t.what[t.Index(m, i, l)] = -1;
        }
      }
    }
  }
  return t;
}

void ReadBack(const DiscreteChain& c, const Table& t, int64_t m, int i, int l, Schedule& out) {
  if (i == l) {
    if (i == c.length) {
      out.push_back({StepKind::kLoss, i});
    } else {
      out.push_back({StepKind::kForwardGrad, i});
      out.push_back({StepKind::kBackward, i});
    }
    return;
  }
  const int choice = t.what[t.Index(m, i, l)];
  if (choice < 0) {
    out.push_back({StepKind::kForwardGrad, i});
    ReadBack(c, t, m - c.xbar[U(i) + 1], i + 1, l, out);
    out.push_back({StepKind::kBackward, i});
  } else {
    out.push_back({StepKind::kForwardNoGradKeep, i});
    for (int k = i + 1; k < choice; ++k) out.push_back({StepKind::kForwardNoGrad, k});
    ReadBack(c, t, m - c.x[U(choice)], choice, l, out);
    ReadBack(c, t, m, i, choice - 1, out);
  }
}

// A schedule of the recurrence as a tree: its time, its need (the smallest m
// for which the recurrence accepts it on (i, l)) and what its first-descent
// path stores (chain input excluded).
struct Summary {
  double time_ms = 0;
  int64_t need = 0;
  int64_t stored = 0;
};

// Need and stored of a schedule given as a list of operations, parsed back
// into the recurrence's tree. `pos` advances over `schedule`.
Summary Summarize(const DiscreteChain& c, const Schedule& s, size_t& pos, int i, int l) {
  const ScheduleStep op = s.at(pos);
  if (i == l) {
    pos += i == c.length ? 1 : 2;
    return {LeafTime(c, i), BaseMemory(c, i), 0};
  }
  if (op.kind == StepKind::kForwardGrad) {
    ++pos;
    const int64_t xbar = c.xbar[U(i) + 1];
    Summary right = Summarize(c, s, pos, i + 1, l);
    ++pos;  // bwd i
    return {LeafTime(c, i) + right.time_ms,
            std::max({FloorMemory(c, i, l), BaseMemory(c, i), xbar + right.need}), xbar + right.stored};
  }
  int j = i + 1;
  double forward_sum = c.fwd[U(i)];
  ++pos;
  while (pos < s.size() && s[pos].kind == StepKind::kForwardNoGrad) {
    forward_sum += c.fwd[U(s[pos].stage)];
    ++pos;
    ++j;
  }
  Summary right = Summarize(c, s, pos, j, l);
  Summary left = Summarize(c, s, pos, i, j - 1);
  return {forward_sum + right.time_ms + left.time_ms,
          std::max({FloorMemory(c, i, l), c.x[U(j)] + right.need, left.need}), c.x[U(j)] + right.stored};
}

}  // namespace

InFlightSolution SolveInFlight(const DiscreteChain& c, int64_t memory_slots, int in_flight) {
  InFlightSolution best;
  const int L = c.length;
  const int64_t x0 = c.x[0];
  const int64_t others = std::max(0, in_flight - 1);
  const Table table = BuildTable(c, memory_slots - x0);
  if (table.top < 0) return best;
  // a: the stored-after-forward allowed (chain input included).
  const int64_t a_max = others == 0 ? memory_slots : memory_slots / (others + 1);
  std::vector<double> spine;
  std::vector<int32_t> spine_what;
  for (int64_t a = others == 0 ? memory_slots : x0; a <= a_max; ++a) {
    const int64_t total = memory_slots - others * a;  // M'
    const int64_t top = total - x0;
    if (top < 0) break;
    const int64_t lo = std::max<int64_t>(0, total - a);  // m at the loss: stored = total - m <= a
    const int64_t width = top - lo + 1;
    if (width <= 0) continue;
    spine.assign(U(width) * U(L + 1), kInfinity);
    spine_what.assign(spine.size(), 0);
    auto at = [&](int64_t m, int i) -> size_t { return U(m - lo) * U(L + 1) + U(i); };
    for (int64_t m = lo; m <= top; ++m) {
      spine[at(m, L)] = table.At(m, L, L);
      for (int i = L - 1; i >= 0; --i) {
        if (m < table.Floor(i, L)) continue;
        double value_best = kInfinity;
        int best_j = 0;
        double forward_sum = 0;
        for (int j = i + 1; j <= L; ++j) {
          forward_sum += c.fwd[U(j) - 1];
          const int64_t rest = m - c.x[U(j)];
          if (rest < lo) continue;
          double value = forward_sum + spine[at(rest, j)] + table.At(m, i, j - 1);
          if (value < value_best) {
            value_best = value;
            best_j = j;
          }
        }
        const int64_t rest = m - c.xbar[U(i) + 1];
        double chain_value = rest >= lo ? table.At(m, i, i) + spine[at(rest, i + 1)] : kInfinity;
        if (best_j > 0 && value_best <= chain_value) {
          spine[at(m, i)] = value_best;
          spine_what[at(m, i)] = best_j;
        } else {
          spine[at(m, i)] = chain_value;
          spine_what[at(m, i)] = -1;
        }
      }
    }
    const double time = spine[at(top, 0)];
    if (!(time < best.time_ms)) continue;
    best.feasible = true;
    best.time_ms = time;
    best.schedule.clear();
    // Read the first-descent path from the spine table, the rest from the plain one.
    std::function<void(int64_t, int)> read_spine = [&](int64_t m, int i) {
      if (i == L) {
        best.schedule.push_back({StepKind::kLoss, L});
        return;
      }
      const int choice = spine_what[at(m, i)];
      if (choice < 0) {
        best.schedule.push_back({StepKind::kForwardGrad, i});
        read_spine(m - c.xbar[U(i) + 1], i + 1);
        best.schedule.push_back({StepKind::kBackward, i});
      } else {
        best.schedule.push_back({StepKind::kForwardNoGradKeep, i});
        for (int k = i + 1; k < choice; ++k) best.schedule.push_back({StepKind::kForwardNoGrad, k});
        read_spine(m - c.x[U(choice)], choice);
        ReadBack(c, table, m, i, choice - 1, best.schedule);
      }
    };
    read_spine(top, 0);
    size_t pos = 0;
    Summary summary = Summarize(c, best.schedule, pos, 0, L);
    best.stored_after_forward = x0 + summary.stored;
    best.need = x0 + summary.need;
  }
  return best;
}

InFlightSolution BruteForceInFlight(const DiscreteChain& c, int64_t memory_slots, int in_flight) {
  struct Tree {
    Summary summary;
    Schedule schedule;
  };
  std::map<std::pair<int, int>, std::vector<Tree>> memo;
  std::function<const std::vector<Tree>&(int, int)> all = [&](int i, int l) -> const std::vector<Tree>& {
    auto key = std::make_pair(i, l);
    auto found = memo.find(key);
    if (found != memo.end()) return found->second;
    std::vector<Tree> trees;
    if (i == l) {
      Tree t;
      t.summary = {LeafTime(c, i), BaseMemory(c, i), 0};
      // push_back, not assignment from a list: GCC 12 warns falsely (-Wnonnull) on the latter.
      if (i == c.length) {
        t.schedule.push_back({StepKind::kLoss, i});
      } else {
        t.schedule.push_back({StepKind::kForwardGrad, i});
        t.schedule.push_back({StepKind::kBackward, i});
      }
      trees.push_back(t);
    } else {
      const int64_t floor = FloorMemory(c, i, l);
      const int64_t xbar = c.xbar[U(i) + 1];
      for (const Tree& right : all(i + 1, l)) {
        Tree t;
        t.summary = {LeafTime(c, i) + right.summary.time_ms,
                     std::max({floor, BaseMemory(c, i), xbar + right.summary.need}), xbar + right.summary.stored};
        t.schedule.push_back({StepKind::kForwardGrad, i});
        t.schedule.insert(t.schedule.end(), right.schedule.begin(), right.schedule.end());
        t.schedule.push_back({StepKind::kBackward, i});
        trees.push_back(std::move(t));
      }
      double forward_sum = 0;
      for (int j = i + 1; j <= l; ++j) {
        forward_sum += c.fwd[U(j) - 1];
        for (const Tree& right : all(j, l)) {
          for (const Tree& left : all(i, j - 1)) {
            Tree t;
            t.summary = {forward_sum + right.summary.time_ms + left.summary.time_ms,
                         std::max({floor, c.x[U(j)] + right.summary.need, left.summary.need}),
                         c.x[U(j)] + right.summary.stored};
            t.schedule.push_back({StepKind::kForwardNoGradKeep, i});
            for (int k = i + 1; k < j; ++k) t.schedule.push_back({StepKind::kForwardNoGrad, k});
            t.schedule.insert(t.schedule.end(), right.schedule.begin(), right.schedule.end());
            t.schedule.insert(t.schedule.end(), left.schedule.begin(), left.schedule.end());
            trees.push_back(std::move(t));
          }
        }
      }
    }
    return memo[key] = std::move(trees);
  };
  InFlightSolution best;
  const int64_t x0 = c.x[0];
  for (const Tree& t : all(0, c.length)) {
    const int64_t stored = x0 + t.summary.stored;
    const int64_t need = x0 + t.summary.need;
    if (need + std::max(0, in_flight - 1) * stored > memory_slots) continue;
    if (t.summary.time_ms < best.time_ms) {
      best.feasible = true;
      best.time_ms = t.summary.time_ms;
      best.schedule = t.schedule;
      best.stored_after_forward = stored;
      best.need = need;
    }
  }
  return best;
}

Chain SubChain(const Chain& chain, int first, int last) {
  Chain sub;
  sub.input_bytes = chain.StageInputBytes(first);
  // Storages (shared between cuts) carry over: the input's are those crossing the cut before `first`.
  if (chain.has_storages()) {
    sub.input_storages = first == 0 ? chain.input_storages : chain.stages[U(first) - 1].out_storages;
  }
  for (int k = first; k < last; ++k) sub.stages.push_back(chain.stages[U(k)]);
  if (last == chain.length()) {
    sub.loss_bwd_ms = chain.loss_bwd_ms;
    sub.loss_bwd_tmp_bytes = chain.loss_bwd_tmp_bytes;
    sub.module_loss_bwd_ms = chain.module_loss_bwd_ms;
    sub.output_held_bytes = chain.output_held_bytes;  // the training loop holds the model's output
    if (chain.output_kept_stage && *chain.output_kept_stage >= first) {
      sub.output_kept_bytes = chain.output_kept_bytes;
      sub.output_kept_stage = *chain.output_kept_stage - first;
    }
  }
  // What the PyTorch target reads of a wrapped module, all of it (its
  // modules are the chain's: the entries of other stages' modules are never
  // looked up).
  sub.pytorch = chain.pytorch;
  return sub;
}

namespace {

PipelineStagePlan PlanStage(const Chain& chain, int first, int last, int in_flight, int64_t budget_bytes, int slots,
                            int64_t fixed_bytes, int64_t end_bytes) {
  PipelineStagePlan plan;
  plan.first = first;
  plan.last = last;
  plan.in_flight = in_flight;
  plan.fixed_bytes = fixed_bytes;
  plan.activation_budget_bytes = budget_bytes - fixed_bytes;
  if (plan.activation_budget_bytes <= 0 || end_bytes > budget_bytes) return plan;
  plan.slot_bytes = std::max<int64_t>(1, plan.activation_budget_bytes / slots);
  Chain sub = SubChain(chain, first, last);
  DiscreteChain d = Discretize(sub, plan.slot_bytes);
  plan.solution = SolveInFlight(d, plan.activation_budget_bytes / plan.slot_bytes, in_flight);
  if (!plan.solution.feasible) return plan;
  SimulationResult sim = Simulate(sub, plan.solution.schedule);
  plan.time_ms = sim.time_ms;
  plan.stored_after_forward_bytes = sim.live_after_forward_bytes;
  plan.peak_bytes = std::max(fixed_bytes + (in_flight - 1) * sim.live_after_forward_bytes + sim.peak_bytes, end_bytes);
  if (plan.peak_bytes > budget_bytes) {
    throw Error(ExitCode::kVerifyFailed, "pipeline stage plan for chain stages " + std::to_string(first) + ".." +
                                             std::to_string(last - 1) + " exceeds its budget in the simulator");
  }
  return plan;
}

PipelinePlan SplitAt(const Chain& chain, int stages, int microbatches, PipelineSchedule schedule,
                     int64_t budget_bytes, int slots, const std::function<int64_t(int, int)>& stage_fixed_bytes,
                     const std::function<int64_t(int, int)>& stage_end_bytes) {
  const int L = chain.length();
  std::map<std::tuple<int, int, int>, PipelineStagePlan> cache;
  auto stage_plan = [&](int s, int first, int last) -> const PipelineStagePlan& {
    const int k = MicrobatchesInFlight(schedule, s, stages, microbatches);
    auto key = std::make_tuple(first, last, k);
    auto found = cache.find(key);
    if (found != cache.end()) return found->second;
    const int64_t fixed = stage_fixed_bytes(first, last);
    const int64_t end = stage_end_bytes ? stage_end_bytes(first, last) : fixed;
    return cache[key] = PlanStage(chain, first, last, k, budget_bytes, slots, fixed, end);
  };
  // best[s][a]: the slowest time of stages s..P-1 covering chain stages a..L-1.
  std::vector<std::vector<double>> best(U(stages) + 1, std::vector<double>(U(L) + 1, kInfinity));
  std::vector<std::vector<int>> cut(U(stages) + 1, std::vector<int>(U(L) + 1, -1));
  best[U(stages)][U(L)] = 0;
  for (int s = stages - 1; s >= 0; --s) {
    for (int a = s; a <= L - (stages - s); ++a) {
      // Pruning that keeps the optimum: a stage's time is at least its
      // stages' forward and backward once (growing with b), and a split whose
      // later stages are already as slow as the best found cannot win.
      double no_recompute = 0;
      for (int b = a + 1; b <= L - (stages - 1 - s); ++b) {
        const Stage& added = chain.stages[U(b) - 1];
        no_recompute += added.fwd_ms + added.bwd_ms;
        if (no_recompute >= best[U(s)][U(a)]) break;
        if (best[U(s) + 1][U(b)] >= best[U(s)][U(a)]) continue;
        const PipelineStagePlan& p = stage_plan(s, a, b);
        if (!p.solution.feasible) continue;
        double value = std::max(p.time_ms, best[U(s) + 1][U(b)]);
        if (value < best[U(s)][U(a)]) {
          best[U(s)][U(a)] = value;
          cut[U(s)][U(a)] = b;
        }
      }
    }
  }
  PipelinePlan plan;
  plan.slowest_stage_ms = best[0][0];
  plan.feasible = plan.slowest_stage_ms < kInfinity;
  if (!plan.feasible) return plan;
  for (int s = 0, a = 0; s < stages; ++s) {
    const int b = cut[U(s)][U(a)];
    plan.stages.push_back(stage_plan(s, a, b));
    a = b;
  }
  return plan;
}

}  // namespace

PipelinePlan PlanPipeline(const Chain& chain, int stages, int microbatches, PipelineSchedule schedule,
                          int64_t budget_bytes, int slots, const std::function<int64_t(int, int)>& stage_fixed_bytes,
                          const std::function<int64_t(int, int)>& stage_end_bytes) {
  if (stages < 1) throw BadInput("invalid --pipeline " + std::to_string(stages) + ": must be at least 1");
  if (microbatches < 1) throw BadInput("invalid --microbatches " + std::to_string(microbatches) + ": must be at least 1");
  if (stages > chain.length()) {
    throw BadInput("invalid --pipeline " + std::to_string(stages) + ": the chain has " + std::to_string(chain.length()) +
                   " stages, so at most --pipeline " + std::to_string(chain.length()));
  }
  PipelinePlan plan = SplitAt(chain, stages, microbatches, schedule, budget_bytes, slots, stage_fixed_bytes, stage_end_bytes);
  if (plan.feasible) return plan;
  // The smallest budget that works: double, then bisect (feasibility grows with the budget up to slot rounding).
  int64_t high = std::max<int64_t>(budget_bytes, 1024);
  int rounds = 0;
  while (!SplitAt(chain, stages, microbatches, schedule, high, slots, stage_fixed_bytes, stage_end_bytes).feasible) {
    if (++rounds > 60 || high > (int64_t{1} << 56)) return plan;
    high *= 2;
  }
  int64_t low = budget_bytes;
  while (high - low > std::max<int64_t>(1, high / 2000)) {
    int64_t mid = low + (high - low) / 2;
    if (SplitAt(chain, stages, microbatches, schedule, mid, slots, stage_fixed_bytes, stage_end_bytes).feasible) {
      high = mid;
    } else {
      low = mid;
    }
  }
  plan.min_budget_bytes = high;
  return plan;
}

}  // namespace ckplan
