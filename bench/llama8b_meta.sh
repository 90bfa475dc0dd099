#!/usr/bin/env bash
# Llama-3-8B (seq 2048, batch 4, bf16) and GPT-2 small (seq 1024, batch 8),
# built on the meta device from transformers configs (offline), exported
# shapes-only, profiled with --device meta (memory and time measured with
# /usr/bin/time -v), solved and reported. Prints the figures docs/measurements.md quotes.
#   bash bench/llama8b_meta.sh [OUT_DIR]    (default out/meta)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-out/meta}
mkdir -p "$OUT"
PY=.venv/bin/python
CKPLAN=build/ckplan
HF_HUB_OFFLINE=1 PYTHONPATH=python:tests/models "$PY" - "$OUT" <<'PYEOF'
import sys, time, warnings, torch, transformers as T
import ckplan_torch
from make_models import HfModel
warnings.filterwarnings("ignore"); T.logging.set_verbosity_error()
out = sys.argv[1]
for name, build, shape, vocab in [
    ("llama3_8b", lambda: T.LlamaForCausalLM(T.LlamaConfig(vocab_size=128256, hidden_size=4096, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=8192,
        rope_theta=500000.0, torch_dtype=torch.bfloat16)), (4, 2048), 128256),
    ("gpt2_small", lambda: T.GPT2LMHeadModel(T.GPT2Config()), (8, 1024), 50257)]:
    start = time.time()
    with torch.device("meta"):
        model = HfModel(build(), True).to(torch.bfloat16)
    ids = torch.randint(0, vocab, shape).to("meta")
    ckplan_torch.export(model, (ids,), f"{out}/{name}.pt2")
    print(f"{name}: built on meta and exported shapes-only in {time.time() - start:.1f} s")
PYEOF
for spec in "llama3_8b 4x2048:int64:0..128256" "gpt2_small 8x1024:int64:0..50257"; do
  set -- $spec
  /usr/bin/time -v "$CKPLAN" profile "$OUT/$1.pt2" --device meta --input "$2" --dtype bf16 --gpu h100-sxm-80gb \
      -o "$OUT/$1.profile.json" > "$OUT/$1.profile.txt" 2> "$OUT/$1.time.txt"
  head -6 "$OUT/$1.profile.txt"
  grep -E "Elapsed|Maximum resident" "$OUT/$1.time.txt"
done
"$CKPLAN" solve "$OUT/llama3_8b.profile.json" --budget 80GB --optimizer adam -o "$OUT/llama3_8b.plan80.json" || true
"$CKPLAN" report "$OUT/llama3_8b.profile.json" --budget 80GB -o "$OUT/llama3_8b.report.html" || true
