#!/usr/bin/env python3
"""Distributed plans on torch.distributed (CPU, gloo, 2 processes started here).

* FSDP2 (`fully_shard` on the plan's units, then the root) with the plan of
  `ckplan solve --data-parallel 2 --shard full` applied: per rank, PyTorch's
  own sizes (the local shards of parameters, gradients and Adam state with
  amsgrad, the unsharded parameters FSDP holds, the activations
  saved_tensors_hooks see)
  agree with the plan's per-rank prediction within 5%; loss and gradients
  equal those of the same step in one process.
* A 2-stage pipeline (`torch.distributed.pipelining`, 1F1B and GPipe, 4
  microbatches) with each stage's plan from `ckplan solve --pipeline 2`
  applied to its submodule: per rank, the most bytes saved for backward at
  once (all microbatches in flight) agree with the stage's prediction within
  5%; losses and gradients equal those of one process.

    test_distributed.py --ckplan BUILD/ckplan
"""
import argparse
import copy
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import ckplan_torch  # noqa: E402

WORLD = 2
BATCH = 16          # per rank (FSDP), per microbatch (pipeline): the profile's batch
MICROBATCHES = 4
WIDTH, HIDDEN, BLOCKS = 64, 256, 6


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, WIDTH)
        self.blocks = nn.ModuleDict({str(i): Block() for i in range(BLOCKS)})
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x):
        x = torch.tanh(self.embed(x))
        for block in self.blocks.values():
            x = block(x)
        return self.head(x)


def loss_fn(out, target=None):
    return out.square().mean()


def storage(t):
    return t.untyped_storage()


class SavedCounter:
    """Bytes saved for backward, unique storages, parameters (sharded or
    gathered) excluded: pack keeps a holder per saved tensor; a holder's
    death (autograd freeing it) takes its bytes off. `peak` is the most held at
    once; checkpointed modules' inputs are counted through their own holders."""

    def __init__(self, model, excluded=()):
        self.live = {}     # storage ptr -> [refcount, nbytes]
        self.peak = 0
        self.model = model
        self.excluded = {storage(t).data_ptr() for t in excluded}  # model inputs
        self.on_unpack = lambda: None

    def _params(self):
        ptrs = set()
        for p in self.model.parameters():
            t = p.to_local() if hasattr(p, "to_local") else p
            ptrs.add(storage(t).data_ptr())
        for m in self.model.modules():
            state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
            for group in (state._fsdp_param_groups if state is not None else []):
                for fp in group.fsdp_params:
                    if hasattr(fp, "_unsharded_param"):
                        ptrs.add(storage(fp._unsharded_param).data_ptr())
        return ptrs

    def total(self):
        return sum(n for _, n in self.live.values())

    def add(self, t):
        counter = self

        class Holder:
            def __init__(self, tensor):
                self.tensor = tensor
                self.ptr = None
                s = storage(tensor)
                if (isinstance(tensor, nn.Parameter) or s.nbytes() == 0 or s.data_ptr() in counter.excluded
                        or s.data_ptr() in counter._params()):
                    return
                self.ptr = s.data_ptr()
                entry = counter.live.setdefault(self.ptr, [0, s.nbytes()])
                entry[0] += 1
                counter.peak = max(counter.peak, counter.total())

            def __del__(self):
                if self.ptr is not None and self.ptr in counter.live:
                    entry = counter.live[self.ptr]
                    entry[0] -= 1
                    if entry[0] == 0:
                        del counter.live[self.ptr]

        return Holder(t)

    def unpack(self, holder):
        self.on_unpack()
        return holder.tensor

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.add, self.unpack)

    def hold_until_grad(self, output, holders):
        """Keeps `holders` until the gradient of `output` arrives (its backward starts)."""
        box = [holders]

        def release(grad):
            box.clear()
            return grad

        output.register_hook(release)

    def hold_checkpoint_inputs(self, model):
        """A checkpointed module keeps its input for the recompute until its
        backward: a holder on its output's autograd node lives as long."""
        def hook(module, args, output):
            if isinstance(output, torch.Tensor) and output.grad_fn is not None:
                self.hold_until_grad(output, [self.add(a) for a in args if isinstance(a, torch.Tensor)])
        return [model.get_submodule(p).register_forward_hook(hook) for p in ckplan_torch.checkpointed_modules(model)]


def gathered_bytes(model):
    """Unsharded parameters FSDP holds now (PyTorch's FSDPParam storages: the
    unsharded parameters and the all-gather outputs, each storage once)."""
    seen = {}
    for m in model.modules():
        state = m._get_fsdp_state() if hasattr(m, "_get_fsdp_state") else None
        for group in (state._fsdp_param_groups if state is not None else []):
            result = getattr(group, "_all_gather_result", None)
            if result is not None and getattr(result, "all_gather_output", None) is not None:
                seen[storage(result.all_gather_output).data_ptr()] = storage(result.all_gather_output).nbytes()
            for fp in group.fsdp_params:
                tensors = list(getattr(fp, "all_gather_outputs", []))
                if hasattr(fp, "_unsharded_param"):
                    tensors.append(fp._unsharded_param)
                for t in tensors:
                    if storage(t).nbytes() > 0:
                        seen[storage(t).data_ptr()] = storage(t).nbytes()
    return sum(seen.values())


def local_bytes(tensors):
    seen = {}
    for t in tensors:
        t = t.to_local() if hasattr(t, "to_local") else t
        seen[storage(t).data_ptr()] = storage(t).nbytes()
    return sum(seen.values())


def close(a, b, rel=0.05):
    return abs(a - b) <= rel * max(abs(b), 1)


# ---- FSDP2 -----------------------------------------------------------------

def fsdp_rank(rank, plan, x, out):
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = Net()
    mesh = torch.distributed.device_mesh.init_device_mesh("cpu", (WORLD,))
    for unit in ckplan_torch.fsdp_units(plan):
        fully_shard(model.get_submodule(unit), mesh=mesh)
    fully_shard(model, mesh=mesh)
    wrapped = ckplan_torch.apply_rank_plan(model, plan)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, amsgrad=True)  # as the plan: --amsgrad
    local = x[rank * BATCH:(rank + 1) * BATCH]

    counter = SavedCounter(model, excluded=[x])
    gathered = [0]

    def note_gathered(*_):
        gathered[0] = max(gathered[0], gathered_bytes(model))

    counter.on_unpack = note_gathered
    handles = [m.register_forward_pre_hook(lambda *a: note_gathered()) for m in model.modules()]
    handles += counter.hold_checkpoint_inputs(model)
    with counter.hooks():
        output = model(local)
        # Checkpointed modules keep their inputs; the output is held to the loss.
        kept_after_forward = counter.total() + storage(output).nbytes()
        loss = loss_fn(output)
    handles += [m.register_full_backward_pre_hook(lambda *a: note_gathered()) for m in model.modules()]
    loss.backward()
    for h in handles:
        h.remove()
    grads = {name: p.grad.full_tensor().clone() for name, p in model.named_parameters()}
    measured = {
        "param_bytes": local_bytes(model.parameters()),
        "grad_bytes": local_bytes(p.grad for p in model.parameters()),
    }
    optimizer.step()
    measured["optimizer_bytes"] = local_bytes(
        v for state in optimizer.state.values() for k, v in state.items() if k != "step")
    measured["gathered_bytes"] = gathered[0]
    measured["saved_bytes"] = kept_after_forward
    loss_value = loss.detach().clone()
    dist.all_reduce(loss_value)
    out.update({"measured": measured, "wrapped": wrapped, "loss": loss_value.item() / WORLD,
                "grads": grads})


# ---- pipeline ----------------------------------------------------------------

def stage_module(model, plan_doc):
    """The stage's part of the model (the modules its plan's chain stages
    cover), module names kept (the pipelining docs' way)."""
    owned = {m for s in plan_doc["stages"] for m in s.get("modules", [])}
    tanh = any(s["name"] == "aten::tanh" for s in plan_doc["stages"])  # the top-level op after embed

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = model.embed if "embed" in owned else None
            self.blocks = nn.ModuleDict({k: b for k, b in model.blocks.items() if f"blocks.{k}" in owned})
            self.head = model.head if "head" in owned else None

        def forward(self, x):
            if self.embed is not None:
                x = self.embed(x)
            if tanh:
                x = torch.tanh(x)
            for block in self.blocks.values():
                x = block(x)
            return self.head(x) if self.head is not None else x

    return Stage()


def pipeline_rank(rank, plan, schedule_name, x, out):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    torch.manual_seed(0)
    model = Net()
    doc = ckplan_torch.rank_plan(plan, stage=rank)
    module = stage_module(model, doc)
    wrapped = ckplan_torch.apply_plan(module, doc)
    stage = PipelineStage(module, rank, WORLD, torch.device("cpu"))
    cls = Schedule1F1B if schedule_name == "1f1b" else ScheduleGPipe
    schedule = cls(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    # A first step outside the count: the stage infers shapes on its first
    # step (a forward whose graph is kept to the end of that step).
    if rank == 0:
        schedule.step(x)
    else:
        schedule.step(target=torch.zeros(x.shape[0]))
    module.zero_grad(set_to_none=True)
    counter = SavedCounter(module, excluded=[x])
    counter.hold_checkpoint_inputs(module)

    def hold_output(mod, args, output):
        # The schedule keeps each microbatch's output (sent on) until its backward.
        if output.grad_fn is not None:
            counter.hold_until_grad(output, [counter.add(output)])

    module.register_forward_hook(hold_output)
    losses = []
    with counter.hooks():
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=torch.zeros(x.shape[0]), losses=losses)
    grads = {name: p.grad.clone() for name, p in module.named_parameters()}
    out.update({"peak_saved": counter.peak, "wrapped": wrapped, "grads": grads,
                "losses": [l.item() for l in losses]})


# ---- processes -----------------------------------------------------------------

def worker(rank, port, plans, x, x_pipe, result_dir):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    results = {}
    try:
        fsdp = {}
        fsdp_rank(rank, plans["fsdp"], x, fsdp)
        results["fsdp"] = fsdp
        dist.barrier()
        for name in ("1f1b", "gpipe"):
            r = {}
            pipeline_rank(rank, plans[name], name, x_pipe, r)
            results[name] = r
            dist.barrier()
    finally:
        torch.save(results, os.path.join(result_dir, f"rank{rank}.pt"))
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ckplan(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"ckplan {' '.join(args)} failed ({result.returncode}): {result.stderr}")
    return result.stdout


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckplan", required=True)
    args = parser.parse_args(argv)
    failures = []

    def check(ok, what):
        print(("ok   " if ok else "FAIL ") + what, flush=True)
        if not ok:
            failures.append(what)

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        model = Net().train()
        sample = torch.randn(BATCH, 32)
        traced = torch.jit.trace(model, (sample,))
        traced.train()
        traced.save(os.path.join(tmp, "net.pt"))
        profile = os.path.join(tmp, "profile.json")
        ckplan(args.ckplan, "profile", os.path.join(tmp, "net.pt"), "--input", f"{BATCH}x32", "-o", profile)
        prof = json.load(open(profile))
        # Budgets where the plans must checkpoint: a solve with room to spare
        # gives the fixed part and the peak without checkpointing; take 60% of
        # the activations' share.
        plans = {"fsdp": os.path.join(tmp, "fsdp.json")}
        # amsgrad: a third state tensor per parameter, sharded as the moments are.
        dp = ["--data-parallel", str(WORLD), "--shard", "full", "--optimizer", "adam", "--amsgrad"]
        # The plan each rank applies (the PyTorch target, a profile's default): 60% of the way from its
        # smallest budget, which a budget in bytes below it is told exactly, to no checkpointing.
        free = json.loads(ckplan(args.ckplan, "solve", profile, "--budget", "1TB", *dp, "-o", "-"))
        rank = free["distributed"]["ranks"][0]
        refused = subprocess.run([args.ckplan, "solve", profile, "--budget", "1", *dp], capture_output=True, text=True)
        minimum = int(re.search(r"per-rank minimum (\d+) for the pytorch target", refused.stderr).group(1))
        budget = minimum + (rank["peak_bytes"] - minimum) * 6 // 10
        ckplan(args.ckplan, "solve", profile, "--budget", str(budget), *dp, "-o", plans["fsdp"])
        for name in ("1f1b", "gpipe"):
            plans[name] = os.path.join(tmp, f"{name}.json")
            pp = ["--pipeline", str(WORLD), "--microbatches", str(MICROBATCHES), "--schedule", name]
            free = json.loads(ckplan(args.ckplan, "solve", profile, "--budget", "1TB", *pp, "-o", "-"))
            peak = max(s["pipeline_stage"]["peak_bytes"] for s in free["distributed"]["stages"])
            fixed = max(s["pipeline_stage"]["fixed"]["total_bytes"] for s in free["distributed"]["stages"])
            ckplan(args.ckplan, "solve", profile, "--budget", str(fixed + (peak - fixed) * 6 // 10), *pp,
                   "-o", plans[name])
        docs = {k: json.load(open(v)) for k, v in plans.items()}

        torch.manual_seed(1)
        x = torch.randn(WORLD * BATCH, 32)
        x_pipe = torch.randn(MICROBATCHES * BATCH, 32)
        mp.spawn(worker, args=(free_port(), plans, x, x_pipe, tmp), nprocs=WORLD)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]

    # The same steps in one process.
    torch.manual_seed(0)
    ref = Net()
    loss = sum(loss_fn(ref(x[r * BATCH:(r + 1) * BATCH])) for r in range(WORLD)) / WORLD
    loss.backward()
    ref_grads = {n: p.grad.clone() for n, p in ref.named_parameters()}

    fsdp_doc = docs["fsdp"]["distributed"]["ranks"][0]
    predicted = dict(fsdp_doc["fixed"])
    predicted["saved_bytes"] = docs["fsdp"]["pytorch"]["predicted"]["saved_bytes"]
    check(len(docs["fsdp"]["checkpoint_modules"]) > 0, f"the FSDP plan checkpoints {docs['fsdp']['checkpoint_modules']}")
    for rank, r in enumerate(results):
        f = r["fsdp"]
        for key in ("param_bytes", "grad_bytes", "optimizer_bytes", "gathered_bytes", "saved_bytes"):
            m, p = f["measured"][key], predicted[key]
            check(close(m, p), f"fsdp rank {rank} {key}: PyTorch {m:,} B, predicted {p:,} B ({(m - p) / max(p, 1):+.1%})")
        m_total = sum(f["measured"].values())
        p_total = sum(predicted[k] for k in f["measured"])
        check(close(m_total, p_total), f"fsdp rank {rank} total: PyTorch {m_total:,} B, predicted {p_total:,} B")
        check(abs(f["loss"] - loss.item()) <= 1e-6 * max(1, abs(loss.item())),
              f"fsdp rank {rank} loss {f['loss']:.8f} = one process {loss.item():.8f}")
        worst = max((f["grads"][n] - g).abs().max().item() / max(g.abs().max().item(), 1e-12)
                    for n, g in ref_grads.items())
        check(worst <= 1e-5, f"fsdp rank {rank} gradients equal one process's (max rel diff {worst:.2e})")

    for name in ("1f1b", "gpipe"):
        torch.manual_seed(0)
        ref = Net()
        chunks = x_pipe.chunk(MICROBATCHES)
        ref_losses = [loss_fn(ref(c)) for c in chunks]
        (sum(ref_losses) / MICROBATCHES).backward()  # the schedule scales gradients by the microbatches
        ref_grads = {n: p.grad for n, p in ref.named_parameters()}
        stages = docs[name]["distributed"]["stages"]
        for rank, r in enumerate(results):
            p = r[name]
            st = stages[rank]["pipeline_stage"]
            expected = st["in_flight"] * st["pytorch_saved_bytes"]
            check(close(p["peak_saved"], expected),
                  f"{name} stage {rank}: most saved at once {p['peak_saved']:,} B, predicted {expected:,} B "
                  f"({st['in_flight']} microbatches x {st['pytorch_saved_bytes']:,} B; "
                  f"checkpointed {p['wrapped']})")
            worst = max((p["grads"][n] - ref_grads[n]).abs().max().item() / max(ref_grads[n].abs().max().item(), 1e-12)
                        for n in p["grads"])
            check(worst <= 1e-5, f"{name} stage {rank} gradients equal one process's (max rel diff {worst:.2e})")
        got = results[WORLD - 1][name]["losses"]
        check(len(got) == MICROBATCHES and all(abs(a - b.item()) <= 1e-6 for a, b in zip(got, ref_losses)),
              f"{name} losses {got} equal one process's")
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


def test_distributed(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan") == 0


if __name__ == "__main__":
    main()
