"""The eager measurement ``export`` records in the archive: per module, the most bytes its forward
holds at once as eager PyTorch runs it."""
import weakref

import torch

from ._model import _ordered_inputs, _state_restored


def _eager_module_peaks(model, args, kwargs=None):
    """Per module path, the most bytes its forward holds at once beyond what
    was held when it was called, as eager PyTorch runs it with autograd on
    the example inputs (what a wrapped module's recomputation holds in
    backward): every storage an op makes counted until it is freed, so
    Python locals that outlive their last use count too (a value kept in a
    variable until the function returns, which a graph frees at its last
    reader). One forward, no backward; the buffers (batch norm's running
    statistics) and the RNG state are restored after. None for a model or
    inputs off the CPU (another device runs other kernels)."""
    from torch.utils import _pytree
    from torch.utils._python_dispatch import TorchDispatchMode
    inputs = _ordered_inputs(args, kwargs)
    tensors = list(model.parameters()) + list(model.buffers()) + inputs
    if any(t.device.type != "cpu" for t in tensors):
        return None
    paths = {}
    for name, m in model.named_modules():
        paths.setdefault(id(m), name)
    live, storages, frames, peaks = [0], {}, [], {}

    def freed(key, nbytes):
        storages.pop(key, None)
        live[0] -= nbytes

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            # An output on an input's storage (a view, an in-place op) is no new memory.
            read = {id(t.untyped_storage()) for t in _pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            for t in _pytree.tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                s = t.untyped_storage()
                if id(s) in storages or id(s) in read or s.nbytes() == 0:
                    continue
                storages[id(s)] = s.nbytes()
                live[0] += s.nbytes()
                weakref.finalize(s, freed, id(s), s.nbytes())
            for frame in frames:
                frame[2] = max(frame[2], live[0] - frame[1])
            return out

    def enter(module, args):
        if id(module) in paths:
            frames.append([paths[id(module)], live[0], 0])

    def leave(module, args, output):
        if id(module) in paths and frames and frames[-1][0] == paths[id(module)]:
            path, _, peak = frames.pop()
            peaks[path] = max(peaks.get(path, 0), peak)

    hooks = [torch.nn.modules.module.register_module_forward_pre_hook(enter),
             torch.nn.modules.module.register_module_forward_hook(leave, always_call=True)]
    try:
        with _state_restored(model), torch.enable_grad(), Count():
            out = model(*args, **(kwargs or {}))
        del out
    except Exception:  # noqa: BLE001 - a measurement only: the archive is complete without it
        return None
    finally:
        for h in hooks:
            h.remove()
    peaks.pop("", None)
    return {"inputs": [{"shape": list(x.shape), "itemsize": x.element_size()} for x in inputs], "bytes": peaks}
