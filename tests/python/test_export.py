"""ckplan_torch.export: a round trip of torch.export in train mode, a dynamic
batch, PyTorch's reason when export fails, a namedtuple output exported as a
plain tuple (run by ctest, label python)."""
import argparse
import collections
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


Outputs = collections.namedtuple("Outputs", ["logits", "hidden"])


class NamedOutputs(nn.Module):
    """Returns a namedtuple, as torchvision's GoogLeNet does in train mode."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(8, 16)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        h = torch.relu(self.body(x))
        return Outputs(self.head(h), h)


def check_namedtuple_output(tmp, failures):
    model = NamedOutputs()
    path = os.path.join(tmp, "named.pt2")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            program = ckplan_torch.export(model, (torch.randn(4, 8),), path)
        except ckplan_torch.ExportError as error:
            failures.append(f"a namedtuple output was refused: {error}")
            return
    notes = [str(w.message) for w in caught if "namedtuple" in str(w.message)]
    if len(notes) != 1 or "plain tuple of its fields (logits, hidden)" not in notes[0]:
        failures.append(f"no note on the namedtuple output: {notes}")
    if "forward" in model.__dict__ or type(model(torch.randn(2, 8))) is not Outputs:
        failures.append("export left the model's forward changed")
    if [s.target for s in program.graph_signature.input_specs if s.target] != \
            ["body.weight", "body.bias", "head.weight", "head.bias"]:
        failures.append(f"parameter names changed: {program.graph_signature.input_specs}")
    out = torch.export.load(path).module()(torch.randn(3, 8))
    if type(out) is not tuple or [tuple(t.shape) for t in out] != [(3, 2), (3, 16)]:
        failures.append(f"the archive returns {type(out).__name__} {[tuple(t.shape) for t in out]}")


class HeldLocal(nn.Module):
    """Keeps a value in a local past its last reader, as transformers' blocks
    keep `ffn_output` through the layer norm of `ffn_output + x`: eager
    PyTorch holds it to the return, a graph frees it after the add."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(64, 64)
        self.norm = nn.LayerNorm(64)

    def forward(self, x):
        h = self.inner(x)
        out = self.norm(h + x)
        return out


def check_eager_peaks(tmp, failures):
    import json
    import zipfile
    model = nn.Sequential(HeldLocal(), nn.BatchNorm1d(64))
    x = torch.randn(8, 64)
    path = os.path.join(tmp, "held.pt2")
    ckplan_torch.export(model, (x,), path)
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("extra/ckplan.json"))
        record = json.loads(archive.read(name))
    peaks = record.get("eager_module_peaks", {})
    # h, h + x (the norm's input, saved), the norm's output, its mean and
    # rstd (8 floats each): all alive when HeldLocal returns.
    rows = x.numel() * x.element_size()
    expected = 3 * rows + 2 * 8 * 4
    if peaks.get("inputs") != [{"shape": [8, 64], "itemsize": 4}]:
        failures.append(f"eager peaks recorded for {peaks.get('inputs')}, not the example's shape")
    if peaks.get("bytes", {}).get("0") != expected:
        failures.append(f"eager peak of the module holding a local: {peaks.get('bytes', {}).get('0')} B, "
                        f"{expected} B expected")
    # The measuring forward leaves no trace: batch norm's statistics as they were.
    bn = model[1]
    if int(bn.num_batches_tracked) != 0 or not torch.equal(bn.running_mean, torch.zeros(64)):
        failures.append("the eager measurement changed batch norm's running statistics")


def check_hugging_face_as_it_comes(tmp, failures, ckplan):
    """A transformers Llama as it comes (use_cache on in its config), given
    its labels and an attention mask as keyword inputs, as a training loop
    calls it: exported, then profiled with no --input."""
    import json
    import subprocess
    import transformers
    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=64, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    ids = torch.randint(3, 100, (2, 16))
    labels = ids.clone()
    labels[:, 0] = -100  # the ignore index, left out of the recorded range
    mask = torch.ones(2, 16, dtype=torch.long)
    path = os.path.join(tmp, "llama.pt2")
    try:
        ckplan_torch.export(model, (ids,), path, kwargs={"labels": labels, "attention_mask": mask})
    except ckplan_torch.ExportError as error:
        failures.append(f"a Llama with its labels does not export: {error}")
        return
    if model.config.use_cache is not True:
        failures.append("export left the model's config with use_cache changed")
    # The plain-tensor BERT output: its first field, with a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bert = transformers.BertModel(transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1,
                                                              num_attention_heads=2, intermediate_size=64))
        program = ckplan_torch.export(bert, (ids,), os.path.join(tmp, "bert.pt2"))
    notes = [str(w.message) for w in caught if "returns no loss" in str(w.message)]
    if len(notes) != 1 or "last_hidden_state" not in notes[0] or program.call_spec.out_spec.num_leaves != 1:
        failures.append(f"BERT without labels: no note, or not its last_hidden_state alone: {notes}")
    if ckplan is None:
        return
    profile_path = os.path.join(tmp, "llama.profile.json")
    run = subprocess.run([ckplan, "profile", path, "--reps", "1", "-o", profile_path], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append(f"ckplan profile without --input failed: {run.stderr.strip()[:300]}")
        return
    with open(profile_path) as f:
        profile = json.load(f)
    texts = [spec["text"] for spec in profile["model"]["inputs"]]
    expected = [f"2x16:int64:{int(ids.min())}..{int(ids.max()) + 1}",
                f"2x16:int64:{int(ids.min())}..{int(ids.max()) + 1}", "2x16:int64:1..2"]
    if texts != expected:
        failures.append(f"profiled with {texts}, the archive's inputs are {expected}")
    if profile["model"].get("loss") != "model":
        failures.append(f"the model's own loss is not the profile's: loss {profile['model'].get('loss')}")
    # The logits beside the loss, which the training loop holds in the output it got.
    logits = [t for t in profile.get("held_outputs", []) if profile["tensors"][t]["shape"] == [2, 16, 128]]
    if not logits:
        failures.append(f"the logits are not among the outputs the loop holds: {profile.get('held_outputs')}")
    # apply_plan turns the cache off for training (the plan counts none), and remove_plan back on.
    plan_path = os.path.join(tmp, "llama.plan.json")
    subprocess.run([ckplan, "solve", profile_path, "--budget", "1TB", "-o", plan_path], check=True, capture_output=True)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ckplan_torch.apply_plan(model, plan_path)
    if model.config.use_cache is not False:
        failures.append("apply_plan left use_cache on")
    ckplan_torch.remove_plan(model)
    if model.config.use_cache is not True:
        failures.append("remove_plan did not set use_cache back")


def check_save_failure(tmp, failures):
    path = os.path.join(tmp, "missing", "m.pt2")
    try:
        ckplan_torch.export(nn.Linear(8, 2), (torch.randn(4, 8),), path)
        failures.append("an export into a missing folder raised nothing")
    except ckplan_torch.ExportError as error:
        if "cannot write" not in str(error):
            failures.append(f"unhelpful ExportError for a missing folder: {error}")
    except Exception as error:  # noqa: BLE001
        failures.append(f"a missing folder raised {type(error).__name__}, not ExportError: {error}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckplan", help="the ckplan binary, for the checks that profile an export")
    args = parser.parse_args(argv)
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
        check_namedtuple_output(tmp, failures)
        check_save_failure(tmp, failures)
        check_eager_peaks(tmp, failures)
        check_hugging_face_as_it_comes(tmp, failures, args.ckplan)
        if any(name.endswith(".partial") for name in os.listdir(tmp)):
            failures.append(f"a partial archive left behind: {os.listdir(tmp)}")
    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


def test_export(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan") == 0


if __name__ == "__main__":
    sys.exit(main())


def test_export_at_batch_one_warns_that_the_batch_is_fixed(tmp_path):
    """torch.export specializes a dimension of size 1: an archive exported at batch 1 runs batch 1 only,
    so export says so (ckplan solve --batch needs an example batch of 2 or more); at batch 2 it is quiet."""
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).train()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckplan_torch.export(model, (torch.randn(1, 8),), str(tmp_path / "one.pt2"))
    assert any("batch 1" in str(w.message) and "2 or more" in str(w.message) for w in caught), \
        [str(w.message) for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckplan_torch.export(model, (torch.randn(2, 8),), str(tmp_path / "two.pt2"))
    assert not any("batch 1" in str(w.message) for w in caught), [str(w.message) for w in caught]
