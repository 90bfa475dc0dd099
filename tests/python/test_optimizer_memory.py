"""The optimizer's memory as torch.optim holds it, against what a plan prices.

For each test model here (profiled with `ckplan profile`), and each of
torch.optim.Adam, AdamW, SGD(momentum=0.9) and SGD in each implementation
(for-loop, foreach, fused), and with the options that change their memory
(Adam's and SGD's weight_decay, amsgrad, nesterov): the plan's `fixed.optimizer_bytes` equals the
state torch.optim makes on its first step, and `fixed.update_tmp_bytes`
equals what a later `optimizer.step()` allocates beyond it at its highest,
both to the byte, measured with torch.profiler's memory timeline on the
eager model. And `--optimizer-impl auto` on a CPU profile is for-loop, what
torch picks there.

A model is profiled and its gradients made once (a module-scoped fixture, one model at a time), each
optimizer measured once; the tests are one per model, optimizer, implementation and check
(`-k "gpt and adam-amsgrad"`).

    pytest tests/python/test_optimizer_memory.py --ckplan BUILD/ckplan --models BUILD/test_models
"""
import gc
import json
import os
import subprocess
import warnings

import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action

import ckplan_torch
import make_models

# float32 convolutions with batch norm buffers; a decoder with tied embeddings; bfloat16 (other scalars);
# a Hugging Face model.
NAMES = ["resnet18", "gpt", "bf16_decoder", "llama"]

IMPLS = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
OPTIMIZERS = {
    # name: (ckplan's options, torch.optim's constructor)
    "adam": (["--optimizer", "adam"], lambda params, flags: torch.optim.Adam(params, lr=1e-3, **flags)),
    "adamw": (["--optimizer", "adamw"], lambda params, flags: torch.optim.AdamW(params, lr=1e-3, **flags)),
    "sgd-momentum": (["--optimizer", "sgd", "--momentum", "0.9"],
                     lambda params, flags: torch.optim.SGD(params, lr=1e-3, momentum=0.9, **flags)),
    "sgd": (["--optimizer", "sgd"], lambda params, flags: torch.optim.SGD(params, lr=1e-3, **flags)),
    # The options that change the state or the update's temporaries.
    "adam-weight-decay": (["--optimizer", "adam", "--weight-decay", "0.01"],
                          lambda params, flags: torch.optim.Adam(params, lr=1e-3, weight_decay=0.01, **flags)),
    "adam-amsgrad": (["--optimizer", "adam", "--amsgrad"],
                     lambda params, flags: torch.optim.Adam(params, lr=1e-3, amsgrad=True, **flags)),
    "adamw-amsgrad": (["--optimizer", "adamw", "--amsgrad"],
                      lambda params, flags: torch.optim.AdamW(params, lr=1e-3, amsgrad=True, **flags)),
    "sgd-weight-decay": (["--optimizer", "sgd", "--weight-decay", "0.0001"],
                         lambda params, flags: torch.optim.SGD(params, lr=1e-3, weight_decay=1e-4, **flags)),
    "sgd-momentum-weight-decay": (["--optimizer", "sgd", "--momentum", "0.9", "--weight-decay", "0.0001"],
                                  lambda params, flags: torch.optim.SGD(params, lr=1e-3, momentum=0.9,
                                                                        weight_decay=1e-4, **flags)),
    "sgd-nesterov": (["--optimizer", "sgd", "--momentum", "0.9", "--nesterov"],
                     lambda params, flags: torch.optim.SGD(params, lr=1e-3, momentum=0.9, nesterov=True, **flags)),
    "sgd-nesterov-weight-decay": (["--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.0001"],
                                  lambda params, flags: torch.optim.SGD(params, lr=1e-3, momentum=0.9, nesterov=True,
                                                                        weight_decay=1e-4, **flags)),
}

# One thread for the whole module, as ckplan profiles on the CPU: more threads hold per-thread buffers.
pytestmark = pytest.mark.usefixtures("one_thread_module")


CASES = [pytest.param(optimizer, impl, id=f"{optimizer}-{impl}") for optimizer in OPTIMIZERS for impl in IMPLS]


def ckplan_out(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    assert result.returncode == 0, f"ckplan {' '.join(args)} failed ({result.returncode}): {result.stderr}"
    return result.stdout


def timeline_growth(fn):
    """What `fn` allocates beyond what was alive before it, at its highest,
    and what it leaves allocated (torch.profiler's memory timeline)."""
    gc.collect()  # garbage from before, collected inside the window, would count as held at its start
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        fn()
    live = peak = 0
    for _, action, _, size in prof._memory_profile().timeline:
        if action == Action.CREATE:
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak, live


def with_gradients(name):
    """The eager model with gradients from one backward, as at a step's end."""
    factory, input_texts = make_models.MODELS[name]
    torch.manual_seed(0)
    model = factory().train()
    generator = torch.Generator().manual_seed(0)
    inputs = [make_models.make_input(t, generator) for t in input_texts]
    with make_models.as_traced():
        out = model(*inputs)
    outputs = out if isinstance(out, (list, tuple)) else [out]
    sum(t.float().sum() for t in outputs if isinstance(t, torch.Tensor) and t.requires_grad).backward()
    return model


class Measured:
    """One test model: its profile, the default plan, and each optimizer's plan and measurement, made once
    when a test first asks."""

    def __init__(self, name, ckplan, models_dir, workdir):
        self.name = name
        self.ckplan = ckplan
        model_path = os.path.join(models_dir, name + ".pt")
        assert os.path.exists(model_path), f"{model_path} is missing: make_models.py makes the test models"
        self.profile_path = os.path.join(workdir, name + ".profile.json")
        _, input_texts = make_models.MODELS[name]
        ckplan_out(ckplan, "profile", model_path, *[a for t in input_texts for a in ("--input", t)], "--reps", "1",
                   "-o", self.profile_path)
        self.auto = json.loads(ckplan_out(ckplan, "solve", self.profile_path, "--budget", "1TB", "-o", "-"))
        self._params = None
        self._measured = {}

    def params(self):
        """The eager model's parameters that have gradients."""
        if self._params is None:
            self._params = [p for p in with_gradients(self.name).parameters() if p.grad is not None]
            assert self._params, f"{self.name}: no parameter has a gradient"
        return self._params

    def measure(self, optimizer, impl):
        """The plan with `optimizer` in `impl` and what torch.optim makes: {"plan", "state_bytes" (the first
        step's), "update_peak" and "left" (a later step's), "warning" (check_optimizer's)}."""
        key = (optimizer, impl)
        if key not in self._measured:
            options, make = OPTIMIZERS[optimizer]
            plan = json.loads(ckplan_out(self.ckplan, "solve", self.profile_path, "--budget", "1TB", *options,
                                         "--optimizer-impl", impl, "-o", "-"))
            params = self.params()
            opt = make(params, IMPLS[impl])
            saved = [p.detach().clone() for p in params]
            _, state_bytes = timeline_growth(opt.step)  # the first step makes the state
            update_peak, left = timeline_growth(opt.step)
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
            self._measured[key] = {"plan": plan, "state_bytes": state_bytes, "update_peak": update_peak,
                                   "left": left, "warning": ckplan_torch.check_optimizer(opt, plan)}
        return self._measured[key]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("optimizer_memory"))


@pytest.fixture(scope="module", params=NAMES)
def model(request, ckplan, models_dir, workdir):
    """One of NAMES, profiled (pytest runs every test of one model before the next)."""
    return Measured(request.param, ckplan, models_dir, workdir)


def test_default_is_for_loop_adam(model):
    """With no --optimizer, the plan prices adam as torch runs it on the CPU (for-loop)."""
    fixed = model.auto["fixed"]
    assert (fixed["optimizer"], fixed["optimizer_impl"]) == ("adam", "for-loop"), \
        f"{model.name}: the default is {fixed['optimizer']} ({fixed['optimizer_impl']}), expected adam (for-loop)"


@pytest.mark.parametrize("optimizer, impl", CASES)
def test_state_to_the_byte(model, optimizer, impl):
    """The plan's fixed.optimizer_bytes is the state torch.optim makes on its first step, to the byte."""
    m = model.measure(optimizer, impl)
    planned = m["plan"]["fixed"]["optimizer_bytes"]
    assert m["state_bytes"] == planned, f"{model.name}, {optimizer} ({impl}): torch.optim's state " \
                                        f"{m['state_bytes']} B, the plan's {planned} B"


@pytest.mark.parametrize("optimizer, impl", CASES)
def test_later_step_leaves_nothing(model, optimizer, impl):
    """A later optimizer.step() leaves nothing allocated once it returns."""
    m = model.measure(optimizer, impl)
    assert m["left"] == 0, f"{model.name}, {optimizer} ({impl}): a later step leaves {m['left']} B allocated"


@pytest.mark.parametrize("optimizer, impl", CASES)
def test_update_temporaries_to_the_byte(model, optimizer, impl):
    """The plan's fixed.update_tmp_bytes is what a later optimizer.step() allocates at its highest, to the
    byte."""
    m = model.measure(optimizer, impl)
    planned = m["plan"]["fixed"].get("update_tmp_bytes", 0)
    assert m["update_peak"] == planned, f"{model.name}, {optimizer} ({impl}): optimizer.step() allocates " \
                                        f"{m['update_peak']} B at its highest, the plan's update temporary {planned} B"


@pytest.mark.parametrize("optimizer, impl", CASES)
def test_plan_records_the_implementation(model, optimizer, impl):
    """The plan's fixed.optimizer_impl is the --optimizer-impl it was solved with."""
    recorded = model.measure(optimizer, impl)["plan"]["fixed"]["optimizer_impl"]
    assert recorded == impl, f"{model.name}, {optimizer} ({impl}): the plan records {recorded}"


@pytest.mark.parametrize("optimizer, impl", CASES)
def test_check_optimizer_finds_the_plans(model, optimizer, impl):
    """check_optimizer (what apply_plan warns with) finds the job's optimizer the plan's: no warning."""
    warning = model.measure(optimizer, impl)["warning"]
    assert warning is None, f"{model.name}, {optimizer} ({impl}): check_optimizer warns: {warning}"


# Param groups: torch.optim's step() updates each group on its own, with its own options and
# implementation, its temporaries freed before the next group's. ckplan_torch.plan(optimizer=...) prices
# each group (`ckplan solve --optimizer-groups`). Two float32 Linear(512, 512) at batch 2, where the
# update is the step's peak; one case per way the groups can differ.
def _layers(model):
    return [list(model[0].parameters()), list(model[1].parameters())]


GROUP_CASES = {
    # Adam's coupled decay in the second group only (issue 48): its weight's `grad + wd * param` held.
    "adam-decay-second": lambda m: torch.optim.Adam([{"params": _layers(m)[0], "weight_decay": 0.0},
                                                     {"params": _layers(m)[1], "weight_decay": 0.1}],
                                                    lr=1e-3, foreach=False),
    "adam-decay-first": lambda m: torch.optim.Adam([{"params": _layers(m)[0], "weight_decay": 0.1},
                                                    {"params": _layers(m)[1], "weight_decay": 0.0}],
                                                   lr=1e-3, foreach=False),
    # The usual decay / no-decay split: each weight's denominator made beside the previous weight's.
    "adamw-weights-biases": lambda m: torch.optim.AdamW([{"params": [m[0].weight, m[1].weight], "weight_decay": 0.1},
                                                         {"params": [m[0].bias, m[1].bias], "weight_decay": 0.0}],
                                                        lr=1e-3, foreach=False),
    # amsgrad's state in one group.
    "adam-amsgrad-one": lambda m: torch.optim.Adam([{"params": _layers(m)[0]},
                                                    {"params": _layers(m)[1], "amsgrad": True}],
                                                   lr=1e-3, foreach=False),
    # Each group its own implementation.
    "adam-foreach-one": lambda m: torch.optim.Adam([{"params": _layers(m)[0], "foreach": True},
                                                    {"params": _layers(m)[1], "foreach": False,
                                                     "weight_decay": 0.1}], lr=1e-3),
    # SGD's momentum per group: a buffer in the second group alone.
    "sgd-momentum-one": lambda m: torch.optim.SGD([{"params": _layers(m)[0], "momentum": 0.0, "weight_decay": 1e-4},
                                                   {"params": _layers(m)[1], "momentum": 0.9, "nesterov": True}],
                                                  lr=1e-3, foreach=False),
}


def _two_linears():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Linear(512, 512)), torch.randn(2, 512)


class GroupedJob:
    """One case: the model, the job's optimizer, its plan (ckplan_torch.plan with the optimizer), and what
    torch.optim makes (the state on a first step, a later step's update) and a training step's peak, each
    measured once."""

    def __init__(self, case, ckplan):
        import memory_timeline
        self.case = case
        self.make = GROUP_CASES[case]
        self.model, self.x = _two_linears()
        self.optimizer = self.make(self.model)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.plan = ckplan_torch.plan(self.model, (self.x,), budget="1GB", optimizer=self.optimizer, ckplan=ckplan)
        self.plan_warnings = [str(w.message) for w in caught if str(w.message).startswith("ckplan_torch")]
        self.step_peak = memory_timeline.training_step_peak(
            self.model, lambda _: self.make(self.model), lambda: (lambda out: (out, out.sum()))(self.model(self.x)))
        # The optimizer's own, as Measured.measure: a fresh one over the model with gradients.
        params = list(self.model.parameters())
        saved = [p.detach().clone() for p in params]
        self.model.zero_grad(set_to_none=True)
        self.model(self.x).sum().backward()
        opt = self.make(self.model)
        _, self.state_bytes = timeline_growth(opt.step)
        self.update_peak, _ = timeline_growth(opt.step)
        self.model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for p, s in zip(params, saved):
                p.copy_(s)


@pytest.fixture(scope="module", params=list(GROUP_CASES))
def grouped(request, ckplan):
    return GroupedJob(request.param, ckplan)


def test_groups_state_to_the_byte(grouped):
    """Each group's state with its own options: the plan's fixed.optimizer_bytes is torch.optim's, to the byte."""
    planned = grouped.plan.doc["fixed"]["optimizer_bytes"]
    assert grouped.state_bytes == planned, f"{grouped.case}: torch.optim's state {grouped.state_bytes} B, the " \
                                           f"plan's {planned} B"


def test_groups_update_temporaries_to_the_byte(grouped):
    """One group at a time: the plan's fixed.update_tmp_bytes is what a later step allocates at its highest."""
    planned = grouped.plan.doc["fixed"].get("update_tmp_bytes", 0)
    assert grouped.update_peak == planned, f"{grouped.case}: optimizer.step() allocates {grouped.update_peak} B " \
                                           f"at its highest, the plan's update temporary {planned} B"


def test_groups_step_measured_within_the_plan(grouped):
    """The training step PyTorch measures (the update its peak) holds within the plan's predicted peak, within 1%
    of it."""
    predicted = grouped.plan.peak_bytes
    assert grouped.step_peak <= predicted <= grouped.plan.budget_bytes, \
        f"{grouped.case}: measured {grouped.step_peak} B, predicted {predicted} B"
    assert grouped.step_peak >= predicted * 0.99, f"{grouped.case}: measured {grouped.step_peak} B, " \
                                                  f"predicted {predicted} B"


def test_groups_recorded_in_the_plan(grouped):
    """The plan's fixed.optimizer_groups: each of the job's groups, its parameters by name, in its order."""
    names = {id(p): n for n, p in grouped.model.named_parameters()}
    want = [[names[id(p)] for p in g["params"]] for g in grouped.optimizer.param_groups]
    recorded = [g["params"] for g in grouped.plan.doc["fixed"].get("optimizer_groups", [])]
    assert recorded == want, f"{grouped.case}: the plan records groups {recorded}, the job's are {want}"
    assert grouped.plan_warnings == [], f"{grouped.case}: plan() warned: {grouped.plan_warnings}"


def test_check_optimizer_finds_the_grouped_plans(grouped):
    """apply(optimizer=...) with the job's own optimizer: no warning."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        grouped.plan.apply(grouped.model, optimizer=grouped.optimizer)
    ckplan_torch.remove_plan(grouped.model)
    ours = [str(w.message) for w in caught if str(w.message).startswith("ckplan_torch")]
    assert ours == [], f"{grouped.case}: apply_plan warns: {ours}"


def test_plan_without_groups_warns_a_grouped_job(grouped):
    """A plan priced as one group (the first's options, as a plan made with the optimizer's name is): the grouped
    job gets a warning naming its param groups."""
    fixed = {k: v for k, v in grouped.plan.doc["fixed"].items() if k != "optimizer_groups"}
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        text = ckplan_torch.check_optimizer(grouped.optimizer, dict(grouped.plan.doc, fixed=fixed), grouped.model)
    assert text is not None and "2 param groups" in text, f"{grouped.case}: expected a warning, got {text}"


def test_groups_with_other_options_warn(grouped):
    """The job's groups with another group's options than the plan's: a warning."""
    fixed = dict(grouped.plan.doc["fixed"])
    fixed["optimizer_groups"] = [dict(g) for g in fixed["optimizer_groups"]]
    last = fixed["optimizer_groups"][-1]
    last["optimizer_impl"] = "fused" if last["optimizer_impl"] != "fused" else "foreach"
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        text = ckplan_torch.check_optimizer(grouped.optimizer, dict(grouped.plan.doc, fixed=fixed), grouped.model)
    assert text is not None and "param groups" in text, f"{grouped.case}: expected a warning, got {text}"


@pytest.mark.parametrize("grouped", ["adam-decay-second"], indirect=True)
def test_grouped_plan_reports(grouped, tmp_path):
    """Plan.report prices the plan's groups again (ckplan report --optimizer-groups): its no-checkpointing row is
    the plan's."""
    report = json.loads(open(grouped.plan.report(tmp_path / "report.json")).read())
    none = [row for row in report["strategies"] if row["name"] == "none"]
    assert none and none[0]["peak_bytes"] == grouped.plan.strategies[0]["peak_bytes"], \
        f"the report's none row {none}, the plan's {grouped.plan.strategies[0]}"


def test_one_group_is_priced_as_before():
    """One param group: no groups (the plan and its flags as without them)."""
    model, _ = _two_linears()
    choice = ckplan_torch._optimizer.OptimizerChoice.from_torch(torch.optim.Adam(model.parameters(), weight_decay=0.1),
                                                                model)
    assert choice.groups == () and choice.solve_flags() == ["--optimizer", "adam", "--optimizer-impl", "for-loop",
                                                            "--weight-decay", "0.1"]


@pytest.mark.parametrize("with_model", [True, False], ids=["and-the-model's", "alone"])
def test_foreign_parameters_warn_at_plan(ckplan, with_model):
    """An optimizer holding a tensor that is not the model's (its gradient and state in no plan): plan() warns in
    one line naming how many."""
    model, x = _two_linears()
    foreign = torch.nn.Parameter(torch.zeros(1000, 1000))
    params = list(model.parameters()) + [foreign] if with_model else [foreign]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckplan_torch.plan(model, (x,), budget="1GB", optimizer=torch.optim.Adam(params), ckplan=ckplan)
    ours = [str(w.message) for w in caught if "not the model's" in str(w.message)]
    assert len(ours) == 1 and "\n" not in ours[0], f"expected one warning, got {ours}"
    assert "holds 1 parameter (4.00 MB) that is not the model's" in ours[0], ours[0]
    assert ("leaves out" in ours[0]) != with_model, ours[0]
