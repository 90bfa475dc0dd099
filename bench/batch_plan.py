"""Batch planning (`ckplan solve MODEL --batch auto`), measured.

    .venv/bin/python bench/batch_plan.py llama8b OUT_DIR   # Llama-3-8B on meta, H100 cost model: the table, timed
    .venv/bin/python bench/batch_plan.py cpu OUT_DIR [NAME ...]  # test models: predicted vs measured samples/s

llama8b: LlamaForCausalLM with Llama-3-8B's config as it comes (SDPA attention, its own loss from
labels), built on the meta device and exported shapes-only with a dynamic batch at sequence 2048, bf16;
then `ckplan solve ARCHIVE --batch auto --device meta --gpu h100-sxm-80gb --budget 80GB --optimizer adam`
with Adam's foreach update (torch's default on CUDA) and its fused one, each timed from the start of the
command (the export is not; it is done once and kept in OUT_DIR).

cpu: for each test model (tests/models/make_models.py, the .pt2 files the build makes), a budget between
its batches (its example batch's peak plus 2.5 times what the samples add), `--batch auto`; then at three
batches it profiled whose best plan fits (the smallest, the largest and one between), the plan's predicted
step time against `ckplan run`'s measured one (3 steps, one thread, the median), as samples per second.
"""
import json
import os
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "models")]
CKPLAN = os.path.join(ROOT, "build", "ckplan")


def ckplan(*args, env=None):
    done = subprocess.run([CKPLAN, *args], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"ckplan {' '.join(args)}: {done.stderr.strip().splitlines()[-1]}")
    return done


def llama8b(out):
    import torch
    import transformers as T
    import ckplan_torch
    archive = os.path.join(out, "llama3_8b_batch.pt2")
    if not os.path.exists(archive):
        warnings.filterwarnings("ignore")
        T.logging.set_verbosity_error()
        config = T.LlamaConfig(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                               num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=8192,
                               rope_theta=500000.0)
        start = time.time()
        with torch.device("meta"):
            model = T.LlamaForCausalLM(config).to(torch.bfloat16).train()
        ids = torch.zeros(2, 2048, dtype=torch.long, device="meta")  # 2: torch.export specializes a batch of 1
        ckplan_torch.export(model, (ids,), archive, kwargs={"labels": ids})
        print(f"exported on meta with labels and a dynamic batch in {time.time() - start:.1f} s (not timed below)")
    # Adam as torch runs it on CUDA by default (foreach: its update's temporaries are whole copies of
    # the parameters) and fused (one kernel, no temporaries), each timed from the command's start.
    for impl in ("foreach", "fused"):
        table = os.path.join(out, f"llama3_8b_batches_{impl}.json")
        start = time.time()
        done = subprocess.run([CKPLAN, "solve", archive, "--batch", "auto", "--device", "meta", "--gpu",
                               "h100-sxm-80gb", "--budget", "80GB", "--optimizer", "adam", "--optimizer-impl", impl,
                               "--max-batch", "1024", "--batch-table", table, "-o",
                               os.path.join(out, f"llama3_8b_plan_{impl}.json")], capture_output=True, text=True)
        print(f"== adam {impl}: ckplan solve --batch auto: {time.time() - start:.1f} s wall, exit {done.returncode}")
        print(done.stdout.split("\n\nthe plan for")[0] if done.returncode == 0 else done.stderr.strip())
        print()


def cpu(out, names):
    import make_models
    models = os.path.join(ROOT, "build", "test_models")
    rows = [("model", "budget", "largest (none / plan)", "batch", "plan", "predicted samples/s",
             "measured samples/s", "error")]
    for name in names or list(make_models.MODELS):
        try:
            cpu_model(name, out, models, rows)
        except SystemExit as error:  # a model whose batch cannot vary (its archive is static): its error
            rows.append((name, "", "", "", "", "", "", str(error)[:120]))
            print(" | ".join(rows[-1]), flush=True)
    print("\n| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]))
    for row in rows[1:]:
        print("| " + " | ".join(row) + " |")


def cpu_model(name, out, models, rows):
    """One model's rows: a budget between its batches, --batch auto, three batches run."""
    import make_models
    _, texts = make_models.MODELS[name]
    work = os.path.join(out, name)
    os.makedirs(work, exist_ok=True)
    model = os.path.join(models, name + ".pt2")
    base = int(texts[0].split("x")[0])
    peaks = []
    for batch in (base, 2 * base):
        path = os.path.join(work, f"base-{batch}.json")
        at = [str(batch) + t[t.index("x"):] for t in texts]
        ckplan("profile", model, *[a for t in at for a in ("--input", t)], "--reps", "1", "-o", path)
        plan = json.loads(ckplan("solve", path, "--budget", "1TB", "-o", "-").stdout)
        peaks.append(plan["predicted"]["peak_bytes"])
    budget = int(peaks[0] + 2.5 * (peaks[1] - peaks[0]))
    profiles, table_path = os.path.join(work, "profiles"), os.path.join(work, "batches.json")
    ckplan("solve", model, "--batch", "auto", "--budget", str(budget), "--max-batch", str(32 * base),
           *[a for t in texts for a in ("--input", t)], "--profiles", profiles, "--batch-table", table_path,
           "-o", os.path.join(work, "plan.json"))
    with open(table_path) as f:
        table = json.load(f)
    fitting = [r["batch"] for r in table["rows"] if "plan" in r and r["plan"]["fits"]]
    chosen = sorted({fitting[0], fitting[len(fitting) // 2], fitting[-1]})
    for batch in chosen:
        plan_path = os.path.join(work, f"plan-{batch}.json")
        ckplan("solve", os.path.join(profiles, f"batch-{batch}.json"), "--budget", str(budget), "-o", plan_path)
        with open(plan_path) as f:
            plan = json.load(f)
        run_path = os.path.join(work, f"run-{batch}.json")
        ckplan("run", model, "--plan", plan_path, "--steps", "3", "-o", run_path)
        with open(run_path) as f:
            measured = json.load(f)["measured"]["step_ms"]
        predicted = plan["predicted"]["time_ms"]
        what = f"wrap {len(plan['checkpoint_modules'])}" if plan["checkpoint_modules"] else "none"
        rows.append((name, f"{budget / 2**20:.1f} MiB", f"{table['largest_none']} / {table['largest_plan']}",
                     str(batch), what, f"{1000 * batch / predicted:.1f}", f"{1000 * batch / measured:.1f}",
                     f"{100 * (measured - predicted) / measured:+.1f}%"))
        print(" | ".join(rows[-1]), flush=True)


def main():
    if len(sys.argv) < 3 or sys.argv[1] not in ("llama8b", "cpu"):
        sys.exit(__doc__)
    os.makedirs(sys.argv[2], exist_ok=True)
    if sys.argv[1] == "llama8b":
        llama8b(sys.argv[2])
    else:
        cpu(sys.argv[2], sys.argv[3:])


if __name__ == "__main__":
    main()
