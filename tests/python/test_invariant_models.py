"""The invariant of issue 12 on every test model: profiles each one (`ckplan
profile`, one rep) and runs the planner's invariant test on its profile
(planner/plan/invariant_test.cc): at 20 budgets from the smallest feasible one to
the peak without checkpointing, optimal (PyTorch and schedule targets) never
slower than a fitting baseline, its smallest budget no more than any
baseline's peak, and with nothing recomputed the same peak as `none`.

One test per model of make_models.py's list; each fails when doctest ran no
test case or no assertion (a renamed test case matches no filter and doctest
exits 0)."""
import os
import re
import subprocess

import pytest

from model_files import MODELS, input_flags, model_file, model_spec

TEST_CASE = "*CKPLAN_INVARIANT_PROFILES*"


def doctest_counts(output, what):
    """(run, passed) from doctest's summary line for `what` ("test cases" or "assertions")."""
    found = re.search(rf"\[doctest\] {what}:\s*(\d+) \|\s*(\d+) passed", output)
    assert found, f"no doctest summary of {what} in: {output[-500:]}"
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize("name", MODELS)
def test_invariant(ckplan, planner_tests, models_dir, name, tmp_path):
    """The invariant holds on the model's profile, checked by one doctest case that made assertions."""
    profile = tmp_path / (name + ".profile.json")
    result = subprocess.run([ckplan, "profile", model_file(models_dir, name, ".pt"), "--reps", "1", "-o",
                             str(profile)] + input_flags(model_spec(models_dir, name)), capture_output=True, text=True)
    assert result.returncode == 0, f"{name}: ckplan profile exit {result.returncode}: {result.stderr.strip()}"
    env = dict(os.environ, CKPLAN_INVARIANT_PROFILES=str(profile))
    result = subprocess.run([planner_tests, f"-tc={TEST_CASE}"], env=env, capture_output=True, text=True)
    output = result.stdout + result.stderr
    cases, _ = doctest_counts(output, "test cases")
    assertions, passed = doctest_counts(output, "assertions")
    assert cases == 1, f"{name}: the filter {TEST_CASE} ran {cases} test cases, expected the invariant's one"
    assert assertions > 0, f"{name}: the invariant test made no assertion"
    assert result.returncode == 0 and passed == assertions, f"{name}: {output[-3000:]}"
