"""Apply a ckplan plan to a PyTorch model: wrap the modules the plan names with
torch.utils.checkpoint, and undo it.

    import ckplan_torch
    ckplan_torch.apply_plan(model, "plan.json")   # before training
    ...
    ckplan_torch.remove_plan(model)

and exports a model for `ckplan profile model.pt2` (torch.export, training IR):

    ckplan_torch.export(model, (x,), "model.pt2")

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

__all__ = ["apply_plan", "remove_plan", "load_plan", "checkpointed_modules", "export", "ExportError"]

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


def _wrap(module):
    original = module.forward
    non_reentrant = _supports_non_reentrant()

    @functools.wraps(original)
    def forward(*args, **kwargs):
        if not torch.is_grad_enabled():
            return original(*args, **kwargs)
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
    torch.export.save(program, path)
    loaded = torch.export.load(path)
    if len(loaded.graph.nodes) != len(program.graph.nodes):
        raise ExportError(f"{path}: the saved program does not load back as it was saved")
    return program
