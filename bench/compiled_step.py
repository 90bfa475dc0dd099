"""What a torch.compile'd training step holds under a ckplan plan, against the
plan's prediction (made for eager PyTorch). For each test model named: its
.pt2 profiled, PyTorch-target plans solved with Adam (for-loop) at no
checkpointing, the halfway budget and the smallest; each plan applied to a
fresh eager model, then the same model compiled (`torch.compile`, inductor on
the CPU); the second of two training steps measured by the profiler's memory
timeline, as tests/python/test_apply_plan.py measures one. Prints a Markdown
table (docs/measurements.md, "Under torch.compile"). Compiling takes about a
minute per plan on this machine.

    .venv/bin/python bench/compiled_step.py [--ckplan build/ckplan] [--models build/test_models] gpt2 llama
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "models"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import torch  # noqa: E402

import ckplan_torch  # noqa: E402
import make_models  # noqa: E402
from test_apply_plan import step_peak  # noqa: E402


def ckplan(binary, *args):
    return subprocess.run([binary, *args], capture_output=True, text=True, check=True).stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckplan", default="build/ckplan")
    parser.add_argument("--models", default="build/test_models")
    parser.add_argument("names", nargs="+")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| model | plan | wrapped | predicted (B) | eager (B) | compiled (B) | compiled against predicted |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        for name in args.names:
            factory, texts = make_models.MODELS[name]
            profile = os.path.join(work, name + ".profile.json")
            ckplan(args.ckplan, "profile", os.path.join(args.models, name + ".pt2"),
                   *[a for t in texts for a in ("--input", t)], "--reps", "1", "-o", profile)
            loose = json.loads(ckplan(args.ckplan, "solve", profile, "--budget", "1TB", "--optimizer", "adam", "-o", "-"))
            smallest = loose["min_budget_bytes"]
            for label, budget in (("none", None), ("halfway", (smallest + loose["predicted"]["peak_bytes"]) // 2),
                                  ("smallest", smallest)):
                plan = loose if budget is None else json.loads(
                    ckplan(args.ckplan, "solve", profile, "--budget", str(budget), "--optimizer", "adam", "-o", "-"))
                measured = {}
                for mode in ("eager", "compiled"):
                    torch.manual_seed(0)
                    model = factory().train()
                    generator = torch.Generator().manual_seed(0)
                    inputs = [make_models.make_input(t, generator) for t in texts]
                    ckplan_torch.apply_plan(model, plan)
                    run = torch.compile(model) if mode == "compiled" else model
                    measured[mode] = step_peak(run, inputs, lambda p: torch.optim.Adam(p, foreach=False))
                predicted = plan["predicted"]["peak_bytes"]
                print(f"| {name} | {label} | {len(plan['checkpoint_modules'])} | {predicted:,} | {measured['eager']:,} | "
                      f"{measured['compiled']:,} | {(measured['compiled'] - predicted) / predicted * 100:+.1f}% |",
                      flush=True)


if __name__ == "__main__":
    main()
