"""ckplan_torch.plan() and enable(): one call from a training script, on
models as users have them (a Hugging Face causal LM with its labels, a
torchvision model), each plan applied and a step measured in PyTorch
against it. Run with pytest (ctest runs it as python_plan)."""
import json
import os

import pytest
import torch
import torchvision
import transformers

import ckplan_torch
import memory_timeline


def gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=64, n_head=4, vocab_size=512, n_positions=64,
                                     bos_token_id=0, eos_token_id=0)
    ids = torch.randint(0, 512, (2, 64), generator=torch.Generator().manual_seed(1))
    return transformers.GPT2LMHeadModel(config), ids


def with_loss(out, target=None):
    """(the output, its loss): the model's own (a ModelOutput's `loss`), or cross-entropy over logits."""
    return out, (out.loss if target is None else torch.nn.functional.cross_entropy(out, target))


@pytest.fixture(scope="module")
def gpt2_plan(ckplan):
    model, ids = gpt2()
    return model, ids, ckplan_torch.plan(model, (ids,), budget="1GB", kwargs={"labels": ids}, ckplan=ckplan)


def test_plan_reads_the_model_as_it_comes(gpt2_plan):
    model, ids, plan = gpt2_plan
    assert plan.target == "pytorch"
    assert plan.budget_bytes == 10**9
    assert plan.checkpoint_modules == []  # a 1 GB budget needs no checkpointing
    names = [row["name"] for row in plan.strategies]
    assert names[0] == "none" and "optimal (pytorch)" in names
    assert all(row["fits"] for row in plan.strategies)
    # The model's own loss (its labels) is what the profile back-propagates.
    assert plan.profile["model"]["loss"] == "model"
    assert 0 < plan.min_budget_bytes < plan.peak_bytes
    assert "strategy" in repr(plan) and "smallest budget" in repr(plan)


def test_no_checkpointing_row_is_pytorchs_step(gpt2_plan):
    """The table's `none` row against the step PyTorch measures without checkpointing."""
    model, ids, plan = gpt2_plan
    none = plan.strategies[0]
    # Without a key-value cache, as the plan counts the step (apply_plan turns it off for training).
    measured = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p),
                             lambda: with_loss(model(ids, labels=ids, use_cache=False)))
    assert measured <= none["peak_bytes"]
    assert measured >= none["peak_bytes"] * 0.99, (measured, none["peak_bytes"])


def test_enable_at_the_smallest_budget_holds_in_pytorch(gpt2_plan, ckplan):
    model, ids, first = gpt2_plan
    budget = first.min_budget_bytes
    plan = ckplan_torch.enable(model, (ids,), budget=budget, kwargs={"labels": ids}, ckplan=ckplan)
    try:
        assert plan.checkpoint_modules and ckplan_torch.checkpointed_modules(model) == plan.checkpoint_modules
        assert plan.peak_bytes <= budget
        measured = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p),
                                                      lambda: with_loss(model(ids, labels=ids)))
        assert measured <= budget, (measured, budget)
        assert measured >= plan.peak_bytes * 0.98, (measured, plan.peak_bytes)
        # And below what no checkpointing measures.
        assert budget < first.strategies[0]["peak_bytes"]
    finally:
        ckplan_torch.remove_plan(model)
    assert model.config.use_cache is True


def test_sac_target_halfway_holds_in_pytorch(gpt2_plan, ckplan):
    """plan(target="sac") on the model as it comes: halfway between its smallest budget and no
    checkpointing, the policy saves ops, the step is measured within the budget, and the plan is no
    slower than wrapping whole modules at that budget, as priced. On this 64-wide model a policy can cost
    more than the ops it spares (its dispatch mode, measured in this Python): priced so, the plan is no
    slower than the module target's; priced at 0, as where a GPU's kernels hide it, it saves ops, and
    that plan is checked."""
    model, ids, first = gpt2_plan
    loose = ckplan_torch.plan(model, (ids,), budget="1GB", kwargs={"labels": ids}, target="sac", ckplan=ckplan)
    budget = (loose.min_budget_bytes + loose.strategies[0]["peak_bytes"]) // 2
    priced = ckplan_torch.plan(model, (ids,), budget=budget, kwargs={"labels": ids}, target="sac", ckplan=ckplan)
    rows = {row["name"]: row for row in priced.strategies}
    whole = rows.get("optimal (pytorch)")  # absent where wrapping whole modules cannot fit the budget
    if whole is not None:
        assert whole["fits"] and whole["peak_bytes"] > 0, whole
        assert priced.time_ms <= whole["time_ms"] * (1 + 1e-9)
    for policy in priced.doc["pytorch"]["sac"]:
        assert bool(policy["save"]) == ("dispatch_ms" in policy), policy
    plan = ckplan_torch.plan(model, (ids,), budget=budget, kwargs={"labels": ids}, target="sac", ckplan=ckplan,
                             sac_dispatch_us=0)
    assert plan.target == "sac" and any(plan.saved_ops.values())
    assert "saving" in repr(plan)
    rows = {row["name"]: row for row in plan.strategies}
    whole = rows.get("optimal (pytorch)")
    if whole is not None:
        assert whole["fits"] and whole["peak_bytes"] > 0, whole
        assert plan.time_ms <= whole["time_ms"] * (1 + 1e-9)
    plan.apply(model)
    try:
        measured = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p),
                                                      lambda: with_loss(model(ids, labels=ids)))
        assert measured <= budget, (measured, budget)
        assert measured >= plan.peak_bytes * 0.98, (measured, plan.peak_bytes)
    finally:
        ckplan_torch.remove_plan(model)


def test_torchvision_model_with_the_jobs_optimizer(ckplan):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.randn(8, 3, 128, 128)
    target = torch.randint(0, 10, (8,))

    def make_optimizer(params):
        return torch.optim.SGD(params, lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-4)

    job_optimizer = make_optimizer(model.parameters())
    loose = ckplan_torch.plan(model, (x,), budget="10GB", optimizer=job_optimizer, ckplan=ckplan)
    assert loose.doc["fixed"]["optimizer"] == "momentum" and loose.doc["fixed"]["optimizer_options"]["nesterov"]
    none_peak = loose.strategies[0]["peak_bytes"]
    assert loose.min_budget_bytes < none_peak
    budget = (loose.min_budget_bytes + none_peak) // 2
    plan = ckplan_torch.plan(model, (x,), budget=budget, optimizer=job_optimizer, ckplan=ckplan)
    assert plan.checkpoint_modules
    plan.apply(model, optimizer=job_optimizer)
    try:
        # The profile's loss for a model returning logits: cross-entropy-like, a gradient the output's size.
        measured = memory_timeline.training_step_peak(model, make_optimizer,
                                 lambda: with_loss(model(x), target))
        assert measured <= budget, (measured, budget)
    finally:
        ckplan_torch.remove_plan(model)


def test_save_report_and_apply_from_the_file(gpt2_plan, tmp_path):
    model, ids, plan = gpt2_plan
    plan.save(tmp_path / "plan.json")
    assert ckplan_torch.load_plan(str(tmp_path / "plan.json")) == plan.doc
    plan.save_profile(tmp_path / "profile.json")
    assert json.loads((tmp_path / "profile.json").read_text())["schema"] == "ckplan.profile/1"
    plan.report(tmp_path / "report.html")
    assert "<html" in (tmp_path / "report.html").read_text()[:500].lower()
    plan.report(tmp_path / "report.json")
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["budget_bytes"] == plan.budget_bytes
    assert [row["name"] for row in report["strategies"]][0] == "none"


def test_errors_are_one_line_python_exceptions(gpt2_plan, ckplan, tmp_path):
    model, ids, plan = gpt2_plan
    with pytest.raises(ckplan_torch.CkplanError) as error:
        ckplan_torch.plan(model, (ids,), budget="1MB", kwargs={"labels": ids}, ckplan=ckplan)
    assert error.value.exit_code == 3
    assert "minimum" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="give the budget"):
        ckplan_torch.plan(model, (ids,), budget="auto", ckplan=ckplan)
    with pytest.raises(ValueError, match="target"):
        ckplan_torch.plan(model, (ids,), budget="1GB", target="selective", ckplan=ckplan)
    with pytest.raises(ckplan_torch.CkplanError, match="no ckplan program"):
        ckplan_torch.find_ckplan(str(tmp_path / "nothing"))
    with pytest.raises(ckplan_torch.CkplanError, match="budget"):
        ckplan_torch.plan(model, (ids,), budget="lots", ckplan=ckplan)
    # The work folder keeps the archive, the profile and the plan when asked, in the call's own folder.
    kept = ckplan_torch.plan(model, (ids,), budget="1GB", kwargs={"labels": ids}, ckplan=ckplan,
                             workdir=tmp_path / "w")
    assert os.listdir(tmp_path / "w") == [os.path.basename(kept.workdir)]
    assert {"model.pt2", "plan.json", "profile.json"} <= set(os.listdir(kept.workdir))


def test_a_model_on_the_meta_device(ckplan):
    """Shapes only: exported without weights, profiled on meta tensors, times from a GPU's cost model."""
    config = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=256,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    ids = torch.zeros(4, 256, dtype=torch.long, device="meta")
    plan = ckplan_torch.plan(model, (ids,), budget="80GB", kwargs={"labels": ids}, gpu="h100-sxm-80gb",
                             ckplan=ckplan)
    assert plan.profile["environment"]["device"] == "meta"
    assert plan.time_ms > 0 and plan.strategies[0]["fits"]


def test_batch_auto_plans_the_fastest_batch_that_fits(gpt2_plan, ckplan):
    """plan(batch="auto") on the transformers GPT-2 with its labels: the batch
    it plans fits the budget in PyTorch (a whole AdamW step by the memory
    timeline), the plan records it, and apply_plan warns once when the job
    runs another batch."""
    _, ids, loose = gpt2_plan
    model, _ = gpt2()
    none_peak = loose.strategies[0]["peak_bytes"]  # at the example batch, 2
    budget = 3 * none_peak
    plan = ckplan_torch.plan(model, (ids,), budget=budget, kwargs={"labels": ids}, batch="auto", max_batch=32,
                             ckplan=ckplan)
    table = plan.batches
    assert table["schema"] == "ckplan.batches/1" and table["chosen"] == plan.batch == plan.doc["batch"]
    assert table["largest_plan"] >= table["largest_none"] > 2, table
    assert table["fastest_plan"] == plan.batch and plan.peak_bytes <= budget
    batch = plan.batch
    big = torch.randint(0, 512, (batch, 64), generator=torch.Generator().manual_seed(2))
    torch.set_num_threads(1)  # as profiled: a CPU step on more threads holds per-thread buffers
    plan.apply(model)
    try:
        measured = memory_timeline.training_step_peak(model, lambda p: torch.optim.AdamW(p),
                                                      lambda: with_loss(model(big, labels=big)))
        assert measured <= budget, (measured, budget)
        # Another batch: one warning, on the first forward only.
        ckplan_torch.remove_plan(model)
        plan.apply(model)
        with pytest.warns(UserWarning, match=f"plan is for batch {batch}, and the model runs batch 2"):
            model(ids, labels=ids)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            model(ids, labels=ids)
    finally:
        ckplan_torch.remove_plan(model)
    with pytest.raises(ValueError, match="batch="):
        ckplan_torch.plan(model, (ids,), budget=budget, kwargs={"labels": ids}, batch="biggest", ckplan=ckplan)


def test_batch_errors_are_one_line(ckplan, tmp_path):
    """`ckplan solve --batch` refuses bad options at once (exit 2), a budget that fits no batch with the
    smallest need (exit 3), and leaves no output behind."""
    import subprocess
    example = os.path.join(os.path.dirname(__file__), "..", "..", "data", "example.pt")
    out = str(tmp_path / "plan.json")

    def solve(*args):
        return subprocess.run([ckplan, "solve", example, *args, "-o", out], capture_output=True, text=True)

    for args, message in [
        (["--batch", "huge", "--budget", "1GB"], "invalid --batch 'huge'"),
        (["--batch", "auto"], "--batch needs --budget"),
        (["--batch", "auto", "--budget", "1GB", "--max-batch", "0"], "invalid --max-batch 0"),
        (["--batch", "auto", "--budget", "1GB", "--input", "8x3x32"], None),  # the model refuses: named
        (["--budget", "1GB", "--input", "8x3x32x32"], "--input is for --batch"),
        (["--batch", "auto", "--budget", "1GB", "--device", "meta"], "needs --gpu"),
    ]:
        done = solve(*args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert lines[-1].startswith("ckplan: error: ") and "Traceback" not in done.stderr, done.stderr
        if message:
            assert message in lines[-1], (message, lines[-1])
        assert not os.path.exists(out)
    done = solve("--batch", "auto", "--budget", "1MiB", "--input", "8x3x32x32")
    assert done.returncode == 3 and "fits no batch" in done.stderr and "batch 1 needs at least" in done.stderr
    assert not os.path.exists(out)
    # A fixed batch: the plan records it.
    done = solve("--batch", "4", "--budget", "1GB", "--input", "8x3x32x32", "--reps", "1")
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        assert json.load(f)["batch"] == 4


def test_seq_largest_plans_the_longest_sequence_that_fits(ckplan):
    """plan(seq="largest") on the transformers GPT-2 with its labels (exported with a dynamic sequence):
    the sequence it names fits the budget in PyTorch (an AdamW step by the memory timeline, one thread as
    profiled), and one token more, with the smallest plan ckplan can make there, does not."""
    torch.set_num_threads(1)
    model, ids = gpt2()  # 2 x 64, n_positions 64: the search stays below 64
    loose = ckplan_torch.plan(model, (ids,), budget="1TB", kwargs={"labels": ids}, ckplan=ckplan)
    short = ids[:, :32].contiguous()
    at_32 = ckplan_torch.plan(model, (short,), budget="1TB", kwargs={"labels": short}, ckplan=ckplan)
    # Between what 32 tokens need without checkpointing and what 64 need with the best plan.
    assert at_32.strategies[0]["peak_bytes"] < loose.min_budget_bytes
    budget = (at_32.strategies[0]["peak_bytes"] + loose.min_budget_bytes) // 2
    plan = ckplan_torch.plan(model, (ids,), budget=budget, kwargs={"labels": ids}, seq="largest", max_seq=64,
                             ckplan=ckplan)
    table = plan.batches
    assert table["dimension"] == "seq" and table["chosen"] == table["largest_plan"] and plan.batch == 2
    seq = table["largest_plan"]
    assert 1 < seq < 64 and plan.peak_bytes <= budget, table

    def measured(at, p):
        x = torch.randint(0, 512, (2, at), generator=torch.Generator().manual_seed(3))
        p.apply(model)
        try:
            return memory_timeline.training_step_peak(model, lambda q: torch.optim.AdamW(q),
                                                      lambda: with_loss(model(x, labels=x)))
        finally:
            ckplan_torch.remove_plan(model)

    assert measured(seq, plan) <= budget
    over = ckplan_torch.plan(model, (ids,), budget="1TB", kwargs={"labels": ids}, seq=seq + 1, ckplan=ckplan)
    least = ckplan_torch.plan(model, (ids,), budget=over.min_budget_bytes, kwargs={"labels": ids}, seq=seq + 1,
                              ckplan=ckplan)
    assert least.min_budget_bytes > budget and measured(seq + 1, least) > budget
