"""The cost model against measured CPU time: every test model profiled on the
CPU (one thread, median of --reps) with --gpu cpu (this machine's measured
cost laws per op kind and dtype, and the rates and fixed costs of the
roofline for kinds without one), the predicted step time beside the
measured one. Like with like: the
measured step is `totals.step_ms` (forward, loss and backward timed whole
without per-op timers, no optimizer step); the prediction is the ops' forward
and backward plus the loss (`time_model.predicted_loss_ms`) plus the gradients
outside the ops (`predicted_accumulate_grad_ms`: each delivered to its `.grad`,
the engine's sums). Prints a Markdown
table (docs/measurements.md).

    .venv/bin/python bench/cost_model_table.py [--ckplan build/ckplan] [--models build/test_models]
"""
import argparse
import json
import os
import subprocess
import tempfile


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckplan", default="build/ckplan")
    parser.add_argument("--models", default="build/test_models")
    parser.add_argument("--reps", default="5")
    args = parser.parse_args()
    names = sorted(f[:-5] for f in os.listdir(args.models) if f.endswith(".json") and f != "torch_version.json")
    print("| model | ops | measured step (ms) | predicted (ms) | predicted / measured | of which outside the ops (ms) | "
          "ops' own measured times (ms) | step outside the ops (ms) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    ratios, own_ratios, calibration = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            with open(os.path.join(args.models, name + ".json")) as f:
                inputs = json.load(f)["inputs"]
            out = os.path.join(tmp, name + ".json")
            cmd = [args.ckplan, "profile", os.path.join(args.models, name + ".pt2"), "--gpu", "cpu", "--reps",
                   args.reps, "-o", out] + [a for t in inputs for a in ("--input", t)]
            subprocess.run(cmd, check=True, capture_output=True)
            with open(out) as f:
                prof = json.load(f)
            model = prof["environment"]["time_model"]
            measured = model["measured_plain_step_ms"]
            predicted = (prof["totals"]["fwd_ms"] + prof["totals"]["bwd_ms"] + model["predicted_loss_ms"] +
                         model.get("predicted_accumulate_grad_ms", 0.0))
            # Predicted outside the ops: the loss, gradients summed into .grad and in the engine.
            fixed = model["predicted_loss_ms"] + model.get("predicted_accumulate_grad_ms", 0.0)
            calibration.append((model.get("calibration_s", 0.0), model.get("calibration_cpu_s", 0.0)))
            ratios.append(predicted / measured)
            own_ratios.append(predicted / model["measured_ops_ms"])
            print(f"| {name} | {len(prof['ops'])} | {measured:.2f} | {predicted:.2f} | {predicted / measured:.2f} | "
                  f"{fixed:.2f} | {model['measured_ops_ms']:.2f} | {measured - model['measured_ops_ms']:.2f} |")
        curves = model["measured_tflops"]
        rate = lambda key: ", ".join(f"{p['tflops'] * 1e3:.1f}" for p in curves[key])
        print(f"\nmachine: linear n^3 (n = 32, 64, 128, 256, 512) fp32 {rate('matmul:float32')} GFLOP/s, bf16 "
              f"{rate('matmul:bfloat16')} GFLOP/s; 3x3 convolution (8, 32, 128 channels) fp32 "
              f"{rate('convolution:float32')} GFLOP/s; attention (L = 32, 128, 512) fp32 {rate('attention:float32')}, "
              f"masked {rate('attention_mask:float32')}, bf16 {rate('attention:bfloat16')}, masked "
              f"{rate('attention_mask:bfloat16')} GFLOP/s; dropout {model['random_gb_per_s']:.2f} GB/s; GELU {model['bandwidth_gb_per_s']:.2f} GB/s, bf16 "
              f"{model['elementwise_gb_per_s'].get('bfloat16', 0):.2f} GB/s; fixed cost "
              f"{model['op_overhead_us']:.2f} us forward, {model['bwd_op_overhead_us']:.2f} us backward, view "
              f"{model['view_overhead_us']:.2f} us; extra autograd node "
              f"{model.get('extra_node_us', {}).get('forward', 0):.2f} us forward, "
              f"{model.get('extra_node_us', {}).get('backward', 0):.2f} us backward; within 25% of the measured step: "
              f"{sum(abs(r - 1) <= 0.25 for r in ratios)} of {len(ratios)} models; of the ops' own measured times: "
              f"{sum(abs(r - 1) <= 0.25 for r in own_ratios)}; calibration {min(c[0] for c in calibration):.2f}-{max(c[0] for c in calibration):.2f} s wall, "
              f"{min(c[1] for c in calibration):.2f}-{max(c[1] for c in calibration):.2f} s CPU")

if __name__ == "__main__":
    main()
