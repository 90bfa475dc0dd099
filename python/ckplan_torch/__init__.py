"""Apply a ckplan plan to a PyTorch model: wrap the modules the plan names with
torch.utils.checkpoint, and undo it.

    import ckplan_torch
    ckplan_torch.apply_plan(model, "plan.json")   # before training
    ...
    ckplan_torch.remove_plan(model)

and exports a model for `ckplan profile model.pt2` (torch.export, training IR):

    ckplan_torch.export(model, (x,), "model.pt2")

A model built under ``with torch.device("meta")`` (no weights anywhere)
exports shapes-only: the graph and the parameters' shapes and dtypes; the
archive is marked (``extra/ckplan.json``: ``{"shapes_only": true}``), and
``ckplan profile --device meta`` profiles it; ``ckplan run`` refuses it.

The plan (``ckplan.plan/1``, from ``ckplan solve`` on a profile of the model)
lists ``checkpoint_modules``: module paths as in ``model.named_modules()``.
Each is checkpointed on its own: its forward keeps only its inputs and is run
again during backward. Non-reentrant checkpointing where the installed torch
has it; the RNG state is kept, so dropout gives the same masks. No dependency
beyond torch.
"""
import collections
import collections.abc
import contextlib
import copy
import functools
import inspect
import json
import os
import sys
import warnings
import weakref

import torch
import torch.utils.checkpoint

__all__ = ["apply_plan", "remove_plan", "load_plan", "checkpointed_modules", "check_model", "check_optimizer",
           "check_trainable", "check_trainable_optimizer", "plan_autocast", "check_autocast", "check_loss",
           "export", "ExportError",
           "rank_plan", "fsdp_units", "apply_rank_plan", "is_meta_model", "plan_batch"]

_ORIGINAL_FORWARD = "_ckplan_original_forward"
# Configs whose use_cache apply_plan turned off, for remove_plan: id -> weakref
# (a transformers config defines __eq__, so it cannot be a dict key itself).
_CACHES_TURNED_OFF = {}


def load_plan(plan):
    """A plan as a dict, from a path, a file object or a dict."""
    try:
        if isinstance(plan, dict):
            doc = plan
        elif hasattr(plan, "read"):
            doc = json.load(plan)
        else:
            with open(plan) as f:
                doc = json.load(f)
    except RecursionError:
        raise ValueError("not a ckplan plan: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        where = getattr(plan, "name", plan) if not isinstance(plan, dict) else "the plan"
        raise ValueError(f"{where}: malformed JSON ({e}): make the plan again with `ckplan solve`") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a ckplan plan (a JSON {type(doc).__name__}, expected an object)")
    if doc.get("schema") != "ckplan.plan/1":
        raise ValueError(f"not a ckplan plan (schema {doc.get('schema')!r}, expected 'ckplan.plan/1')")
    if "checkpoint_modules" not in doc:
        raise ValueError("the plan has no 'checkpoint_modules': make it with `ckplan solve` on a profile")
    modules = doc["checkpoint_modules"]
    if not isinstance(modules, list) or not all(isinstance(p, str) for p in modules):
        raise ValueError("the plan's 'checkpoint_modules' is not a list of module paths (strings)")
    return doc


def _supports_non_reentrant():
    return "use_reentrant" in inspect.signature(torch.utils.checkpoint.checkpoint).parameters


def _snapshot(value):
    """What checkpoint holds of a call's arguments for the recomputation: the
    lists and mappings in them copied as they are at the call (the tensors
    shared); the forward itself gets the caller's own.

    Checkpointing calls the forward again in backward with the arguments it
    held. A caller may fill a container after the call: torchvision's
    DenseNet appends to the running list of features it passes each dense
    layer (the recomputation would read more features than the forward
    did), and Gemma 4's layers store their keys and values in the dict they
    all get (transformers' KVSharingDict), which the held original would keep
    alive to the layer's backward where eager frees them with the forward.
    """
    if isinstance(value, list):
        return [_snapshot(v) for v in value]
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_snapshot(v) for v in value)
    if isinstance(value, collections.abc.MutableMapping):
        held = copy.copy(value)  # a UserDict: a new mapping of the same items
        return held if held is not value else value
    return value


# The ops a selective-checkpointing policy sees (below autograd, as the
# dispatcher runs them), by family, as the plan names them
# (planner/cost/sac_candidates.h): aten::linear arrives as mm or addmm,
# aten::layer_norm as native_layer_norm, attention as its fused kernel.
_SAC_FAMILIES = {
    "mm": "mm", "addmm": "mm", "bmm": "mm", "baddbmm": "mm",
    "convolution": "convolution",
    "native_layer_norm": "layer_norm",
    "native_group_norm": "group_norm",
    "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
    "_scaled_dot_product_flash_attention": "sdpa",
    "_scaled_dot_product_efficient_attention": "sdpa",
    "_scaled_dot_product_cudnn_attention": "sdpa",
    "_scaled_dot_product_fused_attention_overrideable": "sdpa",
}


class _SacPolicy:
    """A wrapped module's selective-checkpointing policy from the plan's
    ``pytorch.sac`` entry: the ``occurrence``-th op of a family in the
    module's forward is saved (CheckpointPolicy.MUST_SAVE) where the plan says
    so, every other op recomputed. Counts per call; after each forward the
    counts are checked against the plan's (one warning per module when the
    model runs other ops than were profiled: the policy then saves other
    outputs than the plan priced)."""

    def __init__(self, spec):
        self.path = spec["module"]
        self.expected = {k: int(v) for k, v in spec.get("family_counts", {}).items() if int(v) > 0}
        self.save = {(s["family"], int(s["occurrence"])): s for s in spec.get("save", [])}
        self.warned = False

    def contexts(self, state):
        from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

        def policy(ctx, func, *args, **kwargs):
            family = _SAC_FAMILIES.get(getattr(getattr(func, "_overloadpacket", None), "__name__", ""))
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


@functools.lru_cache(maxsize=None)
def _checkpoint_options_cached():
    names = inspect.signature(torch.utils.checkpoint.checkpoint).parameters
    return (("respect_saved_tensors_hooks", True),) if "respect_saved_tensors_hooks" in names else ()


def _checkpoint_options():
    """What this torch's non-reentrant checkpoint takes beyond the call."""
    # Tensors a selective policy saves go through saved_tensors_hooks like
    # any other (PyTorch's announced default; saving to the CPU then covers them).
    # The signature is read once, not on every wrapped forward.
    return dict(_checkpoint_options_cached())


def _running_stat_modules(module):
    """The norm layers in ``module`` that update running statistics in training (batch norm, instance
    norm with track_running_stats)."""
    return [m for m in module.modules() if isinstance(m, torch.nn.modules.batchnorm._NormBase)]


def _no_dispatch_modes():
    """A context without the Python dispatch modes in effect (none where this torch lacks the helper)."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:
        return contextlib.nullcontext()
    return _disable_current_modes()


def _once(original, norms, call_args, call_kwargs):
    """``original`` as checkpoint calls it: its first call is the forward, run with the caller's own
    arguments ``call_args`` and ``call_kwargs`` (checkpoint holds their _snapshot); a later one is
    the recomputation in backward, which must leave training as it was: the running statistics and
    ``num_batches_tracked`` its norm layers update in train mode are put back as the forward left
    them (``torch.utils.checkpoint`` already restores the RNG state), also where the recomputation
    stops early."""
    calls = [0]
    call = [call_args, call_kwargs]  # dropped once used: checkpoint holds `run` to the backward

    def run(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 1:
            given, named = call
            call.clear()
            return original(*given, **named)
        tracked = [b for m in norms if m.training and m.track_running_stats
                   for b in (m.running_mean, m.running_var, m.num_batches_tracked) if b is not None]
        # What the recomputation stores in a container it gets (Gemma 4's
        # keys and values) goes to a copy of its own, dropped after it.
        args, kwargs = _snapshot(args), _snapshot(kwargs)
        if not tracked:
            return original(*args, **kwargs)
        # Outside the dispatch modes around the recomputation (a selective
        # policy's counts the ops it sees against the forward's).
        with _no_dispatch_modes():
            kept = [b.detach().clone() for b in tracked]
        try:
            return original(*args, **kwargs)
        finally:
            with torch.no_grad(), _no_dispatch_modes():
                for b, k in zip(tracked, kept):
                    b.copy_(k)

    return run


def _wrap(module, sac=None):
    original = module.forward
    norms = _running_stat_modules(module)
    non_reentrant = _supports_non_reentrant()
    policy = _SacPolicy(sac) if sac and sac.get("save") else None
    if policy is not None and not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"):
        raise ValueError("a selective-checkpointing plan (--target sac) needs torch >= 2.4 "
                         "(torch.utils.checkpoint.create_selective_checkpoint_contexts)")

    @functools.wraps(original)
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        run = _once(original, norms, args, kwargs)
        args = _snapshot(args)
        kwargs = _snapshot(kwargs)
        if policy is not None:
            state = {"forward": collections.Counter(), "recompute": collections.Counter(), "mismatch": None}
            out = torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, preserve_rng_state=True,
                                                    context_fn=functools.partial(policy.contexts, state),
                                                    **_checkpoint_options(), **kwargs)
            policy.check(state)
            return out
        if non_reentrant:
            return torch.utils.checkpoint.checkpoint(run, *args, use_reentrant=False, preserve_rng_state=True,
                                                     **kwargs)
        if kwargs:
            raise TypeError("keyword arguments need non-reentrant checkpointing (torch >= 1.11)")
        return torch.utils.checkpoint.checkpoint(run, *args, preserve_rng_state=True)

    setattr(module, _ORIGINAL_FORWARD, original)
    module.forward = forward


def _eager(model):
    """The module a ``torch.compile``d model runs (its ``_orig_mod``): its
    module paths are the plan's, without the ``_orig_mod.`` prefix."""
    return getattr(model, "_orig_mod", model) if type(model).__name__ == "OptimizedModule" else model


def _describe_bytes(n, style="decimal"):
    """Bytes as ckplan prints them: decimal units (GB) or binary ones (GiB, a plan's unit_style "binary")."""
    units = ((("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)) if style == "binary" else
             (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)))
    for unit, size in units:
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def check_model(model, plan):
    """Raises ValueError unless ``model`` has the parameters the plan's profile
    listed (how many tensors, and their bytes, each tensor once): a plan made
    for another model, or for this one at another size or dtype, predicts
    nothing for it, even where its module paths happen to exist."""
    doc = load_plan(plan)
    source = doc.get("source", {})
    if not isinstance(source, dict):
        raise ValueError("the plan's 'source' is not an object: make the plan again with `ckplan solve`")
    count, nbytes = source.get("param_count"), source.get("param_bytes")
    if count is None or nbytes is None:
        return  # an older plan, or one made from a chain
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (count, nbytes)):
        raise ValueError("the plan's 'source.param_count' and 'source.param_bytes' are not byte counts: "
                         "make the plan again with `ckplan solve`")
    if "pipeline_stage" in doc or "distributed" in doc:
        return  # a rank holds its shards or its stage's modules, not the whole model's parameters
    params = list(_eager(model).parameters())  # each tensor once (tied weights too)
    have_count, have_bytes = len(params), sum(p.numel() * p.element_size() for p in params)
    if (have_count, have_bytes) != (count, nbytes):
        raise ValueError(f"the plan was made for a model with {count} parameter tensors of "
                         f"{_describe_bytes(nbytes)} ({source.get('model_path', 'its profile')}); this model has "
                         f"{have_count} of {_describe_bytes(have_bytes)}: profile and solve for this model, or pass "
                         "strict=False to apply it anyway")
    check_trainable(model, doc)


def _trainable(params):
    """(count, bytes) of the parameters that require grad, each tensor once."""
    seen, count, nbytes = set(), 0, 0
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            count += 1
            nbytes += p.numel() * p.element_size()
    return count, nbytes


def check_trainable(model, plan):
    """Warns when ``model`` trains other parameters than the plan was profiled with (its
    ``source.trainable_count`` and ``trainable_bytes``; absent: every parameter): a frozen parameter
    has no gradient, no optimizer state and saves less for backward, so a plan made with the weights
    frozen predicts too little for a job that trains them, and one made with them trained too much.
    Returns the warning's text, or None when they agree."""
    doc = load_plan(plan)
    source = doc.get("source", {})
    if not isinstance(source, dict) or source.get("param_count") is None or "distributed" in doc:
        return None
    want = (source.get("trainable_count", source["param_count"]), source.get("trainable_bytes", source.get("param_bytes")))
    have = _trainable(_eager(model).parameters())
    if want == have:
        return None
    text = (f"ckplan_torch: the plan was profiled with {want[0]} trainable parameter tensors "
            f"({_describe_bytes(want[1])}) and the model trains {have[0]} ({_describe_bytes(have[1])}): gradients, "
            "optimizer state and what backward saves differ, so the step may not be what the plan predicts; freeze "
            "the model's parameters as the job does before ckplan_torch.plan (requires_grad_(False))")
    warnings.warn(text)
    return text


def check_trainable_optimizer(model, optimizer):
    """Warns when the job's optimizer does not update exactly the model's trainable parameters
    (those that require grad): parameters it holds that the model does not have or that are frozen
    get state no plan counts; trainable ones it lacks get gradients that nothing frees. Returns the
    warning's text, or None when they agree."""
    trainable = {id(p) for p in _eager(model).parameters() if p.requires_grad}
    everything = {id(p) for p in _eager(model).parameters()}
    held = {id(p) for g in optimizer.param_groups for p in g["params"]}
    foreign = len(held - everything)
    frozen = len((held & everything) - trainable)
    missing = len(trainable - held)
    if not (foreign or frozen or missing):
        return None
    parts = []
    if foreign:
        parts.append(f"{foreign} that are not the model's")
    if frozen:
        parts.append(f"{frozen} that the model froze (requires_grad False)")
    if missing:
        parts.append(f"not {missing} of the model's trainable ones")
    text = ("ckplan_torch: the optimizer holds " + "; ".join(parts) + ": the plan counts a gradient and optimizer "
            "state for each trainable parameter of the model, and none for others; give the optimizer the "
            "parameters that require grad (filter(lambda p: p.requires_grad, model.parameters()))")
    warnings.warn(text)
    return text


def _optimizer_of(optimizer):
    """(name, implementation) of a torch.optim optimizer as ckplan names them,
    the implementation as torch picks it (foreach on CUDA, for-loop elsewhere,
    unless the job set ``foreach`` or ``fused``)."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    kind = type(optimizer).__name__
    if kind == "SGD":
        name = "momentum" if group.get("momentum", 0) else "sgd"
    else:
        name = {"Adam": "adam", "AdamW": "adamw"}.get(kind, kind.lower())
    if group.get("fused"):
        impl = "fused"
    elif group.get("foreach") is not None:
        impl = "foreach" if group["foreach"] else "for-loop"
    else:
        cuda = all(p.is_cuda for g in optimizer.param_groups for p in g["params"])
        impl = "foreach" if cuda and optimizer.param_groups else "for-loop"
    return name, impl


def _optimizer_options_of(optimizer, name):
    """The options of a torch.optim optimizer that change its memory, as a
    plan's ``fixed.optimizer_options`` records them: a coupled weight decay
    (Adam, SGD; AdamW's is in place), amsgrad (Adam, AdamW), nesterov (SGD
    with momentum); each only where set. Several param groups: the first's."""
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    options = {}
    if name in ("adam", "sgd", "momentum") and group.get("weight_decay", 0):
        options["weight_decay"] = float(group["weight_decay"])
    if name in ("adam", "adamw") and group.get("amsgrad"):
        options["amsgrad"] = True
    if name == "momentum" and group.get("nesterov"):
        options["nesterov"] = True
    return options


def _solve_flags(name, impl, options):
    """`ckplan solve`'s optimizer flags, as a list: the optimizer as ckplan names it (momentum: SGD with
    momentum 0.9), its implementation and the options that change its memory (_optimizer_options_of)."""
    flags = ["--optimizer", "sgd", "--momentum", "0.9"] if name == "momentum" else ["--optimizer", name]
    flags += ["--optimizer-impl", impl]
    if "weight_decay" in options:
        flags += ["--weight-decay", f"{options['weight_decay']:g}"]
    return flags + [f"--{key}" for key in ("amsgrad", "nesterov") if options.get(key)]


def check_optimizer(optimizer, plan):
    """Warns when the job's optimizer is not the one the plan was priced for:
    its state and its update's temporaries at the step's end are in the plan's
    prediction (``ckplan solve --optimizer NAME --optimizer-impl IMPL`` and
    the options that change them: ``--weight-decay``, ``--amsgrad``,
    ``--nesterov``), and ``maximize=True`` (a negated gradient per
    parameter) is priced by none. Returns the warning's text, or None when
    they agree."""
    fixed = load_plan(plan).get("fixed", {})
    want = (fixed.get("optimizer"), fixed.get("optimizer_impl", "for-loop"))
    have = _optimizer_of(optimizer)
    want_options = {k: (float(v) if k == "weight_decay" else v)
                    for k, v in fixed.get("optimizer_options", {}).items()}
    have_options = _optimizer_options_of(optimizer, have[0])
    plain = {"none", "sgd"}
    same_kind = want == have or (want[0] in plain and have[0] in plain and not want_options and not have_options)
    maximize = any(g.get("maximize") for g in optimizer.param_groups)
    if want[0] is None or (same_kind and want_options == have_options and not maximize):
        return None
    if maximize and same_kind and want_options == have_options:
        text = ("ckplan_torch: the job's optimizer has maximize=True, which makes a negated gradient per parameter "
                "that no plan prices: the step may go over the plan's budget by the largest parameter's size")
    else:
        wanted, had = " ".join(_solve_flags(*want, want_options)), " ".join(_solve_flags(*have, have_options))
        text = (f"ckplan_torch: the plan was priced for {wanted} but the job's optimizer is {had}: its state and "
                f"its update's temporaries differ, so the step may not fit the plan's budget; solve with {had}")
    warnings.warn(text)
    return text


def apply_plan(model, plan, optimizer=None, strict=True):
    """Wraps the plan's checkpoint_modules of ``model``; returns their paths.

    ``model`` may be ``torch.compile``d (the plan applies to the module it
    compiled); apply the plan before its first call. ``optimizer``: the job's
    torch.optim optimizer, checked against the one the plan was priced for
    (check_optimizer: a warning when they differ). The model's parameters are
    checked against the plan's profile (check_model) unless ``strict`` is
    False (as ``load_state_dict(strict=False)``).

    Raises KeyError naming a module path the model lacks (nothing is wrapped
    then), ValueError for a file that is not a plan, a plan made for another
    model, or a module that writes its input in place (``inplace=True``:
    recomputing it from its saved input would fail in backward; ``ckplan
    solve`` never names one).
    """
    doc = load_plan(plan)
    if strict:
        check_model(model, doc)
    if optimizer is not None:
        check_optimizer(optimizer, doc)
        check_trainable_optimizer(model, optimizer)
    model = _eager(model)
    paths = list(doc["checkpoint_modules"])
    named = dict(model.named_modules())
    missing = [p for p in paths if p not in named]
    if missing:
        raise KeyError(f"the plan names module '{missing[0]}', which the model lacks "
                       f"({len(missing)} of {len(paths)} paths missing)")
    inplace = [p for p in paths if getattr(named[p], "inplace", False) is True]
    if inplace:
        raise ValueError(f"the plan names module '{inplace[0]}', which writes its input in place (inplace=True): "
                         "checkpointing it would fail in backward")
    # A container PyTorch never calls (its children are called one by one):
    # wrapping it checkpoints nothing, and the step needs what no
    # checkpointing needs there (README, Known limits).
    for path in paths:
        if isinstance(named[path], (torch.nn.ModuleList, torch.nn.ModuleDict)):
            warnings.warn(f"ckplan_torch.apply_plan: the plan names module '{path}', a "
                          f"{type(named[path]).__name__} that the model's forward never calls: nothing is "
                          "checkpointed there, and the step will need more memory than the plan predicts")
    _watch_batch(model, doc)
    policies = {}
    sac = (doc.get("pytorch") or {}).get("sac")
    if sac is not None:
        if not isinstance(sac, list) or not all(isinstance(e, dict) and e.get("module") in paths for e in sac):
            raise ValueError("the plan's 'pytorch.sac' does not name its checkpoint_modules: make the plan again "
                             "with `ckplan solve --target sac`")
        policies = {e["module"]: e for e in sac}
    for path in paths:
        module = named[path]
        if not hasattr(module, _ORIGINAL_FORWARD):
            _wrap(module, policies.get(path))
    # A training step keeps no key-value cache: the profile counts none
    # (ckplan_torch.export turns caches off), and transformers' own
    # gradient_checkpointing_enable() turns them off in training too.
    configs = _cache_configs(model)
    for config in configs:
        _CACHES_TURNED_OFF[id(config)] = weakref.ref(config)
        config.use_cache = False
    if configs:
        warnings.warn("ckplan_torch.apply_plan: use_cache=False on the model's config (a training step keeps no "
                      "key-value cache, and the plan counts none), as transformers' own gradient checkpointing does; "
                      "remove_plan sets it back")
    return paths


_BATCH_HOOK = "_ckplan_batch_hook"


def plan_batch(plan):
    """The batch a plan is for: its ``batch`` (written by ``ckplan solve``),
    else the first dimension of its profile's first input; None when unknown."""
    doc = load_plan(plan)
    if isinstance(doc.get("batch"), int):
        return doc["batch"]
    inputs = (doc.get("source") or {}).get("inputs") or []
    shape = inputs[0].get("shape") if inputs and isinstance(inputs[0], dict) else None
    return shape[0] if isinstance(shape, list) and shape and isinstance(shape[0], int) else None


def _first_batch(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return None


def plan_autocast(plan):
    """The autocast dtype the plan's profile ran the forward and loss under (``torch.bfloat16``,
    ``torch.float16``), or None."""
    name = (load_plan(plan).get("source") or {}).get("autocast")
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name) if isinstance(name, str) else None


def _job_autocast(module):
    """The autocast dtype the job's forward runs under on the model's device, or None."""
    device = next(iter(list(module.parameters()) + list(module.buffers())), torch.empty(0)).device.type
    if device == "meta" or not torch.is_autocast_enabled(device):
        return None
    return torch.get_autocast_dtype(device)


def _watch_batch(model, doc):
    """On the model's first forward after apply_plan, a warning when it runs
    another batch than the plan was made for (the peak grows with the batch),
    or under another autocast than the plan's profile (or none where it had one)."""
    expected = plan_batch(doc)
    autocast = plan_autocast(doc)
    old = model.__dict__.pop(_BATCH_HOOK, None)
    if old is not None:
        old.remove()

    def check(module, args, kwargs):
        handle = module.__dict__.pop(_BATCH_HOOK, None)
        if handle is not None:
            handle.remove()
        if torch.is_grad_enabled():
            running = _job_autocast(module)
            if running != autocast:
                said = {None: "no autocast", torch.bfloat16: "autocast bfloat16", torch.float16: "autocast float16"}
                warnings.warn(f"ckplan_torch.apply_plan: the plan was made for a forward under "
                              f"{said.get(autocast, autocast)} and the model runs under "
                              f"{said.get(running, running)}: activations have other dtypes, so the step's memory "
                              f"differs from the prediction; plan as the job runs "
                              f"(ckplan_torch.plan(..., autocast={running}))",
                              stacklevel=2)
        batch = _first_batch(args, kwargs)
        if expected is not None and batch is not None and batch != expected:
            warnings.warn(f"ckplan_torch.apply_plan: the plan is for batch {expected}, and the model runs batch "
                          f"{batch}: the step {'needs more memory' if batch > expected else 'holds less'} than the "
                          f"plan predicts; plan this batch (ckplan solve MODEL --batch {batch} ...), or the largest "
                          "that fits (--batch largest)", stacklevel=2)

    model.__dict__[_BATCH_HOOK] = model.register_forward_pre_hook(check, with_kwargs=True)


def remove_plan(model):
    """Undoes apply_plan; returns the paths that were unwrapped."""
    undone = []
    hook = _eager(model).__dict__.pop(_BATCH_HOOK, None)
    if hook is not None:
        hook.remove()
    for path, module in _eager(model).named_modules():
        original = module.__dict__.pop(_ORIGINAL_FORWARD, None)
        if original is not None:
            module.__dict__.pop("forward", None)
            undone.append(path)
        config = getattr(module, "config", None)
        turned_off = _CACHES_TURNED_OFF.get(id(config)) if config is not None else None
        if turned_off is not None and turned_off() is config:
            del _CACHES_TURNED_OFF[id(config)]
            config.use_cache = True
    return undone


def checkpointed_modules(model):
    """Paths of the modules currently wrapped."""
    return [path for path, module in _eager(model).named_modules() if _ORIGINAL_FORWARD in module.__dict__]


# ---- distributed plans (`ckplan solve --data-parallel N --shard MODE`, `--pipeline P`) ----

def rank_plan(plan, stage=None):
    """The plan one rank applies, as a dict. A data-parallel plan is the same
    on every rank (the whole document); a pipeline plan holds one plan per
    stage under ``distributed.stages``: ``stage`` picks it (required then)."""
    doc = load_plan(plan)
    stages = doc.get("distributed", {}).get("stages")
    if stages is None:
        return doc
    if stage is None or not 0 <= stage < len(stages):
        raise ValueError(f"the plan has {len(stages)} pipeline stages: pass stage=0..{len(stages) - 1}"
                         f" (got {stage!r})")
    return stages[stage]


def fsdp_units(plan):
    """Module paths the plan's memory model takes as FSDP units: call
    ``fully_shard`` on each (in this order), then on the model itself (the root)."""
    return list(load_plan(plan).get("distributed", {}).get("fsdp_units", []))


def apply_rank_plan(model, plan, stage=None):
    """apply_plan for one rank: inside an FSDP2-wrapped model (after
    ``fully_shard``; checkpointing wraps the modules' forward, FSDP's hooks stay
    outside it) or on a pipeline stage's submodule (``stage``: its index; module
    paths are the whole model's, as when a stage keeps its modules' names).
    Returns the wrapped paths."""
    # A rank holds its shards (FSDP) or its stage's modules (pipeline), not
    # the parameters the whole model's profile listed.
    return apply_plan(model, rank_plan(plan, stage), strict=False)
# The archive's ckplan record (extra/ckplan.json): {"schema": "ckplan.pt2-extra/1",
# "shapes_only": bool, "aliases": {name: name}}; shapes_only: the weights are
# meta tensors (no data); aliases: tied weights (one tensor under two names).
CKPLAN_EXTRA_FILE = "ckplan.json"


def is_meta_model(model, example_inputs=()):
    """Whether any parameter, buffer or input of ``model`` is on the meta device (no data)."""
    tensors = list(model.parameters()) + list(model.buffers()) + [x for x in example_inputs if isinstance(x, torch.Tensor)]
    return any(t.device.type == "meta" for t in tensors)


def _aliases(model):
    """Tied weights: {name: the first name of the same tensor} (a meta
    archive cannot tell them apart by their storages: none has data)."""
    first, aliases = {}, {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in named:
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
    return aliases


class ExportError(RuntimeError):
    """torch.export could not export, save or load back the model: PyTorch's reason and the fix are in the message."""


def _first_line(error):
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


def _namedtuple_in(spec):
    """The first namedtuple class in a pytree spec (the program's outputs), or None."""
    if spec is None:
        return None
    # The class is the spec's type in older torch, its context in newer.
    for kind in (getattr(spec, "type", None), getattr(spec, "context", None)):
        if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):
            return kind
    children = spec.children() if callable(getattr(spec, "children", None)) else getattr(spec, "children_specs", [])
    for child in children:
        found = _namedtuple_in(child)
        if found is not None:
            return found
    return None


def _plain(value):
    """The value with each namedtuple in it (in tuples, lists, dicts) a plain tuple of its fields."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if type(value) is list:
        return [_plain(v) for v in value]
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def _bound_names(model, args, kwargs=None):
    """The names of forward's parameters the example inputs are passed as."""
    try:
        return set(inspect.signature(model.forward).bind_partial(*args, **(kwargs or {})).arguments)
    except (TypeError, ValueError):
        return set()


@contextlib.contextmanager
def _follow_eager(model, args, kwargs=None):
    """While the model is exported, transformers' masking code takes the
    paths it takes in eager, decided from shapes alone as eager decides them.
    Under torch.export it takes its general path instead, because it cannot
    read values: a causal mask made explicit (eager leaves it to SDPA's
    is_causal), so K and V repeated for grouped-query attention (eager: SDPA's
    enable_gqa), and position ids checked for packed sequences (eager finds
    none in the positions the model makes itself). The general path stays
    where values decide: with an attention mask among the inputs (a padded
    batch needs the mask) or position ids given (they may pack sequences)."""
    masking = sys.modules.get("transformers.masking_utils")
    if masking is None or not any(type(m).__module__.startswith("transformers.") for m in model.modules()):
        yield
        return
    patches = {"is_torchdynamo_exporting": lambda: False}
    if "position_ids" not in _bound_names(model, args, kwargs):
        patches["find_packed_sequence_indices"] = lambda *args, **kwargs: None
    patches = {n: f for n, f in patches.items() if hasattr(masking, n)}
    originals = {n: getattr(masking, n) for n in patches}
    try:
        for n, f in patches.items():
            setattr(masking, n, f)
        yield
    finally:
        for n, f in originals.items():
            setattr(masking, n, f)


def _dynamic_batch_shapes(model, args, kwargs, seq=False):
    """torch.export's dynamic_shapes with the first dimension of every input
    one dimension `batch`, and with ``seq`` the second dimension of every
    integer input of two or more (token ids, labels, masks) dynamic too
    (`Dim.AUTO`: export works out which of them must agree): a tuple for
    positional inputs alone, else a dict by forward's parameter names (None
    where the inputs cannot be named)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)

    def spec(x):
        # A container of tensors (a list of images, a dict of targets) or a
        # Python value: static (what its first dimension is, nothing says).
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return None
        dims = {0: batch}
        if seq and x.dim() >= 2 and not x.is_floating_point() and x.dtype != torch.bool:
            dims[1] = torch.export.Dim.AUTO
        return dims

    if not kwargs:
        return tuple(spec(x) for x in args)
    try:
        signature = inspect.signature(model.forward)
        bound = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(signature.parameters[name].kind not in plain for name in bound):
        return None  # passed through *args or **kwargs: no name to give a shape
    return {name: spec(value) for name, value in bound.items()}


@contextlib.contextmanager
def _state_restored(model):
    """A forward run only to look at the model (in train mode): its buffers (batch norm's running
    statistics) and the RNG state put back after, as they were."""
    buffers = {name: b.detach().clone() for name, b in model.named_buffers()}
    rng = torch.get_rng_state()
    try:
        yield
    finally:
        torch.set_rng_state(rng)
        with torch.no_grad():
            for name, b in model.named_buffers():
                if name in buffers:
                    b.copy_(buffers[name])


@contextlib.contextmanager
def _forward_replaced(model, forward):
    """``model.forward`` is ``forward`` (an instance attribute, removed after) while the model is
    exported: the module paths and parameter names stay the model's own."""
    had_forward = "forward" in model.__dict__
    previous = model.__dict__.get("forward")
    model.forward = forward
    try:
        yield
    finally:
        if had_forward:
            model.forward = previous
        else:
            del model.forward


def _plain_call_paths(model, args, kwargs, paths):
    """Of ``paths``, the modules whose every call takes tensors, numbers, bools, None and containers of
    them, found by one forward without gradients (the buffers and RNG state put back after): a module
    called with a string (a layer type) or an object cannot keep its call signature in torch.export."""
    from torch.utils import _pytree
    names = {id(m): n for n, m in model.named_modules()}
    odd = set()

    def check(module, a, k):
        for leaf in _pytree.tree_leaves((a, k)):
            if not isinstance(leaf, (torch.Tensor, int, float, bool, type(None))):
                odd.add(names.get(id(module)))

    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, a: check(module, a, {}))
    hooks = [hook] + [m.register_forward_pre_hook(lambda module, a, k: check(module, (), k), with_kwargs=True)
                      for m in model.modules()]
    try:
        with _state_restored(model), torch.no_grad(), _follow_eager(model, args, kwargs):
            model(*args, **(kwargs or {}))
    except Exception:  # noqa: BLE001 - only a narrowing: the export says what fails
        return paths
    finally:
        for h in hooks:
            h.remove()
    return tuple(p for p in paths if p not in odd)


def _export_program(model, args, kwargs, dynamic_batch, dynamic_seq=False):
    # Every module's call signature is kept in the program (the graph is the
    # same): the tensors each module is called with, those its ops never read
    # included (a decoder layer's position ids), which torch.utils.checkpoint
    # holds when the module is wrapped. A model whose signatures cannot be
    # kept is exported without them, with a warning.
    paths = tuple(name for name, _ in model.named_modules() if name)

    def attempt(dynamic_shapes):
        with _follow_eager(model, args, kwargs):
            if not paths:
                return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False)
            try:
                return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False,
                                           preserve_module_call_signature=paths)
            except ExportError:
                raise  # the job's own code refused (loss_fn): no other way of exporting changes that
            except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
                # torch.export keeps no signature of a module called with a
                # string (Gemma's rotary embedding, given its layer type):
                # the others' are kept.
                plain = _plain_call_paths(model, args, kwargs, paths)
                if plain != paths:
                    try:
                        return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes,
                                                   strict=False, preserve_module_call_signature=plain)
                    except ExportError:
                        raise
                    except Exception:  # noqa: BLE001
                        pass
                # A model that does not export at all raises its own reason here.
                program = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes,
                                              strict=False)
                warnings.warn(f"ckplan_torch.export: the modules' call signatures cannot be kept "
                              f"({_first_line(error)[:200]}); exported without them: a wrapped module's "
                              f"arguments its ops never read are not counted")
                return program

    dynamic_shapes = _dynamic_batch_shapes(model, args, kwargs) if dynamic_batch else None
    if dynamic_shapes is not None and any(isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == 1
                                          for x in _ordered_inputs(args, kwargs)):
        warnings.warn("ckplan_torch.export: the example inputs have batch 1, and torch.export specializes a "
                      "dimension of size 1: the archive runs batch 1 only. Export with a batch of 2 or more to "
                      "profile it at other batches (ckplan solve MODEL --batch auto)")
    seq_shapes = _dynamic_batch_shapes(model, args, kwargs, seq=True) if dynamic_batch and dynamic_seq else None
    if seq_shapes is not None:
        # The sequence too where the model allows it; else the batch alone, with a warning.
        try:
            return attempt(seq_shapes)
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
            warnings.warn(f"ckplan_torch.export: the sequence dimension cannot be dynamic "
                          f"({str(error).splitlines()[0][:200]}); exported with a dynamic batch only")
    try:
        try:
            return attempt(dynamic_shapes)
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
            if dynamic_shapes is None:
                raise
            # A model whose code fixes the batch size (a reshape to a
            # constant): export it with static shapes, and say so.
            warnings.warn(f"ckplan_torch.export: the batch dimension cannot be dynamic "
                          f"({str(error).splitlines()[0][:200]}); exported with the example's batch size")
            return attempt(None)
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001
        reason = _first_line(error)
        if "cache_utils" in reason:  # transformers' key-value cache as an output
            fix = "export it without the cache: pass use_cache=False, or set model.config.use_cache = False"
        else:
            fix = ("make forward traceable by torch.export (no Python branches on tensor values, tensors in and out), "
                   "or save a trace (torch.jit.trace(model.train(), inputs).save(\"model.pt\")) and profile that")
        raise ExportError(f"torch.export could not export {type(model).__name__}: {reason}; {fix}") from error


def _export_plain_outputs(model, args, kwargs, dynamic_batch, field=None, dynamic_seq=False):
    """The model exported with its forward returning plain tuples where it
    returns namedtuples (torch.export.save cannot save a namedtuple output
    spec), or only its output's `field` when given (a ModelOutput's
    logits), through an instance attribute `forward` that is removed after:
    the module paths and parameter names stay the model's own."""
    original = model.forward

    @functools.wraps(original)
    def forward(*a, **k):
        out = original(*a, **k)
        return out[field] if field is not None else _plain(out)

    with _forward_replaced(model, forward):
        return _export_program(model, args, kwargs, dynamic_batch, dynamic_seq)


_TARGET_NAME = "ckplan_target_{}"


def _loss_name(loss_fn):
    """How a loss function is named in messages and the archive's record."""
    if isinstance(loss_fn, torch.nn.Module):
        return type(loss_fn).__name__
    name = getattr(loss_fn, "__qualname__", None) or getattr(loss_fn, "__name__", None)
    module = getattr(loss_fn, "__module__", None)
    return f"{module}.{name}" if name and module and module != "__main__" else (name or type(loss_fn).__name__)


@contextlib.contextmanager
def _with_loss(model, loss_fn, count):
    """While the model is exported, its forward is the job's step up to the
    loss: ``out = model(...)``, ``loss = loss_fn(out, *targets)``, returning
    ``(loss, *the tensors in out)`` (the loss first: ckplan back-propagates
    it; the model's outputs after it, which the training loop holds through
    ``backward()`` and ``optimizer.step()``). The targets come as keyword-only
    arguments ``ckplan_target_0``... (the program's last inputs). An instance
    attribute ``forward``, removed after: the module paths and parameter
    names stay the model's own."""
    from torch.utils import _pytree
    original = model.forward
    names = [_TARGET_NAME.format(i) for i in range(count)]

    def forward(*args, **kwargs):
        targets = [kwargs.pop(name) for name in names]
        out = original(*args, **kwargs)
        loss = loss_fn(out, *targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ExportError(f"loss_fn ({_loss_name(loss_fn)}) returned "
                              f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}: "
                              "it must return the scalar loss the job calls backward() on (reduction='mean' or "
                              "'sum', not 'none')")
        leaves = [t for t in _pytree.tree_leaves(_plain(out)) if isinstance(t, torch.Tensor)]
        return (loss.reshape(()), *leaves)

    signature = inspect.signature(original)
    params = list(signature.parameters.values())
    tail = [p for p in params if p.kind == inspect.Parameter.VAR_KEYWORD]
    head = [p for p in params if p.kind != inspect.Parameter.VAR_KEYWORD]
    targets = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
    forward.__signature__ = signature.replace(parameters=head + targets + tail)
    forward.__name__ = "forward"
    with _forward_replaced(model, forward):
        yield


def _loss_dict_keys(spec):
    """The keys of a plain dict of losses the program returns (every key naming a loss: torchvision's
    detection models in training, ``{"loss_classifier": ..., "loss_box_reg": ...}``), or None."""
    if getattr(spec, "type", None) is not dict:
        return None
    keys = [str(k) for k in (getattr(spec, "context", None) or [])]
    return keys if keys and all("loss" in k for k in keys) else None


def _sum_losses(out):
    """The loss of a model returning a dict of losses: their sum."""
    return sum(out.values())


def _model_output_fields(spec):
    """The field names of a transformers ModelOutput the program returns, or None."""
    kind = getattr(spec, "type", None)
    if isinstance(kind, type) and issubclass(kind, collections.OrderedDict) and hasattr(kind, "to_tuple"):
        return list(getattr(spec, "context", None) or [])
    return None


def _cache_configs(model):
    """The distinct configs of the model's modules with use_cache on
    (transformers' key-value caches)."""
    configs = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", False) is True:
            configs[id(config)] = config
    return list(configs.values())


@contextlib.contextmanager
def _caches_off(model):
    """transformers' key-value caches off while the model is exported (a
    training step makes none; a cache is no tensor output torch.export can
    save): each config a module holds with use_cache set, set back after."""
    configs = _cache_configs(model)
    try:
        for config in configs:
            config.use_cache = False
        yield
    finally:
        for config in configs:
            config.use_cache = True


def _ordered_inputs(args, kwargs):
    """The example tensors in the order the exported program takes them
    (its flattened inputs): the positional ones, then the keyword ones as
    given, each container (lists, tuples, dicts of tensors) flattened as
    torch.export's pytrees flatten it; Python values (a bool option, an int)
    are constants of the program, not inputs."""
    from torch.utils import _pytree
    return [x for x in _pytree.tree_leaves((list(args), list((kwargs or {}).values())))
            if isinstance(x, torch.Tensor)]


def _is_container(value):
    return isinstance(value, (list, tuple, dict)) and not isinstance(value, torch.Tensor)


_SPEC_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
                torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}


def _input_spec(x):
    """`ckplan profile --input`'s text for an example tensor: its shape and
    dtype, and for integers the range of its values (negative ones, the
    ignore index -100 of labels, left out)."""
    dtype = _SPEC_DTYPES.get(x.dtype)
    if dtype is None or x.dim() == 0:
        return None
    shape = "x".join(str(d) for d in x.shape)
    if dtype == "bool" or x.is_floating_point() or x.device.type == "meta" or x.numel() == 0:
        return f"{shape}:{dtype}"
    values = x[x >= 0]
    if values.numel() == 0:
        return f"{shape}:{dtype}"
    return f"{shape}:{dtype}:{int(values.min())}..{int(values.max()) + 1}"


def _eager_module_peaks(model, args, kwargs=None):
    """Per module path, the most bytes its forward holds at once beyond what
    was held when it was called, as eager PyTorch runs it with autograd on
    the example inputs (what a wrapped module's recomputation holds in
    backward): every storage an op makes counted until it is freed, so
    Python locals that outlive their last use count too (a value kept in a
    variable until the function returns, which a graph frees at its last
    reader). One forward, no backward; the buffers (batch norm's running
    statistics) and the RNG state are restored after. None for a model or
    inputs off the CPU (another device runs other kernels)."""
    from torch.utils import _pytree
    from torch.utils._python_dispatch import TorchDispatchMode
    inputs = _ordered_inputs(args, kwargs)
    tensors = list(model.parameters()) + list(model.buffers()) + inputs
    if any(t.device.type != "cpu" for t in tensors):
        return None
    paths = {}
    for name, m in model.named_modules():
        paths.setdefault(id(m), name)
    live, storages, frames, peaks = [0], {}, [], {}

    def freed(key, nbytes):
        storages.pop(key, None)
        live[0] -= nbytes

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # An output on an input's storage (a view, an in-place op) is no new memory.
            read = {id(t.untyped_storage()) for t in _pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for t in _pytree.tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                s = t.untyped_storage()
                if id(s) in storages or id(s) in read or s.nbytes() == 0:
                    continue
                storages[id(s)] = s.nbytes()
                live[0] += s.nbytes()
                weakref.finalize(s, freed, id(s), s.nbytes())
            for frame in frames:
                frame[2] = max(frame[2], live[0] - frame[1])
            return out

    def enter(module, args):
        if id(module) in paths:
            frames.append([paths[id(module)], live[0], 0])

    def leave(module, args, output):
        if id(module) in paths and frames and frames[-1][0] == paths[id(module)]:
            path, _, peak = frames.pop()
            peaks[path] = max(peaks.get(path, 0), peak)

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]
    try:
        with _state_restored(model), torch.enable_grad(), Count():
            out = model(*args, **(kwargs or {}))
        del out
    except Exception:  # noqa: BLE001 - a measurement only: the archive is complete without it
        return None
    finally:
        for h in hooks:
            h.remove()
    peaks.pop("", None)
    return {"inputs": [{"shape": list(x.shape), "itemsize": x.element_size()} for x in inputs], "bytes": peaks}


_AUTOCAST_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _autocast_context(model, args, kwargs, autocast):
    """``torch.autocast`` on the model's device with dtype ``autocast`` (a null context for None)."""
    if autocast is None:
        return contextlib.nullcontext()
    tensors = list(model.parameters()) + list(model.buffers()) + [
        x for x in _ordered_inputs(args, kwargs) if isinstance(x, torch.Tensor)]
    device = tensors[0].device.type if tensors else "cpu"
    return torch.autocast(device, dtype=autocast)


def check_autocast(autocast, argument="autocast"):
    """``autocast`` as ``torch.autocast`` takes its dtype: torch.bfloat16, torch.float16 or None
    (fp32, no autocast); anything else a ValueError naming the argument."""
    if autocast is None or autocast in _AUTOCAST_DTYPES:
        return autocast
    raise ValueError(f"{argument}={autocast!r}: torch.bfloat16 or torch.float16 (the dtype torch.autocast runs the "
                     "forward in, the weights kept in theirs), or None for no autocast")


def check_loss(loss_fn, targets, argument="loss_fn"):
    """``targets`` as a tuple of tensors for ``loss_fn`` (a callable, or None with no targets); a
    TypeError or ValueError naming the argument otherwise."""
    if isinstance(targets, torch.Tensor):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)):
        raise TypeError(f"targets: a tensor or a tuple of tensors (what loss_fn takes beside the output), not "
                        f"{type(targets).__name__}")
    targets = tuple(targets)
    if loss_fn is None:
        if targets:
            raise ValueError("targets= without loss_fn=: give the loss they are for (loss_fn=nn.CrossEntropyLoss(), "
                             "or a function of (output, *targets)), or pass a model's labels in kwargs")
        return targets
    if not callable(loss_fn):
        raise TypeError(f"{argument}: a callable (output, *targets) -> scalar loss, such as nn.CrossEntropyLoss(), "
                        f"not {type(loss_fn).__name__}")
    wrong = [type(t).__name__ for t in targets if not isinstance(t, torch.Tensor)]
    if wrong:
        raise TypeError(f"targets: tensors only (got {', '.join(wrong)}); a constant of the loss goes in loss_fn "
                        "itself (functools.partial, a lambda, the module's arguments)")
    return targets


def export(model, args, path, kwargs=None, dynamic_batch=True, dynamic_seq=False, autocast=None, loss_fn=None,
           targets=()):
    """Exports ``model`` in train mode for ckplan, with ``torch.export.export``'s
    arguments in its order: ``args`` (a tuple of tensors, or one tensor) and
    ``kwargs`` (tensors by forward's parameter names: a Hugging Face model's
    ``labels``, ``attention_mask``). Non-strict, the training IR (ATen ops
    with autograd, dropout and batch norm as in training); the first
    dimension of every input marked dynamic when ``dynamic_batch`` (one file
    profiles at any batch size), and with ``dynamic_seq`` the second
    dimension of every integer input too (token ids, labels, masks: one file
    profiles at any sequence length, ``ckplan solve --seq``); saved with ``torch.export.save`` and loaded
    back to check the round trip, then renamed to ``path`` (a failure leaves
    no file). The archive records the inputs' shapes, dtypes and integer
    ranges, so ``ckplan profile model.pt2`` needs no ``--input`` at the
    example's shapes. Returns the ExportedProgram.

    ``autocast``: the dtype the job runs its forward (and loss) in under
    ``torch.autocast`` (``torch.bfloat16``, ``torch.float16``; None: no
    autocast), the weights in their own dtype: the model is exported under
    ``torch.autocast(device, dtype=autocast)`` and the archive records it,
    so that ``ckplan profile`` runs the forward and loss under the same
    autocast (its casts, its cache of the weights' casts, the ops it keeps in
    fp32). Regions the model sets itself (``torch.autocast(enabled=False)``
    around rotary embeddings) are kept in the program and run as they are.
    A meta model is exported without it (autocast casts on a real device
    only) and ``ckplan profile --device meta`` applies CUDA's autocast policy
    op by op.

    ``loss_fn`` and ``targets``: the job's own loss, ``loss_fn(output,
    *targets)`` (a module such as ``nn.CrossEntropyLoss()`` or a function
    returning the scalar loss), exported with the model: the archive returns
    the loss first and the model's outputs after it, so that ``ckplan
    profile`` back-propagates that loss (what it keeps for backward, a
    cross-entropy's log-probabilities, counted) and counts the outputs as
    the training loop holds them to the step's end. ``targets``: the tensors
    the loss takes beside the output (class indices, a segmentation map),
    batch first like the inputs; the program takes them after the model's
    inputs. Without a loss_fn, a model given its ``labels`` trains with its
    own loss, and any other with ckplan's (the outputs summed, which keeps
    nothing).

    Hugging Face models as they come: key-value caches are off for the
    export (each config's ``use_cache`` set back after); a model given its
    ``labels`` returns its loss, which the profile back-propagates as it
    is; a ModelOutput without a loss is exported returning its first field
    (the logits, the last hidden state: what a loss reads), with a warning.
    A forward returning a namedtuple (torchvision's GoogLeNet in train mode
    with aux_logits) is exported returning a plain tuple of its fields, in
    order, with a warning: torch.export.save cannot save a namedtuple.
    Raises ExportError with PyTorch's reason and the fix.
    """
    autocast = check_autocast(autocast)
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    kwargs = {name: value for name, value in (kwargs or {}).items() if value is not None}
    targets = check_loss(loss_fn, targets)
    values = _ordered_inputs(args, kwargs)
    if not values:
        raise ExportError(f"the example inputs of {type(model).__name__} hold no tensor: pass the tensors its forward "
                          "takes (a tuple of tensors, lists or dicts of them, and Python values as options)")
    # A container input: shapes static (its first dimension need not be the batch).
    if any(_is_container(v) for v in list(args) + list(kwargs.values())):
        dynamic_batch = dynamic_seq = False
    was_training = model.training
    model.train()
    # On the meta device autocast casts nothing: exported without it, and
    # `ckplan profile --device meta` applies CUDA's autocast policy op by op.
    traced_autocast = None if is_meta_model(model, values) else autocast
    if loss_fn is not None:
        kwargs = {**kwargs, **{_TARGET_NAME.format(i): t for i, t in enumerate(targets)}}
    loss_context = _with_loss(model, loss_fn, len(targets)) if loss_fn is not None else contextlib.nullcontext()
    try:
        with _caches_off(model), _autocast_context(model, args, kwargs, traced_autocast), loss_context:
            program = _export_program(model, args, kwargs, dynamic_batch, dynamic_seq)
            named = None if loss_fn is not None else _namedtuple_in(program.call_spec.out_spec)
            fields = None if loss_fn is not None else _model_output_fields(program.call_spec.out_spec)
            losses = None if loss_fn is not None else _loss_dict_keys(program.call_spec.out_spec)
            if losses:
                warnings.warn(f"ckplan_torch.export: {type(model).__name__} returns a dict of losses "
                              f"({', '.join(losses)}); trained with their sum, as torchvision's detection "
                              f"references do (pass loss_fn= for another)")
                loss_fn, targets = _sum_losses, ()
                with _with_loss(model, _sum_losses, 0):
                    program = _export_program(model, args, kwargs, dynamic_batch, dynamic_seq)
                    eager_peaks = _eager_module_peaks(model, args, kwargs)
            elif named is not None:
                warnings.warn(f"ckplan_torch.export: {type(model).__name__} returns a namedtuple ({named.__name__}), "
                              f"which torch.export.save cannot save; exported returning a plain tuple of its fields "
                              f"({', '.join(named._fields)})")
                program = _export_plain_outputs(model, args, kwargs, dynamic_batch, dynamic_seq=dynamic_seq)
            elif fields and "loss" not in fields and len(fields) > 1:
                warnings.warn(f"ckplan_torch.export: {type(model).__name__} returns no loss (pass its labels in "
                              f"kwargs for the loss it trains with); exported returning its {fields[0]} (of "
                              f"{', '.join(fields)}), which ckplan profile's --loss reads")
                program = _export_plain_outputs(model, args, kwargs, dynamic_batch, field=fields[0],
                                                dynamic_seq=dynamic_seq)
            if not losses:
                eager_peaks = _eager_module_peaks(model, args, kwargs)
    finally:
        model.train(was_training)
    inputs = _ordered_inputs(args, kwargs)
    shapes_only = is_meta_model(model, inputs)
    record = {"schema": "ckplan.pt2-extra/1", "shapes_only": shapes_only, "aliases": _aliases(model)}
    if loss_fn is not None:
        record["loss"] = {"kind": "loss_fn", "name": _loss_name(loss_fn), "targets": len(targets)}
    if autocast is not None:
        devices = [t.device.type for t in list(model.parameters()) + inputs if isinstance(t, torch.Tensor)]
        record["autocast"] = {"dtype": _AUTOCAST_DTYPES[autocast], "device": devices[0] if devices else "cpu"}
    specs = [_input_spec(x) for x in inputs]
    if all(spec is not None for spec in specs):
        record["inputs"] = specs
    if eager_peaks is not None:
        record["eager_module_peaks"] = eager_peaks
    extra = json.dumps(record)
    # Written beside the target and renamed once it loads back.
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    partial = os.path.join(directory, f".{name}.{os.getpid()}.partial")
    try:
        f = open(partial, "wb")
    except OSError as error:
        raise ExportError(f"{path}: cannot write: {error.strerror}; give a path in a folder that exists and "
                          f"you may write to") from error
    try:
        try:
            with f:
                torch.export.save(program, f, extra_files={CKPLAN_EXTRA_FILE: extra})
        except Exception as error:  # noqa: BLE001
            raise ExportError(f"torch.export.save could not save the program of {type(model).__name__}: "
                              f"{_first_line(error)}; make forward return tensors (or tuples, lists or dicts "
                              f"of tensors), e.g. with a wrapper module") from error
        try:
            with open(partial, "rb") as f:
                loaded = torch.export.load(f)
        except Exception as error:  # noqa: BLE001
            raise ExportError(f"{path}: the saved program of {type(model).__name__} does not load back with "
                              f"torch.export.load: {_first_line(error)}; make forward return tensors (or tuples, "
                              f"lists or dicts of tensors) and take tensors only") from error
        if len(loaded.graph.nodes) != len(program.graph.nodes):
            raise ExportError(f"{path}: the saved program does not load back as it was saved "
                              f"({len(loaded.graph.nodes)} nodes, {len(program.graph.nodes)} exported); "
                              f"report it with the torch version ({torch.__version__})")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return program


# ---- one call: export, profile and solve from the training script (planning.py) ----
from .planning import AUTO_BUDGET_MARGIN, CkplanError, Plan, auto_budget, enable, find_ckplan, plan, sac_dispatch_us  # noqa: E402

__all__ += ["plan", "enable", "Plan", "CkplanError", "find_ckplan", "auto_budget", "AUTO_BUDGET_MARGIN", "sac_dispatch_us"]
