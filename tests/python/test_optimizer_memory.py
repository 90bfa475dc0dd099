#!/usr/bin/env python3
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

    test_optimizer_memory.py --ckplan BUILD/ckplan --models BUILD/test_models [names]
"""
import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from torch.profiler._memory_profiler import Action  # noqa: E402

import ckplan_torch  # noqa: E402
import make_models  # noqa: E402
from checks import check, finish  # noqa: E402

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


def ckplan(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ckplan {' '.join(args)} failed ({result.returncode}): {result.stderr}")
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


def run_model(args, name, workdir):
    profile_path = os.path.join(workdir, name + ".profile.json")
    _, input_texts = make_models.MODELS[name]
    ckplan(args.ckplan, "profile", os.path.join(args.models, name + ".pt"),
           *[a for t in input_texts for a in ("--input", t)], "--reps", "1", "-o", profile_path)
    auto = json.loads(ckplan(args.ckplan, "solve", profile_path, "--budget", "1TB", "-o", "-"))
    check(auto["fixed"]["optimizer"] == "adam" and auto["fixed"]["optimizer_impl"] == "for-loop",
          f"{name}: the default is adam as torch runs it on the CPU (for-loop)")
    model = with_gradients(name)
    params = [p for p in model.parameters() if p.grad is not None]
    for optimizer, (options, make) in OPTIMIZERS.items():
        for impl, flags in IMPLS.items():
            plan = json.loads(ckplan(args.ckplan, "solve", profile_path, "--budget", "1TB", *options,
                                     "--optimizer-impl", impl, "-o", "-"))
            fixed = plan["fixed"]
            opt = make(params, flags)
            saved = [p.detach().clone() for p in params]
            _, state_bytes = timeline_growth(opt.step)  # the first step makes the state
            update_peak, left = timeline_growth(opt.step)
            with torch.no_grad():
                for p, s in zip(params, saved):
                    p.copy_(s)
            what = f"{name}, {optimizer} ({impl})"
            print(f"{what}: state {state_bytes} B (plan {fixed['optimizer_bytes']}), "
                  f"update {update_peak} B (plan {fixed.get('update_tmp_bytes', 0)})")
            check(state_bytes == fixed["optimizer_bytes"], f"{what}: the plan's optimizer state is torch.optim's, to the byte")
            check(left == 0, f"{what}: a later step leaves nothing allocated")
            check(update_peak == fixed.get("update_tmp_bytes", 0),
                  f"{what}: the plan's update temporary is what optimizer.step() allocates, to the byte")
            check(fixed["optimizer_impl"] == impl, f"{what}: the plan records the implementation")
            check(ckplan_torch.check_optimizer(opt, plan) is None,
                  f"{what}: apply_plan finds the job's optimizer the plan's (no warning)")


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--models", required=True)
    # float32 convolutions with batch norm buffers; a decoder with tied
    # embeddings; bfloat16 (other scalars); a Hugging Face model.
    parser.add_argument("names", nargs="*", default=["resnet18", "gpt", "bf16_decoder", "llama"])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as workdir:
        for name in args.names:
            run_model(args, name, workdir)
    return finish()


def test_optimizer_memory(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--models") == 0


if __name__ == "__main__":
    sys.exit(main())
