"""The job's optimizer as ckplan prices it, from a torch.optim optimizer, a name or a plan, and
``ckplan solve``'s flags for it."""
import dataclasses
import json
import os
from typing import Optional, Tuple

import torch

from ._model import _eager

# The schema of the file `ckplan solve --optimizer-groups` reads.
GROUPS_SCHEMA = "ckplan.optimizer_groups/1"


@dataclasses.dataclass(frozen=True)
class OptimizerGroup:
    """One param group of a torch.optim optimizer as ckplan prices it: torch.optim's ``step()``
    updates each group on its own, with its own options and implementation, its temporaries freed
    before the next group's.

    ``name``, ``impl`` and ``options`` as OptimizerChoice's (SGD's momentum is a group option:
    ``sgd`` or ``momentum`` per group); ``params``: the names (as the model's
    ``named_parameters()``) of the model's parameters it updates, in its order; None where the
    model was not given (its parameters not compared).
    """

    name: str
    impl: str
    options: dict = dataclasses.field(default_factory=dict)
    params: Optional[Tuple[str, ...]] = None

    def to_json(self):
        """The group as ``--optimizer-groups`` and a plan's ``fixed.optimizer_groups`` write it."""
        doc = {"optimizer": self.name, "optimizer_impl": self.impl}
        if self.options:
            doc["optimizer_options"] = dict(self.options)
        doc["params"] = list(self.params or ())
        return doc

    def prices_like(self, other):
        """The same name, implementation and options (plain SGD's without options alike however
        run: it keeps nothing and makes nothing), and the same parameters where both know them."""
        if self.params is not None and other.params is not None and self.params != other.params:
            return False
        plain = {"none", "sgd"}
        if self.name in plain and other.name in plain and not self.options and not other.options:
            return True
        return (self.name, self.impl, self.options) == (other.name, other.impl, other.options)

    def describe(self):
        """``adam (for-loop, weight_decay 0.1) over 2 parameters``."""
        options = [f"{k} {v:g}" if k == "weight_decay" else k for k, v in sorted(self.options.items())]
        text = f"{self.name} ({', '.join([self.impl] + options)})"
        count = None if self.params is None else len(self.params)
        return text if count is None else f"{text} over {count} parameter{'' if count == 1 else 's'}"


def _group_of(kind, group, names):
    """One torch.optim param group as ckplan prices it (``kind``: the optimizer's class name;
    ``names``: id of a model parameter -> its name, or None)."""
    if kind == "SGD":
        name = "momentum" if group.get("momentum", 0) else "sgd"
    else:
        name = {"Adam": "adam", "AdamW": "adamw"}.get(kind, kind.lower())
    params = group.get("params", [])
    if group.get("fused"):
        impl = "fused"
    elif group.get("foreach") is not None:
        impl = "foreach" if group["foreach"] else "for-loop"
    else:
        # What torch picks for the group (each group on its own): foreach on CUDA.
        impl = "foreach" if params and all(p.is_cuda for p in params) else "for-loop"
    options = {}
    if name in ("adam", "sgd", "momentum") and group.get("weight_decay", 0):
        options["weight_decay"] = float(group["weight_decay"])
    if name in ("adam", "adamw") and group.get("amsgrad"):
        options["amsgrad"] = True
    if name == "momentum" and group.get("nesterov"):
        options["nesterov"] = True
    held = None if names is None else tuple(names[id(p)] for p in params if id(p) in names)
    return OptimizerGroup(name, impl, options, held)


@dataclasses.dataclass(frozen=True)
class OptimizerChoice:
    """An optimizer as ckplan names it: what ``ckplan solve --optimizer`` prices (its state and its
    update's temporaries at the step's end) and a plan's ``fixed`` section records.

    ``name``: ``adamw``, ``adam``, ``sgd``, ``momentum`` (SGD with momentum) or ``none``; ``impl``:
    ``for-loop``, ``foreach`` or ``fused`` (``auto``: ckplan picks); ``options``: those that change its
    memory, each only where set: ``weight_decay`` (a float; coupled, as Adam's and SGD's), ``amsgrad``
    and ``nesterov`` (True). ``groups``: a torch.optim optimizer's param groups where it has several
    (``name``, ``impl`` and ``options`` are then the first's), each priced on its own (``ckplan solve
    --optimizer-groups``); empty for one.
    """

    name: str
    impl: str
    options: dict = dataclasses.field(default_factory=dict)
    groups: Tuple[OptimizerGroup, ...] = ()

    @classmethod
    def of(cls, optimizer, impl="auto", model=None):
        """The optimizer a job gives ``plan``: the torch.optim optimizer itself (its kind, its
        implementation as torch picks it, its options, and its groups' parameters named as
        ``model``'s) or a name (``impl`` with it, no options).
        Raises TypeError for anything else."""
        if isinstance(optimizer, torch.optim.Optimizer):
            return cls.from_torch(optimizer, model)
        if not isinstance(optimizer, str):
            raise TypeError(f"optimizer: a name ('adamw', 'adam', 'sgd', 'momentum', 'none') or a torch.optim "
                            f"optimizer, not {type(optimizer).__name__}")
        return cls(optimizer, impl)

    @classmethod
    def from_torch(cls, optimizer, model=None):
        """A torch.optim optimizer (or any object with its ``param_groups``): the implementation as torch
        picks it (foreach on CUDA, for-loop elsewhere, unless the job set ``foreach`` or ``fused``); the
        options of a coupled weight decay (Adam, SGD; AdamW's is in place), amsgrad (Adam, AdamW),
        nesterov (SGD with momentum). Several param groups: each as a group, with its own options and
        implementation (torch picks one per group), its parameters named as ``model``'s (those that
        are not the model's left out: ``check_trainable_optimizer`` warns of them); without
        ``model``, unnamed. The choice's own name, implementation and options are the first group's."""
        kind = type(optimizer).__name__
        names = None
        if model is not None:
            names = {id(p): name for name, p in _eager(model).named_parameters()}
        groups = [_group_of(kind, g, names) for g in optimizer.param_groups] or [_group_of(kind, {}, names)]
        first = groups[0]
        return cls(first.name, first.impl, first.options, tuple(groups) if len(groups) > 1 else ())

    @classmethod
    def from_plan(cls, fixed):
        """The optimizer a plan was priced for (its ``fixed`` section: ``optimizer``,
        ``optimizer_impl``, ``optimizer_options``, ``optimizer_groups``); None where the plan names
        none."""
        def options_of(doc):
            return {k: (float(v) if k == "weight_decay" else v) for k, v in doc.get("optimizer_options", {}).items()}

        if fixed.get("optimizer") is None:
            return None
        impl = fixed.get("optimizer_impl", "for-loop")
        groups = tuple(OptimizerGroup(g.get("optimizer", fixed["optimizer"]), g.get("optimizer_impl", impl),
                                      options_of(g), tuple(g.get("params", ())))
                       for g in fixed.get("optimizer_groups", ()))
        return cls(fixed["optimizer"], impl, options_of(fixed), groups)

    def prices_like(self, other):
        """Whether a plan priced for this optimizer prices ``other`` too: the same name,
        implementation and options, or both without state (plain SGD or none) and options; with
        param groups, the same groups (each's name, implementation and options, and its parameters
        where both know them). Groups and one group never price alike, even with the same options:
        each group's update runs on its own, in its own order of parameters (AdamW's weights in one
        group and biases in another: each weight's denominator made beside the previous weight's,
        more than one group in the model's order makes)."""
        if not self.groups and not other.groups:
            plain = {"none", "sgd"}
            if self.name in plain and other.name in plain and not self.options and not other.options:
                return True
            return (self.name, self.impl, self.options) == (other.name, other.impl, other.options)
        if len(self.groups) != len(other.groups):
            return False
        return all(a.prices_like(b) for a, b in zip(self.groups, other.groups))

    def describe(self):
        """The optimizer in words: its ``ckplan solve`` flags; with groups, each group's."""
        flags = " ".join(self.solve_flags())
        if not self.groups:
            return flags
        return f"{len(self.groups)} param groups: " + "; ".join(g.describe() for g in self.groups)

    def solve_flags(self):
        """``ckplan solve``'s optimizer flags, as a list: the optimizer (momentum: SGD with momentum
        0.9), its implementation and its options (the first group's: its groups are
        ``groups_flags``')."""
        flags = ["--optimizer", "sgd", "--momentum", "0.9"] if self.name == "momentum" else ["--optimizer", self.name]
        flags += ["--optimizer-impl", self.impl]
        if "weight_decay" in self.options:
            flags += ["--weight-decay", f"{self.options['weight_decay']:g}"]
        return flags + [f"--{key}" for key in ("amsgrad", "nesterov") if self.options.get(key)]

    def groups_flags(self, work):
        """``ckplan solve``'s ``--optimizer-groups FILE`` for the param groups, the file
        (``ckplan.optimizer_groups/1``) written in the folder ``work``; [] without groups."""
        if not self.groups:
            return []
        path = os.path.join(work, "optimizer_groups.json")
        with open(path, "w") as f:
            json.dump({"schema": GROUPS_SCHEMA, "groups": [g.to_json() for g in self.groups]}, f, indent=1)
            f.write("\n")
        return ["--optimizer-groups", path]


def plan_groups_flags(doc, work):
    """``--optimizer-groups`` for the param groups a plan (``doc``) was priced for, their file
    written in ``work``: what ``ckplan report`` needs to price the plan's optimizer again."""
    choice = OptimizerChoice.from_plan(doc.get("fixed", {})) if isinstance(doc.get("fixed"), dict) else None
    return choice.groups_flags(work) if choice is not None else []
