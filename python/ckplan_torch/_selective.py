"""Selective activation checkpointing (``--target sac``): the policy that saves the ops a plan names
inside a wrapped module, and what such a policy costs per op in this Python."""
import statistics
import time
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._errors import PlanError


def _sac_op_families(doc):
    """The plan's ``pytorch.sac_families`` (each family its policies name, with the dispatcher's ops that
    count as it: ckplan's one list, planner/cost/sac_candidates.h) as op name -> family."""
    families = (doc.get("pytorch") or {}).get("sac_families")
    if not isinstance(families, dict) or not all(
            isinstance(ops, list) and all(isinstance(op, str) for op in ops) for ops in families.values()):
        raise PlanError("the plan's selective policies come without 'pytorch.sac_families' (a plan from an older "
                        "ckplan): make the plan again with `ckplan solve --target sac`")
    return {op: family for family, ops in families.items() for op in ops}


class _SacPolicy:
    """A wrapped module's selective-checkpointing policy from the plan's
    ``pytorch.sac`` entry: the ``occurrence``-th op of a family in the
    module's forward is saved (CheckpointPolicy.MUST_SAVE) where the plan says
    so, every other op recomputed. Counts per call; after each forward the
    counts are checked against the plan's (one warning per module when the
    model runs other ops than were profiled: the policy then saves other
    outputs than the plan priced)."""

    def __init__(self, spec, op_families):
        self.path = spec["module"]
        self.op_families = op_families
        self.expected = {k: int(v) for k, v in spec.get("family_counts", {}).items() if int(v) > 0}
        self.save = {(s["family"], int(s["occurrence"])): s for s in spec.get("save", [])}
        self.warned = False

    def contexts(self, state):
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx, func, *args, **kwargs):
            family = self.op_families.get(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))
            if family is None:
                return CheckpointPolicy.PREFER_RECOMPUTE
            counts = state["recompute" if ctx.is_recompute else "forward"]
            index = counts[family]
            counts[family] += 1
            entry = self.save.get((family, index))
            if entry is None:
                return CheckpointPolicy.PREFER_RECOMPUTE
            out = getattr(ctx, "op_output", None)  # torch >= 2.15 calls the policy after the op
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            if isinstance(first, torch.Tensor) and first.numel() != _numel(entry.get("shape", [])):
                state["mismatch"] = (f"its {family} op {index} made {tuple(first.shape)}, the plan's "
                                     f"{entry.get('kind')} (op {entry.get('op')}) {tuple(entry.get('shape', []))}")
            return CheckpointPolicy.MUST_SAVE

        return create_selective_checkpoint_contexts(policy)

    def check(self, state):
        if self.warned:
            return
        ran = {k: v for k, v in state["forward"].items() if v > 0}
        why = state.get("mismatch")
        if ran != self.expected:
            why = f"its forward ran {dict(sorted(ran.items()))} ops of each family, the plan's profile {dict(sorted(self.expected.items()))}"
        if why:
            self.warned = True
            warnings.warn(f"ckplan_torch: module '{self.path}' does not run the ops its plan was made for ({why}): "
                          "its selective-checkpointing policy saves other outputs than the plan priced, so memory "
                          "and time differ from the prediction (gradients are unaffected); profile the model as "
                          "the job runs it")


def _numel(shape):
    n = 1
    for d in shape:
        n *= int(d)
    return n


class DispatchCounter(TorchDispatchMode):
    """Counts the ops dispatched while it is entered, as a selective-checkpointing policy's dispatch
    mode sees them (below autograd, detach included)."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def measure_sac_dispatch_us(layers: int = 10, reps: int = 9) -> float:
    """Measures what a selective-checkpointing policy costs per op of a wrapped module in this
    Python: PyTorch runs the module's forward, and its recomputation in backward, under dispatch
    modes that call into Python for every op. Measured on a stack of tiny transformer-like layers
    (layer_norm, linear, gelu, dropout, softmax, mul, add: the op mix of the layers people wrap)
    checkpointed with a policy that saves nothing, against the same without it: the median forward
    and backward, per op the forward dispatches. ``plan(target="sac")`` passes it to ``ckplan solve
    --sac-dispatch-us``; about 0.2 s (1 s on the first call, which imports).

    Args:
        layers: how many tiny layers the measured forward runs.
        reps: the rounds timed (after one that warms up).

    Returns:
        The cost per dispatched op, in microseconds (0 or more).
    """
    import torch.nn.functional as F
    import torch.utils.checkpoint as tuc

    weight = torch.ones(8, 8, requires_grad=True)
    bias = torch.zeros(8, requires_grad=True)

    def body(x):
        for _ in range(layers):
            h = F.dropout(F.gelu(F.linear(F.layer_norm(x, (8,)), weight, bias)), 0.1, True)
            x = x + torch.softmax(h, -1) * 0.5
        return x

    def policy(ctx, func, *args, **kwargs):
        return tuc.CheckpointPolicy.PREFER_RECOMPUTE

    x = torch.ones(2, 3, 8, requires_grad=True)
    with torch.random.fork_rng():
        counter = DispatchCounter()
        with counter:
            body(x)
        timed = {False: [], True: []}
        for _ in range(reps + 1):  # the first round warms up
            for selective in (False, True):
                extra = {"context_fn": lambda: tuc.create_selective_checkpoint_contexts(policy)} if selective else {}
                start = time.perf_counter()
                tuc.checkpoint(body, x, use_reentrant=False, **extra).sum().backward()
                timed[selective].append(time.perf_counter() - start)
    extra = statistics.median(timed[True][1:]) - statistics.median(timed[False][1:])
    return max(0.0, extra / counter.ops * 1e6)
