#!/usr/bin/env python3
"""Checks ckplan's layering: every quoted include names a file from the repo
root, and a part includes only from itself and the parts it builds on.

    python3 scripts/check_layers.py [REPO_ROOT]

Parts, each on the ones listed for it (planner/CMakeLists.txt and
libtorch/CMakeLists.txt link them in the same order):

    planner/base       (nothing)
    planner/contracts  base
    planner/cost       base, contracts
    planner/solvers    base, contracts, cost
    planner/plan       base, contracts, cost, solvers
    gpu                (nothing)
    libtorch/runtime   planner, gpu
    libtorch/executor  planner, gpu, runtime
    libtorch/profiler  planner, gpu, runtime, executor
    cli                planner; cli/cmd_torch.cc (ckplan-torch only) libtorch too

A test beside its subject (`*_test.cc`) may also include tests/, the
planner's other parts and, in libtorch/, libtorch's; tests/ and bench/ may include anything. The planner and
the torch-free CLI never include LibTorch (<torch/...>, <ATen/...>, <c10/...>).
Exit 0 when all hold; 1 and one line per violation otherwise.
"""

import os
import re
import sys

PLANNER = ["planner/base", "planner/contracts", "planner/cost", "planner/solvers", "planner/plan"]
LIBTORCH = ["libtorch/runtime", "libtorch/executor", "libtorch/profiler"]
ALLOWED = {
    "gpu": ["gpu"],
    "cli": PLANNER + ["cli"],
}
for k, part in enumerate(PLANNER):
    ALLOWED[part] = PLANNER[: k + 1]
for k, part in enumerate(LIBTORCH):
    ALLOWED[part] = PLANNER + ["gpu"] + LIBTORCH[: k + 1]
TORCH = re.compile(r"#include\s*<(torch|ATen|c10)/")
INCLUDE = re.compile(r'#include\s*"([^"]+)"')


def part_of(path):
    for part in sorted(ALLOWED, key=len, reverse=True):
        if path == part or path.startswith(part + "/"):
            return part
    return None


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    checked = 0
    for top in ("planner", "gpu", "libtorch", "cli", "tests", "bench"):
        for folder, _, files in os.walk(os.path.join(root, top)):
            for name in sorted(files):
                if not name.endswith((".h", ".cc")):
                    continue
                path = os.path.relpath(os.path.join(folder, name), root)
                part = part_of(path)
                with open(os.path.join(root, path), encoding="utf-8") as fh:
                    lines = fh.read().splitlines()
                checked += 1
                test = name.endswith("_test.cc")
                allowed = list(ALLOWED.get(part, [])) if part else None
                if allowed is not None and test:  # and the other parts of its own top folder
                    allowed += ["tests"] + PLANNER + (LIBTORCH if path.startswith("libtorch/") else [])
                if path == "cli/cmd_torch.cc":
                    allowed += ["gpu"] + LIBTORCH
                for number, line in enumerate(lines, 1):
                    where = "%s:%d" % (path, number)
                    if TORCH.search(line) and (path.startswith("planner/") or
                                               (part == "cli" and path != "cli/cmd_torch.cc")):
                        problems.append("%s: includes LibTorch, which %s never does" % (where, part))
                    m = INCLUDE.search(line)
                    if not m:
                        continue
                    target = m.group(1)
                    if not os.path.isfile(os.path.join(root, target)):
                        problems.append('%s: "%s" is not a path from the repo root' % (where, target))
                        continue
                    if allowed is None:
                        continue  # tests/ and bench/ may include anything
                    target_part = part_of(target) or target.split("/")[0]
                    if target_part not in allowed:
                        problems.append('%s: %s includes "%s" (%s), which it does not build on' %
                                        (where, part, target, target_part))
    for line in problems:
        print(line)
    print("%d files checked, %d layering problem(s)" % (checked, len(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
