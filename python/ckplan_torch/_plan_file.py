"""Plan documents (``ckplan.plan/1``, from ``ckplan solve``): reading one, what it says (the batch, the
autocast, a rank's plan, FSDP units), and writing one."""
import json
import os
import re
from typing import IO, Any, Dict, List, Optional, Union

import torch

from ._errors import ArgumentError, PlanError

# A plan as the functions here take it: a path, a file object or the document itself.
PlanSource = Union[str, os.PathLike[str], IO[str], Dict[str, Any]]


def load_plan(plan: PlanSource) -> Dict[str, Any]:
    """Reads a plan (``ckplan.plan/1``, from ``ckplan solve``) and checks it is one.

    Args:
        plan: the plan's path, a file object open on it, or the document as a dict.

    Returns:
        The plan document (the dict itself when given one).

    Raises:
        PlanError: malformed JSON, not a ckplan plan, a plan of a newer ckplan (``ckplan.plan/2``
            and after), or no list of ``checkpoint_modules``.
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
    where = "" if isinstance(plan, dict) else f"{getattr(plan, 'name', plan)}: "
    if not isinstance(doc, dict):
        raise PlanError(f"{where}not a ckplan plan (a JSON {type(doc).__name__}, expected an object)")
    refusal = schema_refusal(doc, "plan", "ckplan solve")
    if refusal is not None:
        raise PlanError(where + refusal)
    if "checkpoint_modules" not in doc:
        raise PlanError("the plan has no 'checkpoint_modules': make it with `ckplan solve` on a profile")
    modules = doc["checkpoint_modules"]
    if not isinstance(modules, list) or not all(isinstance(p, str) for p in modules):
        raise PlanError("the plan's 'checkpoint_modules' is not a list of module paths (strings)")
    return doc


def schema_refusal(doc: Dict[str, Any], kind: str, command: str) -> Optional[str]:
    """Why ``doc`` is not a ``ckplan.KIND/1`` this package reads, or None when it is one.

    Args:
        doc: the document (a dict).
        kind: ``"plan"`` or ``"profile"``.
        command: the command that makes one (``ckplan solve``), for the fix.

    Returns:
        ``made by a newer ckplan (plan/2); this one reads plan/1: ...`` for a later version of the
        schema, ``not a ckplan plan (...)`` for anything else; None for ``ckplan.KIND/1``.
    """
    schema = doc.get("schema")
    if schema == f"ckplan.{kind}/1":
        return None
    version = re.fullmatch(rf"ckplan\.{kind}/(\d+)", schema) if isinstance(schema, str) else None
    if version is not None and int(version.group(1)) > 1:
        return (f"made by a newer ckplan ({kind}/{version.group(1)}); this one reads {kind}/1: install the "
                f"ckplan (and ckplan_torch) that made it, or make the {kind} again with this one (`{command}`)")
    return f"not a ckplan {kind} (schema {schema!r}, expected 'ckplan.{kind}/1')"


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
    """Writes beside ``path`` and renames: a failure leaves no half-written file, and raises
    ArgumentError naming ``path``."""
    path = os.fspath(path)
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "w") as f:
            json.dump(doc, f, indent=2)
            f.write("\n")
        os.replace(partial, path)
    except OSError as error:
        folder = os.path.dirname(os.path.abspath(path))
        why = (f"the folder {folder} does not exist" if not os.path.isdir(folder) else
               "it is a folder" if os.path.isdir(path) else error.strerror)
        raise ArgumentError(f"{path}: cannot write: {why}; give a file's path in a folder that exists and you may "
                            "write to") from None
    finally:
        if os.path.exists(partial):
            os.remove(partial)
