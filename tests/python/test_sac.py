"""Selective activation checkpointing (`ckplan solve --target sac`) applied by
ckplan_torch.apply_plan to the eager model of every test model, as users run
it: what the step keeps for backward when the loss starts (autograd's saved
tensors, the wrapped modules' inputs, what the policies save, the outputs)
equals the plan's prediction to the byte; the gradients equal those without
the plan, bit for bit; the policy finds the ops the plan names (no warning);
and at each budget the plan is never slower than wrapping whole modules or a
hand-written policy that fits, as priced. On three models a whole training
step with a torch.optim optimizer is measured by the profiler's memory
timeline against the budget. Run with pytest (ctest runs it as python_sac).

    pytest tests/python/test_sac.py --ckplan build/ckplan --models build/test_models
"""
import json
import os
import subprocess
import warnings

import pytest
import torch

import ckplan_torch
import make_models
import test_apply_plan as apply_checks

# Models whose plans must save some ops at some budget (each has matrix
# products, convolutions or norms a policy can save).
SAVING = {"gpt2", "llama", "bert", "sdpa_decoder", "transformer_encoder", "mobilenet_v2", "unet", "densenet"}


def run(ckplan, *args):
    result = subprocess.run([ckplan, *args], capture_output=True, text=True)
    assert result.returncode == 0, f"ckplan {' '.join(args)}: {result.stderr}"
    return result.stdout


def profile_of(ckplan, models_dir, name, workdir):
    """The model's profile, with every op at the same cost (the plans must not
    depend on how busy the machine was; what is checked here is memory)."""
    _, input_texts = make_models.MODELS[name]
    path = os.path.join(workdir, name + ".profile.json")
    run(ckplan, "profile", os.path.join(models_dir, name + ".pt2"),
        *[a for t in input_texts for a in ("--input", t)], "--reps", "1", "-o", path)
    with open(path) as f:
        doc = json.load(f)
    for op in doc["ops"]:
        op["fwd_ms"], op["fwd_nograd_ms"], op["bwd_ms"] = 1.0, 1.0, 2.0
    doc.pop("calibration", None)
    with open(path, "w") as f:
        json.dump(doc, f)
    # What mul and div keep as 0-dim host tensors: the plan counts them, and
    # saved_tensors_hooks never see them.
    unseen = sum(op.get("wrapped_number_bytes", 0) for op in doc["ops"])
    return path, unseen


def dispatched_ops(model, inputs, paths):
    """The ops each module of `paths` dispatches in one forward of the model, as a policy's dispatch mode
    handles them (below autograd, detach included)."""
    named = dict(model.named_modules())
    counts, handles = {}, []
    for path in paths:
        def pre(module, args, path=path):
            counts[path] = ckplan_torch._selective.DispatchCounter()
            counts[path].__enter__()

        def post(module, args, output, path=path):
            counts[path].__exit__(None, None, None)
        handles += [named[path].register_forward_pre_hook(pre), named[path].register_forward_hook(post)]
    try:
        torch.manual_seed(7)
        model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return {path: c.ops for path, c in counts.items()}


def solve(ckplan, profile, budget, target="sac", *extra):
    return json.loads(run(ckplan, "solve", profile, "--budget", str(budget), "--target", target, "-o", "-", *extra))


@pytest.mark.parametrize("name", list(make_models.MODELS))
def test_sac_plan_keeps_what_it_predicts(ckplan, models_dir, tmp_path, name):
    profile, unseen = profile_of(ckplan, models_dir, name, str(tmp_path))
    loose = solve(ckplan, profile, "1TB")
    assert loose["target"] == "sac"
    factory, input_texts = make_models.MODELS[name]
    torch.manual_seed(0)
    model = factory().train()
    generator = torch.Generator().manual_seed(0)
    inputs = [make_models.make_input(t, generator) for t in input_texts]
    expected = apply_checks.grads(model, inputs, seed=7)
    smallest, none_peak = loose["min_budget_bytes"], loose["predicted"]["peak_bytes"]
    saved_ops = 0
    for k in range(3):
        budget = smallest + (none_peak - smallest) * k // 3
        plan = solve(ckplan, profile, budget)
        assert plan["predicted"]["peak_bytes"] <= budget
        policies = plan["pytorch"]["sac"]
        assert [p["module"] for p in policies] == plan["checkpoint_modules"]
        # The dispatch mode's price: its op count estimated from the profile, against the count in PyTorch.
        estimated = {p["module"]: p["dispatched_ops"] for p in policies if p["save"]}
        for path, count in dispatched_ops(model, inputs, estimated).items():
            print(f"{name}: {path} dispatches {count} ops, estimated {estimated[path]}")
            assert abs(estimated[path] - count) <= 0.15 * count + 2, f"{name}: {path}"
        saved_ops += sum(len(p["save"]) for p in policies)
        # Never slower than what a user could pick instead, priced the same way.
        rows = {row["name"]: row for row in plan["strategies"]}
        mine = rows["optimal (sac)"]["time_ms"]
        for row in plan["strategies"]:
            if row["fits"] and row["name"] != "optimal (schedule)":
                assert mine <= row["time_ms"] * (1 + 1e-9), f"{name} at {budget} B: slower than {row['name']}"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped = ckplan_torch.apply_plan(model, plan)
            assert wrapped == plan["checkpoint_modules"]
            kept, _ = apply_checks.kept_for_backward(model, inputs)
            got = apply_checks.grads(model, inputs, seed=7)
        mismatches = [str(w.message) for w in caught if "does not run the ops" in str(w.message)]
        assert not mismatches, mismatches[0]
        predicted = plan["pytorch"]["predicted"]["saved_bytes"]
        print(f"{name} at {budget} B: {len(wrapped)} modules wrapped, {sum(len(p['save']) for p in policies)} ops "
              f"saved; kept for backward {kept} B (+{unseen} B the hooks never see), predicted {predicted} B")
        assert kept + unseen == predicted, f"{name} at {budget} B: kept {kept + unseen} B, predicted {predicted} B"
        diff = max((a - b).abs().max().item() for a, b in zip(got, expected))
        assert diff == 0.0, f"{name} at {budget} B: gradients differ by {diff}"
        ckplan_torch.remove_plan(model)
    if name in SAVING:
        assert saved_ops > 0, f"{name}: no plan saves an op"


@pytest.mark.parametrize("name,make_optimizer", [
    ("gpt2", lambda p: torch.optim.AdamW(p)),
    ("llama", lambda p: torch.optim.Adam(p, foreach=True)),
    ("mobilenet_v2", lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9)),
])
def test_sac_training_step_within_budget(ckplan, models_dir, tmp_path, name, make_optimizer):
    """A whole step (zero_grad, forward, loss, backward, the optimizer's
    step) at the halfway budget, by the profiler's memory timeline: within
    the budget and within 2% of the prediction."""
    profile, _ = profile_of(ckplan, models_dir, name, str(tmp_path))
    optimizer = make_optimizer([torch.nn.Parameter(torch.zeros(1))])
    options = ckplan_torch._optimizer.OptimizerChoice.of(optimizer).solve_flags()
    loose = solve(ckplan, profile, "1TB", "sac", *options)
    budget = (loose["min_budget_bytes"] + loose["predicted"]["peak_bytes"]) // 2
    plan = solve(ckplan, profile, budget, "sac", *options)
    factory, input_texts = make_models.MODELS[name]
    torch.manual_seed(0)
    model = factory().train()
    generator = torch.Generator().manual_seed(0)
    inputs = [make_models.make_input(t, generator) for t in input_texts]
    ckplan_torch.apply_plan(model, plan)
    measured = apply_checks.step_peak(model, inputs, make_optimizer)
    predicted = plan["predicted"]["peak_bytes"]
    print(f"{name}: step peak {measured} B measured, predicted {predicted} B, budget {budget} B")
    assert any(p["save"] for p in plan["pytorch"]["sac"]), f"{name}: the halfway plan saves no op"
    assert measured <= budget + apply_checks.UNCOUNTED * predicted
    assert abs(measured - predicted) <= 0.02 * predicted


def test_policy_counts_by_the_plans_families(ckplan, models_dir, tmp_path):
    """The policy applied counts ops by the plan's pytorch.sac_families (ckplan's one list of what each family
    is, planner/cost/sac_candidates.h): a plan listing no dispatched op for `mm` makes the policy see none
    (the forward's counts then differ from the plan's, which apply_plan warns about), and a selective plan
    without the list (an older ckplan's) is refused with the fix."""
    profile, _ = profile_of(ckplan, models_dir, "sdpa_decoder", str(tmp_path))
    loose = solve(ckplan, profile, "1TB")
    plan = solve(ckplan, profile, (loose["min_budget_bytes"] + loose["predicted"]["peak_bytes"]) // 2)
    saved = [op["family"] for p in plan["pytorch"]["sac"] for op in p["save"]]
    assert "mm" in saved, f"sdpa_decoder: the halfway plan saves no mm op ({saved})"
    assert plan["pytorch"]["sac_families"]["mm"] == ["mm", "addmm", "bmm", "baddbmm"]
    factory, input_texts = make_models.MODELS["sdpa_decoder"]
    torch.manual_seed(0)
    model = factory().train()
    generator = torch.Generator().manual_seed(0)
    inputs = [make_models.make_input(t, generator) for t in input_texts]
    emptied = json.loads(json.dumps(plan))
    emptied["pytorch"]["sac_families"]["mm"] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckplan_torch.apply_plan(model, emptied)
        out = model(*inputs)
        (out[0] if isinstance(out, tuple) else out).sum().backward()
    ckplan_torch.remove_plan(model)
    assert any("does not run the ops" in str(w.message) for w in caught), [str(w.message) for w in caught]
    older = json.loads(json.dumps(plan))
    del older["pytorch"]["sac_families"]
    with pytest.raises(ckplan_torch.PlanError, match="solve --target sac"):
        ckplan_torch.apply_plan(model, older)
    assert not ckplan_torch.checkpointed_modules(model), "a refused plan left modules wrapped"
