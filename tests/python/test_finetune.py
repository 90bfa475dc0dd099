"""Fine-tuning and mixed precision as jobs run them, planned with ckplan_torch.plan() and measured in
PyTorch: LoRA adapters (peft) on a decoder whose base weights are frozen, a classifier whose backbone is
frozen, and the forward and loss under torch.autocast (bf16; fp16 with torch.amp.GradScaler) with fp32
weights. For each job: the plan's `none` row against the plain step PyTorch measures (within 1%, never
below it), the plan halfway between the smallest budget and no checkpointing applied to the model and
its step measured within the budget, and the gradients under the plan equal to those without it.
Run with pytest (ctest runs it as python_finetune)."""
import contextlib
import warnings

import pytest
import torch
import torchvision
import transformers

import ckplan_torch
import memory_timeline

peft = pytest.importorskip("peft")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: as ckplan profiles on the CPU


class Job:
    """A training job: its model, inputs, optimizer, autocast and loss, and one step of it as the user writes it."""

    def __init__(self, name, model, args, kwargs=None, make_optimizer=None, autocast=None, scaler=False):
        self.name, self.model, self.args, self.kwargs = name, model, args, kwargs or {}
        self.make_optimizer = make_optimizer or (lambda params: torch.optim.AdamW(params))
        self.autocast, self.scaler = autocast, scaler

    def trainable(self):
        return [p for p in self.model.parameters() if p.requires_grad]

    def forward(self):
        """(the output, the loss) under the job's autocast: the model's own loss where it has one (labels),
        else the sum of its output."""
        context = torch.autocast("cpu", dtype=self.autocast) if self.autocast else contextlib.nullcontext()
        with context:
            out = self.model(*self.args, **self.kwargs)
            loss = out.loss if getattr(out, "loss", None) is not None else (out * torch.ones_like(out)).sum()
        return out, loss

    def step_peak(self):
        """One training step's peak after a first, measured by PyTorch's memory timeline (the smaller of
        two), the model's weights put back after; with GradScaler, scale(loss).backward(), step, update."""
        with memory_timeline.restored_after(self.model):
            optimizer = self.make_optimizer(self.trainable())
            # A scale the fp16 gradients do not overflow at: every measured step updates the weights.
            scaler = torch.amp.GradScaler("cpu", init_scale=1.0, enabled=self.scaler)

            def step():
                optimizer.zero_grad()
                out, loss = self.forward()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()

            step()
            peak = min(memory_timeline.timeline_peak(step, memory_timeline.model_tensors(self.model)) for _ in range(2))
            if self.scaler:
                assert scaler.get_scale() >= 1.0, "GradScaler skipped a step: the measured step did not update"
            return peak

    def grads(self):
        """The trainable parameters' gradients after one forward and backward (fixed seed)."""
        return memory_timeline.gradients(self.model, self.forward, self.trainable())

    def plan(self, ckplan, budget):
        optimizer = self.make_optimizer(self.trainable())
        return ckplan_torch.plan(self.model, self.args, budget, kwargs=self.kwargs, optimizer=optimizer,
                                 autocast=self.autocast, ckplan=ckplan)


def llama(layers=3):
    config = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config)
    model.config.use_cache = False
    return model


def gpt2(layers=3):
    config = transformers.GPT2Config(n_layer=layers, n_embd=128, n_head=4, vocab_size=512, n_positions=128,
                                     bos_token_id=0, eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = transformers.GPT2LMHeadModel(config)
    model.config.use_cache = False
    return model


def ids(batch=4, seq=128, vocab=512):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))


def lora_decoder():
    """peft's LoRA (r=8 on q_proj and v_proj) on a Llama: the base frozen, the adapters trained."""
    torch.manual_seed(0)
    model = peft.get_peft_model(llama(), peft.LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                                         lora_dropout=0.0))
    x = ids()
    return Job("lora_decoder", model, (x,), {"labels": x})


def frozen_backbone():
    """A torchvision ResNet-18 with every parameter frozen but its classifier, SGD with momentum over it."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("fc."))
    return Job("frozen_backbone", model, (torch.randn(8, 3, 96, 96),),
               make_optimizer=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9))


def frozen_stem():
    """The same with only the stem and the first stage frozen: a frozen prefix, then layers that train."""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    for name, p in model.named_parameters():
        p.requires_grad_(not name.startswith(("conv1.", "bn1.", "layer1.")))
    return Job("frozen_stem", model, (torch.randn(8, 3, 96, 96),))


def bf16_decoder():
    torch.manual_seed(0)
    x = ids()
    return Job("bf16_decoder", gpt2(), (x,), {"labels": x}, autocast=torch.bfloat16)


def bf16_convnet():
    torch.manual_seed(0)
    return Job("bf16_convnet", torchvision.models.resnet18(num_classes=10), (torch.randn(8, 3, 96, 96),),
               autocast=torch.bfloat16)


def fp16_decoder():
    torch.manual_seed(0)
    x = ids()
    return Job("fp16_decoder", llama(), (x,), {"labels": x}, autocast=torch.float16, scaler=True)


def fp16_convnet():
    torch.manual_seed(0)
    # Small: fp16 convolutions on the CPU take the slow path.
    return Job("fp16_convnet", torchvision.models.resnet18(num_classes=10), (torch.randn(4, 3, 32, 32),),
               autocast=torch.float16, scaler=True)


JOBS = [lora_decoder, frozen_backbone, frozen_stem, bf16_decoder, bf16_convnet, fp16_decoder, fp16_convnet]


@pytest.fixture(scope="module", params=JOBS, ids=lambda f: f.__name__)
def planned(request, ckplan):
    job = request.param()
    return job, job.plan(ckplan, "10GB")


def test_profile_records_the_job(planned):
    """The profile and the plan say what was planned: the frozen parameters and the autocast."""
    job, plan = planned
    params = plan.profile["parameters"]
    frozen = [p["name"] for p in params if p.get("requires_grad", True) is False]
    trainable_bytes = sum(p.numel() * p.element_size() for p in job.trainable())
    assert len(params) - len(frozen) == len(job.trainable())
    source = plan.doc["source"]
    if frozen:
        assert source["trainable_count"] == len(job.trainable()) and source["trainable_bytes"] == trainable_bytes
        # No gradient for a frozen parameter: the gradients are the trainable ones'.
        assert plan.doc["fixed"]["grad_bytes"] == trainable_bytes
    else:
        assert "trainable_count" not in source
    expected = {None: None, torch.bfloat16: "bfloat16", torch.float16: "float16"}[job.autocast]
    assert plan.profile["environment"].get("autocast") == expected
    assert source.get("autocast") == expected
    # print(plan) says both.
    assert ("trains " in repr(plan)) == bool(frozen)
    assert (f"torch.autocast(dtype=torch.{expected})" in repr(plan)) == (expected is not None)
    # The optimizer's state is the trainable parameters' (LoRA: the adapters' alone): AdamW's two moments
    # and a step counter per tensor, SGD's momentum buffer; GradScaler's three scalars under fp16.
    optimizer = job.make_optimizer(job.trainable())
    if isinstance(optimizer, torch.optim.AdamW):
        state = 2 * trainable_bytes + 4 * len(job.trainable())
    else:
        state = trainable_bytes
    assert plan.doc["fixed"]["optimizer_bytes"] == state + (12 if job.scaler else 0)


def test_no_checkpointing_row_is_the_plain_step(planned):
    """The `none` row within 1% of the step PyTorch measures without checkpointing, and never below it."""
    job, plan = planned
    none = plan.strategies[0]
    assert none["name"] == "none"
    measured = job.step_peak()
    assert measured <= none["peak_bytes"], (job.name, measured, none["peak_bytes"])
    assert none["peak_bytes"] <= measured * 1.01, (job.name, measured, none["peak_bytes"])


def test_halfway_plan_holds_in_pytorch(planned, ckplan):
    """Halfway between the smallest budget and no checkpointing: applied, the step is within the budget
    and within 2% of the prediction, and the gradients equal those without the plan."""
    job, loose = planned
    none = loose.strategies[0]["peak_bytes"]
    budget = (loose.min_budget_bytes + none) // 2
    plan = job.plan(ckplan, budget)
    assert plan.peak_bytes <= budget
    expected = job.grads()
    optimizer = job.make_optimizer(job.trainable())
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # the job as planned: no warning
        warnings.filterwarnings("ignore", message=".*use_cache=False.*")
        plan.apply(job.model, optimizer=optimizer)
    try:
        measured = job.step_peak()
        assert measured <= budget, (job.name, measured, budget)
        # Under autocast a wrapped module's weights' casts stay in autocast's cache, which the plan does not
        # model yet (docs/limits.md): within 3% there (the bf16 decoder's plan measured 2.6% under it).
        close = 0.97 if job.autocast is not None else 0.98
        assert measured >= plan.peak_bytes * close, (job.name, measured, plan.peak_bytes)
        got = job.grads()
    finally:
        ckplan_torch.remove_plan(job.model)
    assert len(got) == len(expected) > 0
    for a, b in zip(got, expected):
        assert torch.equal(a, b), job.name


def test_frozen_prefix_is_never_wrapped(ckplan):
    """A frozen backbone saves nothing for backward: no plan wraps a module of it, and the smallest
    budget is no checkpointing's (nothing to gain)."""
    job = frozen_backbone()
    plan = job.plan(ckplan, "10GB")
    assert plan.min_budget_bytes == plan.strategies[0]["peak_bytes"]
    smallest = job.plan(ckplan, plan.min_budget_bytes)
    assert smallest.checkpoint_modules == [] or smallest.checkpoint_modules == ["fc"]
    # What the profile saw: the frozen prefix keeps nothing (the classifier's input alone is saved).
    kept = plan.profile["totals"]["saved_bytes"]
    assert kept <= 8 * 512 * 4 + 8 * 10 * 4, kept


def test_apply_warns_on_another_job(ckplan):
    """apply warns when the job runs otherwise than planned: without the plan's autocast, with another
    trainable set, or with an optimizer over the frozen parameters."""
    job = bf16_convnet()
    plan = job.plan(ckplan, "10GB")
    plan.apply(job.model)
    try:
        with pytest.warns(UserWarning, match="autocast bfloat16.*no autocast"):
            job.model(*job.args)
    finally:
        ckplan_torch.remove_plan(job.model)
    job.model.fc.weight.requires_grad_(False)
    with pytest.warns(UserWarning, match="trainable parameter tensors"):
        plan.apply(job.model)
    ckplan_torch.remove_plan(job.model)
    with pytest.warns(UserWarning, match="1 that the model froze"):
        ckplan_torch.check_trainable_optimizer(job.model, torch.optim.SGD(job.model.parameters(), lr=0.1))


def test_bad_autocast_is_one_line(ckplan):
    job = bf16_convnet()
    with pytest.raises(ValueError, match=r"autocast=torch.float64: torch.bfloat16 or torch.float16"):
        ckplan_torch.plan(job.model, job.args, "10GB", autocast=torch.float64, ckplan=ckplan)


def test_meta_autocast_matches_the_cpu_where_their_policies_agree(ckplan, tmp_path):
    """On the meta device autocast casts nothing, so the profiler applies CUDA's policy by hand. Where the
    CPU's autocast and CUDA's agree (matrix products in the low precision, activations as they come), the
    meta profile of a model built on meta keeps what the CPU's real autocast keeps, op by op, and the
    weights' casts are cached as autocast caches them (a weight used twice cast once)."""
    import json
    import subprocess

    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 64)
            self.b = torch.nn.Linear(64, 64)

        def forward(self, x):
            h = torch.relu(self.a(x))
            h = torch.relu(torch.nn.functional.linear(h, self.a.weight))  # a's weight again: its cast cached
            return self.b(h)

    def profile(model, x, name, *flags):
        ckplan_torch.export(model, (x,), str(tmp_path / f"{name}.pt2"), autocast=torch.bfloat16)
        subprocess.run([ckplan, "profile", str(tmp_path / f"{name}.pt2"), "-o", str(tmp_path / f"{name}.json"),
                        "--reps", "1", *flags], check=True, capture_output=True)
        return json.load(open(tmp_path / f"{name}.json"))

    torch.manual_seed(0)
    cpu = profile(Tied(), torch.randn(32, 64), "cpu")
    with torch.device("meta"):
        model = Tied()
    meta = profile(model, torch.zeros(32, 64, device="meta"), "meta", "--device", "meta", "--gpu", "h100-sxm-80gb")
    assert cpu["environment"]["autocast"] == meta["environment"]["autocast"] == "bfloat16"
    kinds = [op["kind"] for op in cpu["ops"]]
    assert kinds.count("aten::linear") == 3 and kinds == [op["kind"] for op in meta["ops"]]
    assert [op["saved_bytes"] for op in cpu["ops"]] == [op["saved_bytes"] for op in meta["ops"]]
    assert [t["dtype"] for t in cpu["tensors"]] == [t["dtype"] for t in meta["tensors"]]
    assert "BFloat16" in {t["dtype"] for t in meta["tensors"]}
    assert cpu["totals"]["saved_bytes"] == meta["totals"]["saved_bytes"] > 0
