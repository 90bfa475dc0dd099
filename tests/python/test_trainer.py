"""transformers.Trainer after ckplan_torch.enable(): three training steps of
a small Hugging Face causal LM, each within the plan's budget as PyTorch's
memory timeline measures it. Run with pytest (ctest runs it as python_trainer)."""
import pytest
import torch
import transformers

import ckplan_torch
import memory_timeline


class Batches(torch.utils.data.Dataset):
    """Token ids with themselves as labels (a causal LM's loss), as a tokenized dataset gives them."""

    def __init__(self, n, seq, vocab):
        generator = torch.Generator().manual_seed(3)
        self.ids = torch.randint(0, vocab, (n, seq), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, k):
        return {"input_ids": self.ids[k], "labels": self.ids[k]}


@pytest.mark.parametrize("optim, impl", [("adamw_torch_fused", "fused"), ("adamw_torch", "for-loop")])
def test_trainer_steps_fit_the_plan(ckplan, tmp_path, optim, impl):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=4, hidden_size=64, intermediate_size=128,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                                      max_position_embeddings=128)
    model = transformers.LlamaForCausalLM(config)
    batch, seq = 2, 64
    data = Batches(3 * batch, seq, config.vocab_size)
    ids = data.ids[:batch]
    # The Trainer's optimizer: `optim` adamw_torch_fused (its default) is torch's AdamW(fused=True).
    loose = ckplan_torch.plan(model, (ids,), budget="1GB", kwargs={"labels": ids}, optimizer="adamw",
                              optimizer_impl=impl, ckplan=ckplan)
    budget = loose.min_budget_bytes
    assert budget < loose.strategies[0]["peak_bytes"]  # checkpointing is needed to fit
    plan = ckplan_torch.enable(model, (ids,), budget=budget, kwargs={"labels": ids}, optimizer="adamw",
                               optimizer_impl=impl, ckplan=ckplan)
    assert ckplan_torch.checkpointed_modules(model) == plan.checkpoint_modules != []

    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=batch, optim=optim, use_cpu=True,
        report_to=[], save_strategy="no", logging_strategy="no", dataloader_num_workers=0, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data)
    peak = memory_timeline.timeline_peak(trainer.train, memory_timeline.model_tensors(model))
    assert trainer.state.global_step == 3
    print(f"trainer {optim}: budget {budget} B, predicted {plan.peak_bytes} B, measured {peak} B")
    assert peak <= budget, (peak, budget)
    ckplan_torch.remove_plan(model)
