"""``export``: a model as a ``.pt2`` archive for ``ckplan profile`` (torch.export, training IR), with
the job's loss and autocast, and the record ckplan reads beside the program."""
import contextlib
import functools
import inspect
import json
import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._diagnosis import _first_line, forward_failure, named_inputs
from ._errors import ExportError
from ._measure import _eager_module_peaks
from ._model import _is_container, _ordered_inputs, _state_restored, is_meta_model
from ._torch_log import ExportLog, quiet, torch_log_to
from ._transformers import _caches_off, _follow_eager, _model_output_fields


# The archive's ckplan record (extra/ckplan.json): {"schema": "ckplan.pt2-extra/1",
# "shapes_only": bool, "aliases": {name: name}}; shapes_only: the weights are
# meta tensors (no data); aliases: tied weights (one tensor under two names).
CKPLAN_EXTRA_FILE = "ckplan.json"


def _aliases(model):
    """Tied weights: {name: the first name of the same tensor} (a meta
    archive cannot tell them apart by their storages: none has data)."""
    first, aliases = {}, {}
    named = list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    for name, t in named:
        if id(t) in first:
            aliases[name] = first[id(t)]
        else:
            first[id(t)] = name
    return aliases


def _namedtuple_in(spec):
    """The first namedtuple class in a pytree spec (the program's outputs), or None."""
    if spec is None:
        return None
    # The class is the spec's type in older torch, its context in newer.
    for kind in (getattr(spec, "type", None), getattr(spec, "context", None)):
        if isinstance(kind, type) and issubclass(kind, tuple) and hasattr(kind, "_fields"):
            return kind
    children = spec.children() if callable(getattr(spec, "children", None)) else getattr(spec, "children_specs", [])
    for child in children:
        found = _namedtuple_in(child)
        if found is not None:
            return found
    return None


def _plain(value):
    """The value with each namedtuple in it (in tuples, lists, dicts) a plain tuple of its fields."""
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if type(value) is list:
        return [_plain(v) for v in value]
    if type(value) is dict:
        return {k: _plain(v) for k, v in value.items()}
    return value


def _dynamic_batch_shapes(model, args, kwargs, seq=False):
    """torch.export's dynamic_shapes with the first dimension of every input
    one dimension `batch`, and with ``seq`` the second dimension of every
    integer input of two or more (token ids, labels, masks) dynamic too
    (`Dim.AUTO`: export works out which of them must agree): a tuple for
    positional inputs alone, else a dict by forward's parameter names (None
    where the inputs cannot be named)."""
    batch = torch.export.Dim("batch", min=1, max=1 << 20)

    def spec(x):
        # A container of tensors (a list of images, a dict of targets) or a
        # Python value: static (what its first dimension is, nothing says).
        if not isinstance(x, torch.Tensor) or x.dim() == 0:
            return None
        dims = {0: batch}
        if seq and x.dim() >= 2 and not x.is_floating_point() and x.dtype != torch.bool:
            dims[1] = torch.export.Dim.AUTO
        return dims

    if not kwargs:
        return tuple(spec(x) for x in args)
    try:
        signature = inspect.signature(model.forward)
        bound = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None
    plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(signature.parameters[name].kind not in plain for name in bound):
        return None  # passed through *args or **kwargs: no name to give a shape
    return {name: spec(value) for name, value in bound.items()}


@contextlib.contextmanager
def _forward_replaced(model, forward):
    """``model.forward`` is ``forward`` (an instance attribute, removed after) while the model is
    exported: the module paths and parameter names stay the model's own."""
    had_forward = "forward" in model.__dict__
    previous = model.__dict__.get("forward")
    model.forward = forward
    try:
        yield
    finally:
        if had_forward:
            model.forward = previous
        else:
            del model.forward


def _plain_call_paths(model, args, kwargs, paths):
    """Of ``paths``, the modules whose every call takes tensors, numbers, bools, None and containers of
    them, found by one forward without gradients (the buffers and RNG state put back after): a module
    called with a string (a layer type) or an object cannot keep its call signature in torch.export."""
    from torch.utils import _pytree
    names = {id(m): n for n, m in model.named_modules()}
    odd = set()

    def check(module, a, k):
        for leaf in _pytree.tree_leaves((a, k)):
            if not isinstance(leaf, (torch.Tensor, int, float, bool, type(None))):
                odd.add(names.get(id(module)))

    hook = torch.nn.modules.module.register_module_forward_pre_hook(
        lambda module, a: check(module, a, {}))
    hooks = [hook] + [m.register_forward_pre_hook(lambda module, a, k: check(module, (), k), with_kwargs=True)
                      for m in model.modules()]
    try:
        with _state_restored(model), torch.no_grad(), _follow_eager(model, args, kwargs):
            model(*args, **(kwargs or {}))
    except Exception:  # noqa: BLE001 - only a narrowing: the export says what fails
        return paths
    finally:
        for h in hooks:
            h.remove()
    return tuple(p for p in paths if p not in odd)


def _export_program(model, args, kwargs, dynamic_batch, dynamic_seq=False, diagnose=None, where=lambda: ""):
    # Every module's call signature is kept in the program (the graph is the
    # same): the tensors each module is called with, those its ops never read
    # included (a decoder layer's position ids), which torch.utils.checkpoint
    # holds when the module is wrapped. A model whose signatures cannot be
    # kept is exported without them, with a warning.
    # At the first failure, diagnose() raises ExportError when the model's own
    # forward fails eagerly too (a wrong shape, its own exception): no other
    # way of exporting changes that. where(): where torch's log is, for messages.
    paths = tuple(name for name, _ in model.named_modules() if name)
    diagnosed = []

    def trace(dynamic_shapes, signatures=()):
        with quiet():  # a failing export prints the graph it traced: into the log
            return torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes, strict=False,
                                       **({"preserve_module_call_signature": signatures} if signatures else {}))

    def attempt(dynamic_shapes):
        with _follow_eager(model, args, kwargs):
            try:
                return trace(dynamic_shapes, paths)
            except ExportError:
                raise  # the job's own code refused (loss_fn): no other way of exporting changes that
            except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
                if diagnose is not None and not diagnosed:
                    diagnosed.append(True)
                    diagnose()
                if not paths:
                    raise
                # torch.export keeps no signature of a module called with a
                # string (Gemma's rotary embedding, given its layer type):
                # the others' are kept.
                plain = _plain_call_paths(model, args, kwargs, paths)
                if plain != paths:
                    try:
                        return trace(dynamic_shapes, plain)
                    except ExportError:
                        raise
                    except Exception:  # noqa: BLE001
                        pass
                # A model that does not export at all raises its own reason here.
                program = trace(dynamic_shapes)
                warnings.warn(f"ckplan_torch.export: the modules' call signatures cannot be kept "
                              f"({_first_line(error)[:200]}); exported without them: a wrapped module's "
                              f"arguments its ops never read are not counted")
                return program

    dynamic_shapes = _dynamic_batch_shapes(model, args, kwargs) if dynamic_batch else None
    if dynamic_shapes is not None and any(isinstance(x, torch.Tensor) and x.dim() > 0 and x.shape[0] == 1
                                          for x in _ordered_inputs(args, kwargs)):
        warnings.warn("ckplan_torch.export: the example inputs have batch 1, and torch.export specializes a "
                      "dimension of size 1: the archive runs batch 1 only. Export with a batch of 2 or more to "
                      "profile it at other batches (ckplan solve MODEL --batch auto)")
    seq_shapes = _dynamic_batch_shapes(model, args, kwargs, seq=True) if dynamic_batch and dynamic_seq else None
    if seq_shapes is not None:
        # The sequence too where the model allows it; else the batch alone, with a warning.
        try:
            return attempt(seq_shapes)
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
            warnings.warn(f"ckplan_torch.export: the sequence dimension cannot be dynamic "
                          f"({str(error).splitlines()[0][:200]}); exported with a dynamic batch only")
    try:
        try:
            return attempt(dynamic_shapes)
        except ExportError:
            raise
        except Exception as error:  # noqa: BLE001 - PyTorch raises many kinds
            if dynamic_shapes is None:
                raise
            # A model whose code fixes the batch size (a reshape to a
            # constant): export it with static shapes, and say so.
            warnings.warn(f"ckplan_torch.export: the batch dimension cannot be dynamic "
                          f"({str(error).splitlines()[0][:200]}); exported with the example's batch size")
            return attempt(None)
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001
        reason = _first_line(error)
        if "cache_utils" in reason:  # transformers' key-value cache as an output
            fix = "export it without the cache: pass use_cache=False, or set model.config.use_cache = False"
        else:
            fix = ("make forward traceable by torch.export (no Python branches on tensor values, tensors in and out), "
                   "or save a trace (torch.jit.trace(model.train(), inputs).save(\"model.pt\")) and profile that")
        raise ExportError(f"torch.export could not export {type(model).__name__}: {reason}; {fix}{where()}") from None


def _export_plain_outputs(model, args, kwargs, dynamic_batch, field=None, dynamic_seq=False, diagnose=None,
                          where=lambda: ""):
    """The model exported with its forward returning plain tuples where it
    returns namedtuples (torch.export.save cannot save a namedtuple output
    spec), or only its output's `field` when given (a ModelOutput's
    logits), through an instance attribute `forward` that is removed after:
    the module paths and parameter names stay the model's own."""
    original = model.forward

    @functools.wraps(original)
    def forward(*a, **k):
        out = original(*a, **k)
        return out[field] if field is not None else _plain(out)

    with _forward_replaced(model, forward):
        return _export_program(model, args, kwargs, dynamic_batch, dynamic_seq, diagnose, where)


_TARGET_NAME = "ckplan_target_{}"


def _loss_name(loss_fn):
    """How a loss function is named in messages and the archive's record."""
    if isinstance(loss_fn, torch.nn.Module):
        return type(loss_fn).__name__
    name = getattr(loss_fn, "__qualname__", None) or getattr(loss_fn, "__name__", None)
    module = getattr(loss_fn, "__module__", None)
    return f"{module}.{name}" if name and module and module != "__main__" else (name or type(loss_fn).__name__)


@contextlib.contextmanager
def _with_loss(model, loss_fn, count):
    """While the model is exported, its forward is the job's step up to the
    loss: ``out = model(...)``, ``loss = loss_fn(out, *targets)``, returning
    ``(loss, *the tensors in out)`` (the loss first: ckplan back-propagates
    it; the model's outputs after it, which the training loop holds through
    ``backward()`` and ``optimizer.step()``). The targets come as keyword-only
    arguments ``ckplan_target_0``... (the program's last inputs). An instance
    attribute ``forward``, removed after: the module paths and parameter
    names stay the model's own."""
    from torch.utils import _pytree
    original = model.forward
    names = [_TARGET_NAME.format(i) for i in range(count)]

    def forward(*args, **kwargs):
        targets = [kwargs.pop(name) for name in names]
        out = original(*args, **kwargs)
        loss = loss_fn(out, *targets)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ExportError(f"loss_fn ({_loss_name(loss_fn)}) returned "
                              f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}: "
                              "it must return the scalar loss the job calls backward() on (reduction='mean' or "
                              "'sum', not 'none')")
        leaves = [t for t in _pytree.tree_leaves(_plain(out)) if isinstance(t, torch.Tensor)]
        return (loss.reshape(()), *leaves)

    signature = inspect.signature(original)
    params = list(signature.parameters.values())
    tail = [p for p in params if p.kind == inspect.Parameter.VAR_KEYWORD]
    head = [p for p in params if p.kind != inspect.Parameter.VAR_KEYWORD]
    targets = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY) for name in names]
    forward.__signature__ = signature.replace(parameters=head + targets + tail)
    forward.__name__ = "forward"
    with _forward_replaced(model, forward):
        yield


def _loss_dict_keys(spec):
    """The keys of a plain dict of losses the program returns (every key naming a loss: torchvision's
    detection models in training, ``{"loss_classifier": ..., "loss_box_reg": ...}``), or None."""
    if getattr(spec, "type", None) is not dict:
        return None
    keys = [str(k) for k in (getattr(spec, "context", None) or [])]
    return keys if keys and all("loss" in k for k in keys) else None


def _sum_losses(out):
    """The loss of a model returning a dict of losses: their sum."""
    return sum(out.values())


_SPEC_DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16",
                torch.bfloat16: "bfloat16", torch.int64: "int64", torch.int32: "int32", torch.int16: "int16",
                torch.int8: "int8", torch.uint8: "uint8", torch.bool: "bool"}


def _input_spec(x):
    """`ckplan profile --input`'s text for an example tensor: its shape and
    dtype, and for integers the range of its values (negative ones, the
    ignore index -100 of labels, left out)."""
    dtype = _SPEC_DTYPES.get(x.dtype)
    if dtype is None or x.dim() == 0:
        return None
    shape = "x".join(str(d) for d in x.shape)
    if dtype == "bool" or x.is_floating_point() or x.device.type == "meta" or x.numel() == 0:
        return f"{shape}:{dtype}"
    values = x[x >= 0]
    if values.numel() == 0:
        return f"{shape}:{dtype}"
    return f"{shape}:{dtype}:{int(values.min())}..{int(values.max()) + 1}"


_AUTOCAST_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16"}


def _autocast_context(model, args, kwargs, autocast):
    """``torch.autocast`` on the model's device with dtype ``autocast`` (a null context for None)."""
    if autocast is None:
        return contextlib.nullcontext()
    tensors = list(model.parameters()) + list(model.buffers()) + [
        x for x in _ordered_inputs(args, kwargs) if isinstance(x, torch.Tensor)]
    device = tensors[0].device.type if tensors else "cpu"
    return torch.autocast(device, dtype=autocast)


def check_autocast(autocast: Optional[torch.dtype], argument: str = "autocast") -> Optional[torch.dtype]:
    """Checks an autocast dtype as ``export`` and ``plan`` take it.

    Args:
        autocast: ``torch.bfloat16``, ``torch.float16`` or None (fp32, no autocast).
        argument: the argument's name, for the message.

    Returns:
        ``autocast`` as ``torch.autocast`` takes its dtype.

    Raises:
        ValueError: anything else, naming the argument.
    """
    if autocast is None or autocast in _AUTOCAST_DTYPES:
        return autocast
    raise ValueError(f"{argument}={autocast!r}: torch.bfloat16 or torch.float16 (the dtype torch.autocast runs the "
                     "forward in, the weights kept in theirs), or None for no autocast")


def check_loss(loss_fn: Optional[Callable[..., torch.Tensor]], targets: Union[torch.Tensor, Sequence[torch.Tensor]],
               argument: str = "loss_fn") -> Tuple[torch.Tensor, ...]:
    """Checks a loss and its targets as ``export`` and ``plan`` take them.

    Args:
        loss_fn: a callable ``(output, *targets) -> scalar loss``, or None (then no targets).
        targets: a tensor or a sequence of tensors.
        argument: the loss argument's name, for the messages.

    Returns:
        ``targets`` as a tuple of tensors.

    Raises:
        TypeError: a loss that is not callable, or targets that are not tensors.
        ValueError: targets without a loss.
    """
    if isinstance(targets, torch.Tensor):
        targets = (targets,)
    if not isinstance(targets, (tuple, list)):
        raise TypeError(f"targets: a tensor or a tuple of tensors (what loss_fn takes beside the output), not "
                        f"{type(targets).__name__}")
    targets = tuple(targets)
    if loss_fn is None:
        if targets:
            raise ValueError("targets= without loss_fn=: give the loss they are for (loss_fn=nn.CrossEntropyLoss(), "
                             "or a function of (output, *targets)), or pass a model's labels in kwargs")
        return targets
    if not callable(loss_fn):
        raise TypeError(f"{argument}: a callable (output, *targets) -> scalar loss, such as nn.CrossEntropyLoss(), "
                        f"not {type(loss_fn).__name__}")
    wrong = [type(t).__name__ for t in targets if not isinstance(t, torch.Tensor)]
    if wrong:
        raise TypeError(f"targets: tensors only (got {', '.join(wrong)}); a constant of the loss goes in loss_fn "
                        "itself (functools.partial, a lambda, the module's arguments)")
    return targets


def _example(args, kwargs):
    """The example inputs as export takes them: a tuple, and the keyword ones given (not None)."""
    if isinstance(args, torch.Tensor):
        args = (args,)
    if not isinstance(args, tuple):
        args = tuple(args) if isinstance(args, list) else (args,)
    return args, {name: value for name, value in (kwargs or {}).items() if value is not None}


def forward_fails(model: torch.nn.Module, args: Any, kwargs: Optional[Dict[str, Any]] = None,
                  autocast: Optional[torch.dtype] = None, loss_fn: Optional[Callable[..., torch.Tensor]] = None,
                  targets: Sequence[torch.Tensor] = (), args_name: str = "args") -> Optional[str]:
    """Whether the model's own forward (and loss) fails on the example inputs, run once eagerly as
    ``export`` runs it (train mode, caches off, under the autocast), without gradients, its buffers
    and the RNG state put back.

    Returns:
        One line saying what it raised, where and on which input, with the fix; None when it runs.
    """
    args, kwargs = _example(args, kwargs)
    named = named_inputs(args, kwargs, args_name) + [(f"targets[{i}]", t) for i, t in enumerate(targets)]
    loss = (_loss_name(loss_fn), loss_fn, tuple(targets)) if loss_fn is not None else None
    was_training = model.training
    model.train()
    traced_autocast = None if is_meta_model(model, _ordered_inputs(args, kwargs)) else autocast
    try:
        with _caches_off(model), _autocast_context(model, args, kwargs, traced_autocast):
            return forward_failure(model, model.forward, args, kwargs, named, args_name, loss)
    finally:
        model.train(was_training)


def named_specs(args: Any, kwargs: Optional[Dict[str, Any]], targets: Sequence[torch.Tensor] = (),
                args_name: str = "args") -> List[Tuple[str, str]]:
    """(each example tensor's name in the call, its ``--input`` text as the archive records it), in
    the program's order (the loss's targets last)."""
    args, kwargs = _example(args, kwargs)
    named = named_inputs(args, kwargs, args_name) + [(f"targets[{i}]", t) for i, t in enumerate(targets)]
    return [(name, spec) for name, spec in ((name, _input_spec(t)) for name, t in named) if spec is not None]


def export(model: torch.nn.Module, args: Any, path: Union[str, os.PathLike[str]],
           kwargs: Optional[Dict[str, Any]] = None, dynamic_batch: bool = True, dynamic_seq: bool = False,
           autocast: Optional[torch.dtype] = None, loss_fn: Optional[Callable[..., torch.Tensor]] = None,
           targets: Union[torch.Tensor, Sequence[torch.Tensor]] = (),
           log: Union[str, os.PathLike[str], None] = None) -> "torch.export.ExportedProgram":
    """Exports ``model`` in train mode for ``ckplan profile``, with ``torch.export.export``'s
    arguments in its order. Non-strict, the training IR (ATen ops with autograd, dropout and batch
    norm as in training); saved with ``torch.export.save`` and loaded back to check the round trip,
    then renamed to ``path`` (a failure leaves no file). The archive records the inputs' shapes,
    dtypes and integer ranges, so ``ckplan profile model.pt2`` needs no ``--input`` at the
    example's shapes.

    Hugging Face models as they come: key-value caches are off for the
    export (each config's ``use_cache`` set back after); a model given its
    ``labels`` returns its loss, which the profile back-propagates as it
    is; a ModelOutput without a loss is exported returning its first field
    (the logits, the last hidden state: what a loss reads), with a warning.
    A forward returning a namedtuple (torchvision's GoogLeNet in train mode
    with aux_logits) is exported returning a plain tuple of its fields, in
    order, with a warning: torch.export.save cannot save a namedtuple.

    Args:
        model: the model (on the meta device: exported shapes-only, ``ckplan profile --device
            meta``).
        args: the example's positional inputs: a tuple of tensors, or one tensor.
        path: the ``.pt2`` archive to write.
        kwargs: tensors by forward's parameter names (a Hugging Face model's ``labels``,
            ``attention_mask``).
        dynamic_batch: mark the first dimension of every input dynamic (one file profiles at any
            batch size).
        dynamic_seq: mark the second dimension of every integer input dynamic too (token ids,
            labels, masks: one file profiles at any sequence length, ``ckplan solve --seq``).
        autocast: the dtype the job runs its forward (and loss) in under ``torch.autocast``
            (``torch.bfloat16``, ``torch.float16``; None: no autocast), the weights in their own
            dtype: the model is exported under ``torch.autocast(device, dtype=autocast)`` and the
            archive records it, so that ``ckplan profile`` runs the forward and loss under the same
            autocast (its casts, its cache of the weights' casts, the ops it keeps in fp32).
            Regions the model sets itself (``torch.autocast(enabled=False)`` around rotary
            embeddings) are kept in the program and run as they are. A meta model is exported
            without it (autocast casts on a real device only) and ``ckplan profile --device meta``
            applies CUDA's autocast policy op by op.
        loss_fn: the job's own loss, ``loss_fn(output, *targets)`` (a module such as
            ``nn.CrossEntropyLoss()`` or a function returning the scalar loss), exported with the
            model: the archive returns the loss first and the model's outputs after it, so that
            ``ckplan profile`` back-propagates that loss (what it keeps for backward, a
            cross-entropy's log-probabilities, counted) and counts the outputs as the training
            loop holds them to the step's end. Without it, a model given its ``labels`` trains
            with its own loss, and any other with ckplan's (the outputs summed, which keeps
            nothing).
        targets: the tensors the loss takes beside the output (class indices, a segmentation
            map), batch first like the inputs; the program takes them after the model's inputs.
        log: the file torch's log of the export is appended to (the tracebacks and graphs it logs
            as an export fails), instead of the terminal; None: a temporary file, kept and named in
            the error when the export fails, else removed.

    Returns:
        The ExportedProgram.

    Raises:
        ExportError: the model's own forward (or loss) fails on the example inputs or returns no
            tensor (what it raised, in which module, on which input, and the fix), or the model does
            not export, save or load back (PyTorch's reason and the fix). torch's log of the export
            goes to ``log``, not the terminal; the message names it.
        TypeError, ValueError: ``autocast``, ``loss_fn`` or ``targets`` not as described.
    """
    return _export(model, args, path, kwargs=kwargs, dynamic_batch=dynamic_batch, dynamic_seq=dynamic_seq,
                   autocast=autocast, loss_fn=loss_fn, targets=targets, log=log)


def _export(model, args, path, kwargs=None, dynamic_batch=True, dynamic_seq=False, autocast=None, loss_fn=None,
            targets=(), log=None, args_name="args", load_back=True):
    """``export``, its messages naming the positional inputs ``args_name`` (plan()'s
    ``example_inputs``). Without ``load_back`` the saved program is not loaded back with
    torch.export.load (plan(): ckplan reads the archive next, and says so where it cannot; the check
    costs a third of the export)."""
    log = ExportLog(None if log is None else os.fspath(log), type(model).__name__)
    failed = True
    try:
        with torch_log_to(log.path):
            program = _export_logged(model, args, path, kwargs, dynamic_batch, dynamic_seq, autocast, loss_fn,
                                     targets, log, args_name, load_back)
        failed = False
        return program
    finally:
        log.close(failed)


def _export_logged(model, args, path, kwargs, dynamic_batch, dynamic_seq, autocast, loss_fn, targets, log,
                   args_name, load_back=True):
    autocast = check_autocast(autocast)
    args, kwargs = _example(args, kwargs)
    targets = check_loss(loss_fn, targets)
    model_name = type(model).__name__
    forward = model.forward  # the model's own, before the export replaces it
    values = _ordered_inputs(args, kwargs)
    if not values:
        try:
            takes = f"{model_name}.forward{inspect.signature(forward)}"
        except (TypeError, ValueError):
            takes = f"{model_name}'s forward"
        raise ExportError(f"{args_name}={_short(args)} and kwargs={_short(kwargs)} hold no tensor: pass the tensors "
                          f"{takes} takes (a tuple of tensors, lists or dicts of them, and Python values as options)")
    named = named_inputs(args, kwargs, args_name) + [(f"targets[{i}]", t) for i, t in enumerate(targets)]
    loss = (_loss_name(loss_fn), loss_fn, targets) if loss_fn is not None else None

    def diagnose(check_output=True):
        """Raises ExportError when the model's own forward (or loss) fails on the example inputs."""
        message = forward_failure(model, forward, args, kwargs, named, args_name, loss, check_output)
        if message is not None:
            # Raised while torch's own error is handled: without the context, an uncaught one prints
            # its one line, not torch's traceback (in the log, named in the message).
            error = ExportError(message + log.where())
            error.__suppress_context__ = True
            raise error

    # Written beside the target and renamed once it loads back; a path that cannot be written is
    # refused before the export.
    directory, name = os.path.split(os.path.abspath(os.fspath(path)))
    partial = os.path.join(directory, f".{name}.{os.getpid()}.partial")
    try:
        open(partial, "wb").close()
    except OSError as error:
        raise ExportError(f"{path}: cannot write: {error.strerror}; give a path in a folder that exists and "
                          f"you may write to") from error
    try:
        program = _export_to(model, args, partial, path, kwargs, dynamic_batch, dynamic_seq, autocast, loss_fn,
                             targets, values, diagnose, log.where, load_back)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return program


def _short(value, limit=60):
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _export_to(model, args, partial, path, kwargs, dynamic_batch, dynamic_seq, autocast, loss_fn, targets, values,
               diagnose, where, load_back=True):
    """The export, saved to ``partial`` and (``load_back``) loaded back."""
    # A container input: shapes static (its first dimension need not be the batch).
    if any(_is_container(v) for v in list(args) + list(kwargs.values())):
        dynamic_batch = dynamic_seq = False
    was_training = model.training
    model.train()
    # On the meta device autocast casts nothing: exported without it, and
    # `ckplan profile --device meta` applies CUDA's autocast policy op by op.
    traced_autocast = None if is_meta_model(model, values) else autocast
    if loss_fn is not None:
        kwargs = {**kwargs, **{_TARGET_NAME.format(i): t for i, t in enumerate(targets)}}
    loss_context = _with_loss(model, loss_fn, len(targets)) if loss_fn is not None else contextlib.nullcontext()
    try:
        with _caches_off(model), _autocast_context(model, args, kwargs, traced_autocast), loss_context:
            program = _export_program(model, args, kwargs, dynamic_batch, dynamic_seq, diagnose, where)
            named = None if loss_fn is not None else _namedtuple_in(program.call_spec.out_spec)
            fields = None if loss_fn is not None else _model_output_fields(program.call_spec.out_spec)
            losses = None if loss_fn is not None else _loss_dict_keys(program.call_spec.out_spec)
            if losses:
                warnings.warn(f"ckplan_torch.export: {type(model).__name__} returns a dict of losses "
                              f"({', '.join(losses)}); trained with their sum, as torchvision's detection "
                              f"references do (pass loss_fn= for another)")
                loss_fn, targets = _sum_losses, ()
                with _with_loss(model, _sum_losses, 0):
                    program = _export_program(model, args, kwargs, dynamic_batch, dynamic_seq, diagnose, where)
                    eager_peaks = _eager_module_peaks(model, args, kwargs)
            elif named is not None:
                warnings.warn(f"ckplan_torch.export: {type(model).__name__} returns a namedtuple ({named.__name__}), "
                              f"which torch.export.save cannot save; exported returning a plain tuple of its fields "
                              f"({', '.join(named._fields)})")
                program = _export_plain_outputs(model, args, kwargs, dynamic_batch, dynamic_seq=dynamic_seq,
                                                diagnose=diagnose, where=where)
            elif fields and "loss" not in fields and len(fields) > 1:
                warnings.warn(f"ckplan_torch.export: {type(model).__name__} returns no loss (pass its labels in "
                              f"kwargs for the loss it trains with); exported returning its {fields[0]} (of "
                              f"{', '.join(fields)}), which ckplan profile's --loss reads")
                program = _export_plain_outputs(model, args, kwargs, dynamic_batch, field=fields[0],
                                                dynamic_seq=dynamic_seq, diagnose=diagnose, where=where)
            if not losses:
                eager_peaks = _eager_module_peaks(model, args, kwargs)
            on_cpu = list(model.parameters()) + list(model.buffers()) + values
            if eager_peaks is None and all(t.device.type == "cpu" for t in on_cpu):
                # The eager measurement ran and failed where torch.export's trace did not (an int64
                # input into a Linear): the profile would fail on it.
                diagnose(check_output=False)
    finally:
        model.train(was_training)
    inputs = _ordered_inputs(args, kwargs)
    shapes_only = is_meta_model(model, inputs)
    record = {"schema": "ckplan.pt2-extra/1", "shapes_only": shapes_only, "aliases": _aliases(model)}
    if loss_fn is not None:
        record["loss"] = {"kind": "loss_fn", "name": _loss_name(loss_fn), "targets": len(targets)}
    if autocast is not None:
        devices = [t.device.type for t in list(model.parameters()) + inputs if isinstance(t, torch.Tensor)]
        record["autocast"] = {"dtype": _AUTOCAST_DTYPES[autocast], "device": devices[0] if devices else "cpu"}
    specs = [_input_spec(x) for x in inputs]
    if all(spec is not None for spec in specs):
        record["inputs"] = specs
    if eager_peaks is not None:
        record["eager_module_peaks"] = eager_peaks
    extra = json.dumps(record)
    try:
        with open(partial, "wb") as f:
            torch.export.save(program, f, extra_files={CKPLAN_EXTRA_FILE: extra})
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"torch.export.save could not save the program of {type(model).__name__}: "
                          f"{_first_line(error)}; make forward return tensors (or tuples, lists or dicts "
                          f"of tensors), e.g. with a wrapper module{where()}") from error
    if not load_back:
        return program
    try:
        with open(partial, "rb") as f:
            loaded = torch.export.load(f)
    except Exception as error:  # noqa: BLE001
        raise ExportError(f"{path}: the saved program of {type(model).__name__} does not load back with "
                          f"torch.export.load: {_first_line(error)}; make forward return tensors (or tuples, "
                          f"lists or dicts of tensors) and take tensors only{where()}") from error
    if len(loaded.graph.nodes) != len(program.graph.nodes):
        raise ExportError(f"{path}: the saved program does not load back as it was saved "
                          f"({len(loaded.graph.nodes)} nodes, {len(program.graph.nodes)} exported); "
                          f"report it with the torch version ({torch.__version__})")
    return program
