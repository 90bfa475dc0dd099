#!/usr/bin/env python3
"""ckplan's plans against the checkpointing a user could pick instead, measured
the same way in one run, on a Hugging Face GPT-2 and Llama (6 layers, d 256,
batch 4 x 256) and a torchvision ResNet-18 (16 x 3 x 128 x 128), with AdamW:

- wrapping every layer (transformers' gradient_checkpointing_enable(); for the
  ResNet its blocks) and every 2nd layer;
- PyTorch's selective checkpointing around each layer with the policy people
  write by hand: save the matrix products (mm, addmm, bmm), recompute the rest;
- PyTorch's auto-SAC (torch.distributed._tools: MemTracker, RuntimeEstimator
  and SACEstimator on fake tensors, sac_milp for the modules and what share of
  each to discard, then get_optimal_checkpointing_policy_per_module for the ops
  each saves), its budget its own estimate of the weights and gradients plus
  0.7 or 0.5 of its estimate of the activations; its operator benchmark timed on the CPU (needs `pip install
  pulp pwlf`, else it is left out);
- torch.compile with torch._functorch.config.activation_memory_budget (its
  partitioner picks per op what to save), against the compiled step without it;
- ckplan's plans, solved at each peer's measured peak: the module target
  (`--target pytorch`) and selective checkpointing (`--target sac`), applied
  with ckplan_torch.apply_plan to the eager model.

Every method's peak is the profiler's memory timeline over a whole step
(memory_timeline.training_step_peak: zero_grad, forward with the model's own
loss, backward, optimizer.step, the output held); its time the median step
over interleaved rounds, one thread; its gradients compared with the step
without checkpointing (bit for bit for the eager methods). Prints a table per
model and, for each peer, ckplan's sac plan at its peak: no slower, or by how
much. One command:

    .venv/bin/python bench/peers.py [--models gpt2,llama,resnet18] [--rounds 7] [--no-compile]
"""
import argparse
import collections
import contextlib
import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

import torch  # noqa: E402
import torch.utils.checkpoint as tuc  # noqa: E402

import ckplan_torch  # noqa: E402
import memory_timeline  # noqa: E402

warnings.filterwarnings("ignore")
MATMULS = {torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default}


def make(name):
    """(model, inputs, kwargs, forward(model) -> (out, loss), layer paths)."""
    torch.manual_seed(0)
    if name in ("gpt2", "llama"):
        import transformers
        if name == "gpt2":
            config = transformers.GPT2Config(n_layer=6, n_embd=256, n_head=4, vocab_size=4096, n_positions=256,
                                             bos_token_id=0, eos_token_id=0)
            model = transformers.GPT2LMHeadModel(config)
            layers = [f"transformer.h.{i}" for i in range(6)]
        else:
            config = transformers.LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=6,
                                              num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
                                              max_position_embeddings=256, bos_token_id=0, eos_token_id=0)
            model = transformers.LlamaForCausalLM(config)
            layers = [f"model.layers.{i}" for i in range(6)]
        model.config.use_cache = False
        ids = torch.randint(0, 4096, (4, 256), generator=torch.Generator().manual_seed(1))
        labels = ids.clone()

        def forward(m):
            out = m(ids, labels=labels)
            return out, out.loss
        return model.train(), (ids,), {"labels": labels}, forward, layers
    import torchvision
    model = torchvision.models.resnet18(num_classes=10).train()
    x = torch.randn(16, 3, 128, 128, generator=torch.Generator().manual_seed(1))
    target = torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(2))

    def forward(m):
        out = m(x)
        return out, torch.nn.functional.cross_entropy(out, target)
    layers = [f"layer{i}.{j}" for i in range(1, 5) for j in range(2)]
    return model, (x,), {}, forward, layers


def wrap_layers(model, paths, policy=None, context_fn=None):
    """Checkpoints each of `paths` (non-reentrant), with a selective policy (or a context_fn) if given;
    returns the undo."""
    named = dict(model.named_modules())
    undo = []
    for path in paths:
        module = named[path]
        original = module.forward

        def forward(*args, _original=original, **kwargs):
            if not torch.is_grad_enabled():
                return _original(*args, **kwargs)
            extra = {"context_fn": context_fn} if context_fn else {} if policy is None else {
                "context_fn": functools.partial(tuc.create_selective_checkpoint_contexts, policy)}
            return tuc.checkpoint(_original, *args, use_reentrant=False, **extra, **kwargs)
        module.forward = forward
        undo.append(module)

    def done():
        for module in undo:
            del module.forward
    return done


def save_matmuls(ctx, func, *args, **kwargs):
    return tuc.CheckpointPolicy.MUST_SAVE if func in MATMULS else tuc.CheckpointPolicy.PREFER_RECOMPUTE


class _CpuEvent:
    """torch.Event's timing, on the CPU's clock (auto-SAC's operator benchmark records accelerator events)."""

    def __init__(self, enable_timing=True):
        self.at = None

    def record(self, stream=None):
        self.at = time.perf_counter()

    def elapsed_time(self, end):
        return (end.at - self.at) * 1e3


@contextlib.contextmanager
def cpu_op_timing():
    """RuntimeEstimator's operator-level benchmark on a machine without an accelerator."""
    accelerator = torch.accelerator
    saved = torch.Event, accelerator.current_stream, accelerator.synchronize
    torch.Event, accelerator.current_stream, accelerator.synchronize = _CpuEvent, lambda: None, lambda: None
    try:
        yield
    finally:
        torch.Event, accelerator.current_stream, accelerator.synchronize = saved


def auto_sac_peers(name, fractions):
    """PyTorch's auto-SAC on `name`, as torch's own test of it runs (test/distributed/_tools/test_sac_ilp.py):
    the stats on fake tensors, the module MILP at each of `fractions` of its own no-checkpointing peak, then
    each chosen module's op ILP. A Method per fraction; none where pulp or pwlf is missing."""
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.distributed._tools.ilp_utils import (aggregate_stats, get_peak_memory_runtime_baseline,
                                                        parse_module_info)
        from torch.distributed._tools.mem_tracker import _ModState, MemTracker
        from torch.distributed._tools.runtime_estimator import RuntimeEstimator
        from torch.distributed._tools.sac_estimator import OPS_TO_ALWAYS_SKIP, SACEstimator
        from torch.distributed._tools.sac_ilp import get_optimal_checkpointing_policy_per_module, sac_milp
        import pwlf  # noqa: F401  (aggregate_stats fits each module's trade-off curve with it)
    except ImportError as error:
        print(f"{name}: auto-SAC left out ({error}); `.venv/bin/pip install pulp pwlf` adds it", flush=True)
        return []
    started = time.perf_counter()
    mode = "operator-level-benchmark"
    with FakeTensorMode(), cpu_op_timing():
        model, _, _, forward, _ = make(name)
        optimizer = torch.optim.AdamW(model.parameters())

        def step():
            forward(model)[1].backward()
            optimizer.step()
            optimizer.zero_grad()
        tracker = MemTracker()
        tracker.track_external(model, optimizer)
        with tracker:
            step()  # the optimizer's state
            tracker.reset_mod_stats()
            forward(model)[1].backward()
            last = tracker.get_tracker_snapshot("current")
            optimizer.step()
            optimizer.zero_grad()
        # Modules without a backward (their inputs and outputs need no gradient, as rotary embeddings):
        # their backward states are the step's at the end of backward (torch's test does so for POST_BW).
        for stats in tracker.memory_tracking.values():
            for state in (_ModState.PRE_BW, _ModState.PEAK_BW, _ModState.POST_BW):
                if state not in stats.snapshots:
                    stats.snapshots[state] = [copy.deepcopy(last)]
        runtime = RuntimeEstimator()
        with runtime(estimate_mode_type=mode):
            step()
        estimator = SACEstimator()
        with estimator(estimate_mode_type=mode):
            loss = forward(model)[1]
        loss.backward()
        info = aggregate_stats(model, tracker, runtime, estimator, torch.device("cpu"))
    # parse_module_info expects each module called once; a ResNet block calls its relu twice: keep each
    # module's first call in the order lists.
    for key, order in info["mod_order"].items():
        info["mod_order"][key] = list(dict.fromkeys(order))
    graph = parse_module_info(info)
    baseline, _ = get_peak_memory_runtime_baseline(graph)
    # What its memory model holds beside activations: the weights and the gradients.
    fixed = graph.nodes[0]["param_per_module"] + max(node["grad_total"] for node in graph.nodes)
    print(f"{name}: auto-SAC's stats in {time.perf_counter() - started:.0f} s; its estimate without "
          f"checkpointing {baseline:,} B, of which activations {baseline - fixed:,} B", flush=True)
    methods = []
    for fraction in fractions:
        decisions, _, peak = sac_milp(graph, memory_budget=(fixed + fraction * (baseline - fixed)) / 2**30)
        if peak < 0:
            print(f"{name}: auto-SAC finds no solution at {fraction} of its activations", flush=True)
            continue
        saves = {}  # module path -> {(op name, occurrence among the module's ops of that name)}
        for fqn, discard in decisions.items():
            stats = estimator.sac_mod_stats[fqn]
            chosen = get_optimal_checkpointing_policy_per_module(stats, 1 - discard)
            seen = collections.Counter()
            keys = set()
            for op, save in zip(stats.func_names, chosen):
                if save:
                    keys.add((op, seen[op]))
                seen[op] += 1
            saves[fqn.split(".", 1)[1] if "." in fqn else ""] = keys
        method = Method(f"auto-SAC, {fraction} of activations",
                        lambda m, saves=saves: wrap_saving(m, saves, OPS_TO_ALWAYS_SKIP))
        method.detail = ", ".join(f"{path} ({len(keys)} ops)" for path, keys in saves.items())
        methods.append(method)
    return methods


def wrap_saving(model, saves, skipped):
    """Checkpoints each module of `saves` with a policy that saves the ops named there by (name,
    occurrence) among the ops of that name the module runs, counted as auto-SAC counts them (not `skipped`)."""
    undo = []
    for path, keys in saves.items():
        def policy_maker(keys=keys):
            seen = {False: collections.Counter(), True: collections.Counter()}

            def policy(ctx, func, *args, **kwargs):
                if func in skipped:
                    return tuc.CheckpointPolicy.PREFER_RECOMPUTE
                op = func._overloadpacket.__name__
                counter = seen[ctx.is_recompute]
                key = (op, counter[op])
                counter[op] += 1
                return tuc.CheckpointPolicy.MUST_SAVE if key in keys else tuc.CheckpointPolicy.PREFER_RECOMPUTE
            # auto-SAC saves an in-place op with the op whose output it writes (its ILP's constraint): the
            # cached output is then mutated, which the policy must allow.
            return tuc.create_selective_checkpoint_contexts(policy, allow_cache_entry_mutation=True)
        undo.append(wrap_layers(model, [path], context_fn=policy_maker))

    def done():
        for each in undo:
            each()
    return done


class Method:
    def __init__(self, name, apply=None, compiled=None, budget=None):
        self.name, self.apply, self.compiled, self.budget = name, apply, compiled, budget
        self.peak = self.times = self.grad_diff = self.plan = None


def grads_of(model, forward):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    forward(model)[1].backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def measure_peak(model, runner, forward):
    return memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p), lambda: forward(runner))


def step_time(model, runner, forward, optimizer):
    optimizer.zero_grad(set_to_none=True)
    start = time.perf_counter()
    out, loss = forward(runner)
    loss.backward()
    optimizer.step()
    return (time.perf_counter() - start) * 1e3


def measure_peaks(model, forward, methods):
    """Each method's step peak, and its gradients against the step without checkpointing."""
    reference = grads_of(model, forward)
    for m in methods:
        undo = m.apply(model) if m.apply else (lambda: None)
        m.peak = measure_peak(model, model, forward)
        got = grads_of(model, forward)
        m.grad_diff = max((a - b).abs().max().item() for a, b in zip(got, reference))
        undo()


def time_interleaved(model, forward, methods, rounds):
    """Median step per method over interleaved rounds (every method once per round; a warm-up round first)."""
    for m in methods:
        m.times = []
    with memory_timeline.restored_after(model):
        optimizer = torch.optim.AdamW(model.parameters())
        step_time(model, model, forward, optimizer)
        for r in range(rounds + 1):
            for m in methods:
                undo = m.apply(model) if m.apply else (lambda: None)
                t = step_time(model, model, forward, optimizer)
                if r > 0:
                    m.times.append(t)
                undo()


def run_compiled(model, forward, budgets, rounds, plans=()):
    """torch.compile of the whole step's forward and backward, per activation memory budget (1.0: none),
    then of the eager model under each of `plans` ((name, plan): its policy's tags read by the partitioner)."""
    import torch._dynamo
    import torch._functorch.config as functorch_config
    reference = grads_of(model, forward)
    out = []
    for budget, (plan_name, plan) in [(b, (None, None)) for b in budgets] + [(1.0, p) for p in plans]:
        torch._dynamo.reset()
        name = plan_name or (f"torch.compile, budget {budget}" if budget < 1 else "torch.compile, none")
        m = Method(name, budget=budget)
        m.plan = plan
        if plan is not None:
            ckplan_torch.apply_plan(model, plan, strict=False)
        with functorch_config.patch(activation_memory_budget=budget):
            compiled = torch.compile(model)
            grads_of(compiled, forward)  # compiles
            m.peak = measure_peak(model, compiled, forward)
            got = grads_of(compiled, forward)
            m.grad_diff = max((a - b).abs().max().item() for a, b in zip(got, reference))
            with memory_timeline.restored_after(model):
                optimizer = torch.optim.AdamW(model.parameters())
                step_time(model, compiled, forward, optimizer)
                m.times = [step_time(model, compiled, forward, optimizer) for _ in range(rounds)]
        if plan is not None:
            ckplan_torch.remove_plan(model)
        out.append(m)
    torch._dynamo.reset()
    return out


def ckplan_at(program, profile, budget, target):
    """The plan `ckplan solve` makes at `budget` (None where nothing fits), the sac target's with this
    Python's dispatch-mode cost, as ckplan_torch.plan passes it."""
    extra = ["--sac-dispatch-us", f"{ckplan_torch.measure_sac_dispatch_us():.2f}"] if target == "sac" else []
    result = subprocess.run([program, "solve", profile, "--budget", str(budget), "--target", target,
                             "--optimizer", "adamw", *extra, "-o", "-"], capture_output=True, text=True)
    if result.returncode == 3:
        return None
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    return json.loads(result.stdout)


def plan_method(name, plan):
    def apply(model):
        ckplan_torch.apply_plan(model, plan, strict=False)
        return lambda: ckplan_torch.remove_plan(model)
    m = Method(name, apply)
    m.plan = plan
    return m


def median(m):
    return statistics.median(m.times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="gpt2,llama,resnet18")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-compile", action="store_true", help="leave out torch.compile (minutes on a CPU)")
    parser.add_argument("--compile-budgets", default="0.9,0.5,0.1")
    parser.add_argument("--auto-sac", default="0.7,0.5",
                        help="auto-SAC's budgets: its weights and gradients plus these fractions of its activations, "
                             "as it estimates them ('' leaves it out)")
    parser.add_argument("--ckplan", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    program = ckplan_torch.find_ckplan(args.ckplan)
    summary = []
    for name in args.models.split(","):
        model, inputs, kwargs, forward, layers = make(name)
        work = tempfile.mkdtemp(prefix=f"ckplan-peers-{name}-")
        started = time.perf_counter()
        ckplan_torch.plan(model, inputs, budget="1TB", kwargs=kwargs, optimizer="adamw", ckplan=program,
                          workdir=work)
        profile = os.path.join(work, "profile.json")
        print(f"\n== {name}: exported and profiled in {time.perf_counter() - started:.0f} s ({profile})", flush=True)
        peers = [Method("none"),
                 Method("every layer", lambda m: wrap_layers(m, layers)),
                 Method("every 2nd layer", lambda m: wrap_layers(m, layers[::2])),
                 Method("SAC save matmuls, each layer", lambda m: wrap_layers(m, layers, save_matmuls))]
        if args.auto_sac:
            peers += auto_sac_peers(name, [float(f) for f in args.auto_sac.split(",")])
        measure_peaks(model, forward, peers)
        for peer in peers:
            if getattr(peer, "detail", None):
                print(f"{name}: {peer.name} wraps {peer.detail}", flush=True)
        compiled = [] if args.no_compile else run_compiled(
            model, forward, [1.0] + [float(b) for b in args.compile_budgets.split(",")], max(3, args.rounds // 2))
        # ckplan at each peer's measured peak.
        ours = []
        for peer in peers[1:] + compiled[1:]:
            for target in ("pytorch", "sac"):
                plan = ckplan_at(program, profile, peer.peak, target)
                if plan is None:
                    smallest = ckplan_at(program, profile, "1TB", target)["min_budget_bytes"]
                    line = (f"{name}: no ckplan {target} plan within {peer.name}'s measured peak "
                            f"({peer.peak:,} B): its smallest predicted budget is {smallest:,} B "
                            f"({smallest - peer.peak:+,} B)")
                    print(line, flush=True)
                    summary.append(line)
                else:
                    m = plan_method(f"ckplan {target} @ {peer.name}", plan)
                    m.peer = peer
                    ours.append(m)
        measure_peaks(model, forward, ours)
        # Every eager method timed in the same interleaved rounds.
        time_interleaved(model, forward, peers + ours, args.rounds)
        # A sac plan under torch.compile: what the compiled job holds against the plan.
        sac_plans = [m for m in ours if m.name.startswith("ckplan sac")]
        if compiled and sac_plans:
            under = run_compiled(model, forward, [], max(3, args.rounds // 2),
                                 [(f"torch.compile of {sac_plans[-1].name}", sac_plans[-1].plan)])
            compiled += under
        base = median(peers[0])
        compiled_base = median(compiled[0]) if compiled else None
        rows = [("method", "peak MB", "step ms", "overhead", "grads max diff")]
        rows[0] += ("predicted MB", "predicted overhead")
        for m in peers + compiled + ours:
            ref = compiled_base if m in compiled else base
            predicted = getattr(m, "plan", None)
            rows.append((m.name, f"{m.peak / 1e6:.1f}", f"{median(m):.1f}", f"{(median(m) - ref) / ref * 100:+.1f}%",
                         f"{m.grad_diff:.1e}",
                         f"{predicted['predicted']['peak_bytes'] / 1e6:.1f}" if predicted else "",
                         f"{predicted['pytorch']['predicted']['overhead_pct']:+.1f}%" if predicted else ""))
        widths = [max(len(r[k]) for r in rows) for k in range(7)]
        for r in rows:
            print("  ".join(c.ljust(widths[k]) if k == 0 else c.rjust(widths[k]) for k, c in enumerate(r)))
        print(f"(eager overheads against eager none {base:.1f} ms"
              + (f"; torch.compile's against compiled none {compiled_base:.1f} ms)" if compiled else ")"))
        for m in ours:
            if not m.name.startswith("ckplan sac"):
                continue
            peer = m.peer
            if peer in compiled:
                gap = (median(m) - base) / base * 100 - (median(peer) - compiled_base) / compiled_base * 100
                verdict = f"overhead {gap:+.1f} points against torch.compile's"
            else:
                gap = (median(m) - median(peer)) / median(peer) * 100
                verdict = "no slower" if gap <= 0 else f"slower by {gap:.1f}%"
            line = (f"{name}: ckplan sac at {peer.name}'s peak ({peer.peak / 1e6:.1f} MB): {m.peak / 1e6:.1f} MB, "
                    f"{median(m):.1f} ms vs {median(peer):.1f} ms: {verdict}")
            print(line, flush=True)
            summary.append(line)
        for m in compiled:
            if getattr(m, "plan", None) is not None:
                line = (f"{name}: {m.name}: {m.peak / 1e6:.1f} MB measured against the eager plan's "
                        f"{m.plan['predicted']['peak_bytes'] / 1e6:.1f} MB predicted, "
                        f"{(median(m) - compiled_base) / compiled_base * 100:+.1f}% against compiled none")
                print(line, flush=True)
                summary.append(line)
    print("\n" + "\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
