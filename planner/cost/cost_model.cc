#include "planner/cost/cost_model.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>

#include "planner/base/dtype.h"

namespace ckplan {
namespace {

double Numel(const std::vector<int64_t>& shape) {
  double n = 1;
  for (int64_t d : shape) n *= static_cast<double>(d);
  return n;
}

// Bytes per element of a dtype as LibTorch (`BFloat16`) or torch's Python
// (`bfloat16`) names it, in any case; 1 for a name LibTorch has not.
double ElementBytes(const std::string& dtype) {
  const Dtype* d = FindDtypeIgnoringCase(dtype);
  return d != nullptr ? static_cast<double>(d->bytes) : 1;
}

bool IsFloat(const std::string& dtype) {
  const Dtype* d = FindDtypeIgnoringCase(dtype);
  return d != nullptr && d->floating;
}

double ArgBytes(const ArgRecord& a) { return Numel(a.shape) * ElementBytes(a.dtype); }

bool KindIs(const std::string& kind, std::initializer_list<const char*> names) {
  const std::string bare = kind.substr(kind.find("::") == std::string::npos ? 0 : kind.find("::") + 2);
  for (const char* n : names) {
    if (bare == n) return true;
  }
  return false;
}

}  // namespace

OpWork CountOpWork(const Profile& profile, const OpRecord& op, const CostModelConstants& c) {
  OpWork w;
  double out_bytes = 0;
  bool any_grad = false;
  std::set<int> input_storages;
  for (int t : op.inputs) input_storages.insert(profile.tensors[static_cast<size_t>(t)].storage);
  bool all_alias = !op.outputs.empty();
  for (int t : op.outputs) {
    const TensorRecord& r = profile.tensors[static_cast<size_t>(t)];
    out_bytes += Numel(r.shape) * ElementBytes(r.dtype);
    any_grad = any_grad || r.requires_grad;
    if (!input_storages.count(r.storage)) all_alias = false;
    if (w.dtype.empty() && IsFloat(r.dtype)) w.dtype = r.dtype;
  }
  // The dtype its FLOPs run in: its first floating-point argument's, else its output's.
  double in_bytes = 0;
  std::string arg_dtype;
  for (const ArgRecord& a : op.args) {
    in_bytes += ArgBytes(a);
    if (arg_dtype.empty() && IsFloat(a.dtype)) arg_dtype = a.dtype;
  }
  if (!arg_dtype.empty()) w.dtype = arg_dtype;
  w.has_backward = any_grad;
  w.grad_nodes = op.grad_nodes;
  const std::string& kind = op.kind;
  w.kind = kind.substr(kind.find("::") == std::string::npos ? 0 : kind.find("::") + 2);
  const auto& args = op.args;
  auto last = [](const ArgRecord& a) { return a.shape.empty() ? 1.0 : static_cast<double>(a.shape.back()); };
  if (all_alias && !op.inplace) {
    w.op_class = OpClass::kView;
    return w;
  }
  w.fwd_bytes = in_bytes + out_bytes;
  w.bwd_bytes = c.backward_memory_factor * w.fwd_bytes;
  if (KindIs(kind, {"linear"}) && args.size() >= 2) {
    // input [..., K], weight [N, K]: 2 M N K
    w.op_class = OpClass::kMatmul;
    w.fwd_flops = 2.0 * Numel(args[0].shape) * (args[1].shape.empty() ? 1.0 : static_cast<double>(args[1].shape[0]));
    w.weight_bytes = ArgBytes(args[1]);
  } else if (KindIs(kind, {"matmul", "mm", "bmm"}) && args.size() >= 2) {
    w.op_class = OpClass::kMatmul;
    w.fwd_flops = 2.0 * (out_bytes / std::max(1.0, ElementBytes(w.dtype.empty() ? "float" : w.dtype))) * last(args[0]);
    w.weight_bytes = ArgBytes(args[1]);
  } else if (KindIs(kind, {"addmm", "baddbmm", "addbmm"}) && args.size() >= 3) {
    w.op_class = OpClass::kMatmul;
    w.fwd_flops = 2.0 * (out_bytes / std::max(1.0, ElementBytes(w.dtype.empty() ? "float" : w.dtype))) * last(args[1]);
    w.weight_bytes = ArgBytes(args[2]);
  } else if (KindIs(kind, {"conv1d", "conv2d", "conv3d", "convolution", "_convolution", "conv_transpose2d",
                           "conv_transpose1d", "conv_transpose3d", "mkldnn_convolution"}) &&
             args.size() >= 2 && !args[1].shape.empty() && args[1].shape[0] > 0) {
    // 2 x output elements x (C_in / groups x kernel): the weight's elements per output channel.
    // Transposed: the weight is [C_in, C_out / groups, k...]: per input element instead.
    w.op_class = OpClass::kConvolution;
    const bool transposed = kind.find("transpose") != std::string::npos;
    const double per = Numel(args[1].shape) / static_cast<double>(args[1].shape[0]);
    w.fwd_flops = 2.0 * (transposed ? Numel(args[0].shape) : out_bytes / std::max(1.0, ElementBytes(w.dtype))) * per;
    w.weight_bytes = ArgBytes(args[1]);
  } else if (KindIs(kind, {"scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
                           "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention_for_cpu",
                           "_scaled_dot_product_cudnn_attention"}) &&
             args.size() >= 3 && args[0].shape.size() >= 2 && args[1].shape.size() >= 2) {
    // q [..., L, D], k [..., S, D]: Q K^T and P V, 2 L S D each, per batch and head.
    const bool masked = args.size() >= 4 && !args[3].shape.empty();
    w.op_class = masked ? OpClass::kMaskedAttention : OpClass::kAttention;
    if (op.dropout_p > 0) w.op_class = OpClass::kDropoutAttention;
    // The CPU's path, the key of its law: `sdpa` (fused), `sdpa_dropout`
    // (the math path), each with `_mask` (an explicit mask) or `_causal`.
    w.kind = std::string(op.dropout_p > 0 ? "sdpa_dropout" : "sdpa") + (masked ? "_mask" : "") +
             (op.is_causal ? "_causal" : "");
    const auto& q = args[0].shape;
    const double l = static_cast<double>(q[q.size() - 2]), d = static_cast<double>(q.back());
    const double s = static_cast<double>(args[1].shape[args[1].shape.size() - 2]);
    w.fwd_flops = 4.0 * (Numel(q) / (l * d)) * l * s * d;
    w.bwd_flops = c.backward_attention_factor * w.fwd_flops;
    // The math path (dropout) makes the attention matrix, batch x heads x
    // L x S, and passes over it several times (scale, mask, softmax,
    // dropout): its bytes, whatever the head size.
    if (op.dropout_p > 0) w.fwd_bytes += (Numel(q) / (l * d)) * l * s * ElementBytes(args[0].dtype);
    return w;
  }
  if (KindIs(kind, {"lstm", "gru", "rnn_tanh", "rnn_relu"}) && !args.empty() && !args[0].shape.empty()) {
    // Every weight matrix multiplies one vector per timestep and batch
    // element (2 x its elements each), every layer and direction:
    // 2 x (batch x time) x the 2-D weights' elements.
    w.op_class = OpClass::kRecurrent;
    double weights = 0;
    for (size_t a = 1; a < args.size(); ++a) {
      if (args[a].shape.size() == 2) {
        weights += Numel(args[a].shape);
        w.weight_bytes += ArgBytes(args[a]);
      }
    }
    w.fwd_flops = 2.0 * Numel(args[0].shape) / static_cast<double>(std::max<int64_t>(1, args[0].shape.back())) * weights;
    // One small step per time step, layer and direction: the time dimension
    // from `recurrent.batch_first` (PyTorch's default, sequence first, where
    // the profile does not say; unbatched input: its first dimension), the
    // layers and directions recorded, else one per pair of weight matrices.
    const auto& x = args[0].shape;
    const bool batch_first = op.recurrent.num_layers > 0 && op.recurrent.batch_first;
    const double steps = static_cast<double>(x.size() == 3 && batch_first ? x[1] : x[0]);
    double matrices = 0;
    for (size_t a = 1; a < args.size(); ++a) matrices += args[a].shape.size() == 2 ? 1 : 0;
    const double stacks = op.recurrent.num_layers > 0
                              ? op.recurrent.num_layers * (op.recurrent.bidirectional ? 2.0 : 1.0)
                              : std::max(1.0, matrices / 2);
    w.calls = steps * stacks;
  }
  if (w.op_class == OpClass::kMatmul || w.op_class == OpClass::kConvolution || w.op_class == OpClass::kRecurrent) {
    w.bwd_flops = c.backward_matmul_factor * w.fwd_flops;
  }
  if (KindIs(kind, {"dropout", "native_dropout", "feature_dropout", "alpha_dropout", "bernoulli"})) {
    w.op_class = OpClass::kRandom;
  }
  // GELU's tanh approximation runs another kernel: its own law.
  if (KindIs(kind, {"gelu"}) && op.approximate == "tanh") w.kind = "gelu_tanh";
  if (KindIs(kind, {"embedding"}) && !args.empty()) {
    // Forward: gather the rows; backward: zero the weight's gradient, scatter-add the rows.
    w.fwd_bytes = 2 * out_bytes;
    w.bwd_bytes = ArgBytes(args[0]) + 2 * out_bytes;
  }
  return w;
}

namespace {

// The dtype's Python name (`float32`, `bfloat16`): the key of a measured rate
// curve or law; a name LibTorch has not, in lower case.
std::string CurveDtype(const std::string& dtype) {
  if (const Dtype* d = FindDtypeIgnoringCase(dtype)) return d->python;
  std::string lower = dtype;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char ch) { return std::tolower(ch); });
  return lower;
}

}  // namespace

double InterpolateTflops(const std::vector<std::pair<double, double>>& curve, double flops) {
  if (curve.empty()) return 0;
  if (flops <= curve.front().first) return curve.front().second;
  if (flops >= curve.back().first) return curve.back().second;
  for (size_t i = 1; i < curve.size(); ++i) {
    if (flops > curve[i].first) continue;
    const auto& [x0, y0] = curve[i - 1];
    const auto& [x1, y1] = curve[i];
    const double t = std::log(flops / x0) / std::log(x1 / x0);
    return std::exp(std::log(y0) + t * (std::log(y1) - std::log(y0)));
  }
  return curve.back().second;
}

double RooflineMs(const GpuSpec& gpu, OpClass op_class, const std::string& dtype, double flops, double bytes,
                  const CostModelConstants& c, bool backward, double call_flops) {
  if (op_class == OpClass::kView) return gpu.view_overhead_us * 1e-3;
  const std::string key = CurveDtype(dtype);
  const double peak_tflops = key == "bfloat16" ? gpu.bf16_tflops : key == "float16" ? gpu.fp16_tflops : gpu.fp32_tflops;
  double efficiency = 1.0;
  switch (op_class) {
    case OpClass::kMatmul:
    case OpClass::kRecurrent: efficiency = c.matmul_efficiency; break;
    case OpClass::kConvolution: efficiency = c.convolution_efficiency; break;
    case OpClass::kAttention:
    case OpClass::kMaskedAttention:
    case OpClass::kDropoutAttention: efficiency = c.attention_efficiency; break;
    default: efficiency = c.matmul_efficiency; break;  // the few FLOPs of memory-bound ops
  }
  double tflops = peak_tflops * efficiency;
  if (op_class != OpClass::kMemory && op_class != OpClass::kRandom && !gpu.measured_tflops.empty()) {
    // A measured rate at the op's size: the op's own curve (a convolution's,
    // masked attention's, attention's), else the matmul's.
    auto curve = gpu.measured_tflops.end();
    auto find = [&](const std::string& name) {
      if (curve == gpu.measured_tflops.end()) curve = gpu.measured_tflops.find(name + ":" + key);
    };
    if (op_class == OpClass::kConvolution) find("convolution");
    if (op_class == OpClass::kMaskedAttention) find("attention_mask");
    if (op_class == OpClass::kMaskedAttention || op_class == OpClass::kAttention ||
        op_class == OpClass::kDropoutAttention) {
      find("attention");
    }
    find("matmul");
    if (curve != gpu.measured_tflops.end() && !curve->second.empty()) {
      tflops = InterpolateTflops(curve->second, call_flops > 0 ? call_flops : flops);
    }
  }
  const double compute_s = flops > 0 && tflops > 0 ? flops / (tflops * 1e12) : 0;
  // Dropout's forward makes random numbers: its own measured rate where there is one.
  double gb_per_s = gpu.bandwidth_gb_per_s;
  if (const auto it = gpu.elementwise_gb_per_s.find(key); it != gpu.elementwise_gb_per_s.end()) {
    gb_per_s = it->second;
  }
  if (op_class == OpClass::kRandom && !backward && gpu.random_gb_per_s > 0) gb_per_s = gpu.random_gb_per_s;
  const double memory_s = bytes > 0 && gb_per_s > 0 ? bytes / (gb_per_s * 1e9 * c.memory_efficiency) : 0;
  const double overhead_us = backward && gpu.bwd_op_overhead_us > 0 ? gpu.bwd_op_overhead_us : gpu.op_overhead_us;
  return overhead_us * 1e-3 + 1e3 * std::max(compute_s, memory_s);
}

namespace {

// The measured law of an op's kind and dtype, else of its class's stand-in
// (`linear` for matmuls, `conv2d` for convolutions, `sdpa`, `sdpa_mask`,
// `sdpa_dropout` for attention's three CPU paths); null where the device has none.
const std::pair<LinearOpCost, LinearOpCost>* FindOpCost(const GpuSpec& gpu, const OpWork& w, std::string* key = nullptr) {
  if (gpu.op_costs.empty() || w.op_class == OpClass::kView) return nullptr;
  const std::string dtype = CurveDtype(w.dtype.empty() ? "float32" : w.dtype);
  std::string stand_in;
  switch (w.op_class) {
    case OpClass::kMatmul: stand_in = "linear"; break;
    case OpClass::kConvolution: stand_in = "conv2d"; break;
    case OpClass::kAttention: stand_in = "sdpa"; break;
    case OpClass::kMaskedAttention: stand_in = "sdpa_mask"; break;
    case OpClass::kDropoutAttention: stand_in = "sdpa_dropout"; break;
    default: break;
  }
  // Attention's path, not its kind, decides its kernels: w.kind names it (`sdpa_dropout_mask`).
  for (const std::string& name : {w.kind, stand_in}) {
    if (name.empty()) continue;
    const auto it = gpu.op_costs.find(name + ":" + dtype);
    if (it == gpu.op_costs.end()) continue;
    if (key != nullptr) *key = it->first;
    return &it->second;
  }
  return nullptr;
}

// The dtype of the parameters: the weight of the first matmul or
// convolution, else the first floating-point argument's; float32 for none.
std::string ParameterDtype(const Profile& profile, const CostModelConstants& c) {
  std::string first;
  for (const OpRecord& op : profile.ops) {
    const OpWork w = CountOpWork(profile, op, c);
    if ((w.op_class == OpClass::kMatmul || w.op_class == OpClass::kConvolution) && op.args.size() >= 2) {
      return op.args[w.kind == "addmm" && op.args.size() >= 3 ? 2 : 1].dtype;
    }
    for (const ArgRecord& a : op.args) {
      if (first.empty() && IsFloat(a.dtype)) first = a.dtype;
    }
  }
  return first.empty() ? "float32" : first;
}

}  // namespace

double OpMs(const GpuSpec& gpu, const OpWork& w, bool backward, const CostModelConstants& c) {
  // Autograd nodes beyond those its law's microbenchmark made (or, for an
  // op without a law, beyond the one its fixed cost stands for): each costs
  // the engine a node more (a linear on 3-D input flattens it and views its
  // output back; views of non-contiguous gradients copy).
  auto extra_nodes_ms = [&](double priced_nodes) {
    if (!w.grad_nodes || w.op_class == OpClass::kRecurrent) return 0.0;
    const double extra = std::max(0.0, *w.grad_nodes - priced_nodes);
    return 1e-3 * extra * (backward ? gpu.extra_node_bwd_us : gpu.extra_node_fwd_us);
  };
  std::string key;
  if (const auto* law = FindOpCost(gpu, w, &key)) {
    const OpFeatures features{w.fwd_flops, w.fwd_bytes, w.weight_bytes, w.calls};
    const auto nodes = gpu.op_cost_nodes.find(key);
    return 1e-3 * (backward ? law->second : law->first).Us(features) +
           extra_nodes_ms(nodes != gpu.op_cost_nodes.end() ? nodes->second : 1.0);
  }
  return extra_nodes_ms(1.0) +
         (backward ? RooflineMs(gpu, w.op_class, w.dtype, w.bwd_flops, w.bwd_bytes, c, true, w.fwd_flops)
                   : RooflineMs(gpu, w.op_class, w.dtype, w.fwd_flops, w.fwd_bytes, c, false, w.fwd_flops));
}

double PredictedAccumulateGradMs(const Profile& profile, const GpuSpec& gpu) {
  if (gpu.op_costs.empty()) return 0;
  const std::string dtype = CurveDtype(ParameterDtype(profile, {}));
  double us = 0;
  // Each parameter's gradient delivered to its `.grad` (set to None before
  // the step: taken, not added).
  if (const auto it = gpu.op_costs.find("accumulate_grad:" + dtype); it != gpu.op_costs.end()) {
    for (const ParameterRecord& p : TrainableParameters(profile.parameters)) {
      us += it->second.second.Us({0, static_cast<double>(p.bytes), 0});
    }
  }
  // A value several ops read gets a gradient from each of them: the engine
  // adds them up (in its input buffer, no node of its own).
  const auto sum = gpu.op_costs.find("grad_sum:" + dtype);
  if (sum == gpu.op_costs.end()) return us * 1e-3;
  std::vector<int> readers(profile.tensors.size(), 0);
  for (const OpRecord& op : profile.ops) {
    if (!CountOpWork(profile, op).has_backward) continue;
    std::set<int> inputs(op.inputs.begin(), op.inputs.end());
    for (int t : inputs) ++readers[static_cast<size_t>(t)];
  }
  for (size_t t = 0; t < readers.size(); ++t) {
    const TensorRecord& r = profile.tensors[t];
    if (readers[t] < 2 || !r.requires_grad || !IsFloat(r.dtype)) continue;
    us += (readers[t] - 1) * sum->second.second.Us({0, Numel(r.shape) * ElementBytes(r.dtype), 0});
  }
  return us * 1e-3;
}

double PredictedStepMs(const Profile& profile, const GpuSpec& gpu, const CostModelConstants& c) {
  double total = 0;
  for (const OpRecord& op : profile.ops) {
    const OpWork w = CountOpWork(profile, op, c);
    total += OpMs(gpu, w, false, c);
    if (w.has_backward) total += OpMs(gpu, w, true, c);
  }
  return total;
}

double PredictedLossMs(const Profile& profile, const GpuSpec& gpu, const CostModelConstants& c) {
  // Per output: a sum (reads it; backward: an expand, a view, of the
  // gradient), a cast to float32 where it is not, an add to the running loss;
  // each op both ways.
  double ms = 0;
  int terms = 0;
  auto fixed = [&](const std::string& dtype) {  // an op on a scalar: its fixed costs both ways
    return RooflineMs(gpu, OpClass::kMemory, dtype, 0, 0, c) + RooflineMs(gpu, OpClass::kMemory, dtype, 0, 0, c, true);
  };
  for (int t : profile.outputs) {
    const TensorRecord& r = profile.tensors[static_cast<size_t>(t)];
    if (!IsFloat(r.dtype) || !r.requires_grad) continue;
    ms += RooflineMs(gpu, OpClass::kMemory, r.dtype, 0, Numel(r.shape) * ElementBytes(r.dtype), c) +
          RooflineMs(gpu, OpClass::kMemory, r.dtype, 0, 0, c, true);
    if (CurveDtype(r.dtype) != "float32") {
      ms += fixed(r.dtype);
    }
    if (terms++ > 0) {
      ms += fixed(r.dtype);
    }
  }
  return ms;
}

void ApplyCostModel(Profile* profile, const GpuSpec& gpu, const CostModelConstants& c) {
  const double measured_ms = profile->totals.fwd_ms + profile->totals.bwd_ms;
  profile->totals.time_noise_pct.reset();  // the model's times have none
  double measured_ops_ms = 0;  // the ops' own times (the step's also holds the autograd engine's)
  for (const OpRecord& op : profile->ops) measured_ops_ms += op.fwd_ms + op.bwd_ms;
  double fwd = 0, bwd = 0, flops = 0;
  for (OpRecord& op : profile->ops) {
    const OpWork w = CountOpWork(*profile, op, c);
    op.fwd_ms = OpMs(gpu, w, false, c);
    op.bwd_ms = w.has_backward ? OpMs(gpu, w, true, c) : 0;
    // The same kernels without autograd: a recomputation costs the forward
    // (what was measured without autograd, on meta tensors nothing, is replaced).
    op.fwd_nograd_ms = op.fwd_ms;
    fwd += op.fwd_ms;
    bwd += op.bwd_ms;
    flops += w.fwd_flops + (w.has_backward ? w.bwd_flops : 0);
  }
  profile->totals.fwd_ms = fwd;
  profile->totals.bwd_ms = bwd;
  profile->environment.time_model = {
      {"gpu", gpu.name},
      {"description", gpu.description},
      {"fp32_tflops", gpu.fp32_tflops},
      {"bf16_tflops", gpu.bf16_tflops},
      {"fp16_tflops", gpu.fp16_tflops},
      {"bandwidth_gb_per_s", gpu.bandwidth_gb_per_s},
      {"memory_bytes", gpu.memory_bytes},
      {"op_overhead_us", gpu.op_overhead_us},
      {"bwd_op_overhead_us", gpu.bwd_op_overhead_us > 0 ? gpu.bwd_op_overhead_us : gpu.op_overhead_us},
      {"view_overhead_us", gpu.view_overhead_us},
      {"random_gb_per_s", gpu.random_gb_per_s > 0 ? gpu.random_gb_per_s : gpu.bandwidth_gb_per_s},
      {"elementwise_gb_per_s", gpu.elementwise_gb_per_s},
      {"predicted_loss_ms", PredictedLossMs(*profile, gpu, c)},
      {"predicted_accumulate_grad_ms", PredictedAccumulateGradMs(*profile, gpu)},
      {"step_flops", flops},
      {"efficiency", {{"matmul", c.matmul_efficiency}, {"convolution", c.convolution_efficiency},
                      {"attention", c.attention_efficiency}, {"memory", c.memory_efficiency}}},
      {"source", gpu.source}};
  // What the profile measured before (none on meta tensors): for comparison.
  if (measured_ms > 0) {
    profile->environment.time_model["measured_step_ms"] = measured_ms;
    profile->environment.time_model["measured_ops_ms"] = measured_ops_ms;
  }
  // The whole step timed without per-op timers (forward, loss, backward): what
  // the ops' predicted times plus predicted_loss_ms compare with.
  if (profile->totals.step_ms.value_or(0) > 0) {
    profile->environment.time_model["measured_plain_step_ms"] = *profile->totals.step_ms;
  }
  // The step's other work, from the model too where nothing was measured on
  // the device it stands for (meta tensors, or a GPU): the whole step is the
  // ops plus the loss (no time outside them), and an optimizer's update is
  // memory-bound: it reads and writes the parameters, gradients and state,
  // 3 (sgd), 5 (momentum) or 7 (adam) times the parameter bytes.
  const bool measured_here = gpu.name == "cpu" && profile->environment.device == "cpu";
  if (!measured_here) {
    // The executor's cost of a stage run was measured on this machine's
    // CPU, not on the device modelled: no part of the modelled step.
    profile->calibration = Calibration{};
    profile->totals.step_ms = fwd + bwd + PredictedLossMs(*profile, gpu, c) + PredictedAccumulateGradMs(*profile, gpu);
    const double param_bytes = static_cast<double>(profile->totals.param_bytes);
    profile->totals.optimizer_step_ms.clear();
    for (const auto& [name, passes] : {std::pair<const char*, double>{"sgd", 3}, {"momentum", 5}, {"adam", 7}}) {
      profile->totals.optimizer_step_ms[name] =
          gpu.bandwidth_gb_per_s > 0 ? passes * param_bytes / (gpu.bandwidth_gb_per_s * 1e9 * c.memory_efficiency) * 1e3
                                     : 0;
    }
    profile->environment.time_model["optimizer_step"] = "memory-bound: 3/5/7 x parameter bytes (sgd/momentum/adam)";
  }
  if (!gpu.measured_tflops.empty()) {
    nlohmann::json curves = nlohmann::json::object();
    for (const auto& [key, points] : gpu.measured_tflops) {
      for (const auto& [flops, tflops] : points) curves[key].push_back({{"flops", flops}, {"tflops", tflops}});
    }
    profile->environment.time_model["measured_tflops"] = curves;
  }
  if (!gpu.op_costs.empty()) {
    nlohmann::json laws = nlohmann::json::object();
    auto law_json = [](const LinearOpCost& l) {
      return nlohmann::json{{"fixed_us", l.fixed_us}, {"us_per_flop", l.flop_us}, {"us_per_byte", l.byte_us},
                            {"us_per_weight_byte", l.weight_byte_us}};
    };
    for (const auto& [key, law] : gpu.op_costs) {
      laws[key] = {{"forward", law_json(law.first)}, {"backward", law_json(law.second)}};
      if (const auto nodes = gpu.op_cost_nodes.find(key); nodes != gpu.op_cost_nodes.end()) {
        laws[key]["autograd_nodes"] = nodes->second;
      }
    }
    profile->environment.time_model["op_costs"] = laws;
    profile->environment.time_model["extra_node_us"] = {{"forward", gpu.extra_node_fwd_us},
                                                           {"backward", gpu.extra_node_bwd_us}};
  }
}

}  // namespace ckplan
