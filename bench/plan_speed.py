"""What ``ckplan_torch.plan(...)`` costs, in the job's own training steps, phase by phase.

    .venv/bin/python bench/plan_speed.py [NAME ...]      # all models when none named

For each model (the issue's GPT-2: transformers GPT2LMHeadModel 6 x 256, vocabulary 2048, 4 x 256 tokens,
its labels; a torchvision ResNet-50 at 8x3x160x160 with a cross-entropy; and every test model of
tests/models/make_models.py at its example inputs, the output summed): one training step as the job
runs it (forward, loss, backward, torch.optim.AdamW's step, zero_grad; one thread; the median of 5
after 2), then ``plan()`` at a budget of 1 TB (the solve's cost does not depend on it), timed whole
and by phase (export, profile, solve; ``Plan.phase_seconds`` has the profile's own phases where the
ckplan that ran has them), then ``Plan.replan`` at the smallest budget. Prints a Markdown table.

The phases are timed by wrapping ``ckplan_torch._planning``'s export and ``_run`` (so that an
older package times the same way): PYTHONPATH=OLD/python CKPLAN=OLD/build/ckplan gives the before.
"""
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
if "ckplan_torch" not in sys.modules and not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, os.path.join(ROOT, "tests", "models"))

import torch  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")


def issue_gpt2():
    import transformers as T
    T.logging.set_verbosity_error()
    config = T.GPT2Config(vocab_size=2048, n_positions=256, n_embd=256, n_layer=6, n_head=4, bos_token_id=0,
                          eos_token_id=0, use_cache=False)
    model = T.GPT2LMHeadModel(config)
    ids = torch.randint(0, 2048, (4, 256), generator=torch.Generator().manual_seed(0))
    return model, (ids,), {"labels": ids}, None, ()


def resnet50():
    import torchvision
    model = torchvision.models.resnet50(num_classes=10)
    x = torch.randn(8, 3, 160, 160, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 10, (8,), generator=torch.Generator().manual_seed(1))
    return model, (x,), {}, torch.nn.CrossEntropyLoss(), (y,)


def test_model(name):
    import make_models
    factory, texts = make_models.MODELS[name]
    model = factory()
    generator = torch.Generator().manual_seed(0)
    return model, tuple(make_models.make_input(t, generator) for t in texts), {}, None, ()


def loss_of(out, loss_fn, targets):
    if loss_fn is not None:
        return loss_fn(out, *targets)
    if hasattr(out, "loss") and out.loss is not None:
        return out.loss
    if isinstance(out, (tuple, list)):
        return sum(o.float().sum() for o in out if isinstance(o, torch.Tensor))
    return out.float().sum()


def step_seconds(model, inputs, kwargs, loss_fn, targets):
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    times = []
    for _ in range(7):
        start = time.perf_counter()
        loss = loss_of(model(*inputs, **kwargs), loss_fn, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times[2:])


def main(names):
    import ckplan_torch
    from ckplan_torch import _planning
    import make_models
    models = {"gpt2 (issue)": issue_gpt2, "resnet50": resnet50}
    models.update({name: (lambda n=name: test_model(n)) for name in sorted(make_models.MODELS)})
    if names:
        models = {k: v for k, v in models.items() if k.split(" ")[0] in names}
    phases = {}
    export_name = "_export" if hasattr(_planning, "_export") else "export"  # the older package: export
    real_run, real_export = _planning._run, getattr(_planning, export_name)

    def run(program, command, *args):
        start = time.perf_counter()
        try:
            return real_run(program, command, *args)
        finally:
            phases[command] = phases.get(command, 0) + time.perf_counter() - start

    def export(*args, **kwargs):
        start = time.perf_counter()
        try:
            return real_export(*args, **kwargs)
        finally:
            phases["export"] = phases.get("export", 0) + time.perf_counter() - start

    _planning._run = run
    setattr(_planning, export_name, export)
    print("| model | step | plan() | in steps | export | profile | solve | profile's own phases | replan |")
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|")
    for name, make in models.items():
        torch.manual_seed(0)
        model, inputs, kwargs, loss_fn, targets = make()
        model.train()
        step = step_seconds(model, inputs, kwargs, loss_fn, targets)
        phases.clear()
        start = time.perf_counter()
        plan = ckplan_torch.plan(model, inputs, 10**12, kwargs=kwargs, loss_fn=loss_fn, targets=targets)
        total = time.perf_counter() - start
        own = getattr(plan, "phase_seconds", {})
        inner = ", ".join(f"{k[8:]} {v:.2f}" for k, v in sorted(own.items()) if k.startswith("profile.") and v >= 0.01)
        replan = "-"
        if hasattr(plan, "replan") and plan.min_budget_bytes:
            start = time.perf_counter()
            plan.replan(plan.min_budget_bytes)
            replan = f"{time.perf_counter() - start:.3f} s"
        print(f"| {name} | {step:.3f} s | {total:.1f} s | {total / step:.0f} | {phases.get('export', 0):.2f} | "
              f"{phases.get('profile', 0):.2f} | {phases.get('solve', 0):.2f} | {inner} | {replan} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
