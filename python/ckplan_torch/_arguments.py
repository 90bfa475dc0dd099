"""plan()'s arguments that only ckplan can judge, checked before anything is exported (an export
and a profile take minutes on a large model): the budget's text, parsed as ``ckplan solve
--budget`` parses it; the optimizer ckplan prices; the cost model's device; the work folder, and
each call's own folder in it."""
import itertools
import math
import os
import re
import tempfile
import time
from typing import Optional, Tuple, Union

import torch

from ._errors import ArgumentError, CkplanError
from ._programs import _run

# As planner/base/units.cc (ParseBytes) reads a budget: a number as strtod reads it, then a unit.
_NUMBER = re.compile(r"[+-]?(?:0[xX](?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?"
                     r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE)
_UNITS = {"": 1.0, "b": 1.0, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12,
          "tb": 1e12, "p": 1e15, "pb": 1e15, "e": 1e18, "eb": 1e18}
_UNITS.update({name: float(1 << (10 * power)) for power, letter in enumerate("kmgtpe", start=1)
               for name in (f"{letter}ib", f"{letter}i")})
_LARGEST_BUDGET = 9.2e18

# As `ckplan solve --optimizer` and `--optimizer-impl` take them (cli/optimizer_options.cc).
OPTIMIZER_NAMES = ("adamw", "adam", "sgd", "momentum", "none")
OPTIMIZER_IMPLS = ("auto", "for-loop", "foreach", "fused")


def _parse_budget(text: str) -> Tuple[Optional[float], Optional[str]]:
    """``ckplan solve --budget TEXT`` read: (bytes, None), or (None, why it refuses the text)."""
    s = text.strip(" \t")
    if not s:
        return None, "empty"
    number = _NUMBER.match(s)
    if number is None:
        return None, "expected a number such as 24GB, 24GiB, 512MiB or 1.5e9"
    unit = s[number.end():].lstrip(" ").lower()
    if unit not in _UNITS:
        return None, f"unknown unit '{unit}' (use B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB or PiB)"
    digits = number.group(0)
    value = float.fromhex(digits) if "x" in digits.lower() else float(digits)
    if not math.isfinite(value):
        return None, "not a finite number"
    if value <= 0:
        return None, "must be positive"
    size = value * _UNITS[unit]
    if size >= _LARGEST_BUDGET:
        return None, "too large: at most 9.2e18 bytes (8 EiB)"
    if size < 1:
        return None, "less than one byte"
    return size, None


def _budget_refusal(text: str) -> Optional[str]:
    """Why ``ckplan solve --budget TEXT`` refuses the text, or None when it takes it."""
    return _parse_budget(text)[1]


def budget_text(budget: Union[int, float, str]) -> str:
    """The budget as ``ckplan solve --budget`` takes it, checked as it checks it.

    Args:
        budget: bytes (an int, or a float such as ``24e9``) or text (``"24GB"``, ``"24GiB"``).

    Returns:
        The text to pass: a string as given, bytes as digits.

    Raises:
        TypeError: not an int, float or str.
        ArgumentError: a budget ``ckplan solve`` refuses, with why (an unknown unit, not positive,
            not finite, too large).
    """
    if isinstance(budget, bool) or not isinstance(budget, (int, float, str)):
        raise TypeError(f"budget: bytes (int) or text such as '24GB', not {type(budget).__name__}")
    why = _budget_refusal(budget if isinstance(budget, str) else repr(float(budget)) if isinstance(budget, float)
                          else str(budget))
    if why is not None:
        fix = "" if why.startswith("expected") else "; give bytes (an int) or text such as '24GB' or '24GiB'"
        raise ArgumentError(f"budget={budget!r}: {why}{fix}")
    return budget if isinstance(budget, str) else str(math.floor(budget))


def budget_bytes(budget: Union[int, float, str]) -> int:
    """The budget in bytes, as ``ckplan solve --budget`` reads it (checked as ``budget_text`` checks it)."""
    return math.floor(_parse_budget(budget_text(budget))[0])


def check_optimizer_choice(optimizer: object, name: str, impl: str) -> None:
    """Refuses an optimizer ckplan does not price, before any work.

    Args:
        optimizer: plan()'s ``optimizer`` (a name or a torch.optim optimizer).
        name, impl: the optimizer as ckplan names it (``OptimizerChoice``).

    Raises:
        ArgumentError: a name or an implementation ``ckplan solve`` does not take, or a torch.optim
            optimizer of another kind.
    """
    if isinstance(optimizer, torch.optim.Optimizer):
        if name not in OPTIMIZER_NAMES:
            raise ArgumentError(f"optimizer={type(optimizer).__name__}(...): ckplan prices torch.optim's Adam, AdamW "
                                f"and SGD (with or without momentum), not {type(optimizer).__name__}; pass the name "
                                "of the one whose state is as large: 'adam' (two tensors per parameter), 'momentum' "
                                "(one) or 'sgd' (none)")
        return
    if name not in OPTIMIZER_NAMES:
        raise ArgumentError(f"optimizer={optimizer!r}: not an optimizer ckplan prices; give 'adamw', 'adam', 'sgd', "
                            "'momentum' (SGD with momentum) or 'none', or the torch.optim optimizer itself")
    if impl not in OPTIMIZER_IMPLS:
        raise ArgumentError(f"optimizer_impl={impl!r}: 'auto' (what torch picks), 'for-loop', 'foreach' or 'fused'")


def check_gpu(program: str, gpu: Optional[str], meta: bool) -> None:
    """Refuses a cost model's device ckplan does not know (asked of ``ckplan profile``, which checks
    ``--gpu`` before it opens the model), and a meta model without one.

    Raises:
        TypeError: ``gpu`` not a string.
        ArgumentError: an unknown device, or none for a meta model (which has no time to measure).
    """
    if gpu is None:
        if meta:
            raise ArgumentError("gpu=None: a model on the meta device has no op to time; give gpu= the device whose "
                                "cost model gives the times, e.g. gpu='h100-sxm-80gb'")
        return
    if not isinstance(gpu, str):
        raise TypeError(f"gpu: a device's name such as 'h100-sxm-80gb', not {type(gpu).__name__}")
    with tempfile.TemporaryDirectory(prefix="ckplan-") as empty:
        try:
            _run(program, "profile", os.path.join(empty, "none.pt2"), "--gpu", gpu)
        except CkplanError as error:
            message = str(error)
            if message.startswith("unknown --gpu"):
                known = message.split(": ", 1)[1] if ": " in message else message
                raise ArgumentError(f"gpu={gpu!r}: not a device ckplan has a cost model of; {known}") from None


def call_folder(workdir: Union[str, "os.PathLike[str]"], model_name: str) -> str:
    """Makes this call's own folder in ``workdir`` (made too when absent):
    ``MODEL-YYYYmmdd-HHMMSS-PID``, ``-2``, ``-3``... after it when taken, so that calls at once (a
    sweep, several ranks) never share a file.

    Returns:
        The folder's path.

    Raises:
        TypeError: ``workdir`` not a path.
        ArgumentError: a ``workdir`` that is a file or cannot be made or written, naming it.
    """
    if not isinstance(workdir, (str, os.PathLike)):
        raise TypeError(f"workdir: a folder's path, not {type(workdir).__name__}")
    base = os.fspath(workdir)

    def refused(error: OSError) -> ArgumentError:
        if os.path.exists(base) and not os.path.isdir(base):
            why = "it is a file"
        elif isinstance(error, NotADirectoryError):
            why = "a folder above it is a file"
        else:
            why = f"cannot make a folder there: {error.strerror}"
        return ArgumentError(f"workdir={base!r}: {why}; give a folder you may write to (ckplan_torch.plan "
                             "makes it, and a folder of each call's files in it)")

    try:
        os.makedirs(base, exist_ok=True)
    except OSError as error:
        raise refused(error) from None
    stem = f"{model_name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    for n in itertools.count(1):
        folder = os.path.join(base, stem if n == 1 else f"{stem}-{n}")
        try:
            os.mkdir(folder)
            return folder
        except FileExistsError:
            continue
        except OSError as error:
            raise refused(error) from None
