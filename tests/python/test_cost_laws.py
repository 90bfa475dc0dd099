"""`ckplan profile --gpu cpu` on real test models: the profile records each
attention op's dropout_p and is_causal, GELU's approximate and a recurrent
layer's batch_first, num_layers and bidirectional as the model has them
(PyTorch's own module config, read here), the measured cost laws are in the
profile, every linear layer's predicted times are its law at the features
counted here from its recorded arguments plus one engine node per autograd
node beyond its law's, and a recurrent layer pays its law's fixed cost per
time step (run by ctest, labels torch and python)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "models"))
import make_models  # noqa: E402

SDPA = "aten::scaled_dot_product_attention"


def profile(ckplan, models, name, out):
    with open(os.path.join(models, name + ".json")) as f:
        inputs = json.load(f)["inputs"]
    args = [ckplan, "profile", os.path.join(models, name + ".pt2"), "--gpu", "cpu", "--reps", "1", "-o", out]
    subprocess.run(args + [a for t in inputs for a in ("--input", t)], check=True, capture_output=True)
    with open(out) as f:
        return json.load(f)


def law_us(law, flops, nbytes, weight_bytes):
    return (law["fixed_us"] + law["us_per_flop"] * flops + law["us_per_byte"] * nbytes +
            law["us_per_weight_byte"] * weight_bytes)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckplan", required=True)
    parser.add_argument("--models", required=True)
    args = parser.parse_args(argv)
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, expected_p in (("bert", make_models.hf_model("bert").model.config.attention_probs_dropout_prob),
                                 ("llama", make_models.hf_model("llama").model.config.attention_dropout)):
            prof = profile(args.ckplan, args.models, name, os.path.join(tmp, name + ".json"))
            sdpa = [op for op in prof["ops"] if op["kind"] == SDPA]
            if not sdpa:
                failures.append(f"{name}: no {SDPA} op")
            for op in sdpa:
                if abs(op.get("dropout_p", 0.0) - expected_p) > 1e-12:
                    failures.append(f"{name}: op {op['id']} dropout_p {op.get('dropout_p', 0.0)}, model {expected_p}")
            model = prof["environment"]["time_model"]
            laws = model["op_costs"]
            for op in sdpa:  # the CPU's path: dropout (math) or the fused kernel, with a mask or causal
                masked = len(op["args"]) >= 4 and op["args"][3]["shape"]
                path = (("sdpa_dropout" if expected_p > 0 else "sdpa") + ("_mask" if masked else "") +
                        ("_causal" if op.get("is_causal") else "") + ":float32")
                if path not in laws:
                    failures.append(f"{name}: op {op['id']}: no law {path} (laws: {sorted(laws)})")
            for key, law in laws.items():
                for direction in ("forward", "backward"):
                    if any(v < 0 for v in law[direction].values()):
                        failures.append(f"{name}: law {key} {direction} has a negative coefficient: {law[direction]}")
            # Each linear layer: input [..., K], weight [N, K] (and bias [N]): 2 x input elements x N FLOPs.
            linear = laws["linear:float32"]
            extra_us = model["extra_node_us"]
            tensors = prof["tensors"]
            for op in prof["ops"]:
                if op["kind"] != "aten::linear":
                    continue
                a = op["args"]
                flops = 2.0 * numel(a[0]["shape"]) * a[1]["shape"][0]
                nbytes = 4.0 * (sum(numel(x["shape"]) for x in a) + sum(numel(tensors[t]["shape"]) for t in op["outputs"]))
                weight_bytes = 4.0 * numel(a[1]["shape"])
                for direction, field in (("forward", "fwd_ms"), ("backward", "bwd_ms")):
                    extra = max(0, op["grad_nodes"] - linear["autograd_nodes"]) * extra_us[direction]
                    expected = (law_us(linear[direction], flops, nbytes, weight_bytes) + extra) * 1e-3
                    if abs(op[field] - expected) > 1e-9 * max(1.0, expected):
                        failures.append(f"{name}: linear op {op['id']} {field} {op[field]}, its law gives {expected}")
            # Gradients summed outside the ops: at least each parameter's add into .grad.
            acc = laws["accumulate_grad:float32"]["backward"]
            into_grad_ms = sum(law_us(acc, 0, p["bytes"], 0) for p in prof["parameters"]) * 1e-3
            if model["predicted_accumulate_grad_ms"] < into_grad_ms * (1 - 1e-9):
                failures.append(f"{name}: predicted_accumulate_grad_ms {model['predicted_accumulate_grad_ms']} "
                                f"below the parameters' own {into_grad_ms}")
            print(f"{name}: {len(sdpa)} attention ops, dropout_p {expected_p}; laws {sorted(laws)}; "
                  f"calibration {model['calibration_s']:.2f} s wall")
        # sdpa_decoder: causal attention and GELU's tanh approximation, as its modules have them.
        model = make_models.MODELS["sdpa_decoder"][0]()
        approximate = model.h[0].mlp[1].approximate
        prof = profile(args.ckplan, args.models, "sdpa_decoder", os.path.join(tmp, "sdpa_decoder.json"))
        for op in prof["ops"]:
            if op["kind"] == SDPA and not op.get("is_causal"):
                failures.append(f"sdpa_decoder: op {op['id']} not recorded causal (F.scaled_dot_product_attention(is_causal=True))")
            if op["kind"] == "aten::gelu" and op.get("approximate", "none") != approximate:
                failures.append(f"sdpa_decoder: gelu op {op['id']} approximate {op.get('approximate')}, model {approximate}")
        if "gelu_tanh:float32" not in prof["environment"]["time_model"]["op_costs"]:
            failures.append("sdpa_decoder: no law gelu_tanh:float32")
        # recurrent: nn.LSTM and nn.GRU as configured; the GRU pays its fixed cost per time step.
        stack = make_models.MODELS["recurrent"][0]()
        prof = profile(args.ckplan, args.models, "recurrent", os.path.join(tmp, "recurrent.json"))
        laws = prof["environment"]["time_model"]["op_costs"]
        for kind, module in (("aten::lstm", stack.lstm), ("aten::gru", stack.gru)):
            ops = [op for op in prof["ops"] if op["kind"] == kind]
            if len(ops) != 1:
                failures.append(f"recurrent: {len(ops)} {kind} ops")
                continue
            rnn = ops[0].get("recurrent", {})
            want = {"batch_first": module.batch_first, "num_layers": module.num_layers,
                    "bidirectional": module.bidirectional}
            if rnn != want:
                failures.append(f"recurrent: {kind} recorded {rnn}, module {want}")
            x = ops[0]["args"][0]["shape"]
            steps = (x[1] if module.batch_first else x[0]) * module.num_layers * (2 if module.bidirectional else 1)
            law = laws[kind.split("::")[1] + ":float32"]["forward"]
            if ops[0]["fwd_ms"] < law["fixed_us"] * steps * 1e-3 * (1 - 1e-9):
                failures.append(f"recurrent: {kind} fwd_ms {ops[0]['fwd_ms']} below its fixed cost x {steps} steps")
        print(f"sdpa_decoder: causal, gelu approximate {approximate}; recurrent: laws {sorted(laws)}")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


def test_cost_laws(run_script):
    """Under pytest (ctest runs this file so): every check above, one test."""
    assert run_script(main, "--ckplan", "--models") == 0


if __name__ == "__main__":
    main()
