"""ckplan_torch.plan() given bad input, as a careful new user gives it: each error one line, of the
class the package documents, naming the value and the fix; the model's own errors told as such,
torch's log kept out of the terminal; every argument checked before the model is exported; files
that cannot be written named by the user's path; a plan of a newer ckplan said so; and two plan()
calls at once in one workdir, each given its own model's plan. Run with pytest (ctest runs it as
python_bad_input)."""
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from torch import nn

import ckplan_torch

pytestmark = pytest.mark.usefixtures("one_thread_module")

HERE = os.path.dirname(os.path.abspath(__file__))


class MLP(nn.Module):
    """Two layers: 8 features in, 4 out."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 16)
        self.b = nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class RaisesValueError(MLP):
    def forward(self, x):
        raise ValueError("the batch holds no sample")


class ReturnsFloat(MLP):
    def forward(self, x):
        return float(super().forward(x).sum())


class DataDependent(MLP):
    """Runs eagerly; torch.export cannot trace a Python branch on a tensor's value."""

    def forward(self, x):
        if x.sum().item() > 0:
            return super().forward(x)
        return -super().forward(x)


class MustNotRun(MLP):
    """A forward that fails loudly: a test that gives it a bad argument expects no export at all."""

    def forward(self, x):
        raise AssertionError("the model was exported before its arguments were checked")


def meta_mlp():
    with torch.device("meta"):
        return MLP()


def gpt2():
    """A 2-layer GPT-2 with random weights: (model, example_inputs, kwargs with its labels)."""
    import transformers
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=128, n_positions=32,
                                     bos_token_id=0, eos_token_id=0, use_cache=False)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(1))
    return transformers.GPT2LMHeadModel(config), (ids,), {"labels": ids}


def mlp():
    """The MLP at its example: (model, example_inputs, kwargs)."""
    torch.manual_seed(0)
    return MLP(), (torch.randn(4, 8),), {}


MODELS = {"mlp": mlp, "gpt2": gpt2}


def one_line(raised):
    text = str(raised.value)
    assert text and "\n" not in text, f"not one line: {text!r}"
    return text


def assert_names(text, *fragments):
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in {text!r}"


# ---- the model's own errors, told as such ------------------------------------------------------------

def gpt2_without_ids():
    model, (ids,), kwargs = gpt2()
    return model, (), kwargs


def gpt2_longer_than_its_positions():
    model, _, _ = gpt2()
    ids = torch.randint(0, 128, (2, 40))
    return model, (ids,), {"labels": ids}


# case: (model, example_inputs, kwargs, plan()'s other arguments), what the message names.
MODEL_ERRORS = {
    "wrong shape": (lambda: (MLP(), (torch.randn(4, 9),), {}, {}),
                    ["in module 'a' (Linear)", "takes (..., 8) float32", "example_inputs[0] is (4, 9) float32",
                     "give example_inputs as the training step passes them"]),
    "int64 for floats": (lambda: (MLP(), (torch.randint(0, 5, (4, 8)),), {}, {}),
                         ["in module 'a' (Linear)", "takes (..., 8) float32", "example_inputs[0] is (4, 8) int64",
                          "give example_inputs"]),
    "forward raises": (lambda: (RaisesValueError(), (torch.randn(4, 8),), {}, {}),
                       ["the forward raised ValueError: the batch holds no sample",
                        "example_inputs[0] (4, 8) float32", "must run"]),
    "returns a float": (lambda: (ReturnsFloat(), (torch.randn(4, 8),), {}, {}),
                        ["returned float", "the forward must return a tensor or a structure of tensors"]),
    "meta model, cpu inputs": (lambda: (meta_mlp(), (torch.randn(4, 8),), {}, {"gpu": "h100-sxm-80gb"}),
                               ["the model is on meta and example_inputs[0] on cpu", "x.to('meta')"]),
    "empty inputs": (lambda: (MLP(), (), {}, {}),
                     ["example_inputs=()", "hold no tensor", "pass the tensors MLP.forward(x) takes"]),
    "gpt2 without its ids": (lambda: gpt2_without_ids() + ({},),
                             ["the forward raised ValueError", "input_ids", "kwargs['labels'] (2, 16) int64",
                              "must run"]),
    "gpt2 past its positions": (lambda: gpt2_longer_than_its_positions() + ({},),
                                ["in module 'transformer.wpe' (Embedding)", "integer ids in 0..31", "40) int64",
                                 "give example_inputs"]),
}


@pytest.mark.parametrize("case", MODEL_ERRORS)
def test_the_models_own_error_is_told_as_such(case, ckplan, capfd, tmp_path):
    """One line naming the input and the fix; torch's log, if any, in the call's folder (workdir), not
    on the terminal."""
    make, fragments = MODEL_ERRORS[case]
    model, example_inputs, kwargs, options = make()
    capfd.readouterr()
    with pytest.raises(ckplan_torch.ExportError) as raised:
        ckplan_torch.plan(model, example_inputs, "1GB", kwargs=kwargs, ckplan=ckplan, workdir=tmp_path, **options)
    text = one_line(raised)
    assert_names(text, *fragments)
    assert "make forward traceable" not in text, text
    assert "--input" not in text and ".pt2" not in text, f"names the CLI or a temporary file: {text}"
    log = re.search(r"\(torch's log: (.+)\)$", text)
    assert log is None or (log.group(1).startswith(str(tmp_path)) and os.path.getsize(log.group(1)) > 0), text
    terminal = capfd.readouterr().err
    assert "Traceback" not in terminal and "def forward(" not in terminal, f"torch's log on the terminal:\n{terminal}"


def test_a_real_tracing_limit_keeps_its_advice(ckplan, capfd, tmp_path):
    """A forward that runs eagerly but does not trace: PyTorch's reason, "make forward traceable", and
    where torch's log of it is (the call's export.log, which holds it), the terminal left clean."""
    capfd.readouterr()
    with pytest.raises(ckplan_torch.ExportError) as raised:
        ckplan_torch.plan(DataDependent(), (torch.randn(4, 8),), "1GB", ckplan=ckplan, workdir=tmp_path)
    text = one_line(raised)
    assert_names(text, "torch.export could not export DataDependent", "make forward traceable")
    log = re.search(r"\(torch's log: (.+)\)$", text)
    assert log and log.group(1).endswith("export.log") and os.path.getsize(log.group(1)) > 0, text
    terminal = capfd.readouterr().err
    assert "Traceback" not in terminal and "def forward(" not in terminal, f"torch's log on the terminal:\n{terminal}"


def test_ckplans_refusal_of_the_inputs_names_the_argument(ckplan, tmp_path):
    """int64 into a Linear on the meta device: the meta forward lets it through, `ckplan profile`
    refuses it; the message names example_inputs[0], not --input and the temporary archive."""
    with pytest.raises(ckplan_torch.CkplanError) as raised:
        ckplan_torch.plan(meta_mlp(), (torch.zeros(4, 8, dtype=torch.int64, device="meta"),), "1GB",
                          gpu="h100-sxm-80gb", ckplan=ckplan, workdir=tmp_path)
    text = one_line(raised)
    assert_names(text, "the exported MLP", "module 'a'", "example_inputs[0] 4x8:int64", "give example_inputs")
    assert "--input" not in text and ".pt2" not in text, text


# ---- every argument checked before the model is exported ---------------------------------------------

def a_file(tmp_path):
    path = tmp_path / "a-file"
    path.write_text("")
    return path


# case: (plan()'s arguments, given the test's tmp_path), the exception, what the message names.
BAD_ARGUMENTS = {
    "budget with an unknown unit": (lambda tmp: {"budget": "24XB"}, ckplan_torch.ArgumentError,
                                    ["budget='24XB'", "unknown unit 'xb'", "GiB"]),
    "negative budget": (lambda tmp: {"budget": -1}, ckplan_torch.ArgumentError,
                        ["budget=-1", "must be positive", "give bytes"]),
    "infinite budget": (lambda tmp: {"budget": 1e400}, ckplan_torch.ArgumentError,
                        ["budget=inf", "not a finite number", "give bytes"]),
    "budget past a float": (lambda tmp: {"budget": "1e400"}, ckplan_torch.ArgumentError,
                            ["budget='1e400'", "not a finite number", "give bytes"]),
    "budget not a size": (lambda tmp: {"budget": "lots"}, ckplan_torch.ArgumentError,
                          ["budget='lots'", "expected a number such as 24GB"]),
    "budget of a list": (lambda tmp: {"budget": [24]}, TypeError, ["budget", "not list", "'24GB'"]),
    "optimizer's name": (lambda tmp: {"optimizer": "lion"}, ckplan_torch.ArgumentError,
                         ["optimizer='lion'", "'adamw'", "'momentum'"]),
    "optimizer's implementation": (lambda tmp: {"optimizer_impl": "fast"}, ckplan_torch.ArgumentError,
                                   ["optimizer_impl='fast'", "'foreach'"]),
    "optimizer ckplan does not price": (lambda tmp: {"optimizer": torch.optim.RMSprop([nn.Parameter(torch.ones(1))])},
                                        ckplan_torch.ArgumentError, ["optimizer=RMSprop", "'adam'"]),
    "gpu": (lambda tmp: {"gpu": "h100x"}, ckplan_torch.ArgumentError, ["gpu='h100x'", "h100-sxm-80gb"]),
    "target": (lambda tmp: {"target": "selective"}, ValueError, ["target='selective'", "'sac'"]),
    "batch": (lambda tmp: {"batch": "biggest"}, ValueError, ["batch='biggest'", "'largest'"]),
    "workdir is a file": (lambda tmp: {"workdir": a_file(tmp)}, ckplan_torch.ArgumentError,
                          ["a-file", "it is a file", "give a folder"]),
    "workdir under a file": (lambda tmp: {"workdir": a_file(tmp) / "w"}, ckplan_torch.ArgumentError,
                             ["a-file/w", "a folder above it is a file", "give a folder"]),
}


@pytest.mark.parametrize("case", BAD_ARGUMENTS)
def test_a_bad_argument_is_refused_before_the_export(case, ckplan, tmp_path):
    """MustNotRun's forward raises if the model is exported: the refusal comes first."""
    options, kind, fragments = BAD_ARGUMENTS[case]
    arguments = {"budget": "1GB", **options(tmp_path)}
    with pytest.raises(kind) as raised:
        ckplan_torch.plan(MustNotRun(), (torch.randn(4, 8),), ckplan=ckplan, **arguments)
    assert_names(one_line(raised), *fragments)


def test_a_meta_model_without_a_cost_model_is_refused_first(ckplan):
    with pytest.raises(ckplan_torch.ArgumentError) as raised:
        ckplan_torch.plan(meta_mlp(), (torch.randn(4, 8, device="meta"),), "1GB", ckplan=ckplan)
    assert_names(one_line(raised), "gpu=None", "meta device", "gpu='h100-sxm-80gb'")


def test_a_read_only_workdir_is_named(ckplan, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user writes in a read-only folder (root)")
        with pytest.raises(ckplan_torch.ArgumentError) as raised:
            ckplan_torch.plan(MustNotRun(), (torch.randn(4, 8),), "1GB", ckplan=ckplan, workdir=locked / "w")
        assert_names(one_line(raised), str(locked / "w"), "Permission denied", "give a folder you may write to")
    finally:
        locked.chmod(0o700)


# ---- files: the user's path; schemas of a newer ckplan -----------------------------------------------

def test_save_to_a_folder_that_does_not_exist_names_the_path(tmp_path):
    plan = ckplan_torch.Plan({"schema": "ckplan.plan/1", "checkpoint_modules": []})
    path = tmp_path / "missing" / "plan.json"
    with pytest.raises(ckplan_torch.ArgumentError) as raised:
        plan.save(path)
    text = one_line(raised)
    assert_names(text, str(path), "does not exist", "give a file's path in a folder that exists")
    assert "partial" not in text, text


@pytest.mark.parametrize("source", ["dict", "file"])
def test_a_plan_of_a_newer_ckplan_says_so(source, tmp_path):
    doc = {"schema": "ckplan.plan/99", "checkpoint_modules": []}
    if source == "file":
        (tmp_path / "new.json").write_text(json.dumps(doc))
        doc = str(tmp_path / "new.json")
    with pytest.raises(ckplan_torch.PlanError) as raised:
        ckplan_torch.load_plan(doc)
    text = one_line(raised)
    assert_names(text, "made by a newer ckplan (plan/99); this one reads plan/1", "make the plan again")
    assert "not a ckplan plan" not in text, text
    if source == "file":
        assert_names(text, "new.json")


def test_a_profile_of_a_newer_ckplan_says_so():
    with pytest.raises(ckplan_torch.PlanError) as raised:
        ckplan_torch.Plan({"schema": "ckplan.plan/1", "checkpoint_modules": []},
                          profile={"schema": "ckplan.profile/3"})
    assert_names(one_line(raised), "made by a newer ckplan (profile/3); this one reads profile/1", "ckplan profile")


def test_not_a_plan_is_still_not_a_plan():
    with pytest.raises(ckplan_torch.PlanError) as raised:
        ckplan_torch.load_plan({"schema": "ckplan.chain/1", "checkpoint_modules": []})
    assert_names(one_line(raised), "not a ckplan plan", "'ckplan.chain/1'")


# ---- maximize=True -----------------------------------------------------------------------------------

def test_plan_warns_of_a_maximizing_optimizer(ckplan):
    model, example_inputs, _ = mlp()
    optimizer = torch.optim.Adam(model.parameters(), maximize=True)
    with pytest.warns(UserWarning, match="maximize=True"):
        ckplan_torch.plan(model, example_inputs, "1GB", optimizer=optimizer, ckplan=ckplan)


# ---- two calls at once in one workdir ----------------------------------------------------------------

PLAN_IN_A_PROCESS = """
import json, os, sys, time
import torch
torch.set_num_threads(1)
sys.path.insert(0, {here!r})
import ckplan_torch
import test_bad_input
kind, workdir, ckplan, barrier = sys.argv[1:5]
model, example_inputs, kwargs = test_bad_input.MODELS[kind]()
open(os.path.join(barrier, kind), "w").close()
while not os.path.exists(os.path.join(barrier, "go")):  # both call plan() together
    time.sleep(0.01)
plan = ckplan_torch.plan(model, example_inputs, "1GB", kwargs=kwargs, ckplan=ckplan, workdir=workdir)
print(json.dumps({{"param_count": plan.doc["source"]["param_count"], "workdir": plan.workdir}}))
"""


def test_two_calls_at_once_in_one_workdir_get_their_own_plans(ckplan, tmp_path):
    """An MLP and a GPT-2 planned by two processes with the same workdir, each calling plan() once both
    are ready: each gets its own model's plan, from a folder of its own, whose files are its model's."""
    workdir, barrier = tmp_path / "shared", tmp_path / "barrier"
    barrier.mkdir()
    package = os.path.dirname(os.path.dirname(os.path.abspath(ckplan_torch.__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package, os.environ.get("PYTHONPATH", "")])}
    script = PLAN_IN_A_PROCESS.format(here=HERE)
    kinds = ["mlp", "gpt2"]
    processes = [subprocess.Popen([sys.executable, "-c", script, kind, str(workdir), ckplan, str(barrier)], env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for kind in kinds]
    while not all((barrier / kind).exists() for kind in kinds) and all(p.poll() is None for p in processes):
        time.sleep(0.01)
    (barrier / "go").touch()
    results = {}
    for kind, process in zip(kinds, processes):
        out, err = process.communicate()
        assert process.returncode == 0, f"{kind}: {err[-3000:]}"
        results[kind] = json.loads(out.strip().splitlines()[-1])
    for kind in kinds:
        expected = len(list(MODELS[kind]()[0].parameters()))
        got = results[kind]
        assert got["param_count"] == expected, f"{kind} got a plan of {got['param_count']} tensors, not {expected}"
        folder = got["workdir"]
        assert os.path.dirname(folder) == str(workdir), folder
        with open(os.path.join(folder, "plan.json")) as f:
            assert json.load(f)["source"]["param_count"] == expected, f"{folder}/plan.json is not {kind}'s"
    assert results["mlp"]["workdir"] != results["gpt2"]["workdir"]
    assert sorted(os.listdir(workdir)) == sorted(os.path.basename(r["workdir"]) for r in results.values())
