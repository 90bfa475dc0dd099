#!/usr/bin/env python3
"""Compares what two builds of ckplan print and write, byte for byte.

    python3 scripts/compare_outputs.py BASE_BUILD NEW_BUILD [--models a,b] [--no-profile] [--keep DIR]

Each build directory holds `ckplan` (and `ckplan-torch` for profile and run)
and `test_models/` (made at build time). For every test model and for
data/example.profile.json it runs, with each build, from the same input
files:

  * `profile` (`--reps 1`) of each test model, whose JSON is compared with
    the run-dependent fields removed: every key ending in `_ms` (op, stage,
    step and optimizer times), `environment.time_model` (the cost model's
    measured figures) and `environment.hostname` / `environment.date` when
    present, and the measured scales (keys ending `_scale`: what a
    recomputation costs per ms of its ops, a ratio of two timings). Everything
    else (ops, tensors, bytes, peaks) must be equal;
  * `solve` at several budgets (fractions of the profile's measured peak and
    of its smallest budget: some are infeasible, exit 3), each with
    `--target pytorch` and `--target schedule`, with and without `--algo`
    baselines: the exit code, stdout (the strategy table), stderr and the
    plan JSON (`-o`), and a `--sweep` file;
  * `report` as JSON, Markdown and HTML, and its stdout;
  * `solve --data-parallel 2` with each `--shard`, `--pipeline 2` (1f1b and
    gpipe), and `report --plan` of the base build's distributed plans;
  * `run --steps 1` of data/example.pt under a plan, run JSON compared
    without times (`*_ms`, `*overhead_pct`).

The profiles that solve and report read are the BASE build's (the same
file for both builds), so a profiler change cannot hide a planner change.
Exit 0 when everything is equal; 1 and a unified diff of the first
differences otherwise.
"""

import argparse
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIME_KEYS_DROPPED = ("_ms", "_scale")


def strip_times(node, path=""):
    """The JSON without run-dependent fields (see the module doc)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key.endswith(TIME_KEYS_DROPPED) or key.endswith("overhead_pct"):
                continue
            if path == "environment" and key in ("time_model", "hostname", "date"):
                continue
            out[key] = strip_times(value, key if not path else path + "." + key)
        return out
    if isinstance(node, list):
        return [strip_times(v, path) for v in node]
    return node


def mask_times(text):
    """Profile and run print measured times: each time (`0.36 ms`) becomes `T ms`, each percentage
    (`+4.7%`, the measured overhead) `P%`, and runs of spaces one space (table columns follow the
    widths of the times)."""
    text = re.sub(r"-?\d+(\.\d+)? ms\b", "T ms", text)
    text = re.sub(r"[-+]?\d+(\.\d+)?%", "P%", text)
    return re.sub(r" +", " ", text)


def run(cmd, cwd, env=None):
    p = subprocess.run(cmd, cwd=cwd, capture_output=True, env=env, timeout=900)
    return p.returncode, p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")


class Side:
    def __init__(self, build, work, name):
        self.build = os.path.abspath(build)
        self.ckplan = os.path.join(self.build, "ckplan")
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)

    def case_dir(self, case):
        d = os.path.join(self.dir, case)
        os.makedirs(d, exist_ok=True)
        return d


def collect(side, case, args, outputs, strip=None, env=None):
    """Runs `ckplan args` in the case's folder; the texts to compare."""
    d = side.case_dir(case)
    for f in outputs:
        p = os.path.join(d, f)
        if os.path.exists(p):
            os.remove(p)
    code, out, err = run([side.ckplan] + args, d, env)
    if strip is not None:  # a measuring command: its printed times vary
        out, err = mask_times(out), mask_times(err)
    texts = {"exit": str(code) + "\n", "stdout": out, "stderr": err}
    for f in outputs:
        p = os.path.join(d, f)
        if not os.path.exists(p):
            texts[f] = "(missing)\n"
            continue
        with open(p, encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        if strip is not None and f.endswith(".json"):
            text = json.dumps(strip(json.loads(text)), indent=1, sort_keys=True) + "\n"
        texts[f] = text
    return texts


def budgets_for(profile):
    """Budgets around the model's range: some infeasible, one near the smallest, some between."""
    with open(profile) as f:
        totals = json.load(f).get("totals", {})
    peak = int(totals.get("peak_bytes", 0)) or 1 << 20
    return [str(int(peak * k)) for k in (0.3, 0.55, 0.7, 0.85, 1.2)] + ["%.3fMB" % (peak * 0.6 / 1e6)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("base", help="build directory of the base (ckplan, ckplan-torch, test_models/)")
    ap.add_argument("new", help="build directory to compare with it")
    ap.add_argument("--models", default="", help="comma-separated test models (default: all with a .json)")
    ap.add_argument("--no-profile", action="store_true", help="skip profile and run (planner-only changes)")
    ap.add_argument("--keep", default="", help="keep the outputs in this folder (default: a temporary one)")
    ap.add_argument("--max-diff", type=int, default=40, help="diff lines shown per difference")
    args = ap.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="ckplan-compare-")
    os.makedirs(work, exist_ok=True)
    base, new = Side(args.base, work, "base"), Side(args.new, work, "new")
    models_dir = os.path.join(base.build, "test_models")
    names = sorted(f[:-5] for f in os.listdir(models_dir) if f.endswith(".json") and os.path.exists(
        os.path.join(models_dir, f[:-5] + ".pt")))
    if args.models:
        names = [n for n in args.models.split(",") if n]
    profiles_dir = os.path.join(work, "profiles")
    os.makedirs(profiles_dir, exist_ok=True)
    env = dict(os.environ, CKPLAN_MEMORY_LIMIT=os.environ.get("CKPLAN_MEMORY_LIMIT", "4GiB"))

    differences = 0
    cases = 0

    def compare(case, texts_base, texts_new):
        nonlocal differences, cases
        cases += 1
        for key in texts_base:
            a, b = texts_base[key], texts_new.get(key, "(missing)\n")
            if a == b:
                continue
            differences += 1
            print("DIFFERENT: %s: %s" % (case, key))
            diff = list(difflib.unified_diff(a.splitlines(), b.splitlines(), "base/" + key, "new/" + key, lineterm="", n=1))
            for line in diff[: args.max_diff]:
                print("  " + line)
            if len(diff) > args.max_diff:
                print("  ... %d more diff lines" % (len(diff) - args.max_diff))

    def both(case, cmd, outputs, strip=None):
        compare(case, collect(base, case, cmd, outputs, strip, env), collect(new, case, cmd, outputs, strip, env))

    inputs = []  # (name, profile path)
    for name in names:
        with open(os.path.join(models_dir, name + ".json")) as f:
            spec = json.load(f)
        model = os.path.join(models_dir, name + ".pt")
        profile = os.path.join(profiles_dir, name + ".profile.json")
        cmd = ["profile", model, "--reps", "1", "-o", "profile.json"]
        for text in spec["inputs"]:
            cmd += ["--input", text]
        if not args.no_profile or not os.path.exists(profile):
            texts = collect(base, "profile-" + name, cmd, ["profile.json"], lambda j: j, env)
            if texts["exit"] != "0\n":
                print("base profile of %s failed: %s" % (name, texts["stderr"].strip()))
                differences += 1
                continue
            shutil.copy(os.path.join(base.case_dir("profile-" + name), "profile.json"), profile)
            if not args.no_profile:
                strip = lambda j: strip_times(j)
                compare("profile " + name, collect(base, "profile-" + name, cmd, ["profile.json"], strip, env),
                        collect(new, "profile-" + name, cmd, ["profile.json"], strip, env))
        inputs.append((name, profile))
    inputs.append(("example", os.path.join(ROOT, "data", "example.profile.json")))

    for name, profile in inputs:
        for budget in budgets_for(profile):
            for target in ("pytorch", "schedule"):
                both("solve %s %s %s" % (name, budget, target),
                     ["solve", profile, "--budget", budget, "--target", target, "-o", "plan.json"], ["plan.json"])
        budget = budgets_for(profile)[3]
        for algo in ("none", "every", "sqrt"):
            both("solve %s %s --algo %s" % (name, budget, algo),
                 ["solve", profile, "--budget", budget, "--algo", algo, "-o", "plan.json"], ["plan.json"])
        both("solve %s --every 3" % name, ["solve", profile, "--budget", budget, "--every", "3", "-o", "-"], [])
        both("solve %s --sweep" % name,
             ["solve", profile, "--budget", budget, "--target", "schedule", "--sweep", "sweep.json", "-o", "plan.json"],
             ["sweep.json", "plan.json"])
        both("solve %s --show-stages" % name, ["solve", profile, "--show-stages", "--chain-out", "chain.json"],
             ["chain.json"])
        for fmt in ("json", "md", "html"):
            both("report %s %s" % (name, fmt), ["report", profile, "-o", "report." + fmt], ["report." + fmt])
        both("report %s budget" % name, ["report", profile, "--budget", budgets_for(profile)[4], "-o", "report.md"],
             ["report.md"])
        # Distributed plans (`distributed`, `pipeline_stage`) and the report's per-rank table of them,
        # the report reading the base build's plan.
        wide = budgets_for(profile)[4]
        for shard in ("none", "optimizer", "grad", "full"):
            both("solve %s --data-parallel 2 --shard %s" % (name, shard),
                 ["solve", profile, "--budget", wide, "--data-parallel", "2", "--shard", shard, "-o", "plan.json"],
                 ["plan.json"])
        for schedule, microbatches in (("1f1b", "4"), ("gpipe", "2")):
            both("solve %s --pipeline 2 --schedule %s" % (name, schedule),
                 ["solve", profile, "--budget", wide, "--pipeline", "2", "--microbatches", microbatches,
                  "--schedule", schedule, "-o", "plan.json"], ["plan.json"])
        for kind, case in (("ranks", "solve %s --data-parallel 2 --shard full" % name),
                           ("stages", "solve %s --pipeline 2 --schedule 1f1b" % name)):
            plan = os.path.join(base.case_dir(case), "plan.json")
            if os.path.exists(plan):
                kept = os.path.join(profiles_dir, "%s.%s.plan.json" % (name, kind))
                shutil.copy(plan, kept)
                for fmt in ("json", "md"):
                    both("report %s --plan (%s) %s" % (name, case, fmt),
                         ["report", profile, "--plan", kept, "-o", "report." + fmt], ["report." + fmt])

    # A chain file, solved and reported directly.
    chain = os.path.join(base.case_dir("solve example --show-stages"), "chain.json")
    if os.path.exists(chain):
        kept = os.path.join(profiles_dir, "example.chain.json")
        shutil.copy(chain, kept)
        for budget in ("2MiB", "4MB", "8MiB"):
            both("solve chain %s" % budget, ["solve", kept, "--budget", budget, "-o", "plan.json"], ["plan.json"])
        both("report chain", ["report", kept, "-o", "report.md"], ["report.md"])

    if not args.no_profile:
        # `ckplan run` reads a plan (base's, the same file) and writes ckplan.run/1.
        example = os.path.join(ROOT, "data", "example.pt")
        plan = os.path.join(profiles_dir, "example.plan.json")
        code, _, err = run([base.ckplan, "solve", os.path.join(ROOT, "data", "example.profile.json"), "--budget",
                            budgets_for(os.path.join(ROOT, "data", "example.profile.json"))[3], "--target", "schedule",
                            "-o", plan], work, env)
        if code == 0:
            strip = lambda j: strip_times(j)
            both("run example", ["run", example, "--plan", plan, "--steps", "1", "--force", "-o", "run.json"],
                 ["run.json"], strip)
            # --runs in a report
            runs = os.path.join(profiles_dir, "example.run.json")
            shutil.copy(os.path.join(base.case_dir("run example"), "run.json"), runs)
            both("report example --runs", ["report", os.path.join(ROOT, "data", "example.profile.json"), "--runs", runs,
                                           "-o", "report.md"], ["report.md"])
        else:
            print("base solve for the run failed: " + err.strip())
            differences += 1

    print("%d cases, %d differences (outputs in %s)" % (cases, differences, work))
    if not args.keep and differences == 0:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if differences else 0


if __name__ == "__main__":
    sys.exit(main())
