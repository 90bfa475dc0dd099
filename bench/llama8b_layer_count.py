"""Llama-3-8B with eager attention (seq 2048, batch 4, bf16) on meta:
PyTorch's own count of the bytes one decoder layer saves for backward
(saved_tensors_hooks on meta tensors), beside ckplan's meta profile of the
same model exported shapes-only. Prints both per layer.

    .venv/bin/python bench/llama8b_layer_count.py OUT_DIR [--ckplan build/ckplan]
"""
import argparse
import json
import os
import subprocess
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "python"), os.path.join(HERE, "..", "tests", "models"),
                os.path.join(HERE, "..", "tests", "python")]
import torch  # noqa: E402
import transformers as T  # noqa: E402

import ckplan_torch  # noqa: E402
from make_models import HfModel  # noqa: E402
from test_meta_profile import saved_per_layer, ckplan_saved_per_layer  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--ckplan", default="build/ckplan")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    T.logging.set_verbosity_error()
    config = T.LlamaConfig(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                           num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=8192,
                           rope_theta=500000.0, attn_implementation="eager")
    with torch.device("meta"):
        model = HfModel(T.LlamaForCausalLM(config), True).to(torch.bfloat16).train()
    ids = torch.randint(0, 128256, (4, 2048)).to("meta")
    pytorch = saved_per_layer(model, [ids], "model.model.layers")
    path = os.path.join(args.out, "llama3_8b_eager.pt2")
    ckplan_torch.export(model, (ids,), path)
    prof_path = os.path.join(args.out, "llama3_8b_eager.profile.json")
    subprocess.run([args.ckplan, "profile", path, "--device", "meta", "--input", "4x2048:int64:0..128256", "--dtype",
                    "bf16", "--gpu", "h100", "-o", prof_path], check=True, capture_output=True)
    with open(prof_path) as f:
        ckplan = ckplan_saved_per_layer(json.load(f), "model.model.layers")
    print(f"eager attention, per layer: PyTorch {sorted(set(pytorch.values()))} ({len(pytorch)} layers), "
          f"ckplan {sorted(set(ckplan.values()))} ({len(ckplan)} layers): {'equal' if pytorch == ckplan else 'DIFFERENT'}")


if __name__ == "__main__":
    main()
