"""The exceptions ckplan_torch raises: CkplanError and the errors derived from it.

Every error the package raises about a plan, an export or the ckplan program is a CkplanError, so
that a caller catches them all with one class; each is also the built-in exception it was before
the package had its own (ExportError a RuntimeError, PlanError a ValueError, MissingModuleError a
KeyError). An argument of the wrong type or value raises TypeError or ValueError, as Python's own
functions do.
"""


class CkplanError(RuntimeError):
    """The base of ckplan_torch's errors, raised itself when ``ckplan`` refused or failed: its one-line
    message (what and the fix). ``exit_code``: the CLI's (2 bad input, 3 a budget below the smallest
    that fits; 1 for an error of the package's own)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class ExportError(CkplanError):
    """torch.export could not export, save or load back the model: PyTorch's reason and the fix are in the message."""


class PlanError(CkplanError, ValueError):
    """A plan that cannot be applied: not a ckplan plan, made for another model, or asking what this
    model or torch cannot do. The message says what and the fix."""


class MissingModuleError(CkplanError, KeyError):
    """The plan names a module path the model lacks (nothing is wrapped then)."""
