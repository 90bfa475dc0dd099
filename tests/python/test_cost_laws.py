"""`ckplan profile --gpu cpu` on real test models: the profile records each
attention op's dropout_p and is_causal, GELU's approximate and a recurrent
layer's batch_first, num_layers and bidirectional as the model has them
(PyTorch's own module config, read here), the measured cost laws are in the
profile, every linear layer's predicted times are its law at the features
counted here from its recorded arguments plus one engine node per autograd
node beyond its law's, and a recurrent layer pays its law's fixed cost per
time step (run by ctest, labels torch and python)."""
import json
import subprocess

import pytest

import make_models
from model_files import input_flags, model_file, model_spec

SDPA = "aten::scaled_dot_product_attention"


@pytest.fixture(scope="module")
def profiled(ckplan, models_dir, tmp_path_factory):
    """A test model's .pt2 profiled with `--gpu cpu`, once for the module: name -> the profile as a dict."""
    out, done = tmp_path_factory.mktemp("profiles"), {}

    def of(name):
        if name not in done:
            path = out / (name + ".json")
            args = [ckplan, "profile", model_file(models_dir, name, ".pt2"), "--gpu", "cpu", "--reps", "1",
                    "-o", str(path)] + input_flags(model_spec(models_dir, name))
            result = subprocess.run(args, capture_output=True, text=True)
            assert result.returncode == 0, f"{name}: ckplan profile exit {result.returncode}: {result.stderr.strip()}"
            with open(path) as f:
                done[name] = json.load(f)
        return done[name]
    return of


def law_us(law, flops, nbytes, weight_bytes):
    return (law["fixed_us"] + law["us_per_flop"] * flops + law["us_per_byte"] * nbytes +
            law["us_per_weight_byte"] * weight_bytes)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# The attention models and their dropout probability as the model's config has it.
ATTENTION = {"bert": lambda: make_models.hf_model("bert").model.config.attention_probs_dropout_prob,
             "llama": lambda: make_models.hf_model("llama").model.config.attention_dropout}


def ops_of(prof, kind, name):
    """The profile's ops of a kind; fails when there is none (a check over none checks nothing)."""
    ops = [op for op in prof["ops"] if op["kind"] == kind]
    assert ops, f"{name}: no {kind} op in the profile"
    return ops


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_attention_dropout_and_law(profiled, name):
    """Each SDPA op records the model's dropout_p, and the law of the CPU's path it takes (dropout or fused,
    masked, causal) is in the profile."""
    expected_p = ATTENTION[name]()
    prof = profiled(name)
    laws = prof["environment"]["time_model"]["op_costs"]
    for op in ops_of(prof, SDPA, name):
        assert abs(op.get("dropout_p", 0.0) - expected_p) <= 1e-12, (
            f"{name}: op {op['id']} dropout_p {op.get('dropout_p', 0.0)}, model {expected_p}")
        masked = len(op["args"]) >= 4 and op["args"][3]["shape"]
        path = (("sdpa_dropout" if expected_p > 0 else "sdpa") + ("_mask" if masked else "") +
                ("_causal" if op.get("is_causal") else "") + ":float32")
        assert path in laws, f"{name}: op {op['id']}: no law {path} (laws: {sorted(laws)})"


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_laws_have_no_negative_coefficient(profiled, name):
    """Every measured law's forward and backward coefficients are >= 0."""
    laws = profiled(name)["environment"]["time_model"]["op_costs"]
    assert laws, f"{name}: no laws in the profile"
    for key, law in laws.items():
        for direction in ("forward", "backward"):
            assert all(v >= 0 for v in law[direction].values()), (
                f"{name}: law {key} {direction} has a negative coefficient: {law[direction]}")


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_linear_times_follow_their_law(profiled, name):
    """Each linear layer (input [..., K], weight [N, K], bias [N]: 2 x input elements x N FLOPs) is predicted at
    its law, plus one engine node per autograd node beyond the law's."""
    prof = profiled(name)
    model = prof["environment"]["time_model"]
    linear, extra_us, tensors = model["op_costs"]["linear:float32"], model["extra_node_us"], prof["tensors"]
    for op in ops_of(prof, "aten::linear", name):
        a = op["args"]
        flops = 2.0 * numel(a[0]["shape"]) * a[1]["shape"][0]
        nbytes = 4.0 * (sum(numel(x["shape"]) for x in a) + sum(numel(tensors[t]["shape"]) for t in op["outputs"]))
        weight_bytes = 4.0 * numel(a[1]["shape"])
        for direction, field in (("forward", "fwd_ms"), ("backward", "bwd_ms")):
            extra = max(0, op["grad_nodes"] - linear["autograd_nodes"]) * extra_us[direction]
            expected = (law_us(linear[direction], flops, nbytes, weight_bytes) + extra) * 1e-3
            assert abs(op[field] - expected) <= 1e-9 * max(1.0, expected), (
                f"{name}: linear op {op['id']} {field} {op[field]}, its law gives {expected}")


@pytest.mark.parametrize("name", sorted(ATTENTION))
def test_gradients_summed_at_least_into_grad(profiled, name):
    """The gradients summed outside the ops cost at least each parameter's add into .grad."""
    prof = profiled(name)
    model = prof["environment"]["time_model"]
    acc = model["op_costs"]["accumulate_grad:float32"]["backward"]
    assert prof["parameters"], f"{name}: no parameters in the profile"
    into_grad_ms = sum(law_us(acc, 0, p["bytes"], 0) for p in prof["parameters"]) * 1e-3
    assert model["predicted_accumulate_grad_ms"] >= into_grad_ms * (1 - 1e-9), (
        f"{name}: predicted_accumulate_grad_ms {model['predicted_accumulate_grad_ms']} below the parameters' "
        f"own {into_grad_ms}")


def test_causal_attention_and_gelu_tanh(profiled):
    """sdpa_decoder: its attention recorded causal (F.scaled_dot_product_attention(is_causal=True)) and GELU's
    tanh approximation as its modules have them, with a law for gelu_tanh."""
    approximate = make_models.MODELS["sdpa_decoder"][0]().h[0].mlp[1].approximate
    prof = profiled("sdpa_decoder")
    for op in ops_of(prof, SDPA, "sdpa_decoder"):
        assert op.get("is_causal"), f"sdpa_decoder: op {op['id']} not recorded causal"
    for op in ops_of(prof, "aten::gelu", "sdpa_decoder"):
        assert op.get("approximate", "none") == approximate, (
            f"sdpa_decoder: gelu op {op['id']} approximate {op.get('approximate')}, model {approximate}")
    assert "gelu_tanh:float32" in prof["environment"]["time_model"]["op_costs"], "sdpa_decoder: no law gelu_tanh"


@pytest.mark.parametrize("kind", ["aten::lstm", "aten::gru"])
def test_recurrent_layer(profiled, kind):
    """nn.LSTM and nn.GRU recorded as configured (batch_first, num_layers, bidirectional), and each pays its
    law's fixed cost per time step."""
    stack = make_models.MODELS["recurrent"][0]()
    module = stack.lstm if kind == "aten::lstm" else stack.gru
    prof = profiled("recurrent")
    ops = ops_of(prof, kind, "recurrent")
    assert len(ops) == 1, f"recurrent: {len(ops)} {kind} ops, the model has one"
    want = {"batch_first": module.batch_first, "num_layers": module.num_layers, "bidirectional": module.bidirectional}
    assert ops[0].get("recurrent", {}) == want, f"recurrent: {kind} recorded {ops[0].get('recurrent')}, module {want}"
    x = ops[0]["args"][0]["shape"]
    steps = (x[1] if module.batch_first else x[0]) * module.num_layers * (2 if module.bidirectional else 1)
    law = prof["environment"]["time_model"]["op_costs"][kind.split("::")[1] + ":float32"]["forward"]
    assert ops[0]["fwd_ms"] >= law["fixed_us"] * steps * 1e-3 * (1 - 1e-9), (
        f"recurrent: {kind} fwd_ms {ops[0]['fwd_ms']} below its fixed cost x {steps} steps")
