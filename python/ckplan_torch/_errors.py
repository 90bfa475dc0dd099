"""The exceptions ckplan_torch raises."""


class ExportError(RuntimeError):
    """torch.export could not export, save or load back the model: PyTorch's reason and the fix are in the message."""


class CkplanError(RuntimeError):
    """``ckplan`` refused or failed: its one-line message (what and the fix). ``exit_code``: the CLI's
    (2 bad input, 3 a budget below the smallest that fits)."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code
