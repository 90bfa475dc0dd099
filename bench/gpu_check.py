#!/usr/bin/env python3
"""The Python half of bench/gpu_check.sh: the two models, the eager training
step under a plan, the halfway budget, and the table. Each subcommand is one
step of the script (run under its own `timeout`) and reads or writes JSON in
the work folder:

    gpu_check.py export MODEL OUT.pt2 [--dry]                  the .pt2 and OUT.json (its --input specs)
    gpu_check.py halfway SOLVE_STDOUT LOOSE_PLAN EVERY_PLAN      the budget between every and none (bytes)
    gpu_check.py eager MODEL PLAN OUT.json [--dry] [--device cuda] [--steps 3]
    gpu_check.py table WORK_DIR [--out FILE]                     the markdown table

MODEL is gpt2 (a GPT-2-small-shaped decoder: 12 blocks, d_model 768, 12
heads, sequence 1024, batch 8, bf16, F.scaled_dot_product_attention),
resnet50 (torchvision, weights=None, batch 64, 3x224x224, fp32),
gpt2_autocast (the decoder with 6 blocks, fp32 weights, its forward and loss
under torch.autocast bf16: mixed precision as Trainer(bf16=True) runs it) or
gpt2_lora (the same under autocast bf16, its weights frozen, peft's LoRA
adapters r=16 on every attention and MLP projection trained); --dry gives the
tiny shapes of `gpu_check.sh --cpu-dry-run`.
"""
import argparse
import json
import math
import os
import re
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

# Shapes: (full, dry). The dry decoder is narrower as well as shorter, so that
# its profile takes seconds on a shared 2-core CPU.
GPT2 = {"full": dict(batch=8, seq=1024, layers=12, d_model=768, heads=12, vocab=50257),
        "dry": dict(batch=2, seq=64, layers=2, d_model=128, heads=4, vocab=2048)}
RESNET50 = {"full": dict(batch=64, size=224), "dry": dict(batch=2, size=32)}
# The fine-tuning and mixed-precision jobs: the decoder with fewer blocks, fp32
# weights, under autocast bf16 (the dtype torch.autocast takes; ckplan_torch.export
# records it in the archive, which ckplan profile reads).
MIXED = {"full": dict(batch=8, seq=1024, layers=6, d_model=768, heads=12, vocab=50257),
         "dry": dict(batch=2, seq=64, layers=2, d_model=128, heads=4, vocab=2048)}
AUTOCAST = {"gpt2_autocast": "bfloat16", "gpt2_lora": "bfloat16"}
GPT2_DROPOUT = 0.1  # GPT-2's: attention, residual and embedding dropout


# ---- the models --------------------------------------------------------------

def gpt2_classes():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class CausalSelfAttention(nn.Module):
        def __init__(self, d_model, heads, dropout):
            super().__init__()
            self.heads = heads
            self.dropout = dropout
            self.c_attn = nn.Linear(d_model, 3 * d_model)
            self.c_proj = nn.Linear(d_model, d_model)
            self.resid_dropout = nn.Dropout(dropout)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.c_attn(x).split(c, dim=2)
            q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                               dropout_p=self.dropout if self.training else 0.0)
            return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, c)))

    class Mlp(nn.Module):
        def __init__(self, d_model, dropout):
            super().__init__()
            self.c_fc = nn.Linear(d_model, 4 * d_model)
            self.gelu = nn.GELU(approximate="tanh")
            self.c_proj = nn.Linear(4 * d_model, d_model)
            self.dropout = nn.Dropout(dropout)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self, d_model, heads, dropout):
            super().__init__()
            self.ln_1 = nn.LayerNorm(d_model)
            self.attn = CausalSelfAttention(d_model, heads, dropout)
            self.ln_2 = nn.LayerNorm(d_model)
            self.mlp = Mlp(d_model, dropout)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt2(nn.Module):
        """GPT-2 small's shape (124M parameters, lm_head tied to wte).

        Positions are a slice of wpe's weight, not an arange: an arange in
        the exported graph carries the export's device as a constant."""

        def __init__(self, vocab, seq, d_model, heads, layers, dropout):
            super().__init__()
            self.wte = nn.Embedding(vocab, d_model)
            self.wpe = nn.Embedding(seq, d_model)
            self.drop = nn.Dropout(dropout)
            self.h = nn.ModuleList([Block(d_model, heads, dropout) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(d_model)
            self.lm_head = nn.Linear(d_model, vocab, bias=False)
            self.lm_head.weight = self.wte.weight

        def forward(self, idx):
            x = self.drop(self.wte(idx) + self.wpe.weight[: idx.size(1)])
            for block in self.h:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return Gpt2


def build(name, dry, device):
    """(model, example inputs, ckplan --input specs, ckplan --dtype or None), seeded."""
    import torch
    torch.manual_seed(0)
    shape = "dry" if dry else "full"
    if name == "gpt2":
        s = GPT2[shape]
        model = gpt2_classes()(s["vocab"], s["seq"], s["d_model"], s["heads"], s["layers"], GPT2_DROPOUT)
        model = model.to(device=device, dtype=torch.bfloat16)
        ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=device)
        return model, (ids,), [f"{s['batch']}x{s['seq']}:int64:0..{s['vocab']}"], "bf16"
    if name == "resnet50":
        import torchvision
        s = RESNET50[shape]
        model = torchvision.models.resnet50(weights=None).to(device)
        x = torch.randn(s["batch"], 3, s["size"], s["size"], device=device)
        return model, (x,), [f"{s['batch']}x3x{s['size']}x{s['size']}"], None
    if name in AUTOCAST:
        s = MIXED[shape]
        model = gpt2_classes()(s["vocab"], s["seq"], s["d_model"], s["heads"], s["layers"], GPT2_DROPOUT)
        if name == "gpt2_lora":
            import peft
            model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                               target_modules=["c_attn", "c_proj", "c_fc"]))
        model = model.to(device)
        ids = torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=device)
        return model, (ids,), [f"{s['batch']}x{s['seq']}:int64:0..{s['vocab']}"], None
    raise SystemExit(f"gpu_check.py: unknown model '{name}' (gpt2, resnet50, gpt2_autocast or gpt2_lora)")


def autocast_of(name):
    """The torch dtype the job's forward runs under torch.autocast in, or None."""
    import torch
    return getattr(torch, AUTOCAST[name]) if name in AUTOCAST else None


def cmd_export(args):
    """The .pt2 (exported on the CPU: the graph keeps aten.scaled_dot_product_attention,
    whose backend is chosen where it runs) and, beside it, its --input specs."""
    import torch
    import ckplan_torch
    model, inputs, specs, dtype = build(args.model, args.dry, "cpu")
    start = time.time()
    ckplan_torch.export(model, inputs, args.out, autocast=autocast_of(args.model))
    attention = sorted({str(n.target) for n in torch.export.load(args.out).graph.nodes
                        if "scaled_dot_product" in str(n.target)})
    meta = {"model": args.model, "inputs": specs, "dtype": dtype, "export_s": round(time.time() - start, 1),
            "attention_ops": attention, "params": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "autocast": AUTOCAST.get(args.model)}
    write_json(os.path.splitext(args.out)[0] + ".json", meta)
    print(f"{args.model}: exported to {args.out} in {meta['export_s']} s ({meta['params']:,} parameters, "
          f"inputs {' '.join(specs)}{', attention ' + ', '.join(attention) if attention else ''})")


# ---- the halfway budget --------------------------------------------------------

UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2 ** 10, "MiB": 2 ** 20, "GiB": 2 ** 30,
         "TiB": 2 ** 40}


def parse_bytes(text):
    m = re.fullmatch(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)\s*([KMGT]i?B|B)?\s*", text)
    if not m:
        return None
    return int(float(m.group(1).replace(",", "")) * UNITS[m.group(2) or "B"])


def strategy_peaks(solve_stdout):
    """{row name: peak bytes} from the strategy table `ckplan solve` prints
    (rows counted as the plan's target counts them)."""
    peaks, header = {}, None
    for line in solve_stdout.splitlines():
        cells = [c.strip() for c in re.split(r"\s{2,}|\|", line.strip()) if c.strip()]
        if not cells:
            continue
        if header is None and cells[0].lower() in ("strategy", "algorithm") and any("peak" in c.lower() for c in cells):
            header = [c.lower() for c in cells]
            continue
        if header is not None and len(cells) >= len(header):
            peak = parse_bytes(cells[next(i for i, c in enumerate(header) if "peak" in c)])
            if peak is not None:
                peaks[cells[0]] = peak
    return peaks


def cmd_halfway(args):
    with open(args.solve_stdout) as f:
        table = strategy_peaks(f.read())
    loose, every_plan = read_json(args.loose_plan), read_json(args.every_plan)
    if loose.get("checkpoint_modules"):
        raise SystemExit(f"{args.loose_plan}: the plan at the loose budget wraps modules: not a no-checkpointing peak")
    none_peak = loose["predicted"]["peak_bytes"]
    # The table's every row is the PyTorch target's (each stage's module wrapped);
    # `--algo every -o` writes the nested schedule's. Prefer the table's.
    every_peak, every_source = table.get("every"), "strategy table (pytorch target)"
    if every_peak is None:
        every_peak, every_source = every_plan["predicted"]["peak_bytes"], "--algo every plan (schedule)"
    # Never below the target's smallest feasible budget (the table's figures are rounded).
    budget = max((every_peak + none_peak) // 2, loose.get("min_budget_bytes", 0))
    doc = {"budget_bytes": budget, "every_peak_bytes": every_peak, "every_source": every_source,
           "none_peak_bytes": none_peak, "every_schedule_peak_bytes": every_plan["predicted"]["peak_bytes"],
           "strategy_table_peaks": table}
    write_json(args.out, doc)
    print(budget)


# ---- the eager step ------------------------------------------------------------

def forward_backward(model, inputs, autocast=None):
    import contextlib
    import torch
    device = inputs[0].device.type
    with torch.autocast(device, dtype=autocast) if autocast is not None else contextlib.nullcontext():
        out = model(*inputs)
        outs = out if isinstance(out, (tuple, list)) else (out,)
        # The loss ckplan adds: each floating output's sum, in float32.
        loss = sum(t.sum().float() for t in outs if t.is_floating_point())
    loss.backward()


class Timed:
    """A span timed by CUDA events on a GPU (wall time on the CPU), and the
    caching allocator's peak over it (reset at its start)."""

    def __init__(self, cuda):
        import torch
        self.torch, self.cuda = torch, cuda

    def __enter__(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.start, self.end = (self.torch.cuda.Event(enable_timing=True) for _ in range(2))
            self.start.record()
        self.wall = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            self.end.record()
            self.torch.cuda.synchronize()
            self.ms = self.start.elapsed_time(self.end)
            self.peak_bytes = self.torch.cuda.max_memory_allocated()
        else:
            self.ms, self.peak_bytes = (time.perf_counter() - self.wall) * 1e3, None
        return False


def measure_mode(model, inputs, optimizer, cuda, steps, autocast=None):
    """One warm-up step (AdamW makes its state), then `steps` measured training
    steps (zero_grad, forward, loss, backward, AdamW): the allocator's peak over
    the forward and backward and over the whole step, the step's time by CUDA
    events; then `steps` forward+backward passes alone (what ckplan's profile
    times as its step), and one more under torch.profiler for the kernels' own
    time (Kineto's CUPTI records)."""
    import torch

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        forward_backward(model, inputs, autocast)
        fwd_bwd_peak = torch.cuda.max_memory_allocated() if cuda else None
        optimizer.step()
        return fwd_bwd_peak

    def fwd_bwd():
        optimizer.zero_grad(set_to_none=True)
        forward_backward(model, inputs, autocast)

    train_step()
    step_ms, step_peaks, fwd_bwd_peaks = [], [], []
    for _ in range(steps):
        with Timed(cuda) as t:
            fwd_bwd_peaks.append(train_step())
        step_ms.append(t.ms)
        step_peaks.append(t.peak_bytes)
    fwd_bwd_ms = []
    for _ in range(steps):
        with Timed(cuda) as t:
            fwd_bwd()
        fwd_bwd_ms.append(t.ms)
    result = {"timer": "CUDA events" if cuda else "wall (CPU)", "steps": steps,
              "step_ms": statistics.median(step_ms), "fwd_bwd_ms": statistics.median(fwd_bwd_ms)}
    if cuda:
        result.update(peak_bytes=max(step_peaks), fwd_bwd_peak_bytes=max(fwd_bwd_peaks))
        result.update(kineto_kernel_ms(fwd_bwd))
    return result


def kineto_kernel_ms(run):
    """The GPU's own time for one forward+backward by torch.profiler (Kineto:
    CUPTI activity records): kernels, and memcpy/memset apart."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        kernel_us, other_us, count = 0.0, 0.0, 0
        for event in prof.events():
            if event.device_type != torch.autograd.DeviceType.CUDA:
                continue
            us = event.time_range.elapsed_us()
            if re.search(r"(?i)memcpy|memset", event.name):
                other_us += us
            else:
                kernel_us += us
                count += 1
        method = "device events"
        if count == 0:  # an older layout: device time only on the CPU ops that launched it
            averages = prof.key_averages()
            kernel_us = sum(getattr(a, "self_device_time_total", getattr(a, "self_cuda_time_total", 0)) for a in averages)
            method = "key_averages self device time"
        return {"kineto_kernel_ms": kernel_us / 1e3, "kineto_memcpy_memset_ms": other_us / 1e3,
                "kineto_kernels": count, "kineto_method": method}
    except Exception as error:  # noqa: BLE001 - a profiler failure leaves the other figures
        return {"kineto_error": f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]}


def cmd_eager(args):
    import torch
    import ckplan_torch
    if not args.device.startswith("cuda"):
        torch.set_num_threads(1)  # as ckplan profiles on the CPU
    model, inputs, _, _ = build(args.model, args.dry, args.device)
    model.train()
    autocast = autocast_of(args.model)
    # Over the trainable parameters (LoRA's adapters), as a fine-tuning job makes it.
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    plan = ckplan_torch.load_plan(args.plan)
    doc = {"device": args.device, "torch": torch.__version__, "optimizer": "torch.optim.AdamW (defaults: foreach)"}
    if args.device.startswith("cuda"):
        doc["gpu"] = torch.cuda.get_device_name()
    cuda = args.device.startswith("cuda")
    doc["none"] = measure_mode(model, inputs, optimizer, cuda, args.steps, autocast)
    wrapped = ckplan_torch.apply_plan(model, plan, optimizer=optimizer)
    doc["plan"] = measure_mode(model, inputs, optimizer, cuda, args.steps, autocast)
    doc["plan"]["wrapped"] = len(wrapped)
    ckplan_torch.remove_plan(model)
    write_json(args.out, doc)
    for mode in ("none", "plan"):
        m = doc[mode]
        print(f"{args.model} eager {mode}: step {m['step_ms']:.2f} ms ({m['timer']})"
              + (f", peak {m['peak_bytes']:,} B (fwd+bwd {m['fwd_bwd_peak_bytes']:,} B)" if "peak_bytes" in m else "")
              + (f", kernels {m['kineto_kernel_ms']:.2f} ms" if "kineto_kernel_ms" in m else ""))


# ---- the table -----------------------------------------------------------------

def read_json(path):
    with open(path) as f:
        return json.load(f)


def maybe_json(path):
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def write_json(path, doc):
    tmp = path + ".tmp.json"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def fmt_bytes(b):
    if b is None:
        return "-"
    return f"{b / 2 ** 30:.2f} GiB" if abs(b) >= 2 ** 30 else f"{b / 2 ** 20:.1f} MiB"


def fmt_ms(ms):
    return "-" if ms is None or (isinstance(ms, float) and math.isnan(ms)) else f"{ms:.1f} ms" if ms >= 10 else f"{ms:.2f} ms"


def fmt_err(predicted, measured):
    if predicted is None or not measured:
        return "-"
    return f"{(predicted - measured) / measured * 100:+.1f}%"


def eager_verdict(measured, predicted, budget):
    if measured is None:
        return "no peak (CPU)"
    checks = []
    if budget is not None and measured > budget:
        checks.append("over_budget")
    if predicted is not None and abs(predicted - measured) > 0.05 * measured:
        checks.append("prediction_off")
    return ", ".join(checks) or "ok"


def read_steps(work):
    steps = []
    path = os.path.join(work, "steps.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) >= 4:
                    steps.append({"name": parts[0], "status": parts[1], "seconds": parts[2], "note": parts[3]})
    return steps


def short_timer(line):
    if not line:
        return "-"
    if "CUPTI kernel activity" in line:
        return "CUPTI"
    if "CUDA events" in line:
        m = re.search(r"\((.*)\)", line)
        return "CUDA events" + (f" ({m.group(1)})" if m else "")
    if "thread CPU time" in line:
        return "thread CPU time"
    return line


def model_rows(work, model, steps):
    d = os.path.join(work, model)
    mine = [s for s in steps if s["name"].startswith(model + ":")]
    failed = {s["name"]: s for s in mine if s["status"] != "ok"}
    first = next((s for s in mine if s["status"] != "ok"), None)

    def status(step, verdict=None):
        """The step's failure, else the verdict; "ok" only for a step that ran."""
        s = failed.get(f"{model}:{step}")
        if s:
            return f"**{s['status']}: {s['note']}**" if s["status"] == "skipped" else f"**{s['status']}**"
        if verdict:
            return verdict
        if any(x["name"] == f"{model}:{step}" for x in mine):
            return "ok"
        if first is None:
            return "not run"
        why = first["note"] if first["status"] == "skipped" else f"{first['name'].split(':', 1)[1]}: {first['status']}"
        return f"not run ({why})"

    rows = []
    prof = maybe_json(os.path.join(d, "profile.json"))
    half = maybe_json(os.path.join(d, "halfway.json"))
    plan = maybe_json(os.path.join(d, "plan.json"))
    run = maybe_json(os.path.join(d, "run.json"))
    eager = maybe_json(os.path.join(d, "eager.json"))
    meta = maybe_json(os.path.join(d, "meta.profile.json"))
    meta_plan = maybe_json(os.path.join(d, "meta.plan.json"))
    budget = plan["budget_bytes"] if plan else (half or {}).get("budget_bytes")
    wrapped = f"optimal, {len(plan['checkpoint_modules'])} modules" if plan else "optimal"
    device = (prof or {}).get("environment", {}).get("device", "-")
    timer_line = (prof or {}).get("environment", {}).get("timer")
    t = (prof or {}).get("totals", {})

    # The profile itself: what it measured of the step with nothing wrapped.
    rows.append([model, f"profile ({device}), none", "-", "-", fmt_bytes(t.get("peak_bytes")), "-", "-",
                 fmt_ms(t.get("step_ms")), short_timer(timer_line), status("profile")])
    if half:
        rows.append([model, "budget: halfway every / none", fmt_bytes(half["budget_bytes"]),
                     f"every {fmt_bytes(half['every_peak_bytes'])}", f"none {fmt_bytes(half['none_peak_bytes'])}",
                     "-", "-", "-", half["every_source"], status("halfway")])
    if run:
        rows.append([model, f"ckplan run ({wrapped})", fmt_bytes(run["budget_bytes"]),
                     fmt_bytes(run["predicted"]["peak_bytes"]), fmt_bytes(run["measured"]["peak_bytes"]),
                     f"{run['peak_error_pct']:+.1f}%", fmt_ms(run["predicted"]["time_ms"]),
                     fmt_ms(run["measured"]["step_ms"]),
                     "wall" if device.startswith("cuda") else "thread CPU time", status("run", run["verdict"])])
    else:
        rows.append([model, f"ckplan run ({wrapped})", fmt_bytes(budget), "-", "-", "-", "-", "-", "-", status("run")])

    none_plan = maybe_json(os.path.join(d, "loose.plan.json"))
    if eager:
        for mode, p, b, label in (("none", none_plan, None, "eager none + AdamW"),
                                  ("plan", plan, budget, f"eager apply_plan ({wrapped}) + AdamW")):
            m = eager[mode]
            predicted = p["pytorch"]["predicted"]["peak_bytes"] if p else None
            predicted_ms = p["predicted"]["time_ms"] if p else None
            measured = m.get("peak_bytes")
            peak_text = fmt_bytes(measured) + (f" (fwd+bwd {fmt_bytes(m['fwd_bwd_peak_bytes'])})"
                                               if m.get("fwd_bwd_peak_bytes") else "")
            rows.append([model, label, fmt_bytes(b), fmt_bytes(predicted), peak_text, fmt_err(predicted, measured),
                         fmt_ms(predicted_ms), fmt_ms(m["step_ms"]), m["timer"],
                         status("eager", eager_verdict(measured, predicted, b))])
    else:
        rows.append([model, f"eager apply_plan ({wrapped}) + AdamW", fmt_bytes(budget), "-", "-", "-", "-", "-", "-",
                     status("eager")])

    # Kernel time of a forward+backward with nothing wrapped: ckplan's per-op
    # timer summed over the ops, against Kineto's kernels and CUDA events in
    # the eager model.
    if prof and eager and "kineto_kernel_ms" in eager["none"]:
        ops_ms = sum(op.get("fwd_ms", 0) + op.get("bwd_ms", 0) for op in prof.get("ops", []))
        e = eager["none"]
        rows.append([model, "kernel time of fwd+bwd, none", "-", "-", "-", "-",
                     f"ckplan ops {fmt_ms(ops_ms)}",
                     f"Kineto {fmt_ms(e['kineto_kernel_ms'])} ({e['kineto_kernels']} kernels); events {fmt_ms(e['fwd_bwd_ms'])}",
                     f"ckplan {short_timer(timer_line)} vs Kineto (CUPTI) vs CUDA events",
                     f"ckplan / Kineto {fmt_err(ops_ms, e['kineto_kernel_ms'])}"])
    elif eager and "kineto_error" in eager.get("none", {}):
        rows.append([model, "kernel time of fwd+bwd, none", "-", "-", "-", "-", "-", "-",
                     f"Kineto: {eager['none']['kineto_error']}", "failed"])

    # The cost model on meta tensors against the measured figures.
    if meta:
        mt = meta.get("totals", {})
        rows.append([model, "meta --gpu h200 vs profile, none", "-", fmt_bytes(mt.get("peak_bytes")),
                     fmt_bytes(t.get("peak_bytes")), fmt_err(mt.get("peak_bytes"), t.get("peak_bytes")),
                     fmt_ms(mt.get("step_ms")), fmt_ms(t.get("step_ms")), "cost model (h200-141gb)",
                     status("meta-profile")])
    else:
        rows.append([model, "meta --gpu h200", "-", "-", "-", "-", "-", "-", "-", status("meta-profile")])
    if meta_plan:
        measured_peak = run["measured"]["peak_bytes"] if run else None
        measured_ms = run["measured"]["step_ms"] if run else None
        same = plan is not None and sorted(meta_plan["checkpoint_modules"]) == sorted(plan["checkpoint_modules"])
        rows.append([model, f"meta plan at the budget ({len(meta_plan['checkpoint_modules'])} modules, "
                     f"{'the same' if same else 'not the same'} as measured) vs ckplan run",
                     fmt_bytes(meta_plan["budget_bytes"]), fmt_bytes(meta_plan["predicted"]["peak_bytes"]),
                     fmt_bytes(measured_peak), fmt_err(meta_plan["predicted"]["peak_bytes"], measured_peak),
                     fmt_ms(meta_plan["predicted"]["time_ms"]), fmt_ms(measured_ms), "cost model (h200-141gb)",
                     status("meta-solve")])
    elif os.path.exists(os.path.join(d, "meta.profile.json")):
        rows.append([model, "meta plan at the budget", fmt_bytes(budget), "-", "-", "-", "-", "-", "-", status("meta-solve")])
    return rows


def cmd_table(args):
    work = args.work
    info = maybe_json(os.path.join(work, "info.json")) or {}
    steps = read_steps(work)
    lines = [f"# ckplan GPU check: {info.get('mode', '?')}", ""]
    for key in ("machine", "gpu", "torch", "cuda", "cupti", "build", "started"):
        if info.get(key):
            lines.append(f"* {key}: {info[key]}")
    lines += ["", "| model | plan | budget | predicted peak | measured peak | peak error | predicted step | measured step "
              "| timer | verdict |", "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for model in info.get("models", ["gpt2", "resnet50"]):
        for row in model_rows(work, model, steps):
            lines.append("| " + " | ".join(str(c).replace("|", "/") for c in row) + " |")
    lines += ["", "| step | status | seconds | note |", "|---|---|---:|---|"]
    for s in steps:
        lines.append(f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note'].replace('|', '/')} |")
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out:
        tmp = args.out + ".tmp.md"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, args.out)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("export")
    p.add_argument("model")
    p.add_argument("out")
    p.add_argument("--dry", action="store_true")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser("halfway")
    p.add_argument("solve_stdout")
    p.add_argument("loose_plan")
    p.add_argument("every_plan")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_halfway)
    p = sub.add_parser("eager")
    p.add_argument("model")
    p.add_argument("plan")
    p.add_argument("out")
    p.add_argument("--dry", action="store_true")
    p.add_argument("--device", default="cuda")
    p.add_argument("--steps", type=int, default=3)
    p.set_defaults(func=cmd_eager)
    p = sub.add_parser("table")
    p.add_argument("work")
    p.add_argument("--out")
    p.set_defaults(func=cmd_table)
    args = parser.parse_args()
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
