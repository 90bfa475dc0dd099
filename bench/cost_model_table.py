"""The cost model against measured CPU time: every test model profiled on the
CPU (one thread, median of --reps) with --gpu cpu (this machine's measured
matmul, bandwidth and per-op peak), the predicted step time beside the
measured one. Prints a Markdown table (README, "Cost model").

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
    print("| model | ops | measured step (ms) | measured, ops only (ms) | predicted (ms) | predicted / step | "
          "predicted / ops only |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    errors = []
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
            measured = model["measured_step_ms"]
            predicted = prof["totals"]["fwd_ms"] + prof["totals"]["bwd_ms"]
            ops_only = model["measured_ops_ms"]
            errors.append((abs(predicted / measured - 1), abs(predicted / ops_only - 1)))
            print(f"| {name} | {len(prof['ops'])} | {measured:.2f} | {ops_only:.2f} | {predicted:.2f} | "
                  f"{predicted / measured:.2f} | {predicted / ops_only:.2f} |")
        print(f"\nmachine: fp32 {model['fp32_tflops'] * 1e3:.1f} GFLOP/s, bf16 {model['bf16_tflops'] * 1e3:.1f} GFLOP/s, "
              f"copy {model['bandwidth_gb_per_s']:.1f} GB/s, {model['op_overhead_us']:.2f} us per op; "
              f"within 25% of the step: {sum(e[0] <= 0.25 for e in errors)} of {len(errors)} models, "
              f"of the ops' own times: {sum(e[1] <= 0.25 for e in errors)}")


if __name__ == "__main__":
    main()
