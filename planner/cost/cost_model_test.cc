#include "planner/cost/cost_model.h"

#include <doctest/doctest.h>

#include <cmath>

#include "planner/base/error.h"
#include "planner/cost/gpu_table.h"
#include "planner/contracts/profile.h"

using namespace ckplan;

namespace {

// A profile of one op with the given kind, arguments and one output.
Profile OneOp(const std::string& kind, std::vector<ArgRecord> args, std::vector<int64_t> out_shape,
              const std::string& dtype = "float32", bool view = false) {
  Profile p;
  TensorRecord in;
  in.id = 0;
  in.shape = args.empty() ? std::vector<int64_t>{1} : args[0].shape;
  in.dtype = dtype;
  in.storage = 0;
  p.tensors.push_back(in);
  TensorRecord out;
  out.id = 1;
  out.shape = out_shape;
  out.dtype = dtype;
  out.producer = 0;
  out.requires_grad = true;
  out.storage = view ? 0 : 1;
  p.tensors.push_back(out);
  OpRecord op;
  op.kind = kind;
  op.inputs = {0};
  op.outputs = {1};
  op.args = std::move(args);
  p.ops.push_back(op);
  return p;
}

}  // namespace

TEST_CASE("FLOPs of a linear layer: 2 M N K forward, twice that backward") {
  Profile p = OneOp("aten::linear", {{{8, 16, 64}, "Float"}, {{128, 64}, "Float"}, {{128}, "Float"}}, {8, 16, 128});
  OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(w.op_class == OpClass::kMatmul);
  CHECK(w.fwd_flops == doctest::Approx(2.0 * 8 * 16 * 64 * 128));
  CHECK(w.bwd_flops == doctest::Approx(2 * w.fwd_flops));
  // Bytes: the input, weight and bias read, the output written.
  CHECK(w.fwd_bytes == doctest::Approx(4.0 * (8 * 16 * 64 + 128 * 64 + 128 + 8 * 16 * 128)));
  CHECK(w.dtype == "Float");
}

TEST_CASE("FLOPs of a convolution, a batched matmul and attention") {
  // 3x3 convolution, 16 -> 32 channels, 8x8 output: 2 x outputs x 16 x 9.
  Profile conv = OneOp("aten::conv2d", {{{2, 16, 8, 8}, "Float"}, {{32, 16, 3, 3}, "Float"}}, {2, 32, 8, 8});
  CHECK(CountOpWork(conv, conv.ops[0]).fwd_flops == doctest::Approx(2.0 * 2 * 32 * 8 * 8 * 16 * 9));
  Profile bmm = OneOp("aten::matmul", {{{4, 32, 16}, "Float"}, {{4, 16, 8}, "Float"}}, {4, 32, 8});
  CHECK(CountOpWork(bmm, bmm.ops[0]).fwd_flops == doctest::Approx(2.0 * 4 * 32 * 8 * 16));
  // q [B, H, L, D], k and v [B, Hkv, S, D]: 4 B H L S D.
  Profile sdpa = OneOp("aten::scaled_dot_product_attention",
                       {{{2, 8, 128, 64}, "BFloat16"}, {{2, 2, 128, 64}, "BFloat16"}, {{2, 2, 128, 64}, "BFloat16"}},
                       {2, 8, 128, 64}, "bfloat16");
  OpWork w = CountOpWork(sdpa, sdpa.ops[0]);
  CHECK(w.op_class == OpClass::kAttention);
  CHECK(w.fwd_flops == doctest::Approx(4.0 * 2 * 8 * 128 * 128 * 64));
  CHECK(w.bwd_flops == doctest::Approx(2.5 * w.fwd_flops));
}

TEST_CASE("views cost nothing; memory-bound ops cost their bytes over the bandwidth") {
  Profile view = OneOp("aten::view", {{{8, 64}, "Float"}}, {512}, "float32", /*view=*/true);
  const GpuSpec h100 = FindGpu("h100-sxm-80gb");
  OpWork v = CountOpWork(view, view.ops[0]);
  CHECK(v.op_class == OpClass::kView);
  CHECK(RooflineMs(h100, v.op_class, v.dtype, v.fwd_flops, v.fwd_bytes) == 0);
  Profile gelu = OneOp("aten::gelu", {{{1024, 1024}, "BFloat16"}}, {1024, 1024}, "bfloat16");
  OpWork g = CountOpWork(gelu, gelu.ops[0]);
  CHECK(g.op_class == OpClass::kMemory);
  const CostModelConstants c;
  const double expected_ms = h100.op_overhead_us * 1e-3 + 1e3 * (2.0 * 2 * 1024 * 1024) /
                                                              (h100.bandwidth_gb_per_s * 1e9 * c.memory_efficiency);
  CHECK(RooflineMs(h100, g.op_class, g.dtype, g.fwd_flops, g.fwd_bytes) == doctest::Approx(expected_ms));
}

TEST_CASE("a matmul runs at the dtype's peak: bf16 on an H100 is 14.8x fp32") {
  const GpuSpec h100 = FindGpu("h100");
  const double flops = 2.0 * 8192 * 8192 * 8192;
  const double fp32 = RooflineMs(h100, OpClass::kMatmul, "Float", flops, 0);
  const double bf16 = RooflineMs(h100, OpClass::kMatmul, "BFloat16", flops, 0);
  CHECK(fp32 / bf16 == doctest::Approx(989.4 / 67.0).epsilon(0.01));
}

TEST_CASE("ApplyCostModel sets every op's times and the totals, and names the device") {
  Profile p = OneOp("aten::linear", {{{64, 64}, "Float"}, {{64, 64}, "Float"}}, {64, 64});
  p.totals.fwd_ms = 3;
  p.totals.bwd_ms = 4;
  ApplyCostModel(&p, FindGpu("a100-80gb"));
  CHECK(p.ops[0].fwd_ms > 0);
  CHECK(p.ops[0].bwd_ms > p.ops[0].fwd_ms - 1e-12);
  CHECK(p.totals.fwd_ms + p.totals.bwd_ms == doctest::Approx(PredictedStepMs(p, FindGpu("a100-80gb"))));
  CHECK(p.environment.time_model["gpu"] == "a100-80gb");
  CHECK(p.environment.time_model["measured_step_ms"] == 7.0);
  CHECK(p.environment.time_model["measured_ops_ms"] == 0.0);
  CHECK(!p.environment.time_model.contains("measured_plain_step_ms"));  // step_ms not measured
}

TEST_CASE("ApplyCostModel: on meta tensors or for a GPU, the whole step and the optimizer's update come from the model") {
  Profile p = OneOp("aten::linear", {{{64, 64}, "Float"}, {{64, 64}, "Float"}}, {64, 64});
  p.environment.device = "meta";
  p.totals.param_bytes = 1000000;
  p.totals.step_ms = 50;  // timed on meta tensors: meaningless
  p.totals.optimizer_step_ms = {{"sgd", 9.0}, {"momentum", 9.0}, {"adam", 9.0}};
  const GpuSpec a100 = FindGpu("a100-80gb");
  p.ops[0].fwd_nograd_ms = 0.001;  // measured on meta tensors
  p.calibration.stage_run_ms = 0.02;    // the executor's on this CPU: not the GPU's
  p.calibration.nograd_scale = 1.2;
  p.calibration.run_step_ms = 60;
  p.calibration.module_step_ms = 61;
  p.calibration.module_nograd_scale = 1.3;
  p.calibration.checkpoint_call_ms = 0.1;
  ApplyCostModel(&p, a100);
  CHECK(p.ops[0].fwd_nograd_ms == p.ops[0].fwd_ms);  // a recomputation costs the modelled forward
  CHECK(!p.calibration.stage_run_ms);
  CHECK(!p.calibration.nograd_scale);
  CHECK(!p.calibration.run_step_ms);
  CHECK(!p.calibration.module_step_ms);
  CHECK(!p.calibration.module_nograd_scale);
  CHECK(!p.calibration.checkpoint_call_ms);
  CHECK(p.totals.step_ms == doctest::Approx(p.totals.fwd_ms + p.totals.bwd_ms + PredictedLossMs(p, a100)));
  // adam reads parameters, gradients and both moments and writes three: 7 passes over 1 MB.
  const double pass_ms = 1e6 / (a100.bandwidth_gb_per_s * 1e9 * CostModelConstants{}.memory_efficiency) * 1e3;
  CHECK(p.totals.optimizer_step_ms["adam"] == doctest::Approx(7 * pass_ms));
  CHECK(p.totals.optimizer_step_ms["momentum"] == doctest::Approx(5 * pass_ms));
  CHECK(p.totals.optimizer_step_ms["sgd"] == doctest::Approx(3 * pass_ms));
  // Measured on this CPU for `--gpu cpu`: the measured figures stay.
  Profile q = OneOp("aten::linear", {{{64, 64}, "Float"}, {{64, 64}, "Float"}}, {64, 64});
  q.environment.device = "cpu";
  q.totals.step_ms = 50;
  q.totals.optimizer_step_ms = {{"adam", 9.0}};
  GpuSpec cpu = a100;
  cpu.name = "cpu";
  ApplyCostModel(&q, cpu);
  CHECK(q.totals.step_ms == 50.0);
  CHECK(q.totals.optimizer_step_ms["adam"] == 9.0);
}

namespace {

// A CPU-like device as `--gpu cpu` measures one: fixed costs 5 us forward,
// 3 us backward, 2 us a view; 10 GB/s; fp32 linear at 10 GFLOP/s for 1 MFLOP
// calls and 100 GFLOP/s for 100 MFLOP calls; a 3x3 convolution at 20 GFLOP/s.
GpuSpec SmallCpu(bool with_convolution) {
  GpuSpec g;
  g.name = "cpu";
  g.fp32_tflops = g.bf16_tflops = g.fp16_tflops = 1.0;  // not used where a curve is
  g.bandwidth_gb_per_s = 10;
  g.op_overhead_us = 5;
  g.bwd_op_overhead_us = 3;
  g.view_overhead_us = 2;
  g.measured_tflops["matmul:float32"] = {{1e6, 0.01}, {1e8, 0.1}};
  if (with_convolution) g.measured_tflops["convolution:float32"] = {{1e6, 0.02}};
  return g;
}

}  // namespace

TEST_CASE("a measured rate curve: log-log between its points, clamped at its ends") {
  const std::vector<std::pair<double, double>> curve = {{1e6, 0.01}, {1e8, 0.1}};
  CHECK(InterpolateTflops(curve, 1e7) == doctest::Approx(std::sqrt(0.01 * 0.1)));  // halfway in log
  CHECK(InterpolateTflops(curve, 1e3) == doctest::Approx(0.01));
  CHECK(InterpolateTflops(curve, 1e9) == doctest::Approx(0.1));
  CHECK(InterpolateTflops(curve, 1e8) == doctest::Approx(0.1));
  CHECK(InterpolateTflops({}, 1e7) == 0);
}

TEST_CASE("--gpu cpu: a linear layer at the measured rate of its size, plus the fixed cost per direction") {
  Profile p = OneOp("aten::linear", {{{8, 16, 64}, "Float"}, {{128, 64}, "Float"}, {{128}, "Float"}}, {8, 16, 128});
  const GpuSpec cpu = SmallCpu(false);
  const OpWork w = CountOpWork(p, p.ops[0]);
  const double flops = 2.0 * 8 * 16 * 64 * 128;  // 2,097,152
  // log10(2.097152) / 2 of the way from 0.01 to 0.1 TFLOP/s, in log: 0.014485 TFLOP/s.
  const double tflops = 0.01 * std::pow(10.0, std::log10(flops / 1e6) / 2);
  CHECK(tflops == doctest::Approx(0.014485).epsilon(1e-4));
  // Compute (0.1448 ms) outweighs memory (131,584 bytes at 8 GB/s: 0.0164 ms).
  const double fwd = RooflineMs(cpu, w.op_class, w.dtype, w.fwd_flops, w.fwd_bytes, {}, false, w.fwd_flops);
  CHECK(fwd == doctest::Approx(0.005 + 1e3 * flops / (tflops * 1e12)));
  // Backward: two calls of the forward's size at the same rate, the backward's fixed cost.
  const double bwd = RooflineMs(cpu, w.op_class, w.dtype, w.bwd_flops, w.bwd_bytes, {}, true, w.fwd_flops);
  CHECK(bwd == doctest::Approx(0.003 + 1e3 * 2 * flops / (tflops * 1e12)));
  CHECK(PredictedStepMs(p, cpu) == doctest::Approx(fwd + bwd));
  // A memory-bound op: 5 us + 2 x 4 MiB at 10 GB/s x 0.8 forward, 3 us + twice the bytes backward.
  Profile gelu = OneOp("aten::gelu", {{{1024, 1024}, "Float"}}, {1024, 1024});
  const OpWork g = CountOpWork(gelu, gelu.ops[0]);
  CHECK(RooflineMs(cpu, g.op_class, g.dtype, 0, g.fwd_bytes) == doctest::Approx(0.005 + 1e3 * 8388608 / 8e9));
  CHECK(RooflineMs(cpu, g.op_class, g.dtype, 0, g.bwd_bytes, {}, true) ==
        doctest::Approx(0.003 + 1e3 * 2 * 8388608 / 8e9));
}

TEST_CASE("--gpu cpu: views cost the measured view overhead each way (0 on a GPU), convolutions use their curve") {
  Profile view = OneOp("aten::view", {{{8, 64}, "Float"}}, {512}, "float32", /*view=*/true);
  const OpWork v = CountOpWork(view, view.ops[0]);
  CHECK(RooflineMs(SmallCpu(false), v.op_class, v.dtype, 0, 0) == doctest::Approx(0.002));
  CHECK(PredictedStepMs(view, SmallCpu(false)) == doctest::Approx(0.004));
  CHECK(PredictedStepMs(view, FindGpu("h100")) == 0);
  // 2 x 2 x 32 x 8 x 8 x 16 x 9 = 1,179,648 FLOPs: the convolution curve's 0.02 TFLOP/s
  // where there is one, else the matmul curve's at that size.
  Profile conv = OneOp("aten::conv2d", {{{2, 16, 8, 8}, "Float"}, {{32, 16, 3, 3}, "Float"}}, {2, 32, 8, 8});
  const OpWork c = CountOpWork(conv, conv.ops[0]);
  CHECK(RooflineMs(SmallCpu(true), c.op_class, c.dtype, c.fwd_flops, 0) ==
        doctest::Approx(0.005 + 1e3 * 1179648 / 0.02e12));
  const double matmul_rate = 0.01 * std::pow(10.0, std::log10(1.179648) / 2);
  CHECK(RooflineMs(SmallCpu(false), c.op_class, c.dtype, c.fwd_flops, 0) ==
        doctest::Approx(0.005 + 1e3 * 1179648 / (matmul_rate * 1e12)));
}

TEST_CASE("the loss the step computes: a sum per output, a cast to float32, an add, and the plain step recorded") {
  // One bf16 output [4, 8] (64 bytes): sum (5 us + 64 bytes at 8 GB/s) + cast (5 us) forward,
  // 3 us each backward (the sum's backward expands, a view).
  Profile p = OneOp("aten::gelu", {{{4, 8}, "BFloat16"}}, {4, 8}, "bfloat16");
  p.outputs = {1};
  const GpuSpec cpu = SmallCpu(false);
  CHECK(PredictedLossMs(p, cpu) == doctest::Approx(0.005 + 1e3 * 64 / 8e9 + 0.005 + 0.003 + 0.003));
  // Two float32 outputs: two sums and one add, no cast.
  p.tensors[0].requires_grad = true;
  p.tensors[0].dtype = p.tensors[1].dtype = "float32";
  p.outputs = {0, 1};
  CHECK(PredictedLossMs(p, cpu) == doctest::Approx(2 * (0.005 + 1e3 * 128 / 8e9 + 0.003) + 0.005 + 0.003));
  p.totals.step_ms = 9;
  ApplyCostModel(&p, cpu);
  CHECK(p.environment.time_model["measured_plain_step_ms"] == 9.0);
  CHECK(p.environment.time_model["predicted_loss_ms"] == doctest::Approx(PredictedLossMs(p, cpu)));
  CHECK(p.environment.time_model["measured_tflops"]["matmul:float32"].size() == 2);
}

TEST_CASE("the GPU table: every device named, unknown names list the known ones") {
  for (const char* name : {"h100-sxm-80gb", "h200-141gb", "a100-40gb", "a100-80gb", "l4-24gb", "rtx4090-24gb"}) {
    CAPTURE(name);
    const GpuSpec g = FindGpu(name);
    CHECK(g.bf16_tflops >= g.fp32_tflops);
    CHECK(g.memory_bytes > (int64_t{20} << 30));
    CHECK(!g.source.empty());
  }
  CHECK(FindGpu("H100").name == "h100-sxm-80gb");
  CHECK_THROWS_WITH(FindGpu("v100"), doctest::Contains("h100-sxm-80gb, h200-141gb, a100-40gb"));
}

TEST_CASE("--gpu cpu: masked attention and dropout read their own measured rates") {
  GpuSpec cpu = SmallCpu(false);
  cpu.measured_tflops["attention:float32"] = {{1e6, 0.05}};
  cpu.measured_tflops["attention_mask:float32"] = {{1e6, 0.02}};
  cpu.random_gb_per_s = 1;
  // q, k, v [1, 2, 16, 8]: 4 x 2 x 16 x 16 x 8 = 16,384 FLOPs; with a [1, 1, 16, 16] bool mask.
  const std::vector<ArgRecord> qkv = {{{1, 2, 16, 8}, "Float"}, {{1, 2, 16, 8}, "Float"}, {{1, 2, 16, 8}, "Float"}};
  Profile plain = OneOp("aten::scaled_dot_product_attention", qkv, {1, 2, 16, 8});
  std::vector<ArgRecord> with_mask = qkv;
  with_mask.push_back({{1, 1, 16, 16}, "Bool"});
  Profile masked = OneOp("aten::scaled_dot_product_attention", with_mask, {1, 2, 16, 8});
  const OpWork a = CountOpWork(plain, plain.ops[0]), m = CountOpWork(masked, masked.ops[0]);
  CHECK(a.op_class == OpClass::kAttention);
  CHECK(m.op_class == OpClass::kMaskedAttention);
  // Compute (16,384 FLOPs) outweighs memory (4 x 1,024 x 4 bytes at 8 GB/s: 2 us) at both rates.
  CHECK(RooflineMs(cpu, a.op_class, a.dtype, a.fwd_flops, 0) == doctest::Approx(0.005 + 1e3 * 16384 / 0.05e12));
  CHECK(RooflineMs(cpu, m.op_class, m.dtype, m.fwd_flops, 0) == doctest::Approx(0.005 + 1e3 * 16384 / 0.02e12));
  // Dropout over 4 MiB: forward at 1 GB/s x 0.8 (read and written: 8 MiB), backward at the bandwidth.
  Profile dropout = OneOp("aten::dropout", {{{1024, 1024}, "Float"}}, {1024, 1024});
  const OpWork d = CountOpWork(dropout, dropout.ops[0]);
  CHECK(d.op_class == OpClass::kRandom);
  CHECK(RooflineMs(cpu, d.op_class, d.dtype, 0, d.fwd_bytes) == doctest::Approx(0.005 + 1e3 * 8388608 / 0.8e9));
  CHECK(RooflineMs(cpu, d.op_class, d.dtype, 0, d.bwd_bytes, {}, true) ==
        doctest::Approx(0.003 + 1e3 * 2 * 8388608 / 8e9));
  // A bf16 memory-bound op at the bf16 elementwise rate where the device has one.
  cpu.elementwise_gb_per_s["bfloat16"] = 2;
  CHECK(RooflineMs(cpu, OpClass::kMemory, "BFloat16", 0, 1.6e6) == doctest::Approx(0.005 + 1e3 * 1.6e6 / 1.6e9));
  CHECK(RooflineMs(cpu, OpClass::kMemory, "Float", 0, 1.6e6) == doctest::Approx(0.005 + 1e3 * 1.6e6 / 8e9));
  // A GPU has no random rate: dropout at the bandwidth, as any memory-bound op.
  const GpuSpec h100 = FindGpu("h100");
  CHECK(RooflineMs(h100, d.op_class, d.dtype, 0, d.fwd_bytes) ==
        doctest::Approx(RooflineMs(h100, OpClass::kMemory, d.dtype, 0, d.fwd_bytes)));
}

TEST_CASE("--gpu cpu: an op's measured law of its kind (or class) and dtype replaces the roofline") {
  GpuSpec cpu = SmallCpu(false);
  // linear: 10 us + 1 us per 100 kFLOP forward; 20 us + 2 us per 100 kFLOP + 1 us per 1 KB of weight backward.
  cpu.op_costs["linear:float32"] = {LinearOpCost{10, 1e-5, 0, 0}, LinearOpCost{20, 2e-5, 0, 1e-3}};
  Profile p = OneOp("aten::linear", {{{8, 16, 64}, "Float"}, {{128, 64}, "Float"}, {{128}, "Float"}}, {8, 16, 128});
  const OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(w.kind == "linear");
  CHECK(w.weight_bytes == 128 * 64 * 4);
  const double flops = 2.0 * 8 * 16 * 64 * 128;
  CHECK(OpMs(cpu, w, false) == doctest::Approx(1e-3 * (10 + 1e-5 * flops)));
  CHECK(OpMs(cpu, w, true) == doctest::Approx(1e-3 * (20 + 2e-5 * flops + 1e-3 * 32768)));
  CHECK(PredictedStepMs(p, cpu) == doctest::Approx(OpMs(cpu, w, false) + OpMs(cpu, w, true)));
  // A matmul of another kind reads linear's law (its class's stand-in); bf16 has none: the roofline.
  Profile mm = OneOp("aten::mm", {{{16, 64}, "Float"}, {{64, 128}, "Float"}}, {16, 128});
  const OpWork m = CountOpWork(mm, mm.ops[0]);
  CHECK(OpMs(cpu, m, false) == doctest::Approx(1e-3 * (10 + 1e-5 * 2.0 * 16 * 64 * 128)));
  Profile bf = OneOp("aten::linear", {{{16, 64}, "BFloat16"}, {{128, 64}, "BFloat16"}}, {16, 128}, "bfloat16");
  const OpWork b = CountOpWork(bf, bf.ops[0]);
  CHECK(OpMs(cpu, b, false) == doctest::Approx(RooflineMs(cpu, b.op_class, b.dtype, b.fwd_flops, b.fwd_bytes, {},
                                                          false, b.fwd_flops)));
  // A memory-bound kind: its bytes (input and output, 2 x 4 MiB), 2 us + 1 us per 10 KB.
  cpu.op_costs["gelu:float32"] = {LinearOpCost{2, 0, 1e-4, 0}, LinearOpCost{3, 0, 2e-4, 0}};
  Profile gelu = OneOp("aten::gelu", {{{1024, 1024}, "Float"}}, {1024, 1024});
  const OpWork g = CountOpWork(gelu, gelu.ops[0]);
  CHECK(OpMs(cpu, g, false) == doctest::Approx(1e-3 * (2 + 1e-4 * 8388608)));
  CHECK(OpMs(cpu, g, true) == doctest::Approx(1e-3 * (3 + 2e-4 * 8388608)));
  // Views keep the view overhead.
  Profile view = OneOp("aten::view", {{{8, 64}, "Float"}}, {512}, "float32", /*view=*/true);
  CHECK(OpMs(cpu, CountOpWork(view, view.ops[0]), false) == doctest::Approx(0.002));
}

TEST_CASE("attention with dropout takes the math path's law, and the profile records dropout_p") {
  GpuSpec cpu = SmallCpu(false);
  cpu.op_costs["sdpa:float32"] = {LinearOpCost{5, 0, 0, 0}, LinearOpCost{6, 0, 0, 0}};
  cpu.op_costs["sdpa_dropout:float32"] = {LinearOpCost{50, 0, 0, 0}, LinearOpCost{60, 0, 0, 0}};
  const std::vector<ArgRecord> qkv = {{{1, 2, 16, 8}, "Float"}, {{1, 2, 16, 8}, "Float"}, {{1, 2, 16, 8}, "Float"}};
  Profile p = OneOp("aten::scaled_dot_product_attention", qkv, {1, 2, 16, 8});
  CHECK(OpMs(cpu, CountOpWork(p, p.ops[0]), false) == doctest::Approx(0.005));
  p.ops[0].dropout_p = 0.1;
  const OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(w.op_class == OpClass::kDropoutAttention);
  CHECK(w.fwd_flops == doctest::Approx(4.0 * 2 * 16 * 16 * 8));
  CHECK(OpMs(cpu, w, false) == doctest::Approx(0.050));
  CHECK(OpMs(cpu, w, true) == doctest::Approx(0.060));
  // Written only where non-zero, read back.
  p.model = ModelRecord{};
  p.tensors[0].producer = -1;
  p.inputs = {0};
  p.outputs = {1};
  nlohmann::json j = ProfileToJson(p);
  CHECK(j["ops"][0]["dropout_p"] == 0.1);
  CHECK(ProfileFromJson(j, "p.json").ops[0].dropout_p == 0.1);
  p.ops[0].dropout_p = 0;
  CHECK(!ProfileToJson(p)["ops"][0].contains("dropout_p"));
}

TEST_CASE("FLOPs of recurrent layers: 2 x batch x time x the weight matrices' elements") {
  // nn.LSTM(32, 32, num_layers=2, batch_first=True) on [8, 24, 32]: hx (h0, c0) [2, 8, 32];
  // per layer w_ih [128, 32], w_hh [128, 32], b_ih [128], b_hh [128].
  std::vector<ArgRecord> args = {{{8, 24, 32}, "Float"}, {{2, 8, 32}, "Float"}, {{2, 8, 32}, "Float"}};
  for (int layer = 0; layer < 2; ++layer) {
    args.push_back({{128, 32}, "Float"});
    args.push_back({{128, 32}, "Float"});
    args.push_back({{128}, "Float"});
    args.push_back({{128}, "Float"});
  }
  Profile p = OneOp("aten::lstm", args, {8, 24, 32});
  const OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(w.op_class == OpClass::kRecurrent);
  CHECK(w.fwd_flops == doctest::Approx(2.0 * 8 * 24 * (4 * 128 * 32)));
  CHECK(w.bwd_flops == doctest::Approx(2 * w.fwd_flops));
  CHECK(w.weight_bytes == 4 * 128 * 32 * 4);
}

TEST_CASE("gradients outside the ops: each parameter's delivered to its .grad, and a value two ops read summed") {
  GpuSpec cpu = SmallCpu(false);
  // 4 us + 1 us per 10 KB (the law holds one engine node); the engine's sum: 2 us per 10 KB.
  cpu.op_costs["accumulate_grad:float32"] = {LinearOpCost{}, LinearOpCost{4, 0, 1e-4, 0}};
  cpu.op_costs["grad_sum:float32"] = {LinearOpCost{0, 0, 2e-4, 0}, LinearOpCost{0, 0, 2e-4, 0}};
  Profile p = OneOp("aten::linear", {{{16, 64}, "Float"}, {{128, 64}, "Float"}, {{128}, "Float"}}, {16, 128});
  p.parameters = {{"w", {128, 64}, 32768}, {"b", {128}, 512}};
  CHECK(PredictedAccumulateGradMs(p, cpu) == doctest::Approx(1e-3 * ((4 + 3.2768) + (4 + 0.0512))));
  // Tensor 1 [16, 128] read by two ops that need its gradient: one sum, 2 KB x ... less the node.
  TensorRecord out = p.tensors[1];
  out.id = 2;
  out.producer = 1;
  out.storage = 2;
  p.tensors.push_back(out);
  OpRecord relu = p.ops[0];
  relu.id = 1;
  relu.kind = "aten::relu";
  relu.inputs = {1};
  relu.outputs = {2};
  relu.args = {{{16, 128}, "Float"}};
  p.ops.push_back(relu);
  OpRecord gelu = relu;
  gelu.id = 2;
  gelu.kind = "aten::gelu";
  p.tensors.push_back(out);
  p.tensors.back().id = 3;
  p.tensors.back().producer = 2;
  p.tensors.back().storage = 3;
  gelu.outputs = {3};
  p.ops.push_back(gelu);
  const double sum_us = 2e-4 * 16 * 128 * 4;
  CHECK(PredictedAccumulateGradMs(p, cpu) == doctest::Approx(1e-3 * ((4 + 3.2768) + (4 + 0.0512) + sum_us)));
  cpu.op_costs.erase("grad_sum:float32");  // no law for the sums: the parameters' alone
  CHECK(PredictedAccumulateGradMs(p, cpu) == doctest::Approx(1e-3 * ((4 + 3.2768) + (4 + 0.0512))));
  CHECK(PredictedAccumulateGradMs(p, FindGpu("h100")) == 0);  // no law: not modelled
}

TEST_CASE("attention's CPU path names its law: dropout, an explicit mask, causal; is_causal is recorded") {
  GpuSpec cpu = SmallCpu(false);
  cpu.op_costs["sdpa_dropout:float32"] = {LinearOpCost{50, 0, 0, 0}, LinearOpCost{60, 0, 0, 0}};
  cpu.op_costs["sdpa_dropout_mask:float32"] = {LinearOpCost{70, 0, 0, 0}, LinearOpCost{80, 0, 0, 0}};
  cpu.op_costs["sdpa_dropout_causal:float32"] = {LinearOpCost{90, 0, 0, 0}, LinearOpCost{95, 0, 0, 0}};
  std::vector<ArgRecord> args = {{{1, 2, 16, 8}, "Float"}, {{1, 2, 16, 8}, "Float"}, {{1, 2, 16, 8}, "Float"}};
  Profile p = OneOp("aten::scaled_dot_product_attention", args, {1, 2, 16, 8});
  p.ops[0].dropout_p = 0.1;
  CHECK(CountOpWork(p, p.ops[0]).kind == "sdpa_dropout");
  p.ops[0].is_causal = true;
  CHECK(CountOpWork(p, p.ops[0]).kind == "sdpa_dropout_causal");
  CHECK(OpMs(cpu, CountOpWork(p, p.ops[0]), false) == doctest::Approx(0.090));
  p.ops[0].is_causal = false;
  p.ops[0].args.push_back({{1, 1, 16, 16}, "Bool"});
  CHECK(CountOpWork(p, p.ops[0]).kind == "sdpa_dropout_mask");
  CHECK(OpMs(cpu, CountOpWork(p, p.ops[0]), true) == doctest::Approx(0.080));
  p.ops[0].dropout_p = 0;  // no law for sdpa_mask here: the class's stand-in, then the roofline
  CHECK(CountOpWork(p, p.ops[0]).kind == "sdpa_mask");
  // is_causal: written only where true, read back.
  p.ops[0].is_causal = true;
  p.model = ModelRecord{};
  p.tensors[0].producer = -1;
  p.inputs = {0};
  p.outputs = {1};
  const nlohmann::json j = ProfileToJson(p);
  CHECK(j["ops"][0]["is_causal"] == true);
  CHECK(ProfileFromJson(j, "p.json").ops[0].is_causal);
  p.ops[0].is_causal = false;
  CHECK(!ProfileToJson(p)["ops"][0].contains("is_causal"));
}

TEST_CASE("GELU's tanh approximation has its own law; approximate is recorded") {
  GpuSpec cpu = SmallCpu(false);
  cpu.op_costs["gelu:float32"] = {LinearOpCost{2, 0, 1e-4, 0}, LinearOpCost{3, 0, 2e-4, 0}};
  cpu.op_costs["gelu_tanh:float32"] = {LinearOpCost{2, 0, 4e-4, 0}, LinearOpCost{3, 0, 6e-4, 0}};
  Profile p = OneOp("aten::gelu", {{{1024, 1024}, "Float"}}, {1024, 1024});
  CHECK(CountOpWork(p, p.ops[0]).kind == "gelu");
  p.ops[0].approximate = "tanh";
  const OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(w.kind == "gelu_tanh");
  CHECK(OpMs(cpu, w, false) == doctest::Approx(1e-3 * (2 + 4e-4 * 8388608)));
  p.model = ModelRecord{};
  p.tensors[0].producer = -1;
  p.inputs = {0};
  p.outputs = {1};
  const nlohmann::json j = ProfileToJson(p);
  CHECK(j["ops"][0]["approximate"] == "tanh");
  CHECK(ProfileFromJson(j, "p.json").ops[0].approximate == "tanh");
}

TEST_CASE("a recurrent layer pays its law's fixed cost per time step, layer and direction") {
  GpuSpec cpu = SmallCpu(false);
  cpu.op_costs["gru:float32"] = {LinearOpCost{10, 0, 0, 0}, LinearOpCost{20, 0, 0, 0}};
  // nn.GRU(32, 32, batch_first=True) on [8, 24, 32]: h0 [1, 8, 32], w_ih, w_hh [96, 32], b_ih, b_hh [96].
  std::vector<ArgRecord> args = {{{8, 24, 32}, "Float"}, {{1, 8, 32}, "Float"}, {{96, 32}, "Float"},
                                 {{96, 32}, "Float"},    {{96}, "Float"},       {{96}, "Float"}};
  Profile p = OneOp("aten::gru", args, {8, 24, 32});
  CHECK(CountOpWork(p, p.ops[0]).calls == 8);  // not recorded: PyTorch's default, sequence first
  p.ops[0].recurrent = {true, 1, false};
  OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(w.calls == 24);
  CHECK(OpMs(cpu, w, false) == doctest::Approx(1e-3 * 10 * 24));
  CHECK(OpMs(cpu, w, true) == doctest::Approx(1e-3 * 20 * 24));
  p.ops[0].recurrent = {true, 2, true};  // the count recorded: 2 layers x 2 directions
  CHECK(CountOpWork(p, p.ops[0]).calls == 24 * 4);
  p.model = ModelRecord{};
  p.tensors[0].producer = -1;
  p.inputs = {0};
  p.outputs = {1};
  const nlohmann::json j = ProfileToJson(p);
  CHECK(j["ops"][0]["recurrent"]["batch_first"] == true);
  CHECK(j["ops"][0]["recurrent"]["num_layers"] == 2);
  const OpRecord back = ProfileFromJson(j, "p.json").ops[0];
  CHECK(back.recurrent.batch_first);
  CHECK(back.recurrent.num_layers == 2);
  CHECK(back.recurrent.bidirectional);
}

TEST_CASE("autograd nodes beyond those the law's microbenchmark made each cost one more engine node") {
  GpuSpec cpu = SmallCpu(false);
  cpu.op_costs["linear:float32"] = {LinearOpCost{10, 0, 0, 0}, LinearOpCost{20, 0, 0, 0}};
  cpu.op_cost_nodes["linear:float32"] = 2;  // addmm and t on 2-D input
  cpu.extra_node_fwd_us = 1;
  cpu.extra_node_bwd_us = 3;
  Profile p = OneOp("aten::linear", {{{8, 16, 64}, "Float"}, {{128, 64}, "Float"}, {{128}, "Float"}}, {8, 16, 128});
  CHECK(OpMs(cpu, CountOpWork(p, p.ops[0]), false) == doctest::Approx(0.010));  // not recorded: none
  p.ops[0].grad_nodes = 4;  // 3-D input: flattened and viewed back
  const OpWork w = CountOpWork(p, p.ops[0]);
  CHECK(OpMs(cpu, w, false) == doctest::Approx(1e-3 * (10 + 2 * 1)));
  CHECK(OpMs(cpu, w, true) == doctest::Approx(1e-3 * (20 + 2 * 3)));
  p.ops[0].grad_nodes = 1;  // fewer: no credit
  CHECK(OpMs(cpu, CountOpWork(p, p.ops[0]), true) == doctest::Approx(0.020));
  // An op without a law: its fixed cost stands for one node.
  Profile view = OneOp("aten::view", {{{8, 64}, "Float"}}, {512}, "float32", /*view=*/true);
  view.ops[0].grad_nodes = 1;
  const double one = OpMs(cpu, CountOpWork(view, view.ops[0]), true);
  view.ops[0].grad_nodes = 3;
  CHECK(OpMs(cpu, CountOpWork(view, view.ops[0]), true) == doctest::Approx(one + 2 * 3e-3));
  // Written where recorded, read back.
  p.model = ModelRecord{};
  p.tensors[0].producer = -1;
  p.inputs = {0};
  p.outputs = {1};
  CHECK(ProfileFromJson(ProfileToJson(p), "p.json").ops[0].grad_nodes == 1);
  p.ops[0].grad_nodes.reset();
  CHECK(!ProfileToJson(p)["ops"][0].contains("grad_nodes"));
}

TEST_CASE("every dtype LibTorch has is priced at its size: complex128 is 16 bytes, complex32 4, uint16 2") {
  // The same elementwise op in each dtype: its bytes scale with the element's.
  auto bytes = [](const char* libtorch, const char* python) {
    Profile p = OneOp("aten::add", {{{64, 64}, libtorch}, {{64, 64}, libtorch}}, {64, 64}, python);
    return CountOpWork(p, p.ops[0]).fwd_bytes;
  };
  const double float32 = bytes("Float", "float32");
  REQUIRE(float32 > 0);
  CHECK(bytes("ComplexDouble", "complex128") == doctest::Approx(4 * float32));
  CHECK(bytes("ComplexFloat", "complex64") == doctest::Approx(2 * float32));
  CHECK(bytes("ComplexHalf", "complex32") == doctest::Approx(float32));
  CHECK(bytes("UInt16", "uint16") == doctest::Approx(float32 / 2));
  CHECK(bytes("UInt64", "uint64") == doctest::Approx(2 * float32));
  CHECK(bytes("Float8_e4m3fn", "float8_e4m3fn") == doctest::Approx(float32 / 4));
  // Either vocabulary, in any case.
  CHECK(bytes("complexdouble", "COMPLEX128") == doctest::Approx(4 * float32));
}
