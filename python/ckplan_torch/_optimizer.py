"""The job's optimizer as ckplan names it, and ``ckplan solve``'s flags for it."""
import torch


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


def _optimizer_flags(optimizer, optimizer_impl):
    """``ckplan solve``'s optimizer flags: from a name (``adamw``, ``adam``, ``sgd``, ``momentum``,
    ``none``) or from the job's torch.optim optimizer itself (its kind, implementation and options)."""
    if isinstance(optimizer, torch.optim.Optimizer):
        name, impl = _optimizer_of(optimizer)
        return _solve_flags(name, impl, _optimizer_options_of(optimizer, name))
    if not isinstance(optimizer, str):
        raise TypeError(f"optimizer: a name ('adamw', 'adam', 'sgd', 'momentum', 'none') or a torch.optim "
                        f"optimizer, not {type(optimizer).__name__}")
    return _solve_flags(optimizer, optimizer_impl, {})
