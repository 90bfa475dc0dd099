#include "planner/solvers/discrete_chain.h"

#include <algorithm>

#include "planner/base/error.h"

namespace ckplan {

DiscreteChain Discretize(const Chain& chain, int64_t slot_bytes, bool round_up) {
  if (slot_bytes <= 0) throw Error(ExitCode::kInternal, "slot size must be positive");
  auto up = [slot_bytes, round_up](int64_t bytes) { return (bytes + (round_up ? slot_bytes - 1 : 0)) / slot_bytes; };
  const int length = chain.length();
  DiscreteChain d;
  d.length = length;
  d.x.resize(static_cast<size_t>(length) + 2, 0);
  d.xbar.resize(static_cast<size_t>(length) + 2, 0);
  for (int k = 0; k <= length + 1; ++k) d.x[static_cast<size_t>(k)] = up(chain.StageInputBytes(k));
  for (int k = 1; k <= length; ++k) d.xbar[static_cast<size_t>(k)] = up(chain.stages[static_cast<size_t>(k - 1)].saved_bytes);
  auto down = [slot_bytes, round_up](int64_t bytes) { return (bytes + (round_up ? 0 : slot_bytes - 1)) / slot_bytes; };
  int64_t grad_sum = 0;  // bytes
  d.grad_hi.push_back(0);
  d.grad_lo.push_back(0);
  for (const Stage& s : chain.stages) {
    d.grad.push_back(up(s.param_grad_bytes));
    d.grads_at_bwd_peak.push_back(up(chain.GradsAtBackwardPeakBytes(static_cast<int>(d.grads_at_bwd_peak.size()))));
    grad_sum += s.param_grad_bytes;
    d.grad_hi.push_back(up(grad_sum));
    d.grad_lo.push_back(down(grad_sum));
    d.fwd.push_back(s.fwd_ms);
    d.fwd_nograd.push_back(s.NoGradFwdMs());
    d.bwd.push_back(s.bwd_ms);
    d.fwd_tmp.push_back(up(s.fwd_tmp_bytes));
    d.bwd_tmp.push_back(up(s.bwd_tmp_bytes));
    const int64_t replay = chain.ExecutorBackwardBytes(static_cast<int>(d.executor_bwd.size()));
    d.executor_bwd.push_back(replay >= 0 ? up(replay) : -1);
  }
  d.fwd.push_back(0);
  d.fwd_nograd.push_back(0);
  d.bwd.push_back(chain.loss_bwd_ms);
  d.fwd_tmp.push_back(0);
  d.bwd_tmp.push_back(up(chain.loss_bwd_tmp_bytes));
  d.grad.push_back(0);
  d.grads_at_bwd_peak.push_back(0);
  d.executor_bwd.push_back(-1);
  d.grad_hi.push_back(d.grad_hi.back());
  d.grad_lo.push_back(d.grad_lo.back());
  return d;
}

int64_t FloorMemory(const DiscreteChain& c, int i, int l) {
  const size_t u = static_cast<size_t>(i);
  int64_t need = c.x[u + 1] + c.fwd_tmp[u];
  for (int k = i + 1; k < l; ++k) {
    const size_t v = static_cast<size_t>(k);
    need = std::max(need, c.x[v] + c.x[v + 1] + c.fwd_tmp[v]);
  }
  return c.x[static_cast<size_t>(l) + 1] + need;
}

int64_t BaseMemory(const DiscreteChain& c, int i) {
  // The simulator's forward with autograd: max(saved, output + transient),
  // the gradient of the output held.
  const size_t u = static_cast<size_t>(i);
  return std::max(KeptStageMemory(c, i), c.x[u + 1] + std::max(c.xbar[u + 1], c.x[u + 1] + c.fwd_tmp[u]));
}

int64_t KeptStageMemory(const DiscreteChain& c, int i) {
  const size_t u = static_cast<size_t>(i);
  // The stage's replay where the chain has it (Chain::ExecutorBackwardBytes): the
  // output's and the input's gradients, the transient and the stage's own
  // gradients as its ops make them, in place of each at its maximum.
  if (c.executor_bwd[u] >= 0) return c.xbar[u + 1] + c.executor_bwd[u];
  return c.x[u] + c.x[u + 1] + c.xbar[u + 1] + c.bwd_tmp[u] + c.grads_at_bwd_peak[u];
}

int64_t ChainMemory(const DiscreteChain& c, int i, int l) { return KeptStageMemory(c, i) + c.GradBytes(i + 1, l); }

int64_t MinimumMemory(const DiscreteChain& c) {
  // By growing l, and i down from l: mm(i, l) reads mm(j, l) (this column)
  // and mm(i, j - 1) (stored by rows in `row`, one after another).
  const int n = c.length + 1;
  std::vector<int64_t> row(static_cast<size_t>(n) * n, 0);   // row[i * n + l] = mm(i, l)
  auto at = [&](int i, int l) -> int64_t& { return row[static_cast<size_t>(i) * n + l]; };
  std::vector<int64_t> column(static_cast<size_t>(n), 0);    // mm(j, l) for the current l
  for (int l = 0; l < n; ++l) {
    at(l, l) = column[static_cast<size_t>(l)] = BaseMemory(c, l);
    // The floor of (i, l) as i goes down: x_{l+1} + max(x_{i+1} + fwd_tmp_i, max_{i<k<l} ...).
    int64_t inner = 0;  // max over i < k < l
    for (int i = l - 1; i >= 0; --i) {
      const size_t u = static_cast<size_t>(i);
      if (i + 1 < l) inner = std::max(inner, c.x[u + 1] + c.x[u + 2] + c.fwd_tmp[u + 1]);
      const int64_t floor = c.x[static_cast<size_t>(l) + 1] + std::max(c.x[u + 1] + c.fwd_tmp[u], inner);
      int64_t best = std::max(ChainMemory(c, i, l), c.xbar[u + 1] + column[u + 1]);
      const int64_t* left = &row[u * n];
      for (int j = i + 1; j <= l; ++j) {
        // The left part runs with the right part's parameter gradients held.
        best = std::min(best, std::max(c.x[static_cast<size_t>(j)] + column[static_cast<size_t>(j)],
                                       c.GradBytes(j, l) + left[j - 1]));
      }
      at(i, l) = column[u] = std::max(floor, best);
    }
  }
  return c.x[0] + at(0, c.length);
}

int64_t NoRecomputeMemory(const DiscreteChain& c) {
  // Always choosing (b): stage i with autograd, its saved values held below.
  int64_t need = BaseMemory(c, c.length);
  for (int i = c.length - 1; i >= 0; --i) {
    need = std::max({ChainMemory(c, i, c.length), FloorMemory(c, i, c.length),
                     c.xbar[static_cast<size_t>(i) + 1] + need});
  }
  return c.x[0] + need;
}

}  // namespace ckplan
