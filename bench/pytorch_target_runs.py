#!/usr/bin/env python3
"""The PyTorch-target plans under `ckplan run`, for docs/measurements.md: on each test
model, the plan `ckplan solve` writes for a profile by default (modules to
wrap with torch.utils.checkpoint) at the budget halfway between the target's
smallest and its peak with nothing wrapped (adam), run by `ckplan run` (which
runs it as PyTorch does); prints one Markdown row per model: wrapped modules,
budget, predicted and measured peak, the prediction's error, predicted and
measured overhead (the median of the measured steps against the step with
nothing wrapped, in turn), the predicted less the measured in points, verdict.

    bench/pytorch_target_runs.py [--build build] [--steps 7] [MODEL ...]   (after the build made the test models)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

MODELS = ["mlp_chain", "gpt", "resnet18", "unet", "transformer_encoder", "mobilenet_v2", "bert", "vit", "gpt2",
          "llama", "sdpa_decoder", "bf16_decoder", "seq_first_encoder", "transformer_decoder", "recurrent",
          "inplace_head", "mobilenet_v3_small", "densenet", "two_heads"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default="build")
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("models", nargs="*", default=MODELS)
    args = parser.parse_args()
    ckplan = os.path.join(args.build, "ckplan")
    models = os.path.join(args.build, "test_models")

    def run(*command):
        result = subprocess.run([ckplan, *command], capture_output=True, text=True)
        if result.returncode not in (0, 4):  # 4: a verdict other than ok, reported below
            sys.exit(f"ckplan {' '.join(command)}: {result.stderr.strip()}")
        return result.stdout

    print("| model | wrapped | budget | predicted peak | measured peak | error | predicted overhead | "
          "measured overhead | overhead error | verdict |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            with open(os.path.join(models, name + ".json")) as f:
                inputs = [a for text in json.load(f)["inputs"] for a in ("--input", text)]
            profile, plan, report = (os.path.join(tmp, name + suffix) for suffix in (".profile.json", ".plan.json",
                                                                                     ".run.json"))
            run("profile", os.path.join(models, name + ".pt"), *inputs, "-o", profile)
            loose = json.loads(run("solve", profile, "--budget", "1TB", "-o", "-"))
            budget = (loose["min_budget_bytes"] + loose["predicted"]["peak_bytes"]) // 2
            run("solve", profile, "--budget", str(budget), "-o", plan)
            run("run", os.path.join(models, name + ".pt"), "--plan", plan, "--steps", str(args.steps), "-o", report)
            with open(plan) as f:
                wrapped = len(json.load(f)["checkpoint_modules"])
            with open(report) as f:
                r = json.load(f)
            predicted, measured = r["predicted"]["peak_bytes"], r["measured"]["peak_bytes"]
            overhead, measured_overhead = r["predicted"]["overhead_pct"], r["measured_overhead_pct"]
            print(f"| {name} | {wrapped} | {budget:,} | {predicted:,} | {measured:,} | "
                  f"{(predicted - measured) / measured * 100:+.2f}% | {overhead:+.1f}% | {measured_overhead:+.1f}% | "
                  f"{overhead - measured_overhead:+.1f} pp | {r['verdict']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
