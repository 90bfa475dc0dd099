"""ckplan_torch.export: a round trip of torch.export in train mode, a dynamic batch, PyTorch's reason when
export fails, a namedtuple output exported as a plain tuple, the eager peaks recorded in the archive, a
Hugging Face model as it comes (profiled with no --input, its cache off under a plan), and no partial
archive left behind. Each export runs once, in a module-scoped fixture; each test checks one thing of it.
Run with pytest (ctest runs it as python_export)."""
import collections
import json
import os
import subprocess
import warnings
import zipfile

import pytest
import torch
import torch.nn as nn

import ckplan_torch


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """One folder for every export of this file: the last test looks for partial archives in it."""
    return tmp_path_factory.mktemp("export")


def exported_with_warnings(*args, **kwargs):
    """(ckplan_torch.export(...)'s program, the warnings' texts)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = ckplan_torch.export(*args, **kwargs)
    return program, [str(w.message) for w in caught]


# ---- a round trip in train mode -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def with_dropout(folder):
    """A model with dropout, in eval mode, exported: (the model, the program, the archive's path)."""
    model = nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 2)).eval()
    path = str(folder / "m.pt2")
    program, _ = exported_with_warnings(model, (torch.randn(4, 8),), path)
    return model, program, path


def test_export_leaves_the_model_in_eval_mode(with_dropout):
    """Export traces in train mode but gives the model back in the mode it was in (eval)."""
    model, _, _ = with_dropout
    assert not model.training, "export left the model in train mode (it was in eval mode)"


def test_exported_in_train_mode(with_dropout):
    """The program holds the dropout op: traced in train mode, though the model was in eval mode."""
    _, program, _ = with_dropout
    ops = [str(n.target) for n in program.graph.nodes if n.op == "call_function"]
    assert ops, "the exported graph has no call_function node"
    assert any("dropout" in op for op in ops), f"not exported in train mode: no dropout in {ops}"


@pytest.mark.parametrize("batch", [1, 7])
def test_archive_batch_is_dynamic(with_dropout, batch):
    """The archive, loaded back, runs at a batch other than the example's 4."""
    _, _, path = with_dropout
    out = torch.export.load(path).module()(torch.randn(batch, 8))
    assert tuple(out.shape) == (batch, 2), f"batch {batch}: output shape {tuple(out.shape)}, expected {(batch, 2)}"


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


# ---- export failures ----------------------------------------------------------------------------------

class DataDependent(nn.Module):
    """Python control flow on a tensor's value: torch.export cannot trace it."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        if x.sum().item() > 0:
            return self.lin(x)
        return -self.lin(x)


def test_data_dependent_control_flow_is_an_export_error(folder):
    """A model torch.export cannot trace raises ExportError naming the model, in one line, and leaves no
    file behind."""
    path = folder / "bad.pt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ckplan_torch.ExportError) as raised:
            ckplan_torch.export(DataDependent(), (torch.randn(4, 8),), str(path))
    message = str(raised.value)
    assert "torch.export could not export DataDependent" in message and len(message.splitlines()) == 1, \
        f"unhelpful ExportError: {message!r}, expected one line naming DataDependent"
    assert not path.exists(), "a failed export left a file behind"


def test_missing_folder_is_an_export_error(folder):
    """An export into a folder that does not exist raises ExportError that says it cannot write."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ckplan_torch.ExportError) as raised:
            ckplan_torch.export(nn.Linear(8, 2), (torch.randn(4, 8),), str(folder / "missing" / "m.pt2"))
    assert "cannot write" in str(raised.value), f"unhelpful ExportError for a missing folder: {raised.value}"


# ---- a namedtuple output ----------------------------------------------------------------------------

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


@pytest.fixture(scope="module")
def named(folder):
    """NamedOutputs exported: (the model, the program, the warnings' texts, the archive's path)."""
    model = NamedOutputs()
    path = str(folder / "named.pt2")
    program, messages = exported_with_warnings(model, (torch.randn(4, 8),), path)
    return model, program, messages, path


def test_namedtuple_output_is_noted(named):
    """One warning says the namedtuple output is exported as a plain tuple of its fields."""
    _, _, messages, _ = named
    notes = [m for m in messages if "namedtuple" in m]
    assert len(notes) == 1 and "plain tuple of its fields (logits, hidden)" in notes[0], \
        f"expected one note on the namedtuple output naming its fields, got {notes}"


def test_namedtuple_export_leaves_the_forward(named):
    """After the export the model's own forward (returning the namedtuple) is back."""
    model, _, _, _ = named
    assert "forward" not in model.__dict__, "export left an instance forward on the model"
    out = model(torch.randn(2, 8))
    assert type(out) is Outputs, f"the model returns {type(out).__name__} after export, expected Outputs"


def test_namedtuple_export_keeps_parameter_names(named):
    """The program's parameters keep the model's names."""
    _, program, _, _ = named
    targets = [s.target for s in program.graph_signature.input_specs if s.target]
    assert targets == ["body.weight", "body.bias", "head.weight", "head.bias"], f"parameter names changed: {targets}"


def test_namedtuple_archive_returns_a_tuple(named):
    """The archive, loaded back, returns a plain tuple of the two fields' tensors."""
    _, _, _, path = named
    out = torch.export.load(path).module()(torch.randn(3, 8))
    shapes = [tuple(t.shape) for t in out]
    assert type(out) is tuple and shapes == [(3, 2), (3, 16)], \
        f"the archive returns {type(out).__name__} {shapes}, expected tuple [(3, 2), (3, 16)]"


# ---- the eager peaks the archive records -------------------------------------------------------------

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


@pytest.fixture(scope="module")
def held(folder):
    """HeldLocal then batch norm, exported: (the model, the example input, the archive's eager peaks)."""
    model = nn.Sequential(HeldLocal(), nn.BatchNorm1d(64))
    x = torch.randn(8, 64)
    path = str(folder / "held.pt2")
    exported_with_warnings(model, (x,), path)
    with zipfile.ZipFile(path) as archive:
        name = next(n for n in archive.namelist() if n.endswith("extra/ckplan.json"))
        record = json.loads(archive.read(name))
    return model, x, record.get("eager_module_peaks", {})


def test_eager_peaks_are_for_the_example(held):
    """The eager peaks are recorded for the example input's shape."""
    _, _, peaks = held
    assert peaks.get("inputs") == [{"shape": [8, 64], "itemsize": 4}], \
        f"eager peaks recorded for {peaks.get('inputs')}, not the example's shape [8, 64]"


def test_eager_peak_counts_a_held_local(held):
    """The module holding a local peaks with h, h + x (the norm's input, saved), the norm's output, its
    mean and rstd (8 floats each) all alive when it returns."""
    _, x, peaks = held
    expected = 3 * x.numel() * x.element_size() + 2 * 8 * 4
    got = peaks.get("bytes", {}).get("0")
    assert got == expected, f"eager peak of the module holding a local: {got} B, {expected} B expected"


def test_eager_measurement_leaves_running_statistics(held):
    """The measuring forward leaves batch norm's running statistics as they were."""
    model, _, _ = held
    bn = model[1]
    assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros(64)), \
        f"the eager measurement changed batch norm's running statistics ({int(bn.num_batches_tracked)} batches)"


# ---- a Hugging Face model as it comes ------------------------------------------------------------------

@pytest.fixture(scope="module")
def llama(folder):
    """A transformers Llama as it comes (use_cache on in its config), given its labels and an attention
    mask as keyword inputs, as a training loop calls it, exported: (the model, its ids, the archive)."""
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
    path = str(folder / "llama.pt2")
    exported_with_warnings(model, (ids,), path, kwargs={"labels": labels, "attention_mask": mask})
    return model, ids, path


def test_llama_export_leaves_use_cache(llama):
    """Export leaves the model's config with use_cache on, as it came."""
    model, _, _ = llama
    assert model.config.use_cache is True, f"export left use_cache {model.config.use_cache}, expected True"


def test_bert_without_labels_exports_its_last_hidden_state(folder):
    """A BERT without labels returns no loss: export keeps its first field (last_hidden_state) alone and
    says so in one warning."""
    import transformers
    torch.manual_seed(0)
    ids = torch.randint(3, 100, (2, 16))
    bert = transformers.BertModel(transformers.BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1,
                                                          num_attention_heads=2, intermediate_size=64))
    program, messages = exported_with_warnings(bert, (ids,), str(folder / "bert.pt2"))
    notes = [m for m in messages if "returns no loss" in m]
    assert len(notes) == 1 and "last_hidden_state" in notes[0], \
        f"expected one note naming last_hidden_state, got {notes}"
    leaves = program.call_spec.out_spec.num_leaves
    assert leaves == 1, f"the program returns {leaves} outputs, expected last_hidden_state alone"


@pytest.fixture(scope="module")
def llama_profile(llama, ckplan, folder):
    """`ckplan profile` on the Llama archive with no --input: the profile's path and its document."""
    _, _, path = llama
    profile_path = str(folder / "llama.profile.json")
    run = subprocess.run([ckplan, "profile", path, "--reps", "1", "-o", profile_path], capture_output=True, text=True)
    assert run.returncode == 0, f"ckplan profile without --input failed: {run.stderr.strip()[:300]}"
    with open(profile_path) as f:
        return profile_path, json.load(f)


def test_profile_takes_the_archives_inputs(llama, llama_profile):
    """Profiled with no --input, the inputs are the archive's: the ids and labels in their recorded range
    (the ignore index left out), the mask of ones."""
    _, ids, _ = llama
    _, profile = llama_profile
    texts = [spec["text"] for spec in profile["model"]["inputs"]]
    ids_text = f"2x16:int64:{int(ids.min())}..{int(ids.max()) + 1}"
    expected = [ids_text, ids_text, "2x16:int64:1..2"]
    assert texts == expected, f"profiled with {texts}, the archive's inputs are {expected}"


def test_profile_takes_the_models_loss(llama_profile):
    """The model's own loss (from its labels) is the profile's."""
    _, profile = llama_profile
    assert profile["model"].get("loss") == "model", f"the profile's loss is {profile['model'].get('loss')}, " \
                                                    "expected the model's own"


def test_profile_holds_the_logits(llama_profile):
    """The logits beside the loss, which the training loop holds in the output it got, are among the
    outputs the loop holds."""
    _, profile = llama_profile
    held_outputs = profile.get("held_outputs", [])
    logits = [t for t in held_outputs if profile["tensors"][t]["shape"] == [2, 16, 128]]
    assert logits, f"the logits (2x16x128) are not among the outputs the loop holds: {held_outputs}"


def test_plan_turns_the_cache_off_for_training(llama, llama_profile, ckplan, folder):
    """apply_plan turns use_cache off (the plan counts no cache) and remove_plan turns it back on."""
    model, _, _ = llama
    profile_path, _ = llama_profile
    plan_path = str(folder / "llama.plan.json")
    subprocess.run([ckplan, "solve", profile_path, "--budget", "1TB", "-o", plan_path], check=True,
                   capture_output=True)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        ckplan_torch.apply_plan(model, plan_path)
    under_plan = model.config.use_cache
    ckplan_torch.remove_plan(model)
    assert under_plan is False, f"apply_plan left use_cache {under_plan}, expected False"
    assert model.config.use_cache is True, f"remove_plan left use_cache {model.config.use_cache}, expected True"


# ---- what the exports leave ------------------------------------------------------------------------------

def test_no_partial_archive_left(folder, with_dropout, named, held, llama):
    """After every export of this file (the fixtures it asks for make them), the folder holds their
    archives and no `.partial` file."""
    names = os.listdir(folder)
    archives = [n for n in names if n.endswith(".pt2")]
    assert len(archives) >= 4, f"expected the 4 archives of the fixtures in {folder}, found {names}"
    assert not any(n.endswith(".partial") for n in names), f"a partial archive left behind: {names}"
