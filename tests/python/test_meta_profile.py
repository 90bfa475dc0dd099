"""`ckplan profile --device meta` against the real CPU profile, op by op, on
every test model; a shapes-only export (a model built on the meta device);
and the saved bytes per decoder layer of small Llama and GPT-2 models on meta
against PyTorch's own count on meta tensors (saved_tensors_hooks), computed
here (run by ctest, labels torch and python)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
import torch  # noqa: E402

import ckplan_torch  # noqa: E402
import make_models  # noqa: E402


# Where meta and the CPU part ways, and why (docs/cost-model.md).
KNOWN_DIFFERENCES = {}
# Models whose routing depends on the token values, which meta tensors do not have: ckplan refuses them
# on meta in one line naming the op (asserted below), and they are profiled on the CPU.
NOT_ON_META = {
    "mixtral": "its experts' routing counts tokens per expert (aten::histc) and sorts them: data-dependent "
               "shapes, no meta kernel",
}
# nn.LSTM and nn.GRU: on the CPU PyTorch runs oneDNN's RNN layer (MkldnnRnnLayerBackward0, its workspace
# kept for backward); on meta tensors the same op takes the per-timestep composite path (StackBackward0),
# which keeps other tensors.
for _ext in (".pt", ".pt2"):
    KNOWN_DIFFERENCES["recurrent" + _ext] = ("nn.LSTM/nn.GRU run oneDNN's RNN layer on the CPU and the "
                                             "per-timestep composite on meta: other tensors kept")


def profile(ckplan, model, inputs, out, *extra):
    args = [ckplan, "profile", model, "-o", out, "--reps", "1"] + [a for t in inputs for a in ("--input", t)] + list(extra)
    result = subprocess.run(args, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {result.returncode}: {result.stderr.strip()}")
    with open(out) as f:
        return json.load(f)


def compare(name, cpu, meta, failures, transient_differences):
    """Op by op: kind, saved bytes, outputs' shapes, bytes and whether kept;
    the totals but the peak. Transients (kernel workspaces) are not exact on
    meta: their differences are listed, not failed."""
    if len(cpu["ops"]) != len(meta["ops"]):
        failures.append(f"{name}: {len(cpu['ops'])} ops on the CPU, {len(meta['ops'])} on meta")
        return
    tensors_cpu, tensors_meta = cpu["tensors"], meta["tensors"]
    for a, b in zip(cpu["ops"], meta["ops"]):
        if a["fwd_tmp_bytes"] != b["fwd_tmp_bytes"]:
            transient_differences.append(f"op {a['id']} {a['kind']}: {a['fwd_tmp_bytes']} / {b['fwd_tmp_bytes']}")
        for field in ("kind", "module", "saved_bytes"):
            if a[field] != b[field]:
                failures.append(f"{name}: op {a['id']} ({a['kind']} in {a['module']}): {field} {a[field]} on the CPU, "
                                f"{b[field]} on meta")
        out_a = [(tensors_cpu[t]["shape"], tensors_cpu[t]["bytes"], tensors_cpu[t]["kept"]) for t in a["outputs"]]
        out_b = [(tensors_meta[t]["shape"], tensors_meta[t]["bytes"], tensors_meta[t]["kept"]) for t in b["outputs"]]
        if out_a != out_b:
            failures.append(f"{name}: op {a['id']} ({a['kind']}): outputs {out_a} on the CPU, {out_b} on meta")
    for field in ("param_bytes", "buffer_bytes", "input_bytes", "saved_bytes", "output_bytes"):
        if cpu["totals"][field] != meta["totals"][field]:
            failures.append(f"{name}: totals.{field} {cpu['totals'][field]} on the CPU, {meta['totals'][field]} on meta")


def storage_key(t):
    """A storage's identity: its address, or for a meta storage (no data) the storage object."""
    storage = t.untyped_storage()
    return ("meta", storage._cdata) if t.device.type == "meta" else ("data", storage.data_ptr())


class Producers(torch.utils._python_dispatch.TorchDispatchMode):
    """Which module made each storage (the first op that wrote it), as make_models.ProducerMode, by storage_key."""

    def __init__(self, stack, producers):
        super().__init__()
        self.stack, self.producers = stack, producers

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {storage_key(t) for a in list(args) + list((kwargs or {}).values())
                  for t in (a if isinstance(a, (tuple, list)) else [a]) if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0 and storage_key(t) not in inputs:
                self.producers[storage_key(t)] = self.stack[-1]
        return out


def saved_per_layer(model, inputs, layer_prefix):
    """PyTorch's own count (saved_tensors_hooks), on meta or real tensors:
    storages saved for backward (parameters and inputs excluded), per decoder
    layer (the module that made them), keyed by layer index."""
    excluded = {storage_key(t) for t in list(model.parameters()) + list(model.buffers()) + list(inputs)}
    names = {m: n for n, m in model.named_modules()}
    stack, producers, saved = [""], {}, {}

    def enter(mod, args):
        stack.append(names[mod])

    def leave(mod, args, out):
        stack.pop()

    hooks = [m.register_forward_pre_hook(enter) for m in model.modules()]
    hooks += [m.register_forward_hook(leave) for m in model.modules()]

    def pack(t):
        key = storage_key(t)
        if key not in excluded and t.untyped_storage().nbytes() > 0 and key not in saved:
            saved[key] = (t.untyped_storage().nbytes(), producers.get(key, stack[-1]))
        return t

    # On meta tensors transformers' data-dependent mask checks (.item(),
    # which meta tensors cannot answer) are skipped as a trace skips them;
    # real tensors run the eager model as users run it, as exported.
    is_tracing = torch.jit.is_tracing
    if any(t.is_meta for t in inputs):
        torch.jit.is_tracing = lambda: True
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), Producers(stack, producers):
            model(*inputs)
    finally:
        torch.jit.is_tracing = is_tracing
    for h in hooks:
        h.remove()
    layers = {}
    depth = len(layer_prefix.split("."))
    for size, module in saved.values():
        parts = module.split(".")
        if module.startswith(layer_prefix + ".") and len(parts) > depth:
            layers[int(parts[depth])] = layers.get(int(parts[depth]), 0) + size
    return layers


def ckplan_saved_per_layer(prof, layer_prefix):
    layers = {}
    for op in prof["ops"]:
        m = op["module"]
        if m.startswith(layer_prefix + "."):
            index = int(m[len(layer_prefix) + 1:].split(".")[0])
            layers[index] = layers.get(index, 0) + op["saved_bytes"]
    return layers


def check_decoder(ckplan, tmp, name, build, inputs_text, layer_prefix, failures):
    """A model built on meta, exported shapes-only, profiled on meta: its
    saved bytes per layer equal PyTorch's count for the same program, on
    meta tensors (eager attention: the same ops on meta as anywhere) or, for
    SDPA (whose kernel choice is per device, and meta's is the math path),
    on real CPU tensors, whose choice ckplan's meta kernels follow."""
    for attention in ("eager", "sdpa"):
        with torch.device("meta"):
            model = build(attention).train()
        gen = torch.Generator().manual_seed(0)
        real_inputs = [make_models.make_input(t, gen) for t in inputs_text]
        inputs = [x.to("meta") for x in real_inputs]
        path = os.path.join(tmp, f"{name}_{attention}.pt2")
        ckplan_torch.export(model, tuple(inputs), path)
        try:
            prof = profile(ckplan, path, inputs_text, os.path.join(tmp, name + ".json"), "--device", "meta",
                           "--gpu", "h100")
        except RuntimeError as error:
            failures.append(f"{name} ({attention}): {error}")
            continue
        # The model itself (its layers run the exported program's ops).
        if attention == "sdpa":
            model = model.to_empty(device="cpu")
            inputs = real_inputs
        expected = saved_per_layer(model, inputs, "model." + layer_prefix)
        got = ckplan_saved_per_layer(prof, "model." + layer_prefix)
        print(f"{name} ({attention}): saved bytes per layer on meta {got}, PyTorch's count "
              f"({'meta' if attention == 'eager' else 'CPU'} tensors) {expected}")
        if not expected or expected != got:
            failures.append(f"{name} ({attention}): saved bytes per layer on meta: ckplan {got}, PyTorch {expected}")
    # ckplan run refuses the shapes-only archive in one line.
    plan = os.path.join(tmp, name + ".plan.json")
    subprocess.run([ckplan, "solve", os.path.join(tmp, name + ".json"), "--budget", "1GB", "-o", plan], check=True,
                   capture_output=True)
    result = subprocess.run([ckplan, "run", path, "--plan", plan], capture_output=True, text=True)
    if result.returncode != 2 or "no weights" not in result.stderr or result.stderr.count("\n") != 1:
        failures.append(f"{name}: ckplan run on a shapes-only archive: exit {result.returncode}, {result.stderr!r}")
    # The CPU refuses it too, naming --device meta.
    result = subprocess.run([ckplan, "profile", path] + [a for t in inputs_text for a in ("--input", t)],
                            capture_output=True, text=True)
    if result.returncode != 2 or "--device meta" not in result.stderr:
        failures.append(f"{name}: profile on the CPU of a shapes-only archive: exit {result.returncode}, "
                        f"{result.stderr!r}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--models", required=True)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(make_models.MODELS):
            spec_path = os.path.join(args.models, name + ".json")
            if not os.path.exists(spec_path):
                continue
            with open(spec_path) as f:
                inputs = json.load(f)["inputs"]
            for ext in (".pt2", ".pt"):
                model = os.path.join(args.models, name + ext)
                if name in NOT_ON_META:
                    args_meta = [args.ckplan, "profile", model, "-o", os.path.join(tmp, "meta.json"), "--device",
                                 "meta", "--gpu", "h100"] + [a for t in inputs for a in ("--input", t)]
                    refused = subprocess.run(args_meta, capture_output=True, text=True)
                    lines = refused.stderr.strip().splitlines()
                    if refused.returncode == 0 or len(lines) != 1 or "aten::histc" not in lines[0]:
                        failures.append(f"{name}{ext}: not refused on meta in one line naming aten::histc "
                                        f"(exit {refused.returncode}): {refused.stderr.strip()[:300]}")
                    print(f"{name}{ext}: refused on meta ({NOT_ON_META[name]})")
                    continue
                try:
                    cpu = profile(args.ckplan, model, inputs, os.path.join(tmp, "cpu.json"))
                    meta = profile(args.ckplan, model, inputs, os.path.join(tmp, "meta.json"), "--device", "meta",
                                   "--gpu", "h100")
                except RuntimeError as error:
                    failures.append(f"{name}{ext}: {error}")
                    continue
                before, transients = len(failures), []
                compare(name + ext, cpu, meta, failures, transients)
                if name + ext in KNOWN_DIFFERENCES and len(failures) > before:
                    print(f"{name}{ext}: known difference ({len(failures) - before} fields): {KNOWN_DIFFERENCES[name + ext]}")
                    del failures[before:]
                print(f"{name}{ext}: {len(cpu['ops'])} ops, saved {cpu['totals']['saved_bytes']} B on the CPU, "
                      f"{meta['totals']['saved_bytes']} B on meta: {'equal' if len(failures) == before else 'DIFFERENT'}; "
                      f"peak {cpu['totals']['peak_bytes']} / {meta['totals']['peak_bytes']} B; "
                      f"{len(transients)} ops with other transients {transients[:3]}")
        import transformers as T
        T.logging.set_verbosity_error()
        small = dict(num_hidden_layers=2, num_attention_heads=4, intermediate_size=256)
        check_decoder(args.ckplan, tmp, "llama_meta", lambda attention: make_models.HfModel(T.LlamaForCausalLM(
            T.LlamaConfig(vocab_size=512, hidden_size=64, num_key_value_heads=2, max_position_embeddings=64,
                          attn_implementation=attention, **small)), True),
            ["2x64:int64:0..512"], "model.layers", failures)
        check_decoder(args.ckplan, tmp, "gpt2_meta", lambda attention: make_models.HfModel(T.GPT2LMHeadModel(
            T.GPT2Config(vocab_size=512, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                         attn_implementation=attention)), True),
            ["2x64:int64:0..512"], "transformer.h", failures)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def test_meta_profile(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--models") == 0


if __name__ == "__main__":
    sys.exit(main())
