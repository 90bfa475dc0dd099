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
        [--budgets 0.1,0.3,0.5,0.7,0.9]
"""
import argparse
import copy
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
import ckplan_torch._compiled  # noqa: E402
from peers import grads_of, make, step_time  # noqa: E402

warnings.filterwarnings("ignore")


class Variant:
    def __init__(self, name, model, budget=None, plan=None):
        self.name, self.model, self.budget, self.plan = name, model, budget, plan
        self.runner = None
        self.peak = self.grad_diff = None
        self.times = []


def compile_torch_budget(v, forward):
    """torch.compile of the variant's own copy of the model under its activation_memory_budget (compiled
    there and then: dynamo keeps each copy's compiled step apart, so later calls run it as compiled)."""
    import torch._functorch.config as functorch_config
    # torch's own partition (a pass-through partitioner of its own, so dynamo compiles this copy afresh
    # rather than serving another copy's compile).
    passthrough = ckplan_torch._compiled._Partitioner(None)
    passthrough.recording = False
    v.runner = torch.compile(v.model, options={"custom_partitioner_fn": passthrough})
    with functorch_config.patch(activation_memory_budget=v.budget):
        grads_of(v.runner, forward)


def measure(v, forward, reference):
    v.peak = memory_timeline.training_step_peak(v.model, lambda p: torch.optim.AdamW(p), lambda: forward(v.runner))
    got = grads_of(v.runner, forward)
    v.grad_diff = 0.0 if reference is None else max((a - b).abs().max().item() for a, b in zip(got, reference))
    return got


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--budgets", default="0.1,0.3,0.5,0.7,0.9")
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
        # Each variant trains its own copy of the model (the weights alike), so dynamo keeps the compiled
        # steps apart and every variant is timed in the same interleaved rounds without compiling again.
        variants = [Variant("torch.compile, none" if b == 1.0 else f"torch.compile, budget {b}", copy.deepcopy(model),
                            budget=b) for b in [1.0] + [float(b) for b in args.budgets.split(",")]]
        torch._dynamo.reset()
        reference = None
        for v in variants:
            compile_torch_budget(v, forward)
            got = measure(v, forward, reference)
            reference = got if reference is None else reference
            print(f"{name}: {v.name}: {v.peak:,} B, grads max diff {v.grad_diff:.1e}", flush=True)
        ours = []
        for peer in variants[1:]:
            try:
                plan = profile.plan(peer.peak)  # compiles and measures its choice (resets dynamo)
            except ckplan_torch.CkplanError as error:
                line = f"{name}: no ckplan compiled plan at {peer.name}'s peak {peer.peak:,} B: {error}"
                print(line, flush=True)
                summary.append(line)
                continue
            v = Variant(f"ckplan compiled @ {peer.name}", copy.deepcopy(model), plan=plan)
            v.peer = peer
            ours.append(v)
        # Every variant compiled again, each its own copy, none reset after.
        torch._dynamo.reset()
        for v in variants:
            compile_torch_budget(v, forward)
        for v in ours:
            partitioner = ckplan_torch._compiled._Partitioner(v.plan.doc["graphs"])
            v.runner = torch.compile(v.model, options={"custom_partitioner_fn": partitioner})
            with ckplan_torch._compiled._followed(partitioner):  # refuses a step compiled without the plan
                grads_of(v.runner, forward)
        for v in variants + ours:
            measure(v, forward, reference)
        for v in ours:
            plan = v.plan
            print(f"{name}: {v.name}: {v.peak:,} B (plan {plan.peak_bytes:,}, predicted {plan.predicted['peak_bytes']:,}; "
                  f"{plan.source}), grads max diff {v.grad_diff:.1e}", flush=True)
        everyone = variants + ours
        optimizers = {id(v): torch.optim.AdamW(v.model.parameters()) for v in everyone}
        for v in everyone:
            step_time(v.model, v.runner, forward, optimizers[id(v)])  # warm
        for _ in range(args.rounds):
            for v in everyone:
                v.times.append(step_time(v.model, v.runner, forward, optimizers[id(v)]))
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
