"""What the package reads from a model and its example inputs: the module a compiled model runs, its
device, whether it is on the meta device, the example tensors in the order a program takes them."""
import contextlib
from typing import Sequence

import torch


def _eager(model):
    """The module a ``torch.compile``d model runs (its ``_orig_mod``): its
    module paths are the plan's, without the ``_orig_mod.`` prefix."""
    return getattr(model, "_orig_mod", model) if type(model).__name__ == "OptimizedModule" else model


def _first_batch(args, kwargs):
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value.shape[0]
    return None


def is_meta_model(model: torch.nn.Module, example_inputs: Sequence[object] = ()) -> bool:
    """Whether the model is on the meta device (built under ``with torch.device("meta")``, no weights).

    Args:
        model: the model.
        example_inputs: its example inputs; values other than tensors are ignored.

    Returns:
        True when any parameter, buffer or input tensor is on the meta device (no data).
    """
    tensors = list(model.parameters()) + list(model.buffers()) + [x for x in example_inputs if isinstance(x, torch.Tensor)]
    return any(t.device.type == "meta" for t in tensors)


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


def _model_device(model):
    for tensor in list(model.parameters()) + list(model.buffers()):
        return tensor.device
    return torch.device("cpu")
