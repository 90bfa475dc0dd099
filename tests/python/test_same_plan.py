"""The same plan on every run, and Plan.replan (issue 47).

Two profiles of each test model, made as ``ckplan_torch.plan`` makes them (one measured step, the
wrapped modules' recomputation timed): their plans at five budgets from the smallest to no
checkpointing are the same, or, where the noise decided between two plans, each run's plan costs the
other run no more than that run's stated band or 2% of its step (priced there with ``--wrap``).
And ``Plan.replan`` at another budget, target or optimizer equals ``ckplan solve`` of the same profile.
"""
import json
import subprocess

import pytest
import torch

import ckplan_torch
from ckplan_torch._planning import PLAN_PROFILE_REPS
from model_files import MODELS, model_file

pytestmark = pytest.mark.usefixtures("one_thread_module")

# Where two runs' plans differ, how much more the other's may cost on this run's figures beyond the band.
DRIFT = 0.02


def _solve(ckplan, profile, budget, *flags):
    done = subprocess.run([ckplan, "solve", profile, "--budget", str(budget), *flags, "-o", "-"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def two_profiles(ckplan, models_dir, tmp_path_factory):
    def make(name):
        folder = tmp_path_factory.mktemp(name)
        paths = []
        for run in range(2):
            path = str(folder / f"run{run}.json")
            done = subprocess.run([ckplan, "profile", model_file(models_dir, name, ".pt2"), "--reps",
                                   str(PLAN_PROFILE_REPS), "--calibrate", "pytorch", "-o", path],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr
            paths.append(path)
        return paths
    return make


def _priced_on(ckplan, profile, budget, modules, *flags):
    """The predicted step time of wrapping exactly `modules` on `profile`'s figures."""
    if not modules:
        plan = _solve(ckplan, profile, budget, *flags)
        return next(row["time_ms"] for row in plan["strategies"] if row["name"] == "none")
    return _solve(ckplan, profile, budget, *flags, "--wrap", ",".join(modules))["pytorch"]["predicted"]["time_ms"]


@pytest.mark.parametrize("name", MODELS)
def test_two_profiles_plan_alike(name, ckplan, two_profiles):
    first, second = two_profiles(name)
    top = _solve(ckplan, first, 10**13)
    smallest = top["min_budget_bytes"]
    none = next(row["peak_bytes"] for row in top["strategies"] if row["name"] == "none")
    assert smallest <= none
    budgets = sorted({smallest + (none - smallest) * k // 4 for k in range(5)})
    differ = []
    for budget in budgets:
        a, b = _solve(ckplan, first, budget), _solve(ckplan, second, budget)
        if a["checkpoint_modules"] == b["checkpoint_modules"]:
            continue
        differ.append(budget)
        for profile, own, other in ((first, a, b), (second, b, a)):
            band = own["solver"].get("tie_ms", 0)
            theirs = _priced_on(ckplan, profile, budget, other["checkpoint_modules"])
            ours = own["pytorch"]["predicted"]["time_ms"]
            # Within the stated band, or 2% of the step: the band covers the op times' noise, not the
            # calibration's, which moves a plan's price between runs too (DenseNet: 1.6%).
            assert theirs <= ours + max(band, ours * DRIFT) + 1e-6, (
                f"at {budget} B the two profiles chose {a['checkpoint_modules']} and {b['checkpoint_modules']}; "
                f"the other's costs {theirs:.3f} ms on {profile}, beyond its plan's {ours:.3f} ms + band {band:.3f}")
    # Most budgets give the same plan; a difference is a tie the noise decided (checked above). Three
    # profiles of MobileNetV2 differed at two of its budgets (docs/measurements.md#what-plan-costs).
    assert len(differ) <= 2, f"plans differ at {differ} of {budgets}"


@pytest.fixture(scope="module")
def gpt_plan(ckplan):
    import make_models
    factory, texts = make_models.MODELS["gpt"]
    torch.manual_seed(0)
    model = factory().train()
    ids = make_models.make_input(texts[0], torch.Generator().manual_seed(0))
    return ckplan_torch.plan(model, (ids,), 10**12, ckplan=ckplan), model, ids


def test_plan_times_its_phases(gpt_plan):
    plan, _, _ = gpt_plan
    phases = plan.phase_seconds
    for phase in ("export", "profile", "solve", "profile.warm_up", "profile.steps", "profile.calibration"):
        assert phases[phase] > 0, phases
    assert plan.profile["environment"]["reps"] == PLAN_PROFILE_REPS
    # Recomputation timed for the PyTorch target only: the schedule's figures are left out.
    assert "module_nograd_scale" in plan.profile["calibration"]
    assert "nograd_scale" not in plan.profile["calibration"]


@pytest.mark.parametrize("where", [0, 1, 2])
def test_replan_equals_solve_of_the_same_profile(gpt_plan, ckplan, tmp_path, where):
    plan, _, _ = gpt_plan
    none = next(row["peak_bytes"] for row in plan.strategies if row["name"] == "none")
    budget = plan.min_budget_bytes + (none - plan.min_budget_bytes) * where // 2
    again = plan.replan(budget)
    profile = str(tmp_path / "profile.json")
    plan.save_profile(profile)
    solved = _solve(ckplan, profile, budget, "--optimizer", "adamw")
    assert again.checkpoint_modules == solved["checkpoint_modules"]
    assert again.doc["pytorch"] == solved["pytorch"]
    assert again.strategies == solved["strategies"]
    assert again.profile is plan.profile
    assert "smallest budget" in repr(again)
    if where == 0:
        assert again.checkpoint_modules  # the smallest budget wraps something


def test_replan_to_another_target_and_optimizer(gpt_plan, ckplan, tmp_path):
    plan, _, _ = gpt_plan
    profile = str(tmp_path / "profile.json")
    plan.save_profile(profile)
    budget = plan.min_budget_bytes * 11 // 10
    sgd = plan.replan(budget, optimizer="sgd")
    assert sgd.doc["fixed"]["optimizer"] == "sgd"
    assert sgd.checkpoint_modules == _solve(ckplan, profile, budget, "--optimizer", "sgd")["checkpoint_modules"]
    sac = plan.replan(budget, target="sac", sac_dispatch_us=10)
    assert sac.target == "sac"
    assert sac.doc == _solve(ckplan, profile, budget, "--target", "sac", "--optimizer", "adamw",
                             "--optimizer-impl", "for-loop", "--sac-dispatch-us", "10.00") | {"source": sac.doc["source"]}
    with pytest.warns(UserWarning, match="schedule"):
        schedule = plan.replan(budget, target="schedule")
    assert schedule.target == "schedule"


def test_replan_below_the_smallest_budget_says_it(gpt_plan):
    plan, _, _ = gpt_plan
    with pytest.raises(ckplan_torch.CkplanError) as error:
        plan.replan(plan.min_budget_bytes - 1)
    assert error.value.exit_code == 3
    assert "\n" not in str(error.value)


def test_fresh_plan_equals_replan(gpt_plan, ckplan, tmp_path):
    # A second plan() profiles again: near the first's smallest budget it gives the first's replan, or
    # one within the first's stated band of it (a tie the noise decided), priced on the first's profile.
    plan, model, ids = gpt_plan
    budget = plan.min_budget_bytes * 21 // 20
    fresh = ckplan_torch.plan(model, (ids,), budget, ckplan=ckplan)
    again = plan.replan(budget)
    assert fresh.checkpoint_modules
    if fresh.checkpoint_modules != again.checkpoint_modules:
        profile = str(tmp_path / "profile.json")
        plan.save_profile(profile)
        theirs = _priced_on(ckplan, profile, budget, fresh.checkpoint_modules, "--optimizer", "adamw")
        assert theirs <= again.time_ms + max(again.doc["solver"].get("tie_ms", 0), again.time_ms * DRIFT) + 1e-6
