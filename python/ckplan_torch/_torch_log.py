"""torch's log while a model is exported: in a file, not the user's terminal. A failing torch.export
logs each traceback it meets and the graph it traced (thousands of lines for one wrong shape); the
package's one-line error names the file instead."""
import contextlib
import logging
import os
import sys
import tempfile
from typing import Iterator, Optional


def _to_terminal(handler):
    """Whether a handler writes to standard error or output (torch's own follows sys.stderr)."""
    if isinstance(handler, logging.FileHandler):
        return False
    try:
        stream = getattr(handler, "stream", None)
    except Exception:  # noqa: BLE001 - a property of someone else's handler
        return False
    return stream is not None and any(stream is s for s in (sys.stderr, sys.stdout, sys.__stderr__, sys.__stdout__))


def _torch_loggers():
    """The loggers of torch that print to a terminal: ``torch`` and those under it, with their
    handlers that write to standard error or output (torch's own, set up at import, and any the
    user added); handlers writing to files (a ``TORCH_TRACE`` trace) are left as they are."""
    for name, logger in list(logging.Logger.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and (name == "torch" or name.startswith("torch.")):
            streams = [h for h in logger.handlers if _to_terminal(h)]
            if streams:
                yield logger, streams


_streams = []  # the log files of the torch_log_to contexts open now, innermost last


@contextlib.contextmanager
def torch_log_to(path: str) -> Iterator[None]:
    """While the context lasts, what torch's loggers would print to the terminal is appended to
    ``path`` instead (in torch's format), and so is what torch prints itself inside ``quiet()``;
    the handlers are put back after.

    Args:
        path: the log file (appended to).
    """
    stream = open(path, "a", encoding="utf-8", buffering=1)
    handler = logging.StreamHandler(stream)
    swapped = list(_torch_loggers())
    if swapped and swapped[0][1][0].formatter is not None:
        handler.setFormatter(swapped[0][1][0].formatter)
    _streams.append(stream)
    try:
        for logger, streams in swapped:
            for h in streams:
                logger.removeHandler(h)
            logger.addHandler(handler)
        yield
    finally:
        for logger, streams in swapped:
            logger.removeHandler(handler)
            for h in streams:
                logger.addHandler(h)
        _streams.remove(stream)
        stream.close()


def quiet() -> "contextlib.AbstractContextManager[object]":
    """Standard error into the log of the ``torch_log_to`` context open now (none: as it is): for a
    call into torch that prints (a failing torch.export prints the graph it traced). Not around
    the package's own warnings, which the user is to see."""
    return contextlib.redirect_stderr(_streams[-1]) if _streams else contextlib.nullcontext()


class ExportLog:
    """Where torch's log of one export goes: ``path`` when given (kept), else a temporary file kept
    only when the export fails. ``where()``: the text an error appends to name it (empty when
    torch logged nothing)."""

    def __init__(self, path: Optional[str], model_name: str):
        self.kept = path is not None
        if path is None:
            descriptor, path = tempfile.mkstemp(prefix=f"ckplan-export-{model_name}-", suffix=".log")
            os.close(descriptor)
        self.path = path

    def where(self) -> str:
        """`` (torch's log: PATH)`` when torch logged anything, else empty."""
        if os.path.exists(self.path) and os.path.getsize(self.path) > 0:
            return f" (torch's log: {self.path})"
        return ""

    def close(self, failed: bool) -> None:
        """Removes a temporary log after a successful export, or an empty one; keeps it after a failure."""
        empty = not os.path.exists(self.path) or os.path.getsize(self.path) == 0
        if (not self.kept and not failed) or empty:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)
