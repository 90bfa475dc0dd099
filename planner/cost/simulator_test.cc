#include "planner/cost/simulator.h"

#include <doctest/doctest.h>

#include "tests/test_chains.h"
#include "planner/solvers/baselines.h"
#include "planner/base/error.h"

using namespace ckplan;

TEST_CASE("none on the 3-stage chain matches the hand calculation") {
  SimulationResult r = Simulate(testing::ThreeStageChain(), NoCheckpointSchedule(3));
  // Fe0 40, Fe1 55, Fe2 67, loss 76, B2 75+5+7 = 87, B1 80, B0 73.
  CHECK(r.peak_bytes == 87);
  CHECK(r.time_ms == doctest::Approx(21.5));
  CHECK(r.live_after_forward_bytes == 67);
  CHECK(r.peak_during_bytes == std::vector<int64_t>{40, 55, 67, 76, 87, 80, 73});
  CHECK(r.stored_after_bytes.back() == 10);  // the input's gradient
}

TEST_CASE("every on the 3-stage chain matches the hand calculation") {
  SimulationResult r = Simulate(testing::ThreeStageChain(), EveryNSchedule(3, 1));
  // Fck0 34, Fck1 37, Fck2 44, loss 52, Fe2 55, B2 67, Fe1 50, B1 70, Fe0 60, B0 73.
  CHECK(r.peak_during_bytes == std::vector<int64_t>{34, 37, 44, 52, 55, 67, 50, 70, 60, 73});
  CHECK(r.peak_bytes == 73);
  CHECK(r.time_ms == doctest::Approx(30.5));
  CHECK(r.live_after_forward_bytes == 43);
}

TEST_CASE("sqrt on the 3-stage chain uses segments of 2 and matches the hand calculation") {
  CHECK(SqrtSegmentLength(3) == 2);
  SimulationResult r = Simulate(testing::ThreeStageChain(), SqrtSchedule(3));
  // Fck0 34, Fn1 37, Fck2 24, loss 32, Fe2 35, B2 47, Fe0 45, Fe1 60, B1 80, B0 73.
  CHECK(r.peak_during_bytes == std::vector<int64_t>{34, 37, 24, 32, 35, 47, 45, 60, 80, 73});
  CHECK(r.peak_bytes == 80);
  CHECK(r.time_ms == doctest::Approx(30.5));
  CHECK(r.live_after_forward_bytes == 23);
}

TEST_CASE("the simulator rejects a schedule that reads a value it dropped") {
  Chain c = testing::ThreeStageChain();
  // fwd_nograd drops act[1]; the later fwd_grad 1 has nothing to read.
  Schedule s = {{StepKind::kForwardNoGradKeep, 0}, {StepKind::kForwardNoGrad, 1}, {StepKind::kForwardNoGradKeep, 2},
                {StepKind::kLoss, 3},             {StepKind::kForwardGrad, 2},   {StepKind::kBackward, 2},
                {StepKind::kForwardGrad, 1}};
  CHECK_THROWS_WITH_AS(Simulate(c, s), doctest::Contains("op 6 (fwd_grad 1): reads the input of stage 1"), Error);
}

TEST_CASE("the simulator rejects incomplete schedules, double backwards and stages out of range") {
  Chain c = testing::ThreeStageChain();
  Schedule no_backward = {{StepKind::kForwardGrad, 0}, {StepKind::kForwardGrad, 1}, {StepKind::kForwardGrad, 2},
                          {StepKind::kLoss, 3}, {StepKind::kBackward, 2}, {StepKind::kBackward, 1}};
  CHECK_THROWS_WITH_AS(Simulate(c, no_backward), doctest::Contains("no backward for stage 0"), Error);
  Schedule backward_first = {{StepKind::kForwardGrad, 0}, {StepKind::kBackward, 0}};
  CHECK_THROWS_WITH_AS(Simulate(c, backward_first), doctest::Contains("gradient of the output of stage 0"), Error);
  Schedule out_of_range = {{StepKind::kForwardGrad, 7}};
  CHECK_THROWS_WITH_AS(Simulate(c, out_of_range), doctest::Contains("stage out of range"), Error);
  Schedule no_loss = {{StepKind::kForwardGrad, 0}};
  CHECK_THROWS_WITH_AS(Simulate(c, no_loss), doctest::Contains("the loss never runs"), Error);
}

TEST_CASE("every-n covers every stage once in the backward for any n") {
  Chain c = testing::RandomChain(11, 7);
  for (int n = 1; n <= 12; ++n) {
    SimulationResult r = Simulate(c, EveryNSchedule(11, n));
    double expected = c.NoRecomputeTimeMs();
    for (int i = 0; i < 11; ++i) expected += c.stages[static_cast<size_t>(i)].fwd_ms;  // each stage recomputed once
    CHECK(r.time_ms == doctest::Approx(expected));
  }
  CHECK(Simulate(c, NoCheckpointSchedule(11)).time_ms == doctest::Approx(c.NoRecomputeTimeMs()));
}

TEST_CASE("a forward without autograd costs the stage's no-grad time, one with autograd its fwd_ms") {
  Chain c = testing::ThreeStageChain();
  c.stages[0].fwd_nograd_ms = 0.5;
  c.stages[1].fwd_nograd_ms = 1;
  c.stages[2].fwd_nograd_ms = 2;
  // every: each stage once without autograd (3.5), again with it (9), the
  // backwards (12) and the loss (0.5).
  CHECK(Simulate(c, EveryNSchedule(3, 1)).time_ms == doctest::Approx(25.0));
  // none runs every forward with autograd: the no-grad times do not count.
  CHECK(Simulate(c, NoCheckpointSchedule(3)).time_ms == doctest::Approx(21.5));
  CHECK(c.NoRecomputeTimeMs() == doctest::Approx(21.5));
}

TEST_CASE("a stage's backward replay takes the place of its boundary gradients and transient at their maxima") {
  Chain c = testing::ThreeStageChain();
  c.stages[2].executor_bwd_peak_bytes = 9;   // below its bound, 8 + 5 + 7 = 20
  c.stages[1].executor_bwd_peak_bytes = 30;  // above its bound, 5 + 20 + 0 = 25
  SimulationResult r = Simulate(c, NoCheckpointSchedule(3));
  // B2: stored 75 less its output's gradient 8 (the replay counts it), plus
  // 9; B1: 60 - 5 + 30; B0 as without a replay.
  CHECK(r.peak_during_bytes == std::vector<int64_t>{40, 55, 67, 76, 76, 85, 73});
  CHECK(r.peak_bytes == 85);
  // What stays after the backward (stage 1's 40 B of gradients, its input's
  // gradient, its saved values freed) is within its peak.
  c.stages[1].executor_bwd_peak_bytes = 0;
  c.stages[1].param_grad_bytes = 40;
  CHECK(c.ExecutorBackwardBytes(1) == 20 + 40 - 15);
  CHECK(c.ExecutorBackwardBytes(0) == -1);  // no replay: the bound
  r = Simulate(c, NoCheckpointSchedule(3));
  CHECK(r.peak_during_bytes[5] == 100);
  CHECK(r.stored_after_bytes[5] == 100);
}
