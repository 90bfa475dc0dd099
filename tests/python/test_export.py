"""ckplan_torch.export: a round trip of torch.export in train mode, a dynamic
batch, PyTorch's reason when export fails (run by ctest, label python)."""
import argparse
import os
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import ckplan_torch  # noqa: E402


class DataDependent(nn.Module):
    """Python control flow on a tensor's value: torch.export cannot trace it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum().item() > 0:
            return self.lin(x)
        return -self.lin(x)


def main():
    argparse.ArgumentParser(description=__doc__).parse_args()
    warnings.filterwarnings("ignore")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 2)).eval()
        path = os.path.join(tmp, "m.pt2")
        program = ckplan_torch.export(model, (torch.randn(4, 8),), path)
        if model.training:
            failures.append("export left the model in train mode (it was in eval mode)")
        ops = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
        if not any("dropout" in op for op in ops):
            failures.append(f"not exported in train mode: no dropout in {ops}")
        loaded = torch.export.load(path).module()
        for batch in (1, 7):  # the batch dimension is dynamic
            out = loaded(torch.randn(batch, 8))
            if tuple(out.shape) != (batch, 2):
                failures.append(f"batch {batch}: output shape {tuple(out.shape)}")
        try:
            ckplan_torch.export(DataDependent(), (torch.randn(4, 8),), os.path.join(tmp, "bad.pt2"))
            failures.append("a model with data-dependent control flow exported without an error")
        except ckplan_torch.ExportError as error:
            message = str(error)
            if "torch.export could not export DataDependent" not in message or len(message.splitlines()) != 1:
                failures.append(f"unhelpful ExportError: {message!r}")
            if os.path.exists(os.path.join(tmp, "bad.pt2")):
                failures.append("a failed export left a file behind")
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
