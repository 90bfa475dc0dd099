"""``apply_plan``: wraps the modules a plan names with torch.utils.checkpoint (and a selective
policy for a ``sac`` plan), and ``remove_plan`` undoes it."""
import collections
import collections.abc
import contextlib
import copy
import functools
import inspect
import warnings
import weakref
from typing import List, Optional

import torch
import torch.utils.checkpoint

from ._checks import check_model, check_optimizer, check_trainable_optimizer
from ._errors import MissingModuleError, PlanError
from ._model import _eager, _first_batch, _model_device
from ._plan_file import PlanSource, load_plan, plan_autocast, plan_batch, rank_plan
from ._selective import _SacPolicy, _sac_op_families
from ._transformers import _cache_configs


_ORIGINAL_FORWARD = "_ckplan_original_forward"
# Configs whose use_cache apply_plan turned off, for remove_plan: id -> weakref
# (a transformers config defines __eq__, so it cannot be a dict key itself).
_CACHES_TURNED_OFF = {}


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


def _wrap(module, sac=None, op_families=None):
    original = module.forward
    norms = _running_stat_modules(module)
    non_reentrant = _supports_non_reentrant()
    policy = _SacPolicy(sac, op_families) if sac and sac.get("save") else None
    if policy is not None and not hasattr(torch.utils.checkpoint, "create_selective_checkpoint_contexts"):
        raise PlanError("a selective-checkpointing plan (--target sac) needs torch >= 2.4 "
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


def apply_plan(model: torch.nn.Module, plan: PlanSource, optimizer: Optional[torch.optim.Optimizer] = None,
               strict: bool = True) -> List[str]:
    """Wraps the plan's ``checkpoint_modules`` of ``model`` with torch.utils.checkpoint (and, for a
    ``sac`` plan, each with its selective-checkpointing policy).

    Transformers' key-value caches are turned off (``use_cache=False``, as
    ``gradient_checkpointing_enable()`` does; ``remove_plan`` sets them back), and the model's first
    forward warns when it runs another batch or autocast than the plan's.

    Args:
        model: the model; it may be ``torch.compile``d (the plan applies to the module it compiled):
            apply the plan before its first call.
        plan: the plan (as ``load_plan`` takes it).
        optimizer: the job's torch.optim optimizer, checked against the one the plan was priced for
            (``check_optimizer``, ``check_trainable_optimizer``: warnings when they differ).
        strict: check the model's parameters against the plan's profile (``check_model``); False
            skips it, as ``load_state_dict(strict=False)``.

    Returns:
        The wrapped modules' paths.

    Raises:
        MissingModuleError: the plan names a module path the model lacks (nothing is wrapped then).
        PlanError: a file that is not a plan, a plan made for another model, or a module that
            writes its input in place (``inplace=True``: recomputing it from its saved input would
            fail in backward; ``ckplan solve`` never names one).
    """
    doc = load_plan(plan)
    if strict:
        check_model(model, doc)
    if optimizer is not None:
        check_optimizer(optimizer, doc, model)
        check_trainable_optimizer(model, optimizer)
    model = _eager(model)
    paths = list(doc["checkpoint_modules"])
    named = dict(model.named_modules())
    missing = [p for p in paths if p not in named]
    if missing:
        raise MissingModuleError(f"the plan names module '{missing[0]}', which the model lacks "
                                 f"({len(missing)} of {len(paths)} paths missing)")
    inplace = [p for p in paths if getattr(named[p], "inplace", False) is True]
    if inplace:
        raise PlanError(f"the plan names module '{inplace[0]}', which writes its input in place (inplace=True): "
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
            raise PlanError("the plan's 'pytorch.sac' does not name its checkpoint_modules: make the plan again "
                            "with `ckplan solve --target sac`")
        policies = {e["module"]: e for e in sac}
    op_families = _sac_op_families(doc) if any(e.get("save") for e in policies.values()) else None
    for path in paths:
        module = named[path]
        if not hasattr(module, _ORIGINAL_FORWARD):
            _wrap(module, policies.get(path), op_families)
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


def _job_autocast(module):
    """The autocast dtype the job's forward runs under on the model's device, or None."""
    device = _model_device(module).type
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


def remove_plan(model: torch.nn.Module) -> List[str]:
    """Undoes ``apply_plan``: each wrapped module's own forward back, the first forward's check
    removed, and the key-value caches it turned off turned on again.

    Args:
        model: the model the plan was applied to.

    Returns:
        The paths that were unwrapped.
    """
    undone = []
    model = _eager(model)
    hook = model.__dict__.pop(_BATCH_HOOK, None)
    if hook is not None:
        hook.remove()
    for path, module in model.named_modules():
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


def checkpointed_modules(model: torch.nn.Module) -> List[str]:
    """The modules ``apply_plan`` wrapped.

    Args:
        model: the model.

    Returns:
        The paths of the modules currently wrapped.
    """
    return [path for path, module in _eager(model).named_modules() if _ORIGINAL_FORWARD in module.__dict__]


def apply_rank_plan(model: torch.nn.Module, plan: PlanSource, stage: Optional[int] = None) -> List[str]:
    """``apply_plan`` for one rank: inside an FSDP2-wrapped model (after ``fully_shard``;
    checkpointing wraps the modules' forward, FSDP's hooks stay outside it) or on a pipeline
    stage's submodule (module paths are the whole model's, as when a stage keeps its modules'
    names). The parameters are not checked (``strict=False``).

    Args:
        model: the rank's model or stage.
        plan: the plan (as ``load_plan`` takes it).
        stage: the pipeline stage's index (``rank_plan``); required for a pipeline plan.

    Returns:
        The wrapped modules' paths.
    """
    # A rank holds its shards (FSDP) or its stage's modules (pipeline), not
    # the parameters the whole model's profile listed.
    return apply_plan(model, rank_plan(plan, stage), strict=False)
