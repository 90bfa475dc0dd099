#!/usr/bin/env python3
"""ckplan's compiled plans beside torch.compile's own memory budget, measured the same way in one run
(issue 49), on bench/peers.py's models: a Hugging Face GPT-2 and Llama (6 layers, d 256, batch 4 x 256,
their own loss) and a torchvision ResNet-18 (16 x 3 x 128 x 128, cross-entropy), with AdamW.

For each model: torch.compile at ``activation_memory_budget`` 1.0 (none) and 0.1 to 0.9, each step's
peak measured (memory_timeline.training_step_peak: zero_grad, forward, loss, backward, optimizer.step,
the output held); then ckplan's compiled plan solved at each budget's measured peak
(``ckplan_torch.profile_compiled`` once, ``CompiledProfile.plan(peak)`` per budget: the plan chosen is
compiled and measured by ckplan), applied (``CompiledPlan.apply``) and measured here the same way.
Times: the median step over interleaved rounds of every compiled variant, one thread. Gradients: each
variant's against the unplanned compiled step's, seed alike (dropout's masks alike).

    .venv/bin/python bench/compiled_peers.py [--models gpt2,llama,resnet18] [--rounds 9]
        [--budgets 0.1,0.2,...,0.9]
"""
import argparse
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import ckplan_torch  # noqa: E402
import memory_timeline  # noqa: E402
from peers import grads_of, make, step_time  # noqa: E402

warnings.filterwarnings("ignore")


class Variant:
    def __init__(self, name, runner, budget=None, plan=None):
        self.name, self.runner, self.budget, self.plan = name, runner, budget, plan
        self.peak = self.grad_diff = None
        self.times = []


def torch_budget(model, forward, budget):
    import torch._functorch.config as functorch_config
    torch._dynamo.reset()
    compiled = torch.compile(model)
    with functorch_config.patch(activation_memory_budget=budget):
        grads_of(compiled, forward)  # compiles under the budget
    return compiled


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--budgets", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch._dynamo.config.cache_size_limit = 64
    torch._dynamo.config.accumulated_cache_size_limit = 512
    summary = []
    for name in args.models.split(","):
        model, inputs, kwargs, forward, _ = make(name)
        loss_fn = targets = None
        if name == "resnet18":
            x, = inputs
            out_target = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(2))
            loss_fn, targets = torch.nn.CrossEntropyLoss(), (out_target,)
        started = time.perf_counter()
        profile = ckplan_torch.profile_compiled(model, inputs, kwargs=kwargs, optimizer="adamw", loss_fn=loss_fn,
                                                targets=targets or ())
        print(f"\n== {name}: compiled and profiled in {time.perf_counter() - started:.0f} s "
              f"({len(profile.candidates)} candidates)", flush=True)
        reference = None
        variants = []
        for budget in [1.0] + [float(b) for b in args.budgets.split(",")]:
            compiled = torch_budget(model, forward, budget)
            v = Variant("torch.compile, none" if budget == 1.0 else f"torch.compile, budget {budget}", compiled,
                        budget=budget)
            v.peak = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p),
                                                        lambda c=compiled: forward(c))
            got = grads_of(compiled, forward)
            reference = got if reference is None else reference
            v.grad_diff = max((a - b).abs().max().item() for a, b in zip(got, reference))
            variants.append(v)
            print(f"{name}: {v.name}: {v.peak:,} B, grads max diff {v.grad_diff:.1e}", flush=True)
        ours = []
        for peer in variants[1:]:
            try:
                plan = profile.plan(peer.peak)
            except ckplan_torch.CkplanError as error:
                line = f"{name}: no ckplan compiled plan at {peer.name}'s peak {peer.peak:,} B: {error}"
                print(line, flush=True)
                summary.append(line)
                continue
            compiled = plan.apply(model)
            grads_of(compiled, forward)  # compiles
            v = Variant(f"ckplan compiled @ {peer.name}", compiled, plan=plan)
            v.peer = peer
            v.peak = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p),
                                                        lambda c=compiled: forward(c))
            got = grads_of(compiled, forward)
            v.grad_diff = max((a - b).abs().max().item() for a, b in zip(got, reference))
            ours.append(v)
            print(f"{name}: {v.name}: {v.peak:,} B (plan {plan.peak_bytes:,}, predicted {plan.predicted['peak_bytes']:,}; "
                  f"{plan.source}), grads max diff {v.grad_diff:.1e}", flush=True)
        everyone = variants + ours
        with memory_timeline.restored_after(model):
            optimizer = torch.optim.AdamW(model.parameters())
            for v in everyone:
                step_time(model, v.runner, forward, optimizer)  # warm
            for _ in range(args.rounds):
                for v in everyone:
                    v.times.append(step_time(model, v.runner, forward, optimizer))
        base = statistics.median(variants[0].times)
        print(f"\n| {name} | peak MB | step ms | against compiled none | grads max diff | plan's peak MB (predicted) | plan's ms |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for v in everyone:
            ms = statistics.median(v.times)
            extra = (f"{v.plan.peak_bytes / 1e6:.2f} ({v.plan.predicted['peak_bytes'] / 1e6:.2f}) | {v.plan.time_ms:.1f}"
                     if v.plan else " | ")
            print(f"| {v.name} | {v.peak / 1e6:.2f} | {ms:.1f} | {(ms - base) / base * 100:+.1f}% | "
                  f"{v.grad_diff:.1e} | {extra} |")
        for v in ours:
            peer = v.peer
            ms, peer_ms = statistics.median(v.times), statistics.median(peer.times)
            spread = statistics.pstdev(peer.times) / peer_ms * 100
            memory = "no more memory" if v.peak <= peer.peak else f"{v.peak - peer.peak:+,} B more memory"
            speed = ("no slower" if ms <= peer_ms else f"slower by {(ms - peer_ms) / peer_ms * 100:.1f}%")
            line = (f"{name}: at {peer.name}'s peak {peer.peak / 1e6:.2f} MB: ckplan {v.peak / 1e6:.2f} MB, "
                    f"{ms:.1f} ms vs {peer_ms:.1f} ms (rounds' spread {spread:.1f}%): {memory}, {speed}; "
                    f"plan within budget: {v.peak <= v.plan.budget_bytes}, plan's peak vs measured "
                    f"{(v.plan.peak_bytes - v.peak) / v.peak * 100:+.2f}%")
            print(line, flush=True)
            summary.append(line)
        torch._dynamo.reset()
    print("\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
