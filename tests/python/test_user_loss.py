"""The step as the user writes it: their loss (``loss_fn``, ``targets``), the output their loop holds
through ``optimizer.step()``, and training left as it was (batch norm's running statistics) under a plan.

Each job is planned with ``ckplan_torch.plan(..., loss_fn=..., targets=...)`` and its step measured in
PyTorch (tests/python/memory_timeline.py) as the user writes it: ``out = model(x); loss = loss_fn(out, y);
loss.backward(); optimizer.step()``, ``out`` held to the end of the step.
"""
import collections
import gc
import re
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import ckplan_torch
import memory_timeline


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: as ckplan profiles on the CPU


class Job:
    """A training job: its model, inputs, loss (None: ckplan's own, the output summed) and targets."""

    def __init__(self, name, model, args, loss_fn=None, targets=(), make_optimizer=None):
        self.name, self.model, self.args = name, model, args
        self.loss_fn, self.targets = loss_fn, targets
        self.make_optimizer = make_optimizer or (lambda params: torch.optim.Adam(params))

    def forward(self):
        out = self.model(*self.args)
        loss = self.loss_fn(out, *self.targets) if self.loss_fn is not None else (out * torch.ones_like(out)).sum()
        return out, loss

    def step_peak(self):
        return memory_timeline.training_step_peak(self.model, self.make_optimizer, self.forward)

    def grads(self):
        return memory_timeline.gradients(self.model, self.forward)

    def plan(self, ckplan, budget):
        return ckplan_torch.plan(self.model, self.args, budget, optimizer=self.make_optimizer(self.model.parameters()),
                                 loss_fn=self.loss_fn, targets=self.targets, ckplan=ckplan)


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(),
                                  nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU())

    def forward(self, x):
        return self.conv(x)


class TinyUNet(nn.Module):
    """A two-level U-Net over a 2-class map: its skip connection, upsampling and a 1x1 head."""

    def __init__(self, classes=2):
        super().__init__()
        self.enc1, self.enc2 = Down(3, 8), Down(8, 16)
        self.pool = nn.MaxPool2d(2)
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = Down(16, 8)
        self.head = nn.Conv2d(8, classes, 1)

    def forward(self, x):
        a = self.enc1(x)
        b = self.enc2(self.pool(a))
        return self.head(self.dec(torch.cat([self.up(b), a], 1)))


def segmenter():
    """Cross-entropy over the output map: log_softmax keeps the log-probabilities, the output's size."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 64, 64)
    y = torch.randint(0, 2, (2, 64, 64), generator=torch.Generator().manual_seed(1))
    return Job("segmenter", TinyUNet(), (x,), nn.CrossEntropyLoss(), (y,))


class PerLayer(nn.Module):
    """The textbook per-layer example: blocks of Linear-ReLU-Linear in a ModuleList."""

    def __init__(self, blocks=8, width=256):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(width, width * 2), nn.ReLU(), nn.Linear(width * 2, width))
                                    for _ in range(blocks))

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return x


def per_layer():
    """Its loss, ``out.pow(2).mean()``: pow keeps its input, the output."""
    torch.manual_seed(0)
    return Job("per_layer", PerLayer(), (torch.randn(32, 256),), lambda out: out.pow(2).mean())


def relu_last():
    """An MLP ending in a ReLU, which keeps its output for backward: the loop holds that output on through
    the update once the ReLU's backward has released it (ckplan's own loss)."""
    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [nn.Linear(512, 512), nn.ReLU()]
    return Job("relu_last", nn.Sequential(*layers), (torch.randn(64, 512),))


def regression():
    """An MSE against a float target of the output's shape, SGD with momentum."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 512), nn.Tanh(), nn.Linear(512, 64))
    return Job("regression", model, (torch.randn(64, 128),), F.mse_loss, (torch.randn(64, 64),),
               make_optimizer=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9))


JOBS = [segmenter, per_layer, relu_last, regression]


@pytest.fixture(scope="module", params=JOBS, ids=lambda f: f.__name__)
def planned(request, ckplan):
    job = request.param()
    return job, job.plan(ckplan, "10GB")


def test_profile_says_which_loss(planned):
    job, plan = planned
    assert plan.loss == ("loss_fn" if job.loss_fn is not None else "outputs")
    # Without a loss_fn print(plan) says which loss was assumed, and what one keeping its input adds.
    assert ("loss: ckplan's own" in repr(plan)) == (job.loss_fn is None)


def test_no_checkpointing_row_is_the_plain_step(planned):
    """The `none` row within 1% of the step PyTorch measures with the job's loss, never below it."""
    job, plan = planned
    none = plan.strategies[0]
    assert none["name"] == "none"
    measured = job.step_peak()
    assert measured <= none["peak_bytes"], (job.name, measured, none["peak_bytes"])
    assert none["peak_bytes"] <= measured * 1.01, (job.name, measured, none["peak_bytes"])


@pytest.mark.parametrize("where", [0.0, 0.5])
def test_plans_hold_in_pytorch(planned, ckplan, where):
    """At the smallest budget and halfway to no checkpointing: applied, the step is within the budget and
    within 2% of the prediction, and the gradients equal those without the plan."""
    job, loose = planned
    none = loose.strategies[0]["peak_bytes"]
    budget = loose.min_budget_bytes + int((none - loose.min_budget_bytes) * where)
    plan = job.plan(ckplan, budget)
    assert plan.peak_bytes <= budget
    expected = job.grads()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        plan.apply(job.model)
    try:
        measured = job.step_peak()
        assert measured <= budget, (job.name, plan.checkpoint_modules, measured, budget)
        assert measured >= plan.peak_bytes * 0.98, (job.name, plan.checkpoint_modules, measured, plan.peak_bytes)
        got = job.grads()
    finally:
        ckplan_torch.remove_plan(job.model)
    for a, b in zip(got, expected):
        assert torch.equal(a, b), job.name


def test_recomputation_leaves_running_statistics_as_they_were(ckplan):
    """A wrapped module's recomputation runs its batch norms' forward again: under the plan, every buffer
    (running means and variances, num_batches_tracked) after three steps equals the unwrapped model's."""
    def train(model, wrap):
        if wrap:
            ckplan_torch.apply_plan(model, {"schema": "ckplan.plan/1", "checkpoint_modules": wrap}, strict=False)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch.manual_seed(0)
        for _ in range(3):
            x = torch.randn(2, 3, 32, 32)
            y = torch.randint(0, 2, (2, 32, 32))
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        ckplan_torch.remove_plan(model)
        return dict(model.named_buffers())

    torch.manual_seed(0)
    plain = TinyUNet()
    wrapped = TinyUNet()
    wrapped.load_state_dict(plain.state_dict())
    expected = train(plain, [])
    got = train(wrapped, ["enc1", "enc2", "dec"])
    assert set(got) == set(expected) and any("running_mean" in name for name in got)
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_bad_loss_arguments_are_one_line(ckplan):
    model, x = nn.Linear(4, 2), torch.randn(3, 4)
    with pytest.raises(ValueError, match="targets= without loss_fn="):
        ckplan_torch.plan(model, (x,), "1GB", targets=(torch.zeros(3),), ckplan=ckplan)
    with pytest.raises(TypeError, match="loss_fn: a callable"):
        ckplan_torch.plan(model, (x,), "1GB", loss_fn="mse", ckplan=ckplan)
    with pytest.raises(TypeError, match="targets: tensors only"):
        ckplan_torch.plan(model, (x,), "1GB", loss_fn=F.cross_entropy, targets=([0, 1, 1],), ckplan=ckplan)
    with pytest.raises(ckplan_torch.ExportError, match="scalar loss"):
        ckplan_torch.plan(model, (x,), "1GB", loss_fn=lambda out: out.pow(2), ckplan=ckplan)


def test_budget_in_bytes_is_answered_in_bytes(ckplan):
    """A budget given in bytes below the smallest plan: the error gives the smallest in bytes, and that
    budget plans."""
    job = relu_last()
    with pytest.raises(ckplan_torch.CkplanError) as error:
        job.plan(ckplan, 1000)
    assert error.value.exit_code == 3
    found = re.search(r"the minimum (?:for this [^;]* is )?(\d+)\b", str(error.value))
    assert found, str(error.value)
    minimum = int(found.group(1))
    assert job.plan(ckplan, minimum).peak_bytes <= minimum
    with pytest.raises(ckplan_torch.CkplanError):
        job.plan(ckplan, minimum - 1)


def test_global_batch_alone_accumulates_the_example_batch(ckplan):
    job = regression()
    accumulated = ckplan_torch.plan(job.model, job.args, "10GB", loss_fn=job.loss_fn, targets=job.targets,
                                    global_batch=256, ckplan=ckplan)
    assert accumulated.batch == 64
    assert accumulated.doc.get("global_batch") == 256 or accumulated.batches["global_batch"] == 256
    with pytest.raises(ValueError, match="not a multiple of the example's batch"):
        ckplan_torch.plan(job.model, job.args, "10GB", global_batch=100, ckplan=ckplan)
    with pytest.raises(ValueError, match="max_batch"):
        ckplan_torch.plan(job.model, job.args, "10GB", max_batch=8, ckplan=ckplan)


class TinyDetector(nn.Module):
    """Trained as torchvision's detection models are: ``model(images, targets)``, a list of images and a list
    of dicts of boxes and labels, returning a dict of losses."""

    def __init__(self, classes=3):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                                      nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.cls = nn.Linear(16, classes)
        self.box = nn.Linear(16, 4)

    def forward(self, images, targets):
        features = self.backbone(torch.stack(images))
        labels = torch.stack([t["labels"][0] for t in targets])
        boxes = torch.stack([t["boxes"][0] for t in targets])
        return {"loss_classifier": F.cross_entropy(self.cls(features), labels),
                "loss_box_reg": F.smooth_l1_loss(self.box(features), boxes)}


def detection_inputs():
    g = torch.Generator().manual_seed(2)
    images = [torch.randn(3, 32, 32, generator=g) for _ in range(2)]
    targets = [{"boxes": torch.rand(2, 4, generator=g), "labels": torch.randint(0, 3, (2,), generator=g)}
               for _ in range(2)]
    return images, targets


def test_lists_and_dicts_in_a_dict_of_losses_out(ckplan):
    """Lists and dicts of tensors in, as torch.export's pytrees take them; the dict of losses summed (and
    said), planned within 1% of the step PyTorch measures with the losses summed, never below it."""
    torch.manual_seed(0)
    model = TinyDetector()
    images, targets = detection_inputs()
    with pytest.warns(UserWarning, match="dict of losses .*loss_classifier, loss_box_reg.*sum"):
        plan = ckplan_torch.plan(model, (images, targets), "10GB", optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 ckplan=ckplan)
    assert plan.loss == "loss_fn"
    # Every tensor of the lists and dicts is an input of the profile: 2 images, 2 x (boxes, labels).
    assert len(plan.profile["inputs"]) == 6

    def forward():
        out = model(images, targets)
        return out, sum(out.values())

    measured = memory_timeline.training_step_peak(model, lambda p: torch.optim.SGD(p, lr=0.1), forward)
    none = plan.strategies[0]["peak_bytes"]
    assert measured <= none <= measured * 1.01, (measured, none)


class ContrastivePair(nn.Module):
    """CLIP's calling convention: ``model(ids, pixels, return_loss=True)`` returns its loss first, and a
    Python bool chooses it."""

    def __init__(self):
        super().__init__()
        self.text = nn.Sequential(nn.Embedding(100, 32), nn.Flatten(), nn.Linear(8 * 32, 64))
        self.image = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 128), nn.GELU(), nn.Linear(128, 64))

    def forward(self, ids, pixels, return_loss=False):
        logits = self.text(ids) @ self.image(pixels).t()
        if not return_loss:
            return (logits,)
        labels = torch.arange(logits.shape[0])
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        return loss, logits


def test_python_values_are_constants_of_the_export(ckplan):
    """A bool keyword (CLIP's return_loss=True) is a constant of the program: the model exports, its own loss
    is the one planned, within 1% of PyTorch's step."""
    torch.manual_seed(0)
    model = ContrastivePair()
    ids = torch.randint(0, 100, (4, 8), generator=torch.Generator().manual_seed(3))
    pixels = torch.randn(4, 3, 16, 16)
    plan = ckplan_torch.plan(model, (ids, pixels), "10GB", kwargs={"return_loss": True},
                             optimizer=torch.optim.AdamW(model.parameters()), ckplan=ckplan)
    assert plan.loss == "model"
    assert len(plan.profile["inputs"]) == 2

    def forward():
        out = model(ids, pixels, return_loss=True)
        return out, out[0]

    measured = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p), forward)
    none = plan.strategies[0]["peak_bytes"]
    assert measured <= none <= measured * 1.01, (measured, none)


class SharedLayer(nn.Module):
    def __init__(self, width, per_layer, store):
        super().__init__()
        self.up = nn.Linear(width, width * 4)
        self.down = nn.Linear(width * 4, width)
        self.gate = nn.Linear(width, per_layer)
        self.back = nn.Linear(per_layer, width)
        self.store = store

    def forward(self, x, per_layer_input, shared):
        h = self.up(x)
        if self.store:  # as Gemma 4's layers keep their keys and values for later ones
            kept = h * 2  # what only the dict holds
            shared[len(shared)] = kept
            self.stored = weakref.ref(kept)
        x = x + self.down(F.gelu(h))
        return x + self.back(F.gelu(self.gate(x)) * per_layer_input)


class PerLayerBody(nn.Module):
    """Gemma 4's shape: the body makes per-layer inputs from the embeddings before its layers and hands each
    its slice (one tensor read by every layer), and a dict (a UserDict, as transformers' KVSharingDict) that
    the layers fill as they run."""

    def __init__(self, width=64, layers=4, per_layer=32):
        super().__init__()
        self.embed = nn.Embedding(128, width)
        self.per_layer = nn.Linear(width, layers * per_layer)
        self.layers = nn.ModuleList(SharedLayer(width, per_layer, store=i == layers - 1) for i in range(layers))
        self.shape = (layers, per_layer)

    def forward(self, ids):
        x = self.embed(ids)
        per_layer = (self.per_layer(x) * 0.5).view(*ids.shape, *self.shape)  # made by the body's own op
        shared = collections.UserDict()
        for i, layer in enumerate(self.layers):
            x = layer(x, per_layer[:, :, i, :], shared)
        return x


class PerLayerModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = PerLayerBody()
        self.head = nn.Linear(64, 128)

    def forward(self, ids):
        return self.head(self.body(ids))


def test_layers_handed_a_shared_tensor_and_dict_are_wrappable_and_hold(ckplan):
    """A tensor the body makes before its layers and hands to each does not stop cutting between them: the
    layers are wrappable; and the dict they fill is not kept alive by a wrapped layer's checkpoint: the
    step stays within the prediction."""
    torch.manual_seed(0)
    ids = torch.randint(0, 128, (4, 64), generator=torch.Generator().manual_seed(4))
    job = Job("per_layer_body", PerLayerModel(), (ids,), lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()),
              (ids,))
    loose = job.plan(ckplan, "10GB")
    assert any(path.startswith("body.layers.") for path in job.plan(ckplan, loose.min_budget_bytes).checkpoint_modules)
    # Halfway: at the smallest budget the plan misses by 1.1% (the tensor's gradient as several wrapped
    # layers hand it back; docs/limits.md).
    tight = job.plan(ckplan, (loose.min_budget_bytes + loose.strategies[0]["peak_bytes"]) // 2)
    assert any(path.startswith("body.layers.") for path in tight.checkpoint_modules), tight.checkpoint_modules
    tight.apply(job.model)
    try:
        measured = job.step_peak()
    finally:
        ckplan_torch.remove_plan(job.model)
    assert measured <= tight.budget_bytes, (measured, tight.budget_bytes, tight.checkpoint_modules)
    assert measured >= tight.peak_bytes * 0.98, (measured, tight.peak_bytes)
    # The dict the last layer fills dies with the body's forward, as without checkpointing: no wrapped
    # layer's checkpoint keeps it (with the graph, to the backward).
    wrapped = [f"body.layers.{i}" for i in range(3)]
    ckplan_torch.apply_plan(job.model, {"schema": "ckplan.plan/1", "checkpoint_modules": wrapped}, strict=False)
    try:
        out = job.model(ids)
        gc.collect()
        assert job.model.body.layers[3].stored() is None, "a wrapped layer's checkpoint keeps the dict alive"
        out.sum().backward()
    finally:
        ckplan_torch.remove_plan(job.model)
