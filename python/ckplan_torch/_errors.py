"""The exceptions ckplan_torch raises: CkplanError and the errors derived from it.

Every error the package raises about a plan, an export or the ckplan program is a CkplanError, so
that a caller catches them all with one class; each is also the built-in exception it was before
the package had its own (ExportError a RuntimeError, PlanError a ValueError, MissingModuleError a
KeyError). An argument of the wrong type or value raises TypeError or ValueError, as Python's own
functions do; one that only ckplan can judge (a budget's text, an optimizer's name, a folder to
write) raises ArgumentError, which is both a CkplanError and a ValueError.
"""


class CkplanError(RuntimeError):
    """The base of ckplan_torch's errors, raised itself when ``ckplan`` refused or failed: its one-line
    message (what and the fix). ``exit_code``: the CLI's (2 bad input, 3 a budget below the smallest
    that fits; 1 for an error of the package's own)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


class ExportError(CkplanError):
    """The model cannot be exported: its own forward (or loss) fails on the example inputs or returns
    no tensor (the message says what it raised, where, and on which input), or torch.export cannot
    trace, save or load back what runs eagerly (PyTorch's reason and the fix)."""


class ArgumentError(CkplanError, ValueError):
    """An argument refused before any work is done (``exit_code`` 2, the CLI's bad input): a budget
    that is not a size, an optimizer or a cost model's device ckplan does not know, a folder or file
    that cannot be written. The message names the argument, its value and the fix."""

    def __init__(self, message):
        super().__init__(message, exit_code=2)


class PlanError(CkplanError, ValueError):
    """A plan that cannot be applied: not a ckplan plan, made for another model, or asking what this
    model or torch cannot do. The message says what and the fix."""


class MissingModuleError(CkplanError, KeyError):
    """The plan names a module path the model lacks (nothing is wrapped then)."""
