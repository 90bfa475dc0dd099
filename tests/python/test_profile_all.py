"""`ckplan profile` on every TorchScript and .pt2 test model, each under a
time limit: a hang fails (ckplan profile once deadlocked on traced models
whose recomputation re-entered its own checkpoint node, issue 25), and so
does a crash or a non-zero exit. On the models traced as users first trace
Hugging Face models (a ModelOutput dict, with and without labels), the
profile's kept bytes equal PyTorch's own count on the eager model, computed
by make_models.py, the loss is the model's own when it returns one, and
`ckplan run` under the default plan at a budget between its smallest and
none's peak says ok, wrapping no container the forward never calls (an
nn.ModuleList) (run by ctest, labels torch and python)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checks import check, finish  # noqa: E402

# A profile of the largest test model takes about 20 s on this project's
# machines (2 cores, both busy under ctest -j2); a hang never ends.
LIMIT_S = 300


def run(args, limit=LIMIT_S):
    start = time.monotonic()
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {limit} s (a hang)", time.monotonic() - start
    return result, (result.stderr.strip().splitlines() or [""])[-1], time.monotonic() - start


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--models", required=True)
    args = parser.parse_args(argv)
    out = tempfile.mkdtemp(prefix="ckplan-profile-all-")
    names = sorted(f[:-5] for f in os.listdir(args.models)
                   if f.endswith(".json") and f != "torch_version.json")
    for name in names:
        with open(os.path.join(args.models, name + ".json")) as f:
            reference = json.load(f)
        if "inputs" not in reference:
            continue
        inputs = [a for t in reference["inputs"] for a in ("--input", t)]
        for ext in (".pt", ".pt2"):
            model = os.path.join(args.models, name + ext)
            if not os.path.exists(model):
                continue
            profile = os.path.join(out, name + ext + ".profile.json")
            result, last, seconds = run([args.ckplan, "profile", model, "-o", profile, "--reps", "1"] + inputs)
            ok = result is not None and result.returncode == 0
            check(ok, f"{name}{ext}: profiled in {seconds:.1f} s" + ("" if ok else f": {last}"))
            if not ok or ext != ".pt" or "returns_loss" not in reference:
                continue
            with open(profile) as f:
                doc = json.load(f)
            check(doc["totals"]["saved_bytes"] == reference["saved_bytes"],
                  f"{name}: kept for backward {doc['totals']['saved_bytes']} B, PyTorch's count on the eager "
                  f"model {reference['saved_bytes']} B")
            expected_loss = "model" if reference["returns_loss"] else "outputs"
            check(doc["model"].get("loss") == expected_loss and "output_choice" in doc["model"],
                  f"{name}: the loss back-propagated is the {expected_loss} "
                  f"({doc['model'].get('output_choice', 'no choice printed')})")
            # The default plan (PyTorch target) halfway between the smallest
            # budget and none's peak, run as PyTorch runs it.
            plan = os.path.join(out, name + ".plan.json")
            solved = subprocess.run([args.ckplan, "solve", profile, "--budget", "1TB", "-o", "-"],
                                    capture_output=True, text=True)
            check(solved.returncode == 0, f"{name}: solve at 1TB")
            if solved.returncode != 0:
                continue
            loose = json.loads(solved.stdout)
            smallest, none = loose.get("min_budget_bytes"), loose.get("predicted", {}).get("peak_bytes")
            if not smallest or not none:
                check(False, f"{name}: the plan has min_budget_bytes and peak_bytes")
                continue
            budget = (smallest + none) // 2
            solved = subprocess.run([args.ckplan, "solve", profile, "--budget", str(budget), "-o", plan],
                                    capture_output=True, text=True)
            check(solved.returncode == 0, f"{name}: solve at {budget} B")
            if solved.returncode != 0:
                continue
            # Its decoder layers sit in an nn.ModuleList, which eager PyTorch never calls: the profile
            # lists it and no plan wraps it (wrapping it would checkpoint nothing).
            with open(plan) as f:
                wrapped = json.load(f)["checkpoint_modules"]
            containers = doc["model"].get("containers", [])
            check(containers and not set(containers) & set(wrapped),
                  f"{name}: containers {containers}, none of them among the plan's modules {wrapped}")
            result, last, seconds = run([args.ckplan, "run", model, "--plan", plan, "--steps", "1", "-o", "-"])
            verdict = json.loads(result.stdout).get("verdict") if result is not None and result.stdout else None
            check(verdict == "ok", f"{name}: ckplan run at {budget} B: verdict {verdict} ({last})")
    return finish()


def test_profile_all(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--models") == 0


if __name__ == "__main__":
    sys.exit(main())
