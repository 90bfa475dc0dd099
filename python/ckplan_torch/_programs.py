"""Running the ``ckplan`` program: finding it, and turning its one-line errors into CkplanError."""
import os
import shutil
import subprocess
import sysconfig
from typing import Optional

from ._errors import CkplanError


def find_ckplan(path: Optional[str] = None) -> str:
    """Finds the ``ckplan`` program.

    Args:
        path: the program's path; None: ``$CKPLAN``, else the one installed in this Python
            environment (``pip install``), else on ``PATH``, else a source checkout's
            ``build/ckplan``.

    Returns:
        The program's absolute path.

    Raises:
        CkplanError: no program at ``path``, or none found.
    """
    if path:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)
        raise CkplanError(f"{path}: no ckplan program there; give the path of the ckplan binary")
    candidates = [os.environ.get("CKPLAN"),
                  os.path.join(sysconfig.get_path("scripts"), "ckplan"),
                  shutil.which("ckplan"),
                  os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build", "ckplan")]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise CkplanError("the ckplan program is not installed: `pip install --no-build-isolation .` in ckplan's "
                      "folder (README), or set CKPLAN=/path/to/ckplan")


def _run(ckplan, *args):
    """Runs ``ckplan ARGS``; returns its standard output, or raises CkplanError with its message."""
    done = subprocess.run([ckplan, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        errors = [line for line in lines if line.startswith("ckplan: error: ")]
        message = (errors[-1][len("ckplan: error: "):] if errors else (lines[-1] if lines else
                   f"ckplan {args[0]} exited with {done.returncode}"))
        raise CkplanError(message, done.returncode)
    return done.stdout
