#pragma once
// Chains for the planner tests: the hand-checked 3-stage chain and random
// heterogeneous chains with fixed seeds.

#include <cstdint>
#include <random>

#include "planner/contracts/chain.h"

namespace ckplan::testing {

// x0 = 10; stages (out, saved, fwd_tmp, bwd_tmp, fwd, bwd):
// (20, 30, 4, 3, 1, 2), (5, 15, 2, 0, 3, 4), (8, 12, 1, 7, 5, 6); loss bwd 0.5, tmp 1.
inline Stage MakeStage(const char* name, double fwd, double bwd, int64_t out, int64_t saved, int64_t fwd_tmp,
                       int64_t bwd_tmp) {
  Stage s;
  s.name = name;
  s.fwd_ms = fwd;
  s.bwd_ms = bwd;
  s.out_bytes = out;
  s.saved_bytes = saved;
  s.fwd_tmp_bytes = fwd_tmp;
  s.bwd_tmp_bytes = bwd_tmp;
  return s;
}

inline Chain ThreeStageChain() {
  Chain c;
  c.input_bytes = 10;
  c.stages = {MakeStage("a", 1, 2, 20, 30, 4, 3), MakeStage("b", 3, 4, 5, 15, 2, 0), MakeStage("c", 5, 6, 8, 12, 1, 7)};
  c.loss_bwd_ms = 0.5;
  c.loss_bwd_tmp_bytes = 1;
  return c;
}

// Times and sizes drawn over two orders of magnitude (log-uniform).
inline Chain RandomChain(int length, uint32_t seed, int64_t size_scale = 1000000, bool with_tmp = true) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> log_range(0.0, 2.0);
  auto draw = [&](double scale) { return scale * std::pow(10.0, log_range(rng)); };
  Chain c;
  c.input_bytes = static_cast<int64_t>(draw(static_cast<double>(size_scale)));
  for (int i = 0; i < length; ++i) {
    Stage s;
    s.name = "s" + std::to_string(i);
    s.fwd_ms = draw(0.1);
    s.bwd_ms = s.fwd_ms * (1.0 + log_range(rng));
    s.out_bytes = static_cast<int64_t>(draw(static_cast<double>(size_scale)));
    s.saved_bytes = s.out_bytes + static_cast<int64_t>(draw(static_cast<double>(size_scale)));
    s.fwd_tmp_bytes = with_tmp ? static_cast<int64_t>(draw(static_cast<double>(size_scale) / 4)) : 0;
    s.bwd_tmp_bytes = with_tmp ? static_cast<int64_t>(draw(static_cast<double>(size_scale) / 4)) : 0;
    c.stages.push_back(s);
  }
  c.loss_bwd_ms = draw(0.01);
  c.loss_bwd_tmp_bytes = with_tmp ? static_cast<int64_t>(draw(static_cast<double>(size_scale) / 8)) : 0;
  return c;
}

// The same chain with forwards without autograd that cost less than with it
// (30% to 100% of fwd_ms, drawn with their own seed): recomputation then
// costs other than the first forward.
inline Chain WithNoGradForwards(Chain c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> fraction(0.3, 1.0);
  for (Stage& s : c.stages) s.fwd_nograd_ms = s.fwd_ms * fraction(rng);
  return c;
}

// Small integer sizes (the chain is its own slot grid): for brute force.
inline Chain SmallIntegerChain(int length, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> size(1, 6), tmp(0, 3), time(1, 9);
  Chain c;
  c.input_bytes = size(rng);
  for (int i = 0; i < length; ++i) {
    Stage s;
    s.name = "s" + std::to_string(i);
    s.fwd_ms = time(rng) * 0.25;
    s.bwd_ms = time(rng) * 0.5;
    s.out_bytes = size(rng);
    s.saved_bytes = s.out_bytes + size(rng) - 1;
    s.fwd_tmp_bytes = tmp(rng);
    s.bwd_tmp_bytes = tmp(rng);
    c.stages.push_back(s);
  }
  c.loss_bwd_ms = 0.125;
  c.loss_bwd_tmp_bytes = tmp(rng);
  return c;
}

// The same chain with parameter gradients (param_grad_bytes) drawn with their
// own seed, on about two stages in three, at `scale` times the sizes' range;
// some stages' backward peaks hold only part of them (param_grad_bwd_bytes).
inline Chain WithParamGrads(Chain c, uint32_t seed, int64_t scale = 1) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> size(0, 6), pick(0, 2);
  for (Stage& s : c.stages) {
    if (pick(rng) == 0) continue;
    s.param_grad_bytes = size(rng) * scale;
    if (pick(rng) == 0) s.param_grad_bwd_bytes = s.param_grad_bytes / 2;
  }
  return c;
}

// The same chain with each stage's backward replayed as the executor runs it
// (executor_bwd_peak_bytes, as a chain cut from a profile carries it) on about two stages in three,
// drawn with their own seed from 20% to 120% of the bound the stage gets
// without it (x_i + x_{i+1} + bwd_tmp_bytes + its gradients at that peak):
// a replay below that bound (its gradients and transients never all at
// their maxima at once) and, less often, above it.
inline Chain WithBackwardReplays(Chain c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> pick(0, 2), percent(20, 120);
  for (int i = 0; i < c.length(); ++i) {
    Stage& s = c.stages[static_cast<size_t>(i)];
    if (pick(rng) == 0) continue;
    const int64_t bound = c.StageInputBytes(i) + c.StageInputBytes(i + 1) + s.bwd_tmp_bytes + c.GradsAtBackwardPeakBytes(i);
    s.executor_bwd_peak_bytes = bound * percent(rng) / 100;
  }
  return c;
}

}  // namespace ckplan::testing
