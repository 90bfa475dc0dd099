"""What the user's own model or example inputs do wrong, told in one line: the forward run once
eagerly (without gradients, the buffers and RNG state put back), and where it raised, on what, and
what that module takes; and ``ckplan``'s messages about the inputs told with the Python arguments'
names instead of the CLI's ``--input``."""
import re
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ._model import _state_restored

# A name and a tensor of the example inputs, in the order the exported program takes them.
NamedTensor = Tuple[str, torch.Tensor]

_TARGET_KEY = re.compile(r"ckplan_target_(\d+)")


def named_inputs(args: Sequence[Any], kwargs: Dict[str, Any], args_name: str = "args") -> List[NamedTensor]:
    """The example tensors as the caller wrote them (``example_inputs[0]``, ``kwargs['labels']``,
    ``example_inputs[1][0]['boxes']``, a loss's ``targets[0]``), in the order of ``_ordered_inputs``."""
    from torch.utils import _pytree
    named = []

    def add(base, value):
        for path, leaf in _pytree.tree_flatten_with_path(value)[0]:
            if isinstance(leaf, torch.Tensor):
                named.append((base + _pytree.keystr(path), leaf))

    for i, value in enumerate(args):
        add(f"{args_name}[{i}]", value)
    for key, value in kwargs.items():
        target = _TARGET_KEY.fullmatch(str(key))
        add(f"targets[{target.group(1)}]" if target else f"kwargs[{key!r}]", value)
    return named


def describe(t: torch.Tensor) -> str:
    """A tensor as the messages show it: ``(4, 9) float32``, and its device when not the CPU."""
    dtype = str(t.dtype).replace("torch.", "")
    return f"{tuple(t.shape)} {dtype}" + ("" if t.device.type == "cpu" else f" on {t.device}")


def _text(error: BaseException, limit: int = 300) -> str:
    """The first line of an exception's message, at most ``limit`` characters."""
    lines = str(error).strip().splitlines()
    text = lines[0].strip() if lines else ""
    return text[:limit] + "..." if len(text) > limit else text


def _first_line(error: BaseException, limit: int = 300) -> str:
    """``Kind: the first line of its message``."""
    text = _text(error, limit)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _takes(module: torch.nn.Module) -> Optional[str]:
    """What a module of torch.nn takes, as a shape (``(..., 8) float32``), or None for others."""
    weight = getattr(module, "weight", None)
    dtype = f" {str(weight.dtype).replace('torch.', '')}" if isinstance(weight, torch.Tensor) else ""
    if isinstance(module, torch.nn.Linear):
        return f"(..., {module.in_features}){dtype}"
    if isinstance(module, (torch.nn.Embedding, torch.nn.EmbeddingBag)):
        return f"integer ids in 0..{module.num_embeddings - 1}"
    if isinstance(module, torch.nn.modules.conv._ConvNd):
        spatial = {1: ["L"], 2: ["H", "W"], 3: ["D", "H", "W"]}.get(len(module.kernel_size), ["..."])
        return f"(N, {', '.join([str(module.in_channels)] + spatial)}){dtype}"
    if isinstance(module, torch.nn.LayerNorm):
        return f"(..., {', '.join(str(d) for d in module.normalized_shape)})"
    if isinstance(module, (torch.nn.modules.batchnorm._NormBase, torch.nn.GroupNorm)):
        channels = getattr(module, "num_features", None) or getattr(module, "num_channels", None)
        return f"(N, {channels}, ...)"
    return None


def _input_named(tensor: torch.Tensor, named: List[NamedTensor]) -> Optional[str]:
    """The example input a module was given: itself, or a view of it (token ids flattened)."""
    for name, t in named:
        if t is tensor:
            return name

    def storage(t):
        try:
            return t.untyped_storage().data_ptr() if t.device.type != "meta" else 0
        except (RuntimeError, NotImplementedError):
            return 0

    address = storage(tensor)
    for name, t in named:
        if address and storage(t) == address:
            return name if t.shape == tensor.shape else f"its input, a view of {name},"
    return None


def _device_mismatch(model: torch.nn.Module, named: List[NamedTensor]) -> Optional[str]:
    """``the model is on meta and example_inputs[0] on cpu; ...`` when an input is on another device
    than the model's parameters, else None."""
    devices = {t.device for t in list(model.parameters()) + list(model.buffers())}
    if len(devices) != 1:
        return None  # no weights, or spread over devices on purpose: the inputs' device is the model's to say
    device = devices.pop()
    for name, t in named:
        if t.device != device:
            how = ("make the inputs on the meta device too (with torch.device('meta'), or x.to('meta'))"
                   if device.type == "meta" else f"move the inputs there (x.to('{device}'))")
            return f"the model is on {device} and {name} on {t.device}: {how}"
    return None


def _holds_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):  # a ModelOutput is one
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def forward_failure(model: torch.nn.Module, forward: Callable[..., Any], args: Sequence[Any],
                    kwargs: Dict[str, Any], named: List[NamedTensor], args_name: str = "args",
                    loss: Optional[Tuple[str, Callable[..., Any], Sequence[torch.Tensor]]] = None,
                    check_output: bool = True) -> Optional[str]:
    """Runs ``forward(*args, **kwargs)`` (the model's own forward, bound) once eagerly, without
    gradients, its buffers and the RNG state put back after, and the loss after it when given.

    Args:
        model: the model whose forward it is.
        forward: the forward to run (the model's, as it was before export replaced it).
        args, kwargs: the example inputs (without a loss's targets).
        named: the example tensors with their names (``named_inputs``), for the message.
        args_name: what the caller calls the positional inputs (``example_inputs``, ``args``).
        loss: (its name, ``loss_fn``, the targets), run on the output.
        check_output: refuse an output that holds no tensor.

    Returns:
        One line saying what the forward (or the loss) raised, where, on what, and the fix; or
        None when it runs.
    """
    paths = {}
    for name, module in model.named_modules():
        paths.setdefault(id(module), name)
    frames = [(model, "", tuple(args))]  # the modules running, innermost last, with their inputs

    def enter(module, inputs):
        frames.append((module, paths.get(id(module)), inputs))

    def leave(module, inputs, output):
        if len(frames) > 1 and frames[-1][0] is module:
            frames.pop()

    call = f"model(*{args_name}, **kwargs)"
    model_name = type(model).__name__
    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave)]
    try:
        with _state_restored(model), torch.no_grad():
            out = forward(*args, **kwargs)
    except Exception as error:  # noqa: BLE001 - the user's code raises anything: its kind is told
        module, path, inputs = frames[-1]
        where = "" if module is model else (f" in module '{path}' ({type(module).__name__})" if path is not None
                                             else f" in a {type(module).__name__} the model does not hold")
        text = _text(error)
        head = f"{model_name}: the forward raised {type(error).__name__}{where}" + (f": {text}" if text else "")
        mismatch = _device_mismatch(model, named)
        if mismatch:
            return f"{head}; {mismatch}"
        first = next((x for x in inputs if isinstance(x, torch.Tensor)), None) if module is not model else None
        takes = _takes(module) if first is not None else None
        if takes is not None:
            given = _input_named(first, named) or "its input"
            return (f"{head}; {type(module).__name__} '{path}' takes {takes} and {given} is {describe(first)}: "
                    f"give {args_name} as the training step passes them ({call} must run)")
        shown = ", ".join(f"{name} {describe(t)}" for name, t in named[:4]) + (", ..." if len(named) > 4 else "")
        return f"{head}; given {shown or 'no tensor'}, {call} must run as it does in the training step"
    finally:
        for h in hooks:
            h.remove()
    if check_output and not _holds_tensor(out):
        return (f"{model_name}: the forward returned {type(out).__name__}, not a tensor: the forward must return "
                f"a tensor or a structure of tensors (a tuple, list or dict of them, a ModelOutput), e.g. the loss "
                f"or the logits before .item() or float()")
    if loss is not None:
        loss_name, loss_fn, targets = loss
        try:
            with torch.no_grad():
                loss_fn(out, *targets)
        except Exception as error:  # noqa: BLE001
            given = ", ".join(f"targets[{i}] {describe(t)}" for i, t in enumerate(targets)) or "no targets"
            return (f"loss_fn ({loss_name}) raised {_first_line(error)} on the forward's output and {given}; "
                    f"give the targets it takes beside the output (targets=), batch first")
    return None


def in_python_terms(message: str, archive: str, model_name: str, named_specs: List[Tuple[str, str]]) -> str:
    """``ckplan profile``'s message about the archive plan() exported, told with the model's name
    for the archive's path and the Python arguments' names for ``--input SPEC``.

    Args:
        message: ckplan's one line.
        archive: the archive's path, as ckplan was given it.
        model_name: the model's class name.
        named_specs: (the input's Python name, its ``--input`` text), in the program's order.
    """
    exported = f"the exported {model_name}"
    message = message.replace(f"{archive}: ", f"{exported}: ").replace(archive, exported)
    specs = [spec for _, spec in named_specs]
    python = ", ".join(f"{name} {spec}" for name, spec in named_specs)
    for joined in (", ".join(specs), " ".join(specs)) if len(specs) > 1 else ():
        message = message.replace(f"--input {joined}", python)
    for name, spec in sorted(named_specs, key=lambda pair: -len(pair[1])):
        message = re.sub(rf"--input {re.escape(spec)}(?: \(input \d+\))?", f"{name} {spec}", message)
    return message.replace("--input", "example_inputs")
