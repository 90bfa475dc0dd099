"""A training step's peak by PyTorch's own accounting, for the Python tests:
the profiler's memory timeline (every CPU allocation and free, what existed
before the window as pre-existing)."""
import gc

import torch
from torch.profiler import ProfilerActivity, profile
from torch.profiler._memory_profiler import Action


def timeline_peak(run, held=()):
    """The peak of the memory live while ``run()`` runs, in bytes.

    The timeline lists only the storages the window touched; ``held`` are
    tensors alive throughout (the model's parameters and buffers) counted
    all the same when it does not (a buffer no op reads, as transformers'
    Llama keeps `original_inv_freq` beside the `inv_freq` it uses)."""
    held_storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in held}
    # Garbage from before (an earlier optimizer's state in a reference cycle)
    # collected inside the window would show as memory held at its start.
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        run()
    timeline = prof._memory_profile().timeline
    seen = {key.storage.ptr for _, _, (key, _), _ in timeline if hasattr(key, "storage")}
    live = peak = sum(size for ptr, size in held_storages.items() if ptr not in seen)
    for _, action, _, size in timeline:
        if action in (Action.PREEXISTING, Action.CREATE):
            live += size
        elif action == Action.DESTROY:
            live -= size
        peak = max(peak, live)
    return peak


def model_tensors(model):
    return list(model.parameters()) + list(model.buffers())


def restored_after(model):
    """A context that puts the model's weights and buffers back as they were
    (in place, state_dict's tensors sharing the parameters' storages: a
    module's own _load_from_state_dict may want metadata a plain dict lacks,
    as torchvision's MNASNet does) and drops its gradients."""
    class _Restore:
        def __enter__(self):
            self.saved = {k: v.clone() for k, v in model.state_dict().items()}
            return self

        def __exit__(self, *exc):
            model.zero_grad(set_to_none=True)
            with torch.no_grad():
                for name, value in model.state_dict().items():
                    value.copy_(self.saved[name])
            return False
    return _Restore()


def training_step_peak(model, make_optimizer, forward):
    """A training step's peak after the first (which makes the optimizer's
    state), the smaller of two measured, the weights put back after: as a
    loop runs it, zero_grad(), ``out, loss = forward()``, backward, step(),
    the output held to the step's end (``out = model(...)`` holds it).

    The step is deterministic: the smaller of two keeps a one-off allocation
    in the window that is not the step's (vit once measured 8.6 MB above its
    other steps in a fresh clone's CI) from failing a plan that holds."""
    with restored_after(model):
        optimizer = make_optimizer(model.parameters())

        def step():
            optimizer.zero_grad()
            out, loss = forward()
            loss.backward()
            optimizer.step()

        step()
        return min(timeline_peak(step, model_tensors(model)) for _ in range(2))


def gradients(model, forward, params=None):
    """The gradients of ``params`` (default: the model's parameters) after one ``forward()`` returning
    ``(out, loss)`` and its backward, seed 0 (dropout's masks alike from call to call); the model's
    gradients dropped before and after."""
    params = list(model.parameters()) if params is None else list(params)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)
    _, loss = forward()
    loss.backward()
    out = [p.grad.clone() for p in params]
    model.zero_grad(set_to_none=True)
    return out
