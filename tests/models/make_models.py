#!/usr/bin/env python3
"""Makes the test models (TorchScript, traced in train mode) and, for each,
PyTorch's own count of what is saved for backward, for the tests to compare
with `ckplan profile`.

    make_models.py OUT_DIR [name ...]

Writes OUT_DIR/<name>.pt and OUT_DIR/<name>.json:
  {"name", "inputs": [--input texts], "saved_bytes", "module_saved": {path: bytes}}

saved_bytes counts unique storages packed by torch.autograd.graph.saved_tensors_hooks
during a forward of the eager model, parameters and inputs excluded. module_saved
attributes each storage to the module whose op made it (hidden buffers such as
dropout masks to the module running when they are saved), summed for every module
path prefix, the way the profiler attributes allocations.
"""
import contextlib
import json
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode


# ---------------------------------------------------------------- the models
class Block(nn.Module):
    def __init__(self, width, inplace=False):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.ReLU(inplace=inplace)

    def forward(self, x):
        return self.act(self.fc(x))


class MlpChain(nn.Module):
    """16 Linear+ReLU blocks and a head."""

    def __init__(self, width=256, depth=16):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(width) for _ in range(depth)])
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        return self.head(self.blocks(x))


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, heads, seq, dropout):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(seq, seq)).view(1, 1, seq, seq))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :t, :t] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class GptBlock(nn.Module):
    def __init__(self, d_model, heads, seq, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, heads, seq, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    """A GPT-style decoder: token and position embeddings, blocks, final norm, head."""

    def __init__(self, vocab=512, seq=64, d_model=64, heads=4, layers=12, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList([GptBlock(d_model, heads, seq, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def double_conv(cin, cout):
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Down(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.pool = nn.MaxPool2d(2)
        self.conv = double_conv(cin, cout)

    def forward(self, x):
        return self.conv(self.pool(x))


class Up(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
        self.conv = double_conv(cin, cout)

    def forward(self, x, skip):
        return self.conv(torch.cat([skip, self.up(x)], dim=1))


class UNet(nn.Module):
    """A small U-Net: skip connections carry encoder outputs to the decoder."""

    def __init__(self, channels=8):
        super().__init__()
        c = channels
        self.inc = double_conv(3, c)
        self.down1 = Down(c, 2 * c)
        self.down2 = Down(2 * c, 4 * c)
        self.down3 = Down(4 * c, 8 * c)
        self.up1 = Up(8 * c, 4 * c)
        self.up2 = Up(4 * c, 2 * c)
        self.up3 = Up(2 * c, c)
        self.outc = nn.Conv2d(c, 2, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        y = self.up1(x4, x3)
        y = self.up2(y, x2)
        y = self.up3(y, x1)
        return self.outc(y)


class TransformerEncoderModel(nn.Module):
    def __init__(self, d_model=64, heads=4, layers=4, dropout=0.1):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=4 * d_model, dropout=dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x):
        return self.head(self.encoder(x))


class SdpaAttention(nn.Module):
    """Causal self-attention through F.scaled_dot_product_attention (PyTorch 2.x)."""

    def __init__(self, d_model, heads, dropout):
        super().__init__()
        self.heads = heads
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class SdpaBlock(nn.Module):
    def __init__(self, d_model, heads, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d_model)
        self.attn = SdpaAttention(d_model, heads, dropout)
        self.ln_2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d_model, d_model), nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class SdpaDecoder(nn.Module):
    """A decoder whose attention is F.scaled_dot_product_attention: what current models use."""

    def __init__(self, vocab=512, seq=64, d_model=64, heads=4, layers=6, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab, d_model)
        self.wpe = nn.Embedding(seq, d_model)
        self.h = nn.ModuleList([SdpaBlock(d_model, heads, dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class HfModel(nn.Module):
    """A Hugging Face model, built offline from a config with random weights,
    returning its first output as a tensor (tracing needs tensors, not dicts)."""

    def __init__(self, model, decoder):
        super().__init__()
        self.model = model
        self.decoder = decoder

    def forward(self, x):
        extra = {"use_cache": False} if self.decoder else {}
        return self.model(x, return_dict=False, **extra)[0]


def hf_model(name):
    import transformers as T
    T.logging.set_verbosity_error()
    small = dict(num_hidden_layers=4, num_attention_heads=4, intermediate_size=256)
    if name == "gpt2":
        return HfModel(T.GPT2LMHeadModel(T.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=4, n_head=4,
                                                      bos_token_id=0, eos_token_id=0)), True)
    if name == "llama":  # RMSNorm, rotary embeddings, grouped-query attention (4 heads, 2 KV heads), SwiGLU
        return HfModel(T.LlamaForCausalLM(T.LlamaConfig(vocab_size=512, hidden_size=64, num_key_value_heads=2,
                                                        max_position_embeddings=64, bos_token_id=0, eos_token_id=0,
                                                        **small)), True)
    if name == "bert":
        return HfModel(T.BertModel(T.BertConfig(vocab_size=512, hidden_size=64, max_position_embeddings=64, **small),
                                   add_pooling_layer=False), False)
    if name == "vit":  # the pooler's output is not used: leave it out, as the trace would
        return HfModel(T.ViTModel(T.ViTConfig(image_size=32, patch_size=8, hidden_size=64, **small),
                                  add_pooling_layer=False), False)
    if name == "mixtral":  # a mixture of experts: 4 experts, top-2 routing (sort, histc, index_put_)
        # grouped_mm experts: traced, aten::_grouped_mm; exported, transformers::grouped_mm_fallback (the
        # .pt2 reader runs it as aten::_grouped_mm). The eager experts loop over the experts hit: a trace
        # unrolls the loop for the routing it saw, which training changes (ckplan refuses it then).
        return HfModel(T.MixtralForCausalLM(T.MixtralConfig(
            vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
            bos_token_id=0, eos_token_id=0, experts_implementation="grouped_mm")), True)
    raise ValueError(name)


def torchvision_model(name):
    import torchvision
    return getattr(torchvision.models, name)(num_classes=10)


class InplaceHead(nn.Module):
    """Convolutions, then a head that writes in place into a view of its
    input (torchvision's EfficientNet and MobileNet classifiers:
    flatten, then Dropout(inplace=True))."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(*[nn.Sequential(nn.Conv2d(3 if i == 0 else 16, 16, 3, padding=1), nn.ReLU(inplace=True))
                                        for i in range(4)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        # As MobileNetV3's: Hardswish saves its input, so writing into its output is allowed.
        self.classifier = nn.Sequential(nn.Dropout(0.3, inplace=True), nn.Linear(16, 16), nn.Hardswish(inplace=True),
                                        nn.Dropout(0.3, inplace=True), nn.Linear(16, 10))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class SeqFirstEncoder(nn.Module):
    """nn.TransformerEncoder with PyTorch's defaults: sequence first, the fast
    path off in training. Traced, each layer's attention starts with its own
    shape arithmetic (ops that read no activation)."""

    def __init__(self, d_model=64, heads=4, layers=3):
        super().__init__()
        self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(d_model, heads, 2 * d_model), layers,
                                             enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class SeqFirstDecoder(nn.Module):
    """nn.TransformerDecoder (sequence first): every layer also reads the
    encoder's memory, a model input."""

    def __init__(self, d_model=64, heads=4, layers=3):
        super().__init__()
        self.decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(d_model, heads, 2 * d_model), layers)

    def forward(self, tgt, memory):
        return self.decoder(tgt, memory)


def small_convnext():
    """torchvision's ConvNeXt (LayerNorm2d, layer scale, stochastic depth), two stages of one block."""
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    return ConvNeXt([CNBlockConfig(16, 32, 1), CNBlockConfig(32, None, 1)], stochastic_depth_prob=0.1)


def small_densenet():
    """torchvision's DenseNet, small: each dense layer reads every earlier
    feature map of its block."""
    import torchvision
    return torchvision.models.DenseNet(growth_rate=8, block_config=(3, 3), num_init_features=16, bn_size=2,
                                       num_classes=10)


class RecurrentStack(nn.Module):
    """A projection, a 2-layer LSTM and a GRU (each one aten op), a head."""

    def __init__(self, features=16, hidden=32):
        super().__init__()
        self.proj = nn.Linear(features, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.gru = nn.GRU(hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 10)

    def forward(self, x):
        y, _ = self.lstm(torch.relu(self.proj(x)))
        y, _ = self.gru(y)
        return self.head(y).mean(1)


class TwoHeads(nn.Module):
    """Returns a tuple: a classification and a regression head."""

    def __init__(self, width=128, depth=6):
        super().__init__()
        self.body = nn.Sequential(*[nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(depth)])
        self.classes = nn.Linear(width, 10)
        self.box = nn.Linear(width, 4)

    def forward(self, x):
        y = self.body(x)
        return self.classes(y), self.box(y)


MODELS = {
    "mlp_chain": (lambda: MlpChain(), ["32x256"]),
    "resnet18": (lambda: torchvision_model("resnet18"), ["2x3x64x64"]),
    "mobilenet_v2": (lambda: torchvision_model("mobilenet_v2"), ["2x3x64x64"]),
    "gpt": (lambda: Gpt(), ["4x64:int64:0..512"]),
    "unet": (lambda: UNet(), ["2x3x64x64"]),
    "transformer_encoder": (lambda: TransformerEncoderModel(), ["4x32x64"]),
    "sdpa_decoder": (lambda: SdpaDecoder(), ["4x64:int64:0..512"]),
    "bf16_decoder": (lambda: SdpaDecoder().to(torch.bfloat16), ["4x64:int64:0..512"]),
    "gpt2": (lambda: hf_model("gpt2"), ["2x64:int64:0..512"]),
    "llama": (lambda: hf_model("llama"), ["2x64:int64:0..512"]),
    "bert": (lambda: hf_model("bert"), ["2x64:int64:0..512"]),
    "vit": (lambda: hf_model("vit"), ["2x3x32x32"]),
    "mixtral": (lambda: hf_model("mixtral"), ["4x64:int64:0..128"]),
    "inplace_head": (lambda: InplaceHead(), ["8x3x64x64"]),
    "mobilenet_v3_small": (lambda: torchvision_model("mobilenet_v3_small"), ["2x3x64x64"]),
    "seq_first_encoder": (lambda: SeqFirstEncoder(), ["16x4x64"]),
    "transformer_decoder": (lambda: SeqFirstDecoder(), ["16x4x64", "12x4x64"]),
    "densenet": (lambda: small_densenet(), ["2x3x32x32"]),
    "recurrent": (lambda: RecurrentStack(), ["8x24x16"]),
    "two_heads": (lambda: TwoHeads(), ["1024x128"]),
    # Fetches tensors the tracer keeps (layer scales, constants) before the
    # ops that use them: a wrap over its first ops returned them as its own
    # outputs, and recomputing it deadlocked (issue 25).
    "convnext": (lambda: small_convnext(), ["2x3x32x32"]),
}


# ------------------------------------------------------- PyTorch's own count
def storage_of(t):
    """The tensor's storage (untyped_storage() from PyTorch 2.0, storage() before)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


def make_input(text, generator):
    parts = text.split(":")
    shape = [int(s) for s in parts[0].split("x")]
    if len(parts) > 1 and parts[1].startswith("int"):
        lo, hi = (int(v) for v in parts[2].split("..")) if len(parts) > 2 else (0, 2)
        return torch.randint(lo, hi, shape, generator=generator, dtype=torch.long)
    return torch.randn(shape, generator=generator)


class ProducerMode(TorchDispatchMode):
    """Records which module made each storage (the first op that wrote it)."""

    def __init__(self, current_module, producers):
        super().__init__()
        self.current_module = current_module
        self.producers = producers

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = set()
        for a in list(args) + list((kwargs or {}).values()):
            for t in a if isinstance(a, (tuple, list)) else [a]:
                if isinstance(t, torch.Tensor):
                    inputs.add(storage_of(t).data_ptr())
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and storage_of(t).nbytes() > 0:
                ptr = storage_of(t).data_ptr()
                # A fresh storage (not a view or an in-place write of an input)
                # may reuse a freed one's address: it belongs to this module.
                if ptr not in inputs:
                    self.producers[ptr] = self.current_module[-1]
        return out


@contextlib.contextmanager
def as_traced():
    """Runs eager models on the code paths their traces took: some branch on
    torch.jit.is_tracing(). transformers' Llama builds an explicit causal mask
    when traced (in eager it passes none and sets SDPA's is_causal), and with
    a mask SDPA gets K and V repeated for grouped-query attention rather than
    enable_gqa: the trace keeps 65,536 B more per layer of the test Llama."""
    is_tracing = torch.jit.is_tracing
    torch.jit.is_tracing = lambda: True
    try:
        yield
    finally:
        torch.jit.is_tracing = is_tracing


def saved_tensor_count(model, inputs):
    """Unique storages saved for backward (parameters and inputs excluded), in total and per module prefix."""
    excluded = {storage_of(p).data_ptr() for p in model.parameters()}
    excluded |= {storage_of(b).data_ptr() for b in model.buffers()}
    excluded |= {storage_of(x).data_ptr() for x in inputs}
    names = {m: n for n, m in model.named_modules()}
    stack = [""]
    hooks = []

    def enter(mod, args):
        stack.append(names[mod])

    def leave(mod, args, out):
        stack.pop()

    for m in model.modules():
        hooks.append(m.register_forward_pre_hook(enter))
        hooks.append(m.register_forward_hook(leave))
    producers = {}
    saved = {}

    def pack(t):
        storage = storage_of(t)
        ptr = storage.data_ptr()
        if ptr not in excluded and storage.nbytes() > 0 and ptr not in saved:
            saved[ptr] = (storage.nbytes(), producers.get(ptr, stack[-1]))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with ProducerMode(stack, producers):
            out = model(*inputs)
    for h in hooks:
        h.remove()
    total = sum(size for size, _ in saved.values())
    per_module = {}
    for size, module in saved.values():
        parts = module.split(".") if module else []
        for depth in range(len(parts) + 1):
            key = ".".join(parts[:depth])
            per_module[key] = per_module.get(key, 0) + size
    return out, total, per_module


def make(name, out_dir):
    factory, input_texts = MODELS[name]
    torch.manual_seed(0)
    model = factory().train()
    generator = torch.Generator().manual_seed(0)
    inputs = [make_input(t, generator) for t in input_texts]
    traced = torch.jit.trace(model, tuple(inputs), check_trace=False)
    traced.save(os.path.join(out_dir, name + ".pt"))
    # PyTorch's count on the eager model, taking the code paths the trace took.
    with as_traced():
        torch.manual_seed(0)
        _, total, per_module = saved_tensor_count(model, inputs)
    # And on the eager model as users run it, unpatched: what the .pt2 keeps
    # (ckplan_torch.export follows the eager model's code paths).
    torch.manual_seed(0)
    _, eager_total, _ = saved_tensor_count(model, inputs)
    # The same model through torch.export (ckplan_torch.export: train mode,
    # dynamic batch, transformers' masking deciding from shapes as in eager),
    # and PyTorch's count on the exported program itself.
    import ckplan_torch
    pt2_path = os.path.join(out_dir, name + ".pt2")
    torch.manual_seed(0)
    ckplan_torch.export(model, tuple(inputs), pt2_path, dynamic_batch=True)
    exported = torch.export.load(pt2_path).module()
    torch.manual_seed(0)
    _, pt2_total, _ = saved_tensor_count(exported, inputs)
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({"name": name, "inputs": input_texts, "saved_bytes": total, "module_saved": per_module,
                   "pt2_saved_bytes": pt2_total, "eager_saved_bytes": eager_total}, f, indent=1)
    print(f"{name}: saved {total} bytes (traced paths), {eager_total} (eager), exported program {pt2_total}")


def hf_as_users_trace(name):
    """A Hugging Face model as users first trace it: the model itself (no
    wrapper), its ModelOutput (a dict) returned, caches off."""
    import transformers as T
    T.logging.set_verbosity_error()
    if name == "hf_llama_loss":  # given its labels, the model's own loss (cross entropy over the vocabulary)
        return T.LlamaForCausalLM(T.LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, bos_token_id=0, eos_token_id=0, use_cache=False))
    if name == "hf_gpt2_logits":  # no labels: its logits (and no loss) in the dict
        return T.GPT2LMHeadModel(T.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                              bos_token_id=0, eos_token_id=0, use_cache=False))
    raise ValueError(name)


# Traced as users trace them (strict=False, keyword inputs in this order), no .pt2.
AS_USERS_TRACE = {
    "hf_llama_loss": (["input_ids", "labels"], ["2x32:int64:0..256", "2x32:int64:0..256"]),
    "hf_gpt2_logits": (["input_ids"], ["2x32:int64:0..256"]),
}


def make_as_users_trace(name, out_dir):
    keys, input_texts = AS_USERS_TRACE[name]
    torch.manual_seed(0)
    model = hf_as_users_trace(name).train()
    generator = torch.Generator().manual_seed(0)
    inputs = [make_input(t, generator) for t in input_texts]
    traced = torch.jit.trace(model, example_kwarg_inputs=dict(zip(keys, inputs)), strict=False, check_trace=False)
    traced.save(os.path.join(out_dir, name + ".pt"))

    class Positional(nn.Module):  # the eager model called as the trace is: keyword inputs in order
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            out = self.inner(**dict(zip(keys, args)))
            return out["loss"] if out.get("loss") is not None else out["logits"]

    with as_traced():
        torch.manual_seed(0)
        _, total, per_module = saved_tensor_count(Positional(model), inputs)
    per_module = {k[len("inner."):] if k.startswith("inner.") else ("" if k == "inner" else k): v
                  for k, v in per_module.items()}
    with open(os.path.join(out_dir, name + ".json"), "w") as f:
        json.dump({"name": name, "inputs": input_texts, "saved_bytes": total, "module_saved": per_module,
                   "returns_loss": "labels" in keys}, f, indent=1)
    print(f"{name}: saved {total} bytes")


def make_error_cases(out_dir):
    """Models that ckplan must refuse or warn about."""
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    eval_model = nn.Sequential(nn.Linear(16, 16), nn.Dropout(0.5), nn.Linear(16, 4)).eval()
    torch.jit.trace(eval_model, (x,)).save(os.path.join(out_dir, "eval_mode.pt"))
    frozen = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    for p in frozen.parameters():
        p.requires_grad_(False)
    torch.jit.trace(frozen, (x,)).save(os.path.join(out_dir, "frozen.pt"))
    # The same small model, its archive's format version raised past what any
    # LibTorch reads: as if saved by a far newer PyTorch.
    import zipfile
    source = os.path.join(out_dir, "eval_mode.pt")
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(os.path.join(out_dir, "newer_version.pt"), "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("/version") or item.filename == "version":
                data = b"99\n"
            zout.writestr(item, data)
    with open(os.path.join(out_dir, "not_a_model.pt"), "w") as f:
        f.write("this is not a TorchScript archive\n")
    with zipfile.ZipFile(os.path.join(out_dir, "zip_without_model.pt"), "w") as z:
        z.writestr("archive/readme.txt", "a zip file, but no model in it\n")
    # Writes into a value ReLU saved for its backward: PyTorch's backward fails too.
    untrainable = nn.Sequential(nn.Linear(16, 16), nn.ReLU(inplace=True), nn.Dropout(0.3, inplace=True),
                                nn.Linear(16, 4))
    torch.jit.trace(untrainable, (x,), check_trace=False).save(os.path.join(out_dir, "untrainable.pt"))
    # torch.export archives ckplan must refuse: control flow (a higher-order
    # op), an AOTInductor package (no graph), a newer export schema.
    class WithCond(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)

        def forward(self, t):
            return torch.cond(t.sum() > 0, lambda u: self.lin(u), lambda u: self.lin(u) * 2, (t,))

    torch.export.save(torch.export.export(WithCond().train(), (x,), strict=False),
                      os.path.join(out_dir, "control_flow.pt2"))
    import ckplan_torch
    small = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    ckplan_torch.export(small, (x,), os.path.join(out_dir, "small.pt2"))
    with zipfile.ZipFile(os.path.join(out_dir, "small.pt2")) as zin, \
            zipfile.ZipFile(os.path.join(out_dir, "newer_schema.pt2"), "w") as newer, \
            zipfile.ZipFile(os.path.join(out_dir, "aoti_package.pt2"), "w") as aoti:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("models/model.json"):
                doc = json.loads(data)
                doc["schema_version"]["major"] = 99
                newer.writestr(item.filename, json.dumps(doc))
                prefix = item.filename[:-len("models/model.json")]
                aoti.writestr(prefix + "data/aotinductor/model/model.wrapper.so", b"\x7fELF")
                continue
            newer.writestr(item.filename, data)
            aoti.writestr(item.filename, data)
    # Exported in eval mode by torch.export.export itself (dropout off, batch
    # norm on its running statistics): ckplan warns and says training: false.
    eval_export = nn.Sequential(nn.Linear(16, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.5),
                                nn.Linear(64, 4)).eval()
    torch.export.save(torch.export.export(eval_export, (x,), strict=False), os.path.join(out_dir, "eval_export.pt2"))
    # Token ids (through a reshape) into an embedding of 100 rows, and a mask
    # that indexes nothing: `--input 4x8:int64` draws the ids from 0..100.
    class EmbeddingMask(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(100, 16)
            self.lin = nn.Linear(16, 4)

        def forward(self, ids, mask):
            h = self.emb(ids.reshape(-1)).reshape(ids.shape[0], ids.shape[1], 16)
            return self.lin(h * mask.unsqueeze(-1).to(h.dtype))

    ids = torch.randint(0, 100, (4, 8))
    ckplan_torch.export(EmbeddingMask(), (ids, torch.ones(4, 8, dtype=torch.long)),
                        os.path.join(out_dir, "embedding_mask.pt2"))
    # An op from a library registered in Python only (as custom kernels are):
    # the archive names it, LibTorch cannot find it.
    lib = torch.library.Library("ckplan_test", "DEF")
    lib.define("scale(Tensor x) -> Tensor")
    lib.impl("scale", lambda t: t * 2, "CPU")

    class Scale(nn.Module):
        def forward(self, t):
            return torch.ops.ckplan_test.scale(t)

    custom = nn.Sequential(nn.Linear(16, 16), Scale(), nn.Linear(16, 4))
    torch.jit.trace(custom, (x,), check_trace=False).save(os.path.join(out_dir, "custom_op.pt"))


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
    import warnings
    warnings.filterwarnings("ignore")  # tracer warnings about Python values: expected, the shapes are fixed
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "torch_version.json"), "w") as f:
        json.dump({"torch": torch.__version__.split("+")[0]}, f)
    names = sys.argv[2:] or list(MODELS) + list(AS_USERS_TRACE) + ["errors"]
    for name in names:
        if name == "errors":
            make_error_cases(out_dir)
        elif name in AS_USERS_TRACE:
            make_as_users_trace(name, out_dir)
        else:
            make(name, out_dir)


if __name__ == "__main__":
    main()
