"""Plans for compiled training: which values of torch.compile's joint graph the forward saves for the
backward, chosen by ckplan under a budget in bytes, and a compiled model that saves exactly those.

How (docs/how-it-works.md, "Compiled jobs"): AOTAutograd traces the forward and backward as one joint
graph and its partitioner (``min_cut_rematerialization_partition``) chooses the saved values, then
splits the graph. ckplan sets Inductor's ``custom_partitioner_fn``: the partition is torch's own
code, with the choice of saved values (``choose_saved_values_set``) replaced by ckplan's.

- **Profile.** The job's step is compiled once, recording each joint graph; the compiled step is
  measured (its peak before and after ``optimizer.step()``, its time). The ops torch will not
  recompute by itself (matmuls, convolutions, attention, reductions: the min-cut's "banned" nodes)
  are each timed on tensors of their shapes, one thread, median of runs.
- **Candidates.** Each set of banned nodes to recompute is turned into saved values by torch's
  min-cut (``solve_min_cut(..., dont_ban)``), which recomputes pointwise ops for free: exact bytes
  (the saved values' storages). Sets come from a knapsack on the measured times at 21 sizes, and
  from torch's own ``activation_memory_budget`` choices at 0.0 to 0.9, so a plan is never one torch
  would make slower. Random ops are never in a set, and a candidate recomputing one is dropped: a
  recomputed dropout would draw a fresh mask.
- **Prediction.** Peak: the measured peak of the forward and backward, less the measured plan's
  saved bytes, plus the candidate's; the optimizer's measured peak beside it. Time: the measured
  step plus the recomputed ops' times. The plan chosen is then compiled and measured; the plan
  reports that measurement, and where it is over the budget the next plan is tried.
"""
import contextlib
import hashlib
import importlib
import json
import operator
import os
import statistics
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
from torch.utils import _pytree

from ._arguments import budget_bytes
from ._errors import ArgumentError, CkplanError, PlanError
from ._plan_file import _describe_bytes

SCHEMA = "ckplan.compiled_plan/1"
_LOCK = threading.Lock()
# The knapsack's sizes: fractions of what the banned values hold.
_KNAPSACK_STEPS = 21
_TORCH_BUDGETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
# A marker allocated between backward and optimizer.step() so one timeline splits the two.
_MARKER_BYTES = 7 * 4099


def _partitioners():
    from torch._functorch import partitioners
    return partitioners


def _signature(graph) -> str:
    text = "\n".join(f"{n.op}:{n.name}:{n.target}" for n in graph.nodes)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _storage(node):
    from torch._inductor.fx_utils import get_node_storage
    return get_node_storage(node)


def _storage_bytes(node) -> int:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        try:
            return int(val.untyped_storage().nbytes())
        except Exception:  # noqa: BLE001 - a tensor without storage: its own size
            return val.numel() * val.element_size()
    return 0


_OPS = []
_MISSING = object()


def _is_view(node) -> bool:
    if not _OPS:
        _OPS.append(_partitioners().get_default_op_list())
    packet = getattr(node.target, "_overloadpacket", None)
    return packet is not None and packet in _OPS[0].view_ops


def _is_pointwise_or_view(node) -> bool:
    target = node.target
    if node.op != "call_function":
        return True
    if not _OPS:
        _OPS.append(_partitioners().get_default_op_list())
    ops = _OPS[0]
    packet = getattr(target, "_overloadpacket", None)
    if packet is not None and (packet in ops.view_ops or target in ops.view_ops):
        return True
    if len(_OPS) == 1:
        importlib.import_module("torch._inductor.inductor_prims")  # registers prims.inductor_random
        _OPS.append({torch.ops.prims.inductor_random.default, torch.ops.prims.inductor_lookup_seed.default,
                     torch.ops.prims.iota.default, torch.ops.aten.full.default})
    if target in _OPS[1]:
        return True  # generated inside the fused kernel that uses it
    tags = getattr(target, "tags", ())
    return torch.Tag.pointwise in tags or target is operator.getitem


class _Graph:
    """One joint graph as the partitioner saw it, kept to evaluate candidates after the compile."""

    def __init__(self, index, graph, node_info, choose):
        P = _partitioners()
        ops = P.get_default_op_list()
        self.index = index
        self.graph = graph
        self.info = node_info
        self.signature = _signature(graph)
        self.inputs = set(node_info.inputs)
        self.input_storages = {_storage(n) for n in node_info.inputs}
        # Ops that draw fresh randomness each run (dropout's seeds, rand_like): never recomputed. Inductor's
        # inductor_random from a saved seed is not one: it gives the same values again.
        self.random = {n for n in graph.nodes if n.op == "call_function" and
                       (ops.is_random(n) or torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ()))}
        from torch._functorch import config
        self.aggressive = P.MinCutOptions(ban_if_used_far_apart=False, ban_if_long_fusible_chains=False,
                                          ban_if_materialized_backward=False, ban_if_not_in_allowlist=False,
                                          ban_if_reduction=config.ban_recompute_reductions)
        self.default = list(choose(graph, node_info, memory_budget=1.0))
        self.torch_choices = {}
        for budget in _TORCH_BUDGETS:
            try:
                self.torch_choices[budget] = list(choose(graph, node_info, memory_budget=budget))
            except Exception:  # noqa: BLE001 - a budget torch cannot partition at: not a candidate
                pass
        with self._random_saved():
            _, banned = P.solve_min_cut(graph, node_info, self.aggressive)
        self.banned = [n for n in banned
                       if getattr(n, "dist_from_bw", 0) < int(1e9) and n not in self.random
                       and isinstance(n.meta.get("val"), torch.Tensor) and _storage(n) not in self.input_storages
                       and n.meta.get("recompute") != torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE]

    def saved_bytes(self, saved) -> int:
        seen, total = set(), 0
        for n in saved:
            key = _storage(n)
            if key is None or key in self.input_storages or key in seen:
                continue
            seen.add(key)
            total += _storage_bytes(n)
        return total

    def recomputed(self, saved) -> List[Any]:
        """The forward nodes the backward runs again when ``saved`` are saved."""
        info, keep = self.info, set(saved)
        out, stack = [], [i for n in info.required_bw_nodes if not info.is_required_fw(n)
                          for i in n.all_input_nodes]
        done = set()
        while stack:
            n = stack.pop()
            if n in done or n in keep or n.op != "call_function" or not info.is_required_fw(n):
                done.add(n)
                continue
            done.add(n)
            out.append(n)
            stack.extend(n.all_input_nodes)
        return out

    @contextlib.contextmanager
    def _random_saved(self):
        """The fresh-random ops marked MUST_SAVE while ckplan's cuts are solved: the min-cut recomputes none."""
        policy = torch.utils.checkpoint.CheckpointPolicy.MUST_SAVE
        before = {n: n.meta.get("recompute", _MISSING) for n in self.random}
        for n in self.random:
            n.meta["recompute"] = policy
        try:
            yield
        finally:
            for n, value in before.items():
                if value is _MISSING:
                    n.meta.pop("recompute", None)
                else:
                    n.meta["recompute"] = value

    def simulate(self, saved, inplace=True) -> int:
        """The peak of the forward and backward when ``saved`` are saved, by the storages' liveness: a
        storage is made by the first value in it (a pointwise value only where it leaves its fused
        kernel: used by an op that is not pointwise, saved or an output; a view makes none) and held to
        the last use of any value in it; the backward recomputes what it needs when it first needs it. A
        pointwise kernel writes into an input of its size that dies there (Inductor's in-place buffers)
        instead of a new one. The compiled step's fixed memory is left out: the difference between two
        plans is what it predicts."""
        info, keep = self.info, set(saved)
        # The forward runs what it needs and what it saves (the min-cut may save a value of the
        # backward's that depends on the forward's only: it is computed in the forward then).
        fw_set = set(info.required_fw_nodes)
        stack = [n for n in keep if n.op == "call_function"]
        while stack:
            n = stack.pop()
            if n in fw_set or n.op != "call_function":
                continue
            fw_set.add(n)
            stack.extend(n.all_input_nodes)
        fw = [n for n in self.graph.nodes if n in fw_set]
        bw = [n for n in self.graph.nodes if n.op == "call_function" and info.is_required_bw(n)
              and n not in fw_set]
        outputs = set()
        for n in self.graph.nodes:
            if n.op == "output":
                outputs.update(x for x in _pytree.tree_leaves(n.args) if isinstance(x, torch.fx.Node))
        cache = {}

        def storage(n):
            """(key, bytes made when n runs) of n's value."""
            if n not in cache:
                val = n.meta.get("val")
                if n.op != "call_function" or not isinstance(val, torch.Tensor):
                    cache[n] = (None, 0)
                elif (_is_pointwise_or_view(n) and not _is_view(n) and n not in keep and n not in outputs
                      and all(_is_pointwise_or_view(u) and not _is_view(u) for u in n.users)):
                    cache[n] = (None, 0)  # fused into its users' kernel
                else:
                    cache[n] = (_storage(n), _storage_bytes(n))
            return cache[n]

        def sweep(steps, held, pinned):
            """steps: [(index, [nodes run then])]; ``held``: storages alive at the start (key: bytes), each
            freed after its last use; ``pinned``: storages never freed. The peak."""
            last = {}
            for i, made in steps:
                for v in made:
                    for x in v.all_input_nodes:
                        key = storage(x)[0]
                        if key is not None:
                            last[key] = max(last.get(key, -1), i)
            owner = {}  # a storage written in place into another's: the other
            sizes = dict(held)
            live = peak = sum(held.values())
            ends: Dict[int, set] = {}
            for key in held:
                if key not in pinned:
                    ends.setdefault(last.get(key, -1), set()).add(key)
            live -= sum(sizes[k] for k in ends.pop(-1, ()))
            for i, made in steps:
                for v in made:
                    key, nbytes = storage(v)
                    if key is None or key in sizes or key in owner or key in self.input_storages:
                        continue
                    end = max(last.get(key, i), i)
                    if inplace and _is_pointwise_or_view(v) and not _is_view(v):
                        dying = [owner.get(k, k) for x in v.all_input_nodes for k in [storage(x)[0]]
                                 if k is not None and k not in pinned and k not in self.input_storages
                                 and i in ends and owner.get(k, k) in ends[i] and sizes.get(owner.get(k, k)) == nbytes]
                        if dying:
                            reused = dying[0]
                            owner[key] = reused
                            ends[i].discard(reused)
                            if key in pinned:
                                pinned = pinned | {reused}
                            else:
                                ends.setdefault(end, set()).add(reused)
                            continue
                    sizes[key] = nbytes
                    live += nbytes
                    if key not in pinned:
                        ends.setdefault(end, set()).add(key)
                peak = max(peak, live)
                for key in ends.pop(i, ()):
                    live -= sizes[key]
            return peak

        kept = {storage(n)[0] for n in keep | outputs if n in fw_set} - {None}
        forward_peak = sweep([(i, [n]) for i, n in enumerate(fw)], {}, kept)
        made: Dict[Any, int] = {}
        order: Dict[int, List[Any]] = {}

        def need(v, i):
            if v in made or v in keep or v not in fw_set or v.op != "call_function":
                return
            for x in v.all_input_nodes:
                need(x, i)
            made[v] = i
            order.setdefault(i, []).append(v)

        steps = []
        for i, b in enumerate(bw):
            for x in b.all_input_nodes:
                need(x, i)
            steps.append((i, order.get(i, []) + [b]))
        # The saved values at the backward's start, each freed after its last use; the gradients kept.
        held = {}
        for n in keep:
            key, nbytes = storage(n) if n in fw_set else (None, 0)
            if key is not None and key not in self.input_storages:
                held[key] = nbytes
        grads = {storage(n)[0] for n in outputs if n not in fw_set} - {None}
        return max(forward_peak, sweep(steps, held, grads))

    def with_recomputed(self, dont_ban) -> List[Any]:
        from torch.utils._ordered_set import OrderedSet
        with self._random_saved():
            saved, _ = _partitioners().solve_min_cut(self.graph, self.info, self.aggressive, OrderedSet(dont_ban))
        return list(saved)


def _materialize(x, generator):
    """A real tensor for a node's fake value (its shape, strides, dtype, on the CPU or its device)."""
    if isinstance(x, torch.fx.Node):
        x = x.meta.get("val")
    if isinstance(x, torch.Tensor):
        shape = [int(s) for s in x.shape]
        stride = [int(s) for s in x.stride()]
        out = torch.empty_strided(shape, stride, dtype=x.dtype, device=x.device)
        if out.is_floating_point() or out.is_complex():
            out.normal_(generator=generator if out.device.type == "cpu" else None)
        else:
            out.zero_()
        return out
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return x.node.hint if hasattr(x.node, "hint") else int(x)
    return x


def _time_node(node, generator, budget_s=0.05) -> float:
    """Milliseconds the node's op takes on tensors of its shapes: median of runs after one warm-up."""
    with torch.no_grad():
        args, kwargs = _pytree.tree_map(lambda x: _materialize(x, generator), (node.args, node.kwargs))
        try:
            node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op that will not run alone: priced at nothing
            return 0.0
        times, start = [], time.perf_counter()
        while len(times) < 3 or (len(times) < 15 and time.perf_counter() - start < budget_s):
            t = time.perf_counter()
            node.target(*args, **kwargs)
            times.append((time.perf_counter() - t) * 1e3)
        return statistics.median(times)


try:
    from torch._inductor.custom_graph_pass import CustomPartitionerFn as _PartitionerBase
except ImportError:  # a torch without Inductor's custom partitioner: compile= is refused
    _PartitionerBase = object


class _Partitioner(_PartitionerBase):
    """Inductor's ``custom_partitioner_fn``: torch's min-cut partition, the saved values ckplan's.

    ``record`` (``saved`` None): each joint graph kept (a ``_Graph``), torch's own saved values used (the
    compiled job with no plan). ``follow``: the saved values the plan names for the graph (by its
    signature); a graph the plan does not know warns and keeps torch's."""

    def __init__(self, saved_by_signature=None, token=None):
        self.saved = saved_by_signature
        # A recording is never served from torch's caches: its key is its own.
        self.token = token if token is not None or saved_by_signature is not None else os.urandom(8).hex()
        self.graphs: List[_Graph] = []
        self.recording = saved_by_signature is None
        self.unplanned: List[str] = []
        self.followed: List[str] = []

    def __deepcopy__(self, memo):
        return self  # inductor copies its config; the record is this object's

    def __getstate__(self):
        return {"saved": self.saved, "token": self.token}  # the cache key: the plan, not the record

    def __setstate__(self, state):
        self.__init__(state["saved"], state["token"])

    def uuid(self):
        return hashlib.sha256(json.dumps([self.saved, self.token], sort_keys=True).encode()).hexdigest()

    def __call__(self, gm, joint_inputs, **kwargs):
        P = _partitioners()
        original = P.choose_saved_values_set

        def choose(joint_graph, node_info, memory_budget=1.0):
            if self.saved is None and not self.recording:
                return original(joint_graph, node_info, memory_budget=memory_budget)
            if self.saved is None:
                graph = _Graph(len(self.graphs), joint_graph, node_info, original)
                self.graphs.append(graph)
                return graph.default
            signature = _signature(joint_graph)
            names = self.saved.get(signature)
            if names is None:
                self.unplanned.append(signature)
                warnings.warn("ckplan_torch: torch.compile made a graph the plan does not know (another input "
                              "shape or dtype, autocast on where the plan had it off or the reverse, a graph "
                              "break, another torch): torch's own partition is used for it; plan again with the "
                              "inputs and autocast the job trains with", stacklevel=2)
                return original(joint_graph, node_info, memory_budget=memory_budget)
            by_name = {n.name: n for n in joint_graph.nodes}
            self.followed.append(signature)
            return [by_name[name] for name in names]

        with _LOCK:
            P.choose_saved_values_set = choose
            try:
                return P.min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
            finally:
                P.choose_saved_values_set = original


def _cache_hits() -> int:
    """AOTAutograd's and Inductor's cache hits so far: a compile served from them partitions nothing."""
    from torch._dynamo.utils import counters
    return sum(counters["aot_autograd"].get(k, 0) for k in ("autograd_cache_hit",)) + \
        counters["inductor"].get("fxgraph_cache_hit", 0)


@contextlib.contextmanager
def _followed(partitioner):
    """The compile inside used ``partitioner`` (or a cache entry keyed by it): refused otherwise, as when
    dynamo serves an earlier compile of the model."""
    hits = _cache_hits()
    yield
    if not partitioner.followed and _cache_hits() == hits:
        raise CkplanError("torch.compile did not compile the planned step with ckplan's partitioner (an earlier "
                          "compile of the model served from dynamo's cache): call torch._dynamo.reset() and plan "
                          "again")


def _default_loss(out):
    """The loss of a step with no ``loss_fn``: a model's own (``.loss``, a dict of losses summed), else
    its outputs summed (ckplan's loss, which keeps nothing)."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    if isinstance(out, dict) and out and all("loss" in str(k) for k in out):
        return sum(out.values())
    leaves = [t for t in _pytree.tree_leaves(out if not hasattr(out, "to_tuple") else out.to_tuple())
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise CkplanError("the compiled model returned no floating-point tensor to back-propagate: give loss_fn")
    return sum(t.float().sum() for t in leaves)


class _Step:
    """The job's training step on a (compiled) model: zero_grad, forward, loss, backward, step, the
    output held to the step's end as ``out = model(...)`` holds it."""

    def __init__(self, run, args, kwargs, loss_fn, targets, autocast, optimizer):
        self.run, self.args, self.kwargs = run, args, kwargs
        self.loss_fn, self.targets, self.autocast, self.optimizer = loss_fn, targets, autocast, optimizer

    def forward(self):
        device = next((t.device.type for t in _pytree.tree_leaves((self.args, self.kwargs))
                       if isinstance(t, torch.Tensor)), "cpu")
        context = (torch.autocast(device, dtype=self.autocast) if self.autocast is not None
                   else contextlib.nullcontext())
        with context:
            out = self.run(*self.args, **self.kwargs)
            loss = self.loss_fn(out, *self.targets) if self.loss_fn is not None else _default_loss(out)
        return out, loss

    def __call__(self, marker=False):
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        out, loss = self.forward()
        loss.backward()
        mark = torch.empty(_MARKER_BYTES, dtype=torch.uint8) if marker else None
        if self.optimizer is not None:
            self.optimizer.step()
        del mark
        return out


def _step_peaks(step, held) -> Tuple[int, int, int]:
    """(peak until backward's end, peak of optimizer.step(), the level at backward's end) of one step, in bytes, by the profiler's
    memory timeline (every allocation and free; storages alive before counted when touched, and the
    model's parameters and buffers always)."""
    import gc
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import Action
    held_storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True) as prof:
        step(marker=True)
    timeline = prof._memory_profile().timeline
    seen = {key.storage.ptr for _, _, (key, _), _ in timeline if hasattr(key, "storage")}
    live = sum(size for ptr, size in held_storages.items() if ptr not in seen)
    before = after = live
    marked, at_mark = False, 0
    for _, action, _, size in timeline:
        if action in (Action.PREEXISTING, Action.CREATE):
            live += size
            if action == Action.CREATE and size == _MARKER_BYTES and not marked:
                marked = True
                live -= size
                at_mark = live
                continue
        elif action == Action.DESTROY:
            if size == _MARKER_BYTES and marked:
                continue
            live -= size
        if marked:
            after = max(after, live)
        else:
            before = max(before, live)
    return before, after, at_mark


def _step_ms(step, min_steps=3, seconds=1.0) -> float:
    times, start = [], time.perf_counter()
    while len(times) < min_steps or (len(times) < 25 and time.perf_counter() - start < seconds):
        t = time.perf_counter()
        step()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


@contextlib.contextmanager
def _weights_kept(model):
    """The model's weights and buffers put back after (in place) and its gradients dropped."""
    saved = {k: v.detach().clone() for k, v in model.state_dict(keep_vars=True).items()}
    try:
        yield
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, value in model.state_dict(keep_vars=True).items():
                value.detach().copy_(saved[name])


def _fresh_optimizer(model, optimizer):
    """An optimizer like the job's on the model's parameters, for the measured steps (the job's own
    untouched): a torch.optim instance's class and param groups, or a name."""
    if optimizer is None or optimizer == "none":
        return None
    if isinstance(optimizer, torch.optim.Optimizer):
        groups = [{**{k: v for k, v in g.items() if k != "params"}, "params": list(g["params"])}
                  for g in optimizer.param_groups]
        return type(optimizer)(groups)
    params = [p for p in model.parameters() if p.requires_grad]
    kinds = {"adamw": lambda: torch.optim.AdamW(params), "adam": lambda: torch.optim.Adam(params),
             "sgd": lambda: torch.optim.SGD(params, lr=1e-3),
             "momentum": lambda: torch.optim.SGD(params, lr=1e-3, momentum=0.9)}
    if optimizer not in kinds:
        raise ArgumentError(f"optimizer={optimizer!r}: 'adamw', 'adam', 'sgd', 'momentum', 'none' or a "
                            "torch.optim optimizer")
    return kinds[optimizer]()


def _compile_options(compile):
    """torch.compile's keyword arguments from ``compile=`` (True, or a dict of them): inductor only,
    ``mode`` folded into ``options`` (torch takes one of the two)."""
    if compile is True:
        kwargs = {}
    elif isinstance(compile, dict):
        kwargs = dict(compile)
    else:
        raise ArgumentError(f"compile={compile!r}: True, or a dict of torch.compile's arguments "
                            "(mode, options, dynamic, fullgraph)")
    unknown = set(kwargs) - {"mode", "options", "dynamic", "fullgraph", "backend"}
    if unknown:
        raise ArgumentError(f"compile: {sorted(unknown)} is not an argument ckplan passes to torch.compile; "
                            "give mode, options, dynamic or fullgraph")
    if kwargs.get("backend", "inductor") != "inductor":
        raise ArgumentError(f"compile: backend={kwargs['backend']!r}: ckplan plans Inductor's partition "
                            "only; leave backend out")
    kwargs.pop("backend", None)
    options = dict(kwargs.pop("options", None) or {})
    mode = kwargs.pop("mode", None)
    if mode is not None:
        import torch._inductor
        try:
            options = {**torch._inductor.list_mode_options(mode), **options}
        except Exception as error:  # noqa: BLE001 - torch's words for an unknown mode
            raise ArgumentError(f"compile: mode={mode!r}: {error}") from None
    if "custom_partitioner_fn" in options:
        raise ArgumentError("compile: options has custom_partitioner_fn: ckplan's plan is that partitioner; "
                            "leave it out")
    return kwargs, options


def _compiled(model, kwargs, options, partitioner, reset=True):
    if reset:
        torch._dynamo.reset()
    return torch.compile(model, options={**options, "custom_partitioner_fn": partitioner}, **kwargs)


class _Candidate:
    def __init__(self, source, saved_by_graph, graphs, times):
        self.source = source
        self.saved = saved_by_graph  # per graph: list of nodes
        self.saved_bytes = sum(g.saved_bytes(s) for g, s in zip(graphs, saved_by_graph))
        self.recompute_ms = 0.0
        self.recomputed_random = False
        self.recomputed_ops = 0
        for g, s in zip(graphs, saved_by_graph):
            for n in g.recomputed(s):
                if n in g.random:
                    self.recomputed_random = True
                if not _is_pointwise_or_view(n):
                    self.recompute_ms += times.time(n)
                    self.recomputed_ops += 1
        self.simulated = sum(g.simulate(s) for g, s in zip(graphs, saved_by_graph))
        self.peak = None
        self.step_ms = None
        self.measured_peak = None

    def key(self):
        return tuple(tuple(sorted(n.name for n in s)) for s in self.saved)


def _work_key(node):
    """Ops that do the same work: one target on arguments of the same shapes, strides and dtypes."""
    def spec(x):
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else x
        if isinstance(val, torch.Tensor):
            return ("t", tuple(val.shape), tuple(val.stride()), str(val.dtype))
        return repr(val)
    return (str(node.target), tuple(spec(a) for a in _pytree.tree_leaves((node.args, node.kwargs))))


class _PooledTimes:
    """Each node's time, timed once per group of nodes doing the same work (``_work_key``): identical
    layers cost exactly the same, so the knapsack's choice among them is a tie broken by position, the
    same on every run."""

    def __init__(self, generator):
        self.generator, self.by_work = generator, {}

    def time(self, node):
        key = _work_key(node)
        if key not in self.by_work:
            self.by_work[key] = _time_node(node, self.generator)
        return self.by_work[key]


def _candidates(graphs, generator):
    """The plans to choose from: knapsacks on the measured times at 21 sizes, and torch's own choices."""
    times = _PooledTimes(generator)
    banned = [(g, n) for g in graphs for n in g.banned]
    found: Dict[tuple, _Candidate] = {}

    def add(source, saved_by_graph):
        c = _Candidate(source, saved_by_graph, graphs, times)
        if not c.recomputed_random:
            found.setdefault(c.key(), c)  # the first source of a saved set names it

    add("torch.compile", [g.default for g in graphs])
    for budget in _TORCH_BUDGETS:
        if all(budget in g.torch_choices for g in graphs):
            add(f"torch.compile budget {budget:.1f}", [g.torch_choices[budget] for g in graphs])
    if banned:
        from torch._functorch._activation_checkpointing.knapsack import dp_knapsack
        sizes = [float(max(n.meta["val"].numel() * n.meta["val"].element_size(), 1)) for _, n in banned]
        total = sum(sizes)
        memory = [s / total for s in sizes]
        runtimes = [max(times.time(n), 1e-6) for _, n in banned]
        for step in range(_KNAPSACK_STEPS):
            fraction = step / (_KNAPSACK_STEPS - 1)
            _, saved_idx, recompute_idx = dp_knapsack(memory, runtimes, fraction)
            dont_ban = [[] for _ in graphs]
            for i in recompute_idx:
                g, n = banned[i]
                dont_ban[g.index].append(n)
            add(f"ckplan knapsack {fraction:.2f}", [g.with_recomputed(d) for g, d in zip(graphs, dont_ban)])
    return list(found.values())


def _choose(candidates, budget):
    fits = [c for c in candidates if c.peak <= budget]
    if not fits:
        return None
    return min(fits, key=lambda c: (round(c.step_ms, 6), c.peak, c.source))


class CompiledPlan:
    """A plan for a compiled training step (``plan(..., compile=...)``): which values the compiled
    forward saves for the backward, per joint graph, and what the step holds and takes under it.

    ``apply(model)`` returns the model compiled to follow it. ``peak_bytes`` and ``time_ms`` are the
    plan's compiled step as plan() measured it (``predicted``: before it was measured, from the
    profile); ``replan(budget)`` chooses again among the same candidates without compiling."""

    def __init__(self, doc: Dict[str, Any]):
        if doc.get("schema") != SCHEMA:
            raise PlanError(f"not a compiled plan ({doc.get('schema')!r}); this reads {SCHEMA}")
        self.doc = doc

    @property
    def target(self) -> str:
        return "compiled"

    @property
    def budget_bytes(self) -> int:
        return self.doc["budget_bytes"]

    @property
    def peak_bytes(self) -> int:
        return self.doc["measured"]["peak_bytes"]

    @property
    def time_ms(self) -> float:
        return self.doc["measured"]["step_ms"]

    @property
    def predicted(self) -> Dict[str, Any]:
        return self.doc["predicted"]

    @property
    def overhead_pct(self) -> float:
        base = self.doc["baseline"]["step_ms"]
        return (self.time_ms - base) / base * 100

    @property
    def min_budget_bytes(self) -> int:
        return self.doc["min_budget_bytes"]

    @property
    def saved_bytes(self) -> int:
        return self.doc["saved_bytes"]

    @property
    def recomputed_ops(self) -> int:
        return self.doc["recomputed_ops"]

    @property
    def source(self) -> str:
        return self.doc["source"]

    @property
    def candidates(self) -> List[Dict[str, Any]]:
        return self.doc["candidates"]

    def apply(self, model: torch.nn.Module, **compile_kwargs) -> torch.nn.Module:
        """``torch.compile(model, ...)`` following the plan: the saved values of each joint graph are the
        plan's. ``compile_kwargs``: torch.compile's (default: those plan() was given). Resets dynamo's
        caches, so the model is compiled again with the plan's partitioner."""
        kwargs, options = _compile_options(compile_kwargs or self.doc.get("compile") or True)
        return _compiled(model, kwargs, options, _Partitioner(self.doc["graphs"]))

    def replan(self, budget: Union[int, str]) -> "CompiledPlan":
        """The fastest of this plan's candidates under another budget, from their predictions (not
        measured: ``plan()`` again to measure it). Raises CkplanError (exit_code 3) below the smallest."""
        limit = budget_bytes(budget)
        fits = [c for c in self.doc["candidates"] if c["peak_bytes"] <= limit]
        if not fits:
            raise _below(limit, min(c["peak_bytes"] for c in self.doc["candidates"]))
        best = min(fits, key=lambda c: (round(c["step_ms"], 6), c["peak_bytes"], c["source"]))
        doc = dict(self.doc, budget_bytes=limit, graphs=best["graphs"], saved_bytes=best["saved_bytes"],
                   recomputed_ops=best["recomputed_ops"], source=best["source"],
                   predicted={"peak_bytes": best["peak_bytes"], "step_ms": best["step_ms"]},
                   measured={"peak_bytes": best["peak_bytes"], "step_ms": best["step_ms"], "measured": False})
        return CompiledPlan(doc)

    def save(self, path: Union[str, os.PathLike]) -> None:
        partial = f"{os.fspath(path)}.partial"
        with open(partial, "w") as f:
            json.dump(self.doc, f, indent=1)
        os.replace(partial, path)

    @classmethod
    def load(cls, path: Union[str, os.PathLike]) -> "CompiledPlan":
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as error:
            raise PlanError(f"{os.fspath(path)}: {error}") from None
        return cls(doc)

    def __repr__(self):
        base = self.doc["baseline"]
        m = self.doc["measured"]
        return (f"CompiledPlan: {self.source}, {self.recomputed_ops} op(s) recomputed beyond pointwise, "
                f"saves {_describe_bytes(self.saved_bytes)}\n"
                f"  compiled step: peak {_describe_bytes(m['peak_bytes'])} of {_describe_bytes(self.budget_bytes)}, "
                f"{m['step_ms']:.1f} ms ({self.overhead_pct:+.1f}% against torch.compile with no budget: "
                f"{_describe_bytes(base['peak_bytes'])}, {base['step_ms']:.1f} ms)"
                + ("" if m.get("measured", True) else " (predicted, not measured)") + "\n"
                f"  smallest budget: {_describe_bytes(self.min_budget_bytes)} (CompiledPlan.replan(budget))")


def _below(limit, smallest):
    return CkplanError(f"budget {_describe_bytes(limit)} ({limit} B) is below the smallest compiled plan, "
                       f"{_describe_bytes(smallest)} ({smallest} B): give at least that, or a smaller batch", exit_code=3)


def _json_or_true(compile):
    try:
        json.dumps(compile)
        return compile
    except (TypeError, ValueError):
        return True


class CompiledProfile:
    """The compiled step of a job, measured once: its joint graphs, the candidates' exact saved bytes and
    their predicted peaks and times. ``plan(budget)`` chooses among them and measures the choice."""

    def __init__(self, model, example_inputs, kwargs, optimizer, compile, autocast, loss_fn, targets):
        self.model, self.args, self.kwargs = model, tuple(example_inputs), dict(kwargs or {})
        self.optimizer, self.compile, self.autocast = optimizer, compile, autocast
        self.loss_fn, self.targets = loss_fn, tuple(targets)
        self.compile_kwargs, self.options = _compile_options(compile)
        self.held = list(model.parameters()) + list(model.buffers())
        self.seconds: Dict[str, float] = {}
        generator = torch.Generator().manual_seed(0)
        with _weights_kept(model):
            start = time.perf_counter()
            recorder = _Partitioner(None)
            step = self._step(recorder)
            try:
                step()  # compiles, and makes the optimizer's state
            except CkplanError:
                raise
            except Exception as error:  # noqa: BLE001 - torch's pages of context, told in one line
                first = (str(error).strip().splitlines() or [""])[0][:300]
                raise CkplanError(f"torch.compile of the training step failed ({type(error).__name__}: {first}): "
                                  "the job compiled so fails the same way; plan it eager (compile=None)") from None
            self.seconds["compile"] = time.perf_counter() - start
            if not recorder.graphs:
                raise CkplanError("torch.compile made no graph with a backward for this model (nothing it "
                                  "compiled needs gradients): nothing to plan")
            start = time.perf_counter()
            self.fb0, self.opt0, self.mark0 = min(_step_peaks(step, self.held) for _ in range(2))
            self.base_ms = _step_ms(step)
            self.seconds["measure"] = time.perf_counter() - start
        recorder.recording = False
        self.graphs = recorder.graphs
        start = time.perf_counter()
        self.candidates = _candidates(self.graphs, generator)
        self.seconds["candidates"] = time.perf_counter() - start
        self.default = next(c for c in self.candidates if c.source == "torch.compile")
        self.default.measured_peak = max(self.fb0, self.opt0)
        self.anchors = [(self.default, self.fb0)]  # (plan, its measured forward-backward peak)
        for c in self.candidates:
            self.predict(c)

    def _step(self, partitioner, reset=True):
        run = _compiled(self.model, self.compile_kwargs, self.options, partitioner, reset=reset)
        opt = _fresh_optimizer(self.model, self.optimizer)
        return _Step(run, self.args, self.kwargs, self.loss_fn, self.targets, self.autocast, opt)

    def predict(self, c):
        """A candidate's peak: the measured forward and backward peak of the measured plan whose simulated
        peak is nearest, moved by the difference of the two simulated peaks (``_Graph.simulate``); the
        optimizer's measured peak. Its time: the measured step's with the recomputed ops'."""
        anchor, fb = min(self.anchors, key=lambda a: (abs(a[0].simulated - c.simulated), a[0].source))
        c.peak = c.measured_peak if c.measured_peak is not None else max(fb - anchor.simulated + c.simulated,
                                                                          self.opt0)
        c.step_ms = self.base_ms + c.recompute_ms - self.default.recompute_ms

    def saved_names(self, c):
        return {g.signature: [n.name for n in s] for g, s in zip(self.graphs, c.saved)}

    def measure(self, c):
        """(peak, forward-backward peak, optimizer peak, step ms) of the step compiled to follow ``c``."""
        if c is self.default:
            return max(self.fb0, self.opt0), self.fb0, self.opt0, self.base_ms
        with _weights_kept(self.model):
            follower = _Partitioner(self.saved_names(c))
            # dynamo would serve the step with no plan from its cache (it takes the two backends for one).
            step = self._step(follower)
            with _followed(follower):
                step()
            fb, after, _ = min(_step_peaks(step, self.held) for _ in range(2))
            ms = _step_ms(step)
        return max(fb, after), fb, after, ms

    def smallest(self):
        return min(c.peak for c in self.candidates)

    def plan(self, budget, workdir=None, tries=3) -> "CompiledPlan":
        limit = budget_bytes(budget)
        start = time.perf_counter()
        # The chosen plan compiled and measured, and kept as an anchor of the predictions; where it was over
        # the budget, or a faster plan is now predicted to fit, that one is tried (at most ``tries`` plans
        # once one fits, ``2 * tries`` while none has).
        tried, fits, misses = set(), [], []
        while len(tried) < (tries if fits else 2 * tries):  # more tries while none has fit
            untried = [c for c in self.candidates if c.key() not in tried]
            pick = _choose(untried, limit)
            if pick is None and not fits and untried:
                # None predicted to fit: the prediction is a simulation; the least predicted is measured
                # before the budget is refused.
                unmeasured = [c for c in untried if c.measured_peak is None]
                pick = min(unmeasured, key=lambda c: (c.peak, c.step_ms, c.source)) if unmeasured else None
                if pick is None or pick.peak > limit * 1.25:
                    break
            if pick is None or (fits and pick.step_ms >= min(f[0].step_ms for f in fits)):
                break
            predicted = pick.peak
            tried.add(pick.key())
            peak, fb, after, ms = self.measure(pick)
            pick.measured_peak = peak
            if pick is not self.default:
                self.anchors.append((pick, fb))
            if peak <= limit:
                fits.append((pick, peak, ms, predicted))
            else:
                misses.append({"source": pick.source, "predicted_peak_bytes": predicted,
                               "measured_peak_bytes": peak})
            for c in self.candidates:
                self.predict(c)
        self.seconds["verify"] = time.perf_counter() - start
        if not fits and not misses:
            raise _below(limit, self.smallest())
        if not fits:
            least = min(misses, key=lambda m: m["measured_peak_bytes"])
            raise CkplanError(f"no compiled plan measured within the budget {_describe_bytes(limit)} ({limit} B): "
                              f"{len(misses)} tried, the least measured {_describe_bytes(least['measured_peak_bytes'])} "
                              f"({least['measured_peak_bytes']} B; predicted {_describe_bytes(least['predicted_peak_bytes'])}"
                              f"): give at least {least['measured_peak_bytes']} B", exit_code=3)
        chosen, peak, ms, predicted = min(fits, key=lambda f: (round(f[0].step_ms, 6), f[1]))
        measured = (peak, ms)
        table = sorted(({"source": c.source, "saved_bytes": c.saved_bytes, "peak_bytes": c.peak,
                         "step_ms": round(c.step_ms, 4), "recomputed_ops": c.recomputed_ops,
                         "graphs": self.saved_names(c)} for c in self.candidates),
                       key=lambda r: (r["peak_bytes"], r["step_ms"]))
        doc = {"schema": SCHEMA, "budget_bytes": limit, "compile": _json_or_true(self.compile),
               "torch": torch.__version__, "graphs": self.saved_names(chosen), "source": chosen.source,
               "saved_bytes": chosen.saved_bytes, "recomputed_ops": chosen.recomputed_ops,
               "predicted": {"peak_bytes": predicted, "step_ms": round(chosen.step_ms, 4)},
               "measured": {"peak_bytes": measured[0], "step_ms": round(measured[1], 4), "measured": True},
               "misses": misses,
               "baseline": {"peak_bytes": max(self.fb0, self.opt0), "step_ms": round(self.base_ms, 4),
                            "forward_backward_peak_bytes": self.fb0, "optimizer_peak_bytes": self.opt0,
                            "backward_end_bytes": self.mark0, "saved_bytes": self.default.saved_bytes},
               "min_budget_bytes": self.smallest(), "candidates": table,
               "seconds": {k: round(v, 3) for k, v in self.seconds.items()}}
        plan = CompiledPlan(doc)
        if workdir is not None:
            plan.save(os.path.join(workdir, "plan.json"))
        return plan


def profile_compiled(model: torch.nn.Module, example_inputs: Union[torch.Tensor, Sequence[Any]],
                     kwargs: Optional[Dict[str, Any]] = None, optimizer: Union[str, torch.optim.Optimizer] = "adamw",
                     compile: Union[bool, Dict[str, Any]] = True, autocast: Optional[torch.dtype] = None,
                     loss_fn: Optional[Callable[..., torch.Tensor]] = None,
                     targets: Union[torch.Tensor, Sequence[torch.Tensor]] = ()) -> CompiledProfile:
    """The compiled training step profiled once, to plan it at several budgets: ``CompiledProfile.plan(budget)``
    (each compiles and measures its choice). The arguments as ``plan``'s with ``compile=``; the model's
    weights are put back after."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if isinstance(targets, torch.Tensor):
        targets = (targets,)
    return CompiledProfile(model, tuple(example_inputs), kwargs, optimizer, compile, autocast, loss_fn, targets)


def plan_compiled(model, example_inputs, budget, kwargs, optimizer, compile, autocast, loss_fn, targets,
                  workdir=None):
    """``plan(..., compile=...)``: the fastest saved values of the compiled step under ``budget``."""
    budget_bytes(budget)
    profile = CompiledProfile(model, example_inputs, kwargs, optimizer, compile, autocast, loss_fn, targets)
    return profile.plan(budget, workdir=workdir)
