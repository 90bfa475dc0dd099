"""The job's optimizer as ckplan prices it, from a torch.optim optimizer, a name or a plan, and
``ckplan solve``'s flags for it."""
import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class OptimizerChoice:
    """An optimizer as ckplan names it: what ``ckplan solve --optimizer`` prices (its state and its
    update's temporaries at the step's end) and a plan's ``fixed`` section records.

    ``name``: ``adamw``, ``adam``, ``sgd``, ``momentum`` (SGD with momentum) or ``none``; ``impl``:
    ``for-loop``, ``foreach`` or ``fused`` (``auto``: ckplan picks); ``options``: those that change its
    memory, each only where set: ``weight_decay`` (a float; coupled, as Adam's and SGD's), ``amsgrad``
    and ``nesterov`` (True).
    """

    name: str
    impl: str
    options: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, optimizer, impl="auto"):
        """The optimizer a job gives ``plan``: the torch.optim optimizer itself (its kind, its
        implementation as torch picks it, its options) or a name (``impl`` with it, no options).
        Raises TypeError for anything else."""
        if isinstance(optimizer, torch.optim.Optimizer):
            return cls.from_torch(optimizer)
        if not isinstance(optimizer, str):
            raise TypeError(f"optimizer: a name ('adamw', 'adam', 'sgd', 'momentum', 'none') or a torch.optim "
                            f"optimizer, not {type(optimizer).__name__}")
        return cls(optimizer, impl)

    @classmethod
    def from_torch(cls, optimizer):
        """A torch.optim optimizer (or any object with its ``param_groups``): the implementation as torch picks it (foreach on CUDA, for-loop
        elsewhere, unless the job set ``foreach`` or ``fused``); the options of a coupled weight decay
        (Adam, SGD; AdamW's is in place), amsgrad (Adam, AdamW), nesterov (SGD with momentum). Several
        param groups: the first's."""
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
        options = {}
        if name in ("adam", "sgd", "momentum") and group.get("weight_decay", 0):
            options["weight_decay"] = float(group["weight_decay"])
        if name in ("adam", "adamw") and group.get("amsgrad"):
            options["amsgrad"] = True
        if name == "momentum" and group.get("nesterov"):
            options["nesterov"] = True
        return cls(name, impl, options)

    @classmethod
    def from_plan(cls, fixed):
        """The optimizer a plan was priced for (its ``fixed`` section: ``optimizer``,
        ``optimizer_impl``, ``optimizer_options``); None where the plan names none."""
        options = {k: (float(v) if k == "weight_decay" else v) for k, v in fixed.get("optimizer_options", {}).items()}
        if fixed.get("optimizer") is None:
            return None
        return cls(fixed["optimizer"], fixed.get("optimizer_impl", "for-loop"), options)

    def prices_like(self, other):
        """Whether a plan priced for this optimizer prices ``other`` too: the same name,
        implementation and options, or both without state (plain SGD or none) and options."""
        plain = {"none", "sgd"}
        if self.name in plain and other.name in plain and not self.options and not other.options:
            return True
        return (self.name, self.impl, self.options) == (other.name, other.impl, other.options)

    def solve_flags(self):
        """``ckplan solve``'s optimizer flags, as a list: the optimizer (momentum: SGD with momentum
        0.9), its implementation and its options."""
        flags = ["--optimizer", "sgd", "--momentum", "0.9"] if self.name == "momentum" else ["--optimizer", self.name]
        flags += ["--optimizer-impl", self.impl]
        if "weight_decay" in self.options:
            flags += ["--weight-decay", f"{self.options['weight_decay']:g}"]
        return flags + [f"--{key}" for key in ("amsgrad", "nesterov") if self.options.get(key)]
