"""Plan documents (``ckplan.plan/1``, from ``ckplan solve``): reading one, what it says (the batch, the
autocast, a rank's plan, FSDP units), and writing one."""
import json
import os
from typing import IO, Any, Dict, List, Optional, Union

import torch

from ._errors import PlanError

# A plan as the functions here take it: a path, a file object or the document itself.
PlanSource = Union[str, os.PathLike[str], IO[str], Dict[str, Any]]


def load_plan(plan: PlanSource) -> Dict[str, Any]:
    """Reads a plan (``ckplan.plan/1``, from ``ckplan solve``) and checks it is one.

    Args:
        plan: the plan's path, a file object open on it, or the document as a dict.

    Returns:
        The plan document (the dict itself when given one).

    Raises:
        PlanError: malformed JSON, not a ckplan plan, or no list of ``checkpoint_modules``.
    """
    try:
        if isinstance(plan, dict):
            doc = plan
        elif hasattr(plan, "read"):
            doc = json.load(plan)
        else:
            with open(plan) as f:
                doc = json.load(f)
    except RecursionError:
        raise PlanError("not a ckplan plan: JSON nested too deeply") from None
    except json.JSONDecodeError as e:
        where = getattr(plan, "name", plan) if not isinstance(plan, dict) else "the plan"
        raise PlanError(f"{where}: malformed JSON ({e}): make the plan again with `ckplan solve`") from None
    if not isinstance(doc, dict):
        raise PlanError(f"not a ckplan plan (a JSON {type(doc).__name__}, expected an object)")
    if doc.get("schema") != "ckplan.plan/1":
        raise PlanError(f"not a ckplan plan (schema {doc.get('schema')!r}, expected 'ckplan.plan/1')")
    if "checkpoint_modules" not in doc:
        raise PlanError("the plan has no 'checkpoint_modules': make it with `ckplan solve` on a profile")
    modules = doc["checkpoint_modules"]
    if not isinstance(modules, list) or not all(isinstance(p, str) for p in modules):
        raise PlanError("the plan's 'checkpoint_modules' is not a list of module paths (strings)")
    return doc


def _describe_bytes(n, style="decimal"):
    """Bytes as ckplan prints them: decimal units (GB) or binary ones (GiB, a plan's unit_style "binary")."""
    units = ((("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)) if style == "binary" else
             (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)))
    for unit, size in units:
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def plan_batch(plan: PlanSource) -> Optional[int]:
    """The batch a plan is for.

    Args:
        plan: the plan (as ``load_plan`` takes it).

    Returns:
        Its ``batch`` (written by ``ckplan solve``), else the first dimension of its profile's first
        input; None when unknown.
    """
    doc = load_plan(plan)
    if isinstance(doc.get("batch"), int):
        return doc["batch"]
    inputs = (doc.get("source") or {}).get("inputs") or []
    shape = inputs[0].get("shape") if inputs and isinstance(inputs[0], dict) else None
    return shape[0] if isinstance(shape, list) and shape and isinstance(shape[0], int) else None


def plan_autocast(plan: PlanSource) -> Optional[torch.dtype]:
    """The autocast dtype the plan's profile ran the forward and loss under.

    Args:
        plan: the plan (as ``load_plan`` takes it).

    Returns:
        ``torch.bfloat16`` or ``torch.float16``, or None (no autocast).
    """
    name = (load_plan(plan).get("source") or {}).get("autocast")
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name) if isinstance(name, str) else None


def rank_plan(plan: PlanSource, stage: Optional[int] = None) -> Dict[str, Any]:
    """The plan one rank applies (``ckplan solve --data-parallel N --shard MODE``, ``--pipeline P``).

    A data-parallel plan is the same on every rank (the whole document); a pipeline plan holds one
    plan per stage under ``distributed.stages``.

    Args:
        plan: the plan (as ``load_plan`` takes it).
        stage: the pipeline stage's index; required for a pipeline plan.

    Returns:
        The rank's plan document.

    Raises:
        PlanError: a pipeline plan without a stage, or one it does not have.
    """
    doc = load_plan(plan)
    stages = doc.get("distributed", {}).get("stages")
    if stages is None:
        return doc
    if stage is None or not 0 <= stage < len(stages):
        raise PlanError(f"the plan has {len(stages)} pipeline stages: pass stage=0..{len(stages) - 1}"
                        f" (got {stage!r})")
    return stages[stage]


def fsdp_units(plan: PlanSource) -> List[str]:
    """The module paths the plan's memory model takes as FSDP units.

    Args:
        plan: the plan (as ``load_plan`` takes it).

    Returns:
        The paths to call ``fully_shard`` on, in this order, before the model itself (the root);
        empty for a plan that is not data-parallel.
    """
    return list(load_plan(plan).get("distributed", {}).get("fsdp_units", []))


def _write_json(path, doc):
    """Writes beside ``path`` and renames: a failure leaves no half-written file."""
    path = os.fspath(path)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
