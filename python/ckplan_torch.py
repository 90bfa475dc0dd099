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
import functools
import inspect
import json

import torch
import torch.utils.checkpoint

__all__ = ["apply_plan", "remove_plan", "load_plan", "checkpointed_modules", "export", "ExportError",
           "rank_plan", "fsdp_units", "apply_rank_plan", "is_meta_model"]

_ORIGINAL_FORWARD = "_ckplan_original_forward"


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
    """A copy of the lists and dicts in a call's arguments (the tensors shared).

    Checkpointing calls the forward again in backward with the same arguments.
    A caller may grow a list after the call: torchvision's DenseNet passes its
    running list of features to each dense layer and appends to it, so the
    recomputation would read more features than the forward did.
    """
    if isinstance(value, list):
        return [_snapshot(v) for v in value]
    if isinstance(value, dict):
        return {k: _snapshot(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_snapshot(v) for v in value)
    return value


def _wrap(module):
    original = module.forward
    non_reentrant = _supports_non_reentrant()

    @functools.wraps(original)
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
        args = _snapshot(args)
        kwargs = _snapshot(kwargs)
        if non_reentrant:
            return torch.utils.checkpoint.checkpoint(original, *args, use_reentrant=False, preserve_rng_state=True,
                                                     **kwargs)
        if kwargs:
            raise TypeError("keyword arguments need non-reentrant checkpointing (torch >= 1.11)")
        return torch.utils.checkpoint.checkpoint(original, *args, preserve_rng_state=True)

    setattr(module, _ORIGINAL_FORWARD, original)
    module.forward = forward


def apply_plan(model, plan):
    """Wraps the plan's checkpoint_modules of ``model``; returns their paths.

    Raises KeyError naming a module path the model lacks (nothing is wrapped
    then), ValueError for a file that is not a plan or a module that writes
    its input in place (``inplace=True``: recomputing it from its saved input
    would fail in backward; ``ckplan solve`` never names one).
    """
    doc = load_plan(plan)
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
    for path in paths:
        module = named[path]
        if not hasattr(module, _ORIGINAL_FORWARD):
            _wrap(module)
    return paths


def remove_plan(model):
    """Undoes apply_plan; returns the paths that were unwrapped."""
    undone = []
    for path, module in model.named_modules():
        original = module.__dict__.pop(_ORIGINAL_FORWARD, None)
        if original is not None:
            module.__dict__.pop("forward", None)
            undone.append(path)
    return undone


def checkpointed_modules(model):
    """Paths of the modules currently wrapped."""
    return [path for path, module in model.named_modules() if _ORIGINAL_FORWARD in module.__dict__]


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
    return apply_plan(model, rank_plan(plan, stage))
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
    """torch.export could not export the model: PyTorch's reason is in the message."""


def export(model, example_inputs, path, dynamic_batch=True):
    """Exports ``model`` in train mode for ckplan: ``torch.export.export``
    (non-strict, the training IR: ATen ops with autograd, dropout and batch
    norm as in training), the first dimension of every input marked dynamic
    when ``dynamic_batch`` (one file profiles at any batch size), saved with
    ``torch.export.save`` and loaded back to check the round trip. Returns
    the ExportedProgram. Raises ExportError with PyTorch's reason.
    """
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    if not all(isinstance(x, torch.Tensor) for x in example_inputs):
        raise ExportError("ckplan exports models whose inputs are tensors; got "
                          + ", ".join(type(x).__name__ for x in example_inputs))
    was_training = model.training
    model.train()
    dynamic_shapes = None
    if dynamic_batch:
        batch = torch.export.Dim("batch", min=1, max=1 << 20)
        dynamic_shapes = tuple({0: batch} if x.dim() > 0 else None for x in example_inputs)
    try:
        try:
            program = torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)
        except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
            if dynamic_shapes is None:
                raise
            # A model whose code fixes the batch size (a reshape to a
            # constant): export it with static shapes, and say so.
            import warnings
            warnings.warn(f"ckplan_torch.export: the batch dimension cannot be dynamic "
                          f"({str(error).splitlines()[0][:200]}); exported with the example's batch size")
            program = torch.export.export(model, example_inputs, strict=False)
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"torch.export could not export {type(model).__name__}: "
                          f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
                          ) from error
    finally:
        model.train(was_training)
    shapes_only = is_meta_model(model, example_inputs)
    torch.export.save(program, path, extra_files={CKPLAN_EXTRA_FILE: json.dumps(
        {"schema": "ckplan.pt2-extra/1", "shapes_only": shapes_only, "aliases": _aliases(model)})})
    loaded = torch.export.load(path)
    if len(loaded.graph.nodes) != len(program.graph.nodes):
        raise ExportError(f"{path}: the saved program does not load back as it was saved")
    return program
