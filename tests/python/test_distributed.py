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

The plans and the two processes' steps run once (module-scoped fixtures); the tests are one per rank
(or stage), size and check.

    pytest tests/python/test_distributed.py --ckplan BUILD/ckplan
"""
import json
import os
import re
import socket
import subprocess

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import ckplan_torch

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


def ckplan_out(binary, *args):
    result = subprocess.run([binary, *args], capture_output=True, text=True)
    assert result.returncode == 0, f"ckplan {' '.join(args)} failed ({result.returncode}): {result.stderr}"
    return result.stdout


SCHEDULES = ["1f1b", "gpipe"]
FSDP_SIZES = ["param_bytes", "grad_bytes", "optimizer_bytes", "gathered_bytes", "saved_bytes"]
RANKS = [pytest.param(r, id=f"rank{r}") for r in range(WORLD)]
STAGES = [pytest.param(r, id=f"stage{r}") for r in range(WORLD)]


@pytest.fixture(scope="module")
def plans(ckplan, tmp_path_factory):
    """Net traced and profiled, and its plans: {"fsdp", "1f1b", "gpipe": the plan's path}, in a folder of
    their own. Budgets where the plans must checkpoint: 60% of the way from the smallest budget to no
    checkpointing's peak."""
    tmp = str(tmp_path_factory.mktemp("distributed"))
    torch.manual_seed(0)
    model = Net().train()
    sample = torch.randn(BATCH, 32)
    traced = torch.jit.trace(model, (sample,))
    traced.train()
    traced.save(os.path.join(tmp, "net.pt"))
    profile = os.path.join(tmp, "profile.json")
    ckplan_out(ckplan, "profile", os.path.join(tmp, "net.pt"), "--input", f"{BATCH}x32", "-o", profile)
    paths = {"fsdp": os.path.join(tmp, "fsdp.json")}
    # amsgrad: a third state tensor per parameter, sharded as the moments are.
    dp = ["--data-parallel", str(WORLD), "--shard", "full", "--optimizer", "adam", "--amsgrad"]
    # The plan each rank applies (the PyTorch target, a profile's default): 60% of the way from its
    # smallest budget, which a budget in bytes below it is told exactly, to no checkpointing.
    free = json.loads(ckplan_out(ckplan, "solve", profile, "--budget", "1TB", *dp, "-o", "-"))
    rank = free["distributed"]["ranks"][0]
    refused = subprocess.run([ckplan, "solve", profile, "--budget", "1", *dp], capture_output=True, text=True)
    found = re.search(r"per-rank minimum (\d+) for the pytorch target", refused.stderr)
    assert found, f"a budget of 1 B does not tell the per-rank minimum: {refused.stderr.strip()}"
    minimum = int(found.group(1))
    budget = minimum + (rank["peak_bytes"] - minimum) * 6 // 10
    ckplan_out(ckplan, "solve", profile, "--budget", str(budget), *dp, "-o", paths["fsdp"])
    for name in SCHEDULES:
        paths[name] = os.path.join(tmp, f"{name}.json")
        pp = ["--pipeline", str(WORLD), "--microbatches", str(MICROBATCHES), "--schedule", name]
        free = json.loads(ckplan_out(ckplan, "solve", profile, "--budget", "1TB", *pp, "-o", "-"))
        peak = max(s["pipeline_stage"]["peak_bytes"] for s in free["distributed"]["stages"])
        fixed = max(s["pipeline_stage"]["fixed"]["total_bytes"] for s in free["distributed"]["stages"])
        ckplan_out(ckplan, "solve", profile, "--budget", str(fixed + (peak - fixed) * 6 // 10), *pp,
                   "-o", paths[name])
    return tmp, paths


@pytest.fixture(scope="module")
def docs(plans):
    """The plans' documents, by the plans' names."""
    _, paths = plans
    docs = {}
    for name, path in paths.items():
        with open(path) as f:
            docs[name] = json.load(f)
    return docs


@pytest.fixture(scope="module")
def inputs():
    """(the FSDP step's batch, WORLD x BATCH rows; the pipeline's, MICROBATCHES x BATCH rows)."""
    torch.manual_seed(1)
    x = torch.randn(WORLD * BATCH, 32)
    return x, torch.randn(MICROBATCHES * BATCH, 32)


@pytest.fixture(scope="module")
def results(plans, inputs):
    """What each of the WORLD processes measured: [{"fsdp", "1f1b", "gpipe": that step's record}]."""
    tmp, paths = plans
    x, x_pipe = inputs
    mp.spawn(worker, args=(free_port(), paths, x, x_pipe, tmp), nprocs=WORLD)
    results = [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(WORLD)]
    for rank, r in enumerate(results):
        assert sorted(r) == sorted(["fsdp", *SCHEDULES]), f"rank {rank} ran {sorted(r)}, not fsdp and {SCHEDULES}"
    return results


@pytest.fixture(scope="module")
def fsdp_reference(inputs):
    """The FSDP step in one process: (its loss, its gradients by parameter name)."""
    x, _ = inputs
    torch.manual_seed(0)
    ref = Net()
    loss = sum(loss_fn(ref(x[r * BATCH:(r + 1) * BATCH])) for r in range(WORLD)) / WORLD
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in ref.named_parameters()}


@pytest.fixture(scope="module")
def pipeline_reference(inputs):
    """The pipeline's step in one process: (the microbatches' losses, the gradients by parameter name),
    gradients scaled by the microbatches as the schedule does."""
    _, x_pipe = inputs
    torch.manual_seed(0)
    ref = Net()
    losses = [loss_fn(ref(c)) for c in x_pipe.chunk(MICROBATCHES)]
    (sum(losses) / MICROBATCHES).backward()
    return [l.item() for l in losses], {n: p.grad.clone() for n, p in ref.named_parameters()}


def fsdp_predicted(docs):
    """The FSDP plan's per-rank prediction: its fixed sizes and the PyTorch target's saved bytes."""
    predicted = dict(docs["fsdp"]["distributed"]["ranks"][0]["fixed"])
    predicted["saved_bytes"] = docs["fsdp"]["pytorch"]["predicted"]["saved_bytes"]
    return predicted


def max_relative_difference(grads, reference):
    """The largest difference of a gradient from the reference's, over the reference's largest value."""
    assert grads, "no gradients to compare"
    return max((grads[n] - reference[n]).abs().max().item() / max(reference[n].abs().max().item(), 1e-12)
               for n in grads)


def test_fsdp_plan_checkpoints(docs):
    """At its budget the FSDP plan checkpoints modules (what the rank tests measure is a plan that acts)."""
    modules = docs["fsdp"]["checkpoint_modules"]
    assert len(modules) > 0, "the FSDP plan checkpoints nothing at 60% of the way to no checkpointing's peak"


@pytest.mark.parametrize("key", FSDP_SIZES)
@pytest.mark.parametrize("rank", RANKS)
def test_fsdp_rank_size(results, docs, rank, key):
    """Each size of a rank (parameters' shards, gradients' shards, Adam's state with amsgrad, the
    unsharded parameters FSDP holds, the activations saved) as PyTorch holds it, within 5% of the plan's
    per-rank prediction."""
    m, p = results[rank]["fsdp"]["measured"][key], fsdp_predicted(docs)[key]
    assert close(m, p), f"fsdp rank {rank} {key}: PyTorch {m:,} B, predicted {p:,} B ({(m - p) / max(p, 1):+.1%}), " \
                        "expected within 5%"


@pytest.mark.parametrize("rank", RANKS)
def test_fsdp_rank_total(results, docs, rank):
    """The sum of a rank's sizes within 5% of the prediction's."""
    measured = results[rank]["fsdp"]["measured"]
    predicted = fsdp_predicted(docs)
    assert sorted(measured) == sorted(FSDP_SIZES), f"rank {rank} measured {sorted(measured)}, not {FSDP_SIZES}"
    m_total = sum(measured.values())
    p_total = sum(predicted[k] for k in measured)
    assert close(m_total, p_total), f"fsdp rank {rank} total: PyTorch {m_total:,} B, predicted {p_total:,} B " \
                                    f"({(m_total - p_total) / max(p_total, 1):+.1%}), expected within 5%"


@pytest.mark.parametrize("rank", RANKS)
def test_fsdp_rank_loss(results, fsdp_reference, rank):
    """The loss averaged over the ranks equals the same step's in one process (to 1e-6 relative)."""
    got, expected = results[rank]["fsdp"]["loss"], fsdp_reference[0]
    assert abs(got - expected) <= 1e-6 * max(1, abs(expected)), \
        f"fsdp rank {rank} loss {got:.8f}, one process {expected:.8f}"


@pytest.mark.parametrize("rank", RANKS)
def test_fsdp_rank_gradients(results, fsdp_reference, rank):
    """Every parameter's full gradient on the rank equals one process's (to 1e-5 relative)."""
    grads, reference = results[rank]["fsdp"]["grads"], fsdp_reference[1]
    assert sorted(grads) == sorted(reference), f"fsdp rank {rank} has gradients of {sorted(grads)}, " \
                                               f"one process of {sorted(reference)}"
    worst = max_relative_difference(grads, reference)
    assert worst <= 1e-5, f"fsdp rank {rank} gradients differ from one process's by {worst:.2e} (relative), " \
                          "expected 1e-5 or less"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_stage_saved_at_once(results, docs, schedule, stage):
    """The most bytes a stage saves for backward at once (every microbatch in flight) within 5% of the
    stage's prediction: in_flight x pytorch_saved_bytes."""
    measured = results[stage][schedule]
    st = docs[schedule]["distributed"]["stages"][stage]["pipeline_stage"]
    expected = st["in_flight"] * st["pytorch_saved_bytes"]
    assert expected > 0, f"{schedule} stage {stage}: the plan predicts nothing saved"
    assert close(measured["peak_saved"], expected), \
        f"{schedule} stage {stage}: most saved at once {measured['peak_saved']:,} B, predicted {expected:,} B " \
        f"({st['in_flight']} microbatches x {st['pytorch_saved_bytes']:,} B; checkpointed {measured['wrapped']}), " \
        "expected within 5%"


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_stage_gradients(results, pipeline_reference, schedule, stage):
    """The stage's parameters' gradients equal one process's (to 1e-5 relative)."""
    grads = results[stage][schedule]["grads"]
    worst = max_relative_difference(grads, pipeline_reference[1])
    assert worst <= 1e-5, f"{schedule} stage {stage} gradients ({len(grads)} parameters) differ from one " \
                          f"process's by {worst:.2e} (relative), expected 1e-5 or less"


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_losses(results, pipeline_reference, schedule):
    """The last stage's losses, one per microbatch, equal one process's (to 1e-6)."""
    got, expected = results[WORLD - 1][schedule]["losses"], pipeline_reference[0]
    assert len(got) == MICROBATCHES, f"{schedule}: {len(got)} losses, expected {MICROBATCHES}"
    assert all(abs(a - b) <= 1e-6 for a, b in zip(got, expected)), \
        f"{schedule} losses {got}, one process's {expected}"
