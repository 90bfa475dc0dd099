"""`ckplan profile` on every TorchScript and .pt2 test model, each under a
time limit: a hang fails (ckplan profile once deadlocked on traced models
whose recomputation re-entered its own checkpoint node, issue 25), and so
does a crash or a non-zero exit. On the models traced as users first trace
Hugging Face models (a ModelOutput dict, with and without labels), the
profile's kept bytes equal PyTorch's own count on the eager model, computed
by make_models.py, the loss is the model's own when it returns one, and
`ckplan run` under the default plan at a budget between its smallest and
none's peak says ok, wrapping no container the forward never calls (an
nn.ModuleList) (run by ctest, labels torch and python).

The models are make_models.py's list, not the folder's: a model the build
did not make fails its test."""
import json
import subprocess
import time

import pytest

from model_files import AS_USERS_TRACE, MODELS, input_flags, model_file, model_spec

# A profile of the largest test model takes about 20 s on this project's
# machines (2 cores, both busy under ctest -j2); a hang never ends.
LIMIT_S = 300

PROFILED = ([(name, ".pt") for name in MODELS] + [(name, ".pt2") for name in MODELS] +
            [(name, ".pt") for name in AS_USERS_TRACE])


def run(args, limit=LIMIT_S):
    """(the finished process or None on a hang, its last line of stderr, seconds)."""
    start = time.monotonic()
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {limit} s (a hang)", time.monotonic() - start
    return result, (result.stderr.strip().splitlines() or [""])[-1], time.monotonic() - start


@pytest.fixture(scope="module")
def profiles(ckplan, models_dir, tmp_path_factory):
    """Profiles a test model once for the module: (name, ext) -> (profile path or None, what went wrong)."""
    out = tmp_path_factory.mktemp("profiles")
    done = {}

    def profile_of(name, ext):
        if (name, ext) not in done:
            model = model_file(models_dir, name, ext)
            path = out / f"{name}{ext}.profile.json"
            result, last, seconds = run([ckplan, "profile", model, "-o", str(path), "--reps", "1"] +
                                        input_flags(model_spec(models_dir, name)))
            ok = result is not None and result.returncode == 0
            done[name, ext] = (path if ok else None, f"{seconds:.1f} s" + ("" if ok else f": {last}"))
        return done[name, ext]
    return profile_of


@pytest.mark.parametrize("name,ext", PROFILED, ids=[n + e for n, e in PROFILED])
def test_profiles(profiles, name, ext):
    """`ckplan profile --reps 1` exits 0 within the time limit and writes the profile."""
    path, what = profiles(name, ext)
    assert path is not None, f"{name}{ext}: not profiled ({what})"
    with open(path) as f:
        assert json.load(f)["ops"], f"{name}{ext}: a profile with no ops"


@pytest.fixture(scope="module")
def as_users(profiles, models_dir):
    """name -> (its NAME.json, its profile as a dict) for the models traced as users trace them."""
    loaded = {}

    def get(name):
        if name not in loaded:
            path, what = profiles(name, ".pt")
            if path is None:
                pytest.fail(f"{name}.pt: not profiled ({what})")
            with open(path) as f:
                loaded[name] = (model_spec(models_dir, name), json.load(f), path)
        return loaded[name]
    return get


@pytest.mark.parametrize("name", AS_USERS_TRACE)
def test_kept_bytes_equal_pytorch(as_users, name):
    """The profile's bytes kept for backward equal PyTorch's count on the eager model (make_models.py)."""
    spec, doc, _ = as_users(name)
    assert spec["saved_bytes"] > 0, f"{name}: PyTorch's count is {spec['saved_bytes']}"
    assert doc["totals"]["saved_bytes"] == spec["saved_bytes"], (
        f"{name}: kept for backward {doc['totals']['saved_bytes']} B, PyTorch's count on the eager model "
        f"{spec['saved_bytes']} B")


@pytest.mark.parametrize("name", AS_USERS_TRACE)
def test_loss_is_the_models_own(as_users, name):
    """A model given its labels back-propagates its own loss; one without, its outputs; the profile says which."""
    spec, doc, _ = as_users(name)
    expected = "model" if spec["returns_loss"] else "outputs"
    assert doc["model"].get("loss") == expected, f"{name}: loss {doc['model'].get('loss')}, expected {expected}"
    assert "output_choice" in doc["model"], f"{name}: the profile does not say which output it chose"


@pytest.mark.parametrize("name", AS_USERS_TRACE)
def test_run_under_default_plan(ckplan, models_dir, as_users, name, tmp_path):
    """The default plan (PyTorch target) halfway between the smallest budget and none's peak: no container the
    forward never calls (the decoder layers' nn.ModuleList) among its modules, and `ckplan run` says ok."""
    _, doc, profile = as_users(name)
    solved = subprocess.run([ckplan, "solve", str(profile), "--budget", "1TB", "-o", "-"], capture_output=True,
                            text=True)
    assert solved.returncode == 0, f"{name}: solve at 1TB: {solved.stderr.strip()}"
    loose = json.loads(solved.stdout)
    smallest, none = loose.get("min_budget_bytes"), loose.get("predicted", {}).get("peak_bytes")
    assert smallest and none, f"{name}: the plan has no min_budget_bytes or predicted.peak_bytes"
    budget = (smallest + none) // 2
    plan = tmp_path / "plan.json"
    solved = subprocess.run([ckplan, "solve", str(profile), "--budget", str(budget), "-o", str(plan)],
                            capture_output=True, text=True)
    assert solved.returncode == 0, f"{name}: solve at {budget} B: {solved.stderr.strip()}"
    with open(plan) as f:
        wrapped = json.load(f)["checkpoint_modules"]
    containers = doc["model"].get("containers", [])
    assert containers, f"{name}: the profile lists no container (its layers sit in an nn.ModuleList)"
    assert not set(containers) & set(wrapped), f"{name}: the plan wraps containers {set(containers) & set(wrapped)}"
    result, last, _ = run([ckplan, "run", model_file(models_dir, name, ".pt"), "--plan", str(plan), "--steps", "1",
                           "-o", "-"])
    verdict = json.loads(result.stdout).get("verdict") if result is not None and result.stdout else None
    assert verdict == "ok", f"{name}: ckplan run at {budget} B: verdict {verdict} ({last})"
