"""The invariant of issue 12 on every test model: profiles each one (`ckplan
profile`, one rep) and runs the planner's invariant test on the profiles
(planner/plan/invariant_test.cc): at 20 budgets from the smallest feasible one to
the peak without checkpointing, optimal (PyTorch and schedule targets) never
slower than a fitting baseline, its smallest budget no more than any
baseline's peak, and with nothing recomputed the same peak as `none`."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckplan", required=True)
    ap.add_argument("--planner-tests", required=True)
    ap.add_argument("--models", required=True)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        profiles = []
        for name in sorted(os.listdir(args.models)):
            if not name.endswith(".json"):
                continue
            model = os.path.join(args.models, name[:-5] + ".pt")
            if not os.path.exists(model):
                continue
            spec = json.load(open(os.path.join(args.models, name)))
            if "inputs" not in spec:
                continue
            out = os.path.join(tmp, name[:-5] + ".profile.json")
            inputs = [a for t in spec["inputs"] for a in ("--input", t)]
            subprocess.run([args.ckplan, "profile", model, *inputs, "--reps", "1", "-o", out], check=True,
                           stdout=subprocess.DEVNULL)
            profiles.append(out)
        print(f"{len(profiles)} test models profiled", flush=True)
        env = dict(os.environ, CKPLAN_INVARIANT_PROFILES=":".join(profiles))
        result = subprocess.run([args.planner_tests, "-tc=*CKPLAN_INVARIANT_PROFILES*"], env=env)
        return result.returncode if profiles else 1


def test_invariant_models(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--planner-tests", "--models") == 0


if __name__ == "__main__":
    sys.exit(main())
