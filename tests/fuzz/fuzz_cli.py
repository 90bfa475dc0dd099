#!/usr/bin/env python3
"""Fuzzes the torch-free ckplan CLI with structured mutations of valid inputs.

Starts from the example profile in data/, the chain `solve --chain-out` cuts
it into, and a `ckplan.run/1` report; mutates one to three fields of each
(numbers at the edges of int64 and double, wrong types, deleted keys,
repeated or dropped list items, deep nesting, long module paths, truncated
text), runs `ckplan solve` or `ckplan report` on each, and fails on:
  - an exit code other than 0, 2, 3 or 4, or a signal;
  - a run over --timeout seconds;
  - a sanitizer report on stderr;
  - an error that is not one line `ckplan: error: ...`;
  - any file left in the output folder by a run that failed, or any file
    other than the one asked for by a run that succeeded.
With --mode plan, the mutated files are plans (from `ckplan solve` on the
example profile, for data/example.pt) run by `ckplan run` (LibTorch: each
case costs a second or more, so a few hundred cases), under
CKPLAN_MEMORY_LIMIT=1GiB so that a plan asking for a huge batch is refused
without exhausting the machine; the failure rules are the same.
With --mode apply, the mutated plans go in process through the Python
helper (python/ckplan_torch/: apply_plan, a training step, remove_plan)
on the example model built from data/make_example.py: it must raise
ValueError or KeyError (its documented errors) or wrap modules that still
train; any other exception fails the case.
Standard library only (torch for --mode apply). Deterministic for a given --seed; stops starting new
cases after --max-seconds so that the whole test stays bounded.
"""

import argparse
import concurrent.futures
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

INT64_MAX = 2**63 - 1
EDGE_NUMBERS = [0, 1, -1, 0.5, -0.0, 2**31, 2**50, 2**50 + 1, 2**53 + 1, 2**62, INT64_MAX, INT64_MAX + 1,
                2**64 - 1, -(2**63), 1e15, 1e20, 1e300, -1e300, 1e-300, 16384, 1e9, 1e9 + 1]
# Written into the text as they are: not representable in Python's json.
RAW_NUMBERS = ["1e400", "-1e400", "NaN", "Infinity", "18446744073709551616", "1" + "0" * 400, "0.1e-400"]
# Input texts a plan's source may name: valid, odd, too large, malformed.
INPUT_TEXTS = ["8x3x32x32", "1x3x32x32", "3x3x32x32", "64x3x32x32", "8x3x33x32", "8x3x32", "8x3x32x32x1", "0x3x32x32",
               "4096x3x32x32", "100000x3x224x224", "999999999999x999999999999", "8x3x32x32:int64:0..1e300",
               "8x3x32x32:float64", "8x3x32x32:bfloat16", "8x3x32x32:bool", "x", ""]
BUDGETS = ["1MB", "8MiB", "64MiB", "1GB", "1TB", "100", "1EiB", "9.1e18", "9.2e18", "7.99EiB"]


def walk(node, path=()):
    """Every (path, value) in the document."""
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from walk(value, path + (key,))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from walk(value, path + (index,))


def get(doc, path):
    for key in path:
        doc = doc[key]
    return doc


def put(doc, path, value):
    if not path:
        return value
    get(doc, path[:-1])[path[-1]] = value
    return doc


class Mutator:
    def __init__(self, rng):
        self.rng = rng
        self.raw = {}  # placeholder string -> raw JSON text

    def placeholder(self, text):
        key = "@@RAW%d@@" % len(self.raw)
        self.raw[key] = text
        return key

    def mutate(self, doc):
        rng = self.rng
        nodes = list(walk(doc))
        numbers = [(p, v) for p, v in nodes if isinstance(v, (int, float)) and not isinstance(v, bool)]
        kind = rng.random()
        if kind < 0.45 and numbers:
            path, value = rng.choice(numbers)
            pick = rng.random()
            if pick < 0.1:
                return put(doc, path, self.placeholder(rng.choice(RAW_NUMBERS)))
            if pick < 0.6:
                # Stays valid more often: the planner's arithmetic on odd but legal values.
                factor = rng.choice([0, 2, 3, 10, 1000, 10**6, 10**9])
                return put(doc, path, value * factor if isinstance(value, int) else value * float(factor))
            return put(doc, path, rng.choice(EDGE_NUMBERS))
        if kind < 0.55:
            # One value for every byte field (or every time) at once: all zero, all huge.
            suffix = rng.choice(["_bytes", "_ms"])
            value = rng.choice([0, 1, 2**40, 2**50, 2**49 + 3, 1e9, 16384])
            for path, old in numbers:
                if path and isinstance(path[-1], str) and path[-1].endswith(suffix) and rng.random() < 0.8:
                    put(doc, path, value)
            return doc
        path, value = rng.choice(nodes)
        if kind < 0.7 and isinstance(value, list) and value:
            op = rng.randrange(4)
            if op == 0:
                value.append(copy.deepcopy(rng.choice(value)))          # a repeated item
            elif op == 1:
                del value[rng.randrange(len(value))]                    # a dropped item
            elif op == 2:
                rng.shuffle(value)
            else:
                # Many repeats; not thousands: a chain of 1000 stages is a
                # long solve (tens of seconds), not a bug this test looks for.
                for _ in range(rng.choice([10, 100])):
                    value.append(copy.deepcopy(value[-1]))
            return doc
        if kind < 0.8 and isinstance(value, str):
            if path and path[-1] == "text":
                return put(doc, path, rng.choice(INPUT_TEXTS))
            op = rng.randrange(3)
            if op == 0:
                return put(doc, path, ".".join(["m"] * rng.choice([100, 5000, 100000])))  # a deep module path
            if op == 1:
                return put(doc, path, "")
            return put(doc, path, value + "\u00e9<&>\"")
        if kind < 0.85 and isinstance(value, dict) and value:
            del value[rng.choice(sorted(value))]                         # a missing field
            return doc
        if kind < 0.95 and path:
            replacement = rng.choice([None, True, "x", [], {}, [1, 2], {"a": 1}, -5, 3.25])
            return put(doc, path, replacement)
        if path:
            depth = rng.choice([10, 70, 1000, 100000])
            return put(doc, path, self.placeholder("[" * depth + "]" * depth))
        return doc

    def text(self, doc):
        text = json.dumps(doc, separators=(",", ":"))
        for key, raw in self.raw.items():
            text = text.replace('"' + key + '"', raw)
        if self.rng.random() < 0.03:
            text = text[: self.rng.randrange(len(text) + 1)]               # truncated
        return text


def seeds(ckplan, source_dir, work):
    profile_path = os.path.join(source_dir, "data", "example.profile.json")
    with open(profile_path) as f:
        profile = json.load(f)
    chain_path = os.path.join(work, "seed.chain.json")
    subprocess.run([ckplan, "solve", profile_path, "--chain-out", chain_path], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    with open(chain_path) as f:
        chain = json.load(f)
    # A small chain too: mutations of it run fastest.
    small = copy.deepcopy(chain)
    small["stages"] = small["stages"][:4]
    small.pop("input_storages", None)
    for stage in small["stages"]:
        for key in ("out_storages", "private_saved_bytes", "kept_out_storages"):
            stage.pop(key, None)
    run = {"schema": "ckplan.run/1", "algorithm": "optimal", "budget_bytes": 8000000,
           "measured": {"peak_bytes": 7000000, "step_ms": 20.5}, "baseline": {"step_ms": 18.0},
           "predicted": {"peak_bytes": 6900000, "time_ms": 19.0}, "verdict": "ok"}
    docs = {"profile": profile, "chain": chain, "small": small, "run": run}
    # Plans for data/example.pt: optimal (binary units), every (decimal units).
    for name, extra in (("plan", ["--budget", "9MiB"]), ("plan_every", ["--budget", "12MB", "--algo", "every"])):
        plan_path = os.path.join(work, name + ".json")
        subprocess.run([ckplan, "solve", profile_path, "-o", plan_path] + extra, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
        with open(plan_path) as f:
            docs[name] = json.load(f)
    return docs


def one_case(args, seed_docs, case, work):
    rng = random.Random(args.seed * 1000003 + case)
    if args.mode == "plan":
        kind = rng.choice(["plan", "plan", "plan_every"])
    else:
        kind = rng.choice(["small", "small", "chain", "chain", "profile", "run"])
    doc = copy.deepcopy(seed_docs[kind])
    mutator = Mutator(rng)
    for _ in range(rng.choice([1, 1, 2, 3])):
        doc = mutator.mutate(doc)
    text = mutator.text(doc)
    case_dir = os.path.join(work, "case%d" % case)
    out_dir = os.path.join(case_dir, "out")
    os.makedirs(out_dir)
    input_path = os.path.join(case_dir, "input.json")
    with open(input_path, "w") as f:
        f.write(text)
    if kind == "run":
        inputs = [os.path.join(args.source_dir, "data", "example.profile.json"), "--runs", input_path]
    else:
        inputs = [input_path]
    env = None
    if kind.startswith("plan"):
        expected = "run.json"
        model = os.path.join(args.source_dir, "data", "example.pt")
        command = [args.ckplan, "run", model, "--plan", input_path, "--steps", "1", "-o",
                   os.path.join(out_dir, expected)]
        command += rng.choice([[], [], [], ["--force"], ["--loss", "mse"], ["--loss", "mean"]])
        env = dict(os.environ, CKPLAN_MEMORY_LIMIT="1GiB")
    elif kind != "run" and rng.random() < 0.6:
        expected = "plan.json"
        command = [args.ckplan, "solve"] + inputs + ["--budget", rng.choice(BUDGETS), "-o",
                                                     os.path.join(out_dir, expected)]
        command += rng.choice([[], [], ["--algo", "none"], ["--algo", "sqrt"], ["--every", "2"],
                               ["--slots", "50"], ["--threads", "3"], ["--sweep", os.path.join(out_dir, "sweep.json")]])
    else:
        expected = rng.choice(["r.md", "r.json", "r.html"])
        command = [args.ckplan, "report"] + inputs + ["-o", os.path.join(out_dir, expected), "--slots", "100"]
        if rng.random() < 0.3:
            command += ["--budget", rng.choice(BUDGETS)]
    problems = []
    started = time.monotonic()
    try:
        result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                timeout=args.timeout, env=env)
        code, err = result.returncode, result.stderr.decode("utf-8", "replace")
        out = result.stdout.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        code, err, out = None, "", ""
        problems.append("took more than %g s" % args.timeout)
    elapsed = time.monotonic() - started
    if code is not None:
        if code < 0:
            problems.append("killed by signal %d" % -code)
        elif code not in (0, 2, 3, 4):
            problems.append("exit code %d" % code)
        if "Sanitizer" in err or "runtime error:" in err:
            problems.append("sanitizer report")
        # `run` exits 4 when the plan fails its check: a verdict and its report, not an error.
        verdict = kind.startswith("plan") and code == 4 and "\nverdict: " in out and not err.strip()
        if code != 0 and not verdict and not (err.startswith("ckplan: error: ") and err.count("\n") == 1):
            problems.append("not a one-line error")
    else:
        verdict = False
    left = sorted(os.listdir(out_dir))
    allowed = {expected, "sweep.json"} if code == 0 or verdict else set()
    if any(name not in allowed for name in left):
        problems.append("files left: %s" % ", ".join(left))
    if problems:
        keep = os.path.join(args.keep, "case%d.json" % case) if args.keep else None
        if keep:
            os.makedirs(args.keep, exist_ok=True)
            shutil.copy(input_path, keep)
        return "FAIL case %d (%s, %.1f s): %s\n  command: %s\n  stderr: %s" % (
            case, kind, elapsed, "; ".join(problems), " ".join(command), err.strip()[:600])
    if args.keep and code == 4:
        os.makedirs(args.keep, exist_ok=True)
        shutil.copy(input_path, os.path.join(args.keep, "case%d.exit4.json" % case))
    shutil.rmtree(case_dir)
    if args.verbose:
        print("case %d (%s): exit %s: %s" % (case, kind, code, err.strip()[:300]))
    return code


def apply_cases(args, seed_docs):
    """--mode apply: mutated plans through ckplan_torch.apply_plan in this process."""
    import importlib.util
    import io
    import torch
    sys.path.insert(0, os.path.join(args.source_dir, "python"))
    import ckplan_torch
    spec = importlib.util.spec_from_file_location("make_example", os.path.join(args.source_dir, "data",
                                                                                 "make_example.py"))
    make_example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_example)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = make_example.ExampleNet()
    names = [name for name, _ in model.named_modules()]
    x = torch.randn(2, 3, 32, 32)
    failures, codes = [], {}
    deadline = time.monotonic() + args.max_seconds
    ran = 0
    for case in range(args.cases):
        if time.monotonic() > deadline:
            break
        ran += 1
        rng = random.Random(args.seed * 1000003 + case)
        doc = copy.deepcopy(seed_docs[rng.choice(["plan", "plan_every"])])
        mutator = Mutator(rng)
        if rng.random() < 0.5:
            # What apply_plan reads: module paths, odd ones, and values of other types.
            doc["checkpoint_modules"] = rng.choice([
                rng.sample(names, rng.randrange(1, 4)), [rng.choice(names)] * 3, [""], ["layer1.0", None],
                ["no.such.module"], [[]], [{}], [1.5], "layer1.0", None, 7, {"layer1.0": 1}, [],
                [".".join(["m"] * 1000)], ["layer1.0\u00e9"]])
            if rng.random() < 0.2:
                doc = rng.choice([[], None, "plan", 3, [doc]])
        else:
            for _ in range(rng.choice([1, 1, 2, 3])):
                doc = mutator.mutate(doc)
        text = mutator.text(doc)
        outcome = "applied"
        try:
            paths = ckplan_torch.apply_plan(model, io.StringIO(text))
            model.zero_grad()
            model(x).sum().backward()
            if sorted(ckplan_torch.remove_plan(model)) != sorted(set(paths)):
                failures.append("FAIL case %d: remove_plan did not undo apply_plan's %s" % (case, paths))
        except (ValueError, KeyError) as e:
            outcome = type(e).__name__
            if ckplan_torch.checkpointed_modules(model):
                failures.append("FAIL case %d: %s left modules wrapped" % (case, outcome))
        except RecursionError:
            outcome = "RecursionError"  # Python's json on a nesting deeper than its stack: its own limit
        except Exception as e:  # anything else is a bug in the helper
            failures.append("FAIL case %d: %s: %s\n  plan: %s" % (case, type(e).__name__, str(e)[:300], text[:300]))
            ckplan_torch.remove_plan(model)
            continue
        codes[outcome] = codes.get(outcome, 0) + 1
    for failure in failures[:20]:
        print(failure)
    print("fuzz: %d of %d cases ran, %d failed (seed %d); outcomes of the others: %s" % (
        ran, args.cases, len(failures), args.seed, ", ".join("%s: %d" % kv for kv in sorted(codes.items()))))
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("--cases", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--mode", choices=["solve", "plan", "apply"], default="solve",
                        help="solve: chain/profile/run files through solve and report; plan: plans through run; "
                             "apply: plans through ckplan_torch.apply_plan")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds one run may take")
    parser.add_argument("--max-seconds", type=float, default=100.0, help="start no case after this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--verbose", action="store_true", help="print every case's outcome")
    parser.add_argument("--keep", help="copy failing inputs (and those that exit 4) into this folder")
    args = parser.parse_args()

    work = tempfile.mkdtemp(prefix="ckplan_fuzz_")
    try:
        seed_docs = seeds(args.ckplan, args.source_dir, work)
        if args.mode == "apply":
            return apply_cases(args, seed_docs)
        deadline = time.monotonic() + args.max_seconds
        failures, ran, codes = [], 0, {}
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            pending = set()
            case = 0
            while case < args.cases or pending:
                while case < args.cases and len(pending) < 2 * args.jobs and time.monotonic() < deadline:
                    pending.add(pool.submit(one_case, args, seed_docs, case, work))
                    case += 1
                if not pending:
                    break
                done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in done:
                    ran += 1
                    outcome = future.result()
                    if isinstance(outcome, str):
                        failures.append(outcome)
                    else:
                        codes[outcome] = codes.get(outcome, 0) + 1
        for failure in failures[:20]:
            print(failure)
        print("fuzz: %d of %d cases ran, %d failed (seed %d); exit codes of the others: %s" % (
            ran, args.cases, len(failures), args.seed, ", ".join("%s: %d" % kv for kv in sorted(codes.items()))))
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
