"""Llama-3-8B as it comes (LlamaForCausalLM, Llama-3-8B's config), on the meta
device, with its labels, with eager attention and with transformers' default (SDPA): exported with
``ckplan_torch.export(model, (ids,), path, kwargs={"labels": ids})``, profiled
with ``ckplan profile --device meta`` (batch 4, sequence 2048, bf16; no
--input: the archive records them) under /usr/bin/time, beside PyTorch's own
count of what the eager model with its labels saves for backward
(saved_tensors_hooks on meta tensors, the loss included). Prints both.
With SDPA PyTorch's own meta run takes the math path and keeps the attention
matrices (scores, masked scores, probabilities), which neither the CPU's nor
CUDA's flash kernel keeps and ckplan's meta profile does not count
(docs/cost-model.md): that count is printed but is no reference.

    .venv/bin/python bench/llama8b_labels.py OUT_DIR [--ckplan build/ckplan]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python"), os.path.join(HERE, "..", "tests", "python")]
import torch  # noqa: E402
import transformers as T  # noqa: E402

import ckplan_torch  # noqa: E402
from test_meta_profile import storage_key  # noqa: E402


def pytorch_saved_bytes(model, ids):
    """Every storage saved for backward (parameters and inputs excluded), once each, in bytes."""
    excluded = {storage_key(t) for t in list(model.parameters()) + list(model.buffers()) + [ids]}
    saved = {}

    def pack(t):
        key = storage_key(t)
        if key not in excluded and t.untyped_storage().nbytes() > 0:
            saved[key] = t.untyped_storage().nbytes()
        return t

    # transformers' data-dependent mask checks (.item()) cannot run on meta tensors: skipped as a trace skips them.
    is_tracing = torch.jit.is_tracing
    torch.jit.is_tracing = lambda: True
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(ids, labels=ids, use_cache=False)
    finally:
        torch.jit.is_tracing = is_tracing
    assert out.loss is not None
    return sum(saved.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--ckplan", default=os.path.join(HERE, "..", "build", "ckplan"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    warnings.filterwarnings("ignore")
    T.logging.set_verbosity_error()
    for attention in ("eager", "sdpa"):
        check(args, attention)


def check(args, attention):
    config = T.LlamaConfig(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=8192,
                           rope_theta=500000.0, attn_implementation=attention)
    start = time.time()
    with torch.device("meta"):
        model = T.LlamaForCausalLM(config).to(torch.bfloat16).train()
    ids = torch.zeros(4, 2048, dtype=torch.long, device="meta")
    path = os.path.join(args.out, f"llama3_8b_labels_{attention}.pt2")
    ckplan_torch.export(model, (ids,), path, kwargs={"labels": ids})
    print(f"{attention} attention: built on meta and exported shapes-only with labels in {time.time() - start:.1f} s")
    pytorch = pytorch_saved_bytes(model, ids)
    profile_path = os.path.join(args.out, f"llama3_8b_labels_{attention}.profile.json")
    done = subprocess.run(["/usr/bin/time", "-v", args.ckplan, "profile", path, "--device", "meta", "--gpu",
                           "h100-sxm-80gb", "-o", profile_path], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"ckplan profile failed: {done.stderr.strip().splitlines()[-1]}")
    wall = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", done.stderr).group(1)
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    with open(profile_path) as f:
        profile = json.load(f)
    ckplan = profile["totals"]["saved_bytes"]
    print(f"  loss: {profile['model'].get('loss')}")
    print(f"  saved for backward: PyTorch {pytorch:,} B, ckplan {ckplan:,} B, "
          f"difference {ckplan - pytorch:+,} B ({100 * (ckplan - pytorch) / pytorch:+.4f}%)")
    if attention == "sdpa":
        print("  (PyTorch's meta run takes SDPA's math path, keeping the attention matrices no flash kernel keeps: "
              "no reference here)")
    print(f"  ckplan profile: {wall} wall, {rss_kb / 1024:.0f} MiB peak resident")


if __name__ == "__main__":
    main()
