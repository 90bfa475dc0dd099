#include "libtorch/profiler/profiler.h"

#include <ATen/Parallel.h>
#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/script.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <set>

#include "planner/base/error.h"
#include "libtorch/runtime/file_hash.h"
#include "libtorch/runtime/device.h"
#include "libtorch/runtime/meta_device.h"
#include "libtorch/executor/optimizer_step.h"
#include "libtorch/profiler/calibration.h"
#include "planner/cost/same_work.h"
#include "libtorch/runtime/timing.h"
#include "libtorch/runtime/graph_program.h"
#include "libtorch/runtime/pt2_model.h"
#include "libtorch/runtime/tracking_allocator.h"

namespace ckplan {
namespace {




// Backward functions are linked to forward ops through autograd sequence
// numbers: every autograd node made while op k ran has a number in op k's range.
struct BackwardRecorder {
  bool active = false;
  std::vector<std::pair<uint64_t, int>> range_starts;  // (first seq, op), ascending
  std::vector<uint64_t> range_ends;
  std::vector<double> bwd_ms;
  std::vector<int64_t> bwd_tmp_bytes;
  // Per op: live memory when its first backward node started (-1 before),
  // and its peak over all its nodes above that (OpRecord::bwd_span_peak_bytes).
  std::vector<int64_t> bwd_span_start, bwd_span_peak_bytes;
  int span_op = -1;  // the op whose backward node ran last: what runs until the next one is its
  void CreditSpan(int op, int64_t window_peak) {
    if (op < 0 || static_cast<size_t>(op) >= bwd_span_start.size()) return;
    const size_t k = static_cast<size_t>(op);
    bwd_span_peak_bytes[k] = std::max(bwd_span_peak_bytes[k], window_peak - bwd_span_start[k]);
  }
  GpuOpTimer* gpu_timer = nullptr;  // kernel time on a GPU
  // The detailed step: the storages kept for backward not yet freed
  // (tracker allocation ids), and for each freed one the op whose backward
  // ran last when it went (autograd releases what a node saved once the
  // node returns, before the next one starts).
  std::vector<int64_t> pending;
  std::map<int64_t, int> released_by;
  int last_op = -1;

  void NoteReleases() {
    const TrackingAllocator& tracker = TrackingAllocator::Instance();
    for (size_t k = 0; k < pending.size();) {
      if (tracker.IsLive(pending[k])) {
        ++k;
        continue;
      }
      if (last_op >= 0) released_by[pending[k]] = last_op;
      pending[k] = pending.back();
      pending.pop_back();
    }
  }

  int OpFor(int64_t seq) const {
    if (seq < 0) return -1;
    auto it = std::upper_bound(range_starts.begin(), range_starts.end(),
                               std::make_pair(static_cast<uint64_t>(seq), INT32_MAX));
    if (it == range_starts.begin()) return -1;
    size_t k = static_cast<size_t>(std::prev(it) - range_starts.begin());
    return static_cast<uint64_t>(seq) < range_ends[k] ? range_starts[k].second : -1;
  }
};

BackwardRecorder* g_recorder = nullptr;

struct BackwardContext : at::ObserverContext {
  Clock::time_point start;
  int op = -1;
  int previous_owner = kOwnerNone;
  int64_t live_at_start = 0;
};

std::unique_ptr<at::ObserverContext> OnBackwardStart(const at::RecordFunction& fn) {
  if (g_recorder == nullptr || !g_recorder->active) return nullptr;
  auto ctx = std::make_unique<BackwardContext>();
  ctx->op = g_recorder->OpFor(fn.seqNr());
  if (!g_recorder->pending.empty()) g_recorder->NoteReleases();
  if (ctx->op >= 0) g_recorder->last_op = ctx->op;
  ctx->previous_owner = TrackingAllocator::Owner();
  TrackingAllocator& tracker = TrackingAllocator::Instance();
  ctx->live_at_start = tracker.live_bytes();
  // Since the last node started: the node, the engine's work after it and
  // nodes of no op (a parameter's AccumulateGrad) count to the last op's span.
  g_recorder->CreditSpan(g_recorder->span_op, tracker.window_peak_bytes());
  if (ctx->op >= 0) g_recorder->span_op = ctx->op;
  tracker.ResetWindowPeak();
  if (ctx->op >= 0) TrackingAllocator::SetOwner(ctx->op);
  if (ctx->op >= 0 && static_cast<size_t>(ctx->op) < g_recorder->bwd_span_start.size() &&
      g_recorder->bwd_span_start[static_cast<size_t>(ctx->op)] < 0) {
    g_recorder->bwd_span_start[static_cast<size_t>(ctx->op)] = ctx->live_at_start;
  }
  if (ctx->op >= 0 && g_recorder->gpu_timer) g_recorder->gpu_timer->Begin(ctx->op, /*backward=*/true);
  ctx->start = Clock::now();
  return ctx;
}

void OnBackwardEnd(const at::RecordFunction&, at::ObserverContext* raw) {
  auto* ctx = static_cast<BackwardContext*>(raw);
  if (ctx == nullptr || g_recorder == nullptr) return;
  double ms = OpMsSince(ctx->start);
  TrackingAllocator::SetOwner(ctx->previous_owner);
  if (ctx->op < 0) return;
  if (g_recorder->gpu_timer) g_recorder->gpu_timer->End(ctx->op, /*backward=*/true);
  size_t op = static_cast<size_t>(ctx->op);
  g_recorder->bwd_ms[op] += ms;
  int64_t transient = TrackingAllocator::Instance().window_peak_bytes() - ctx->live_at_start;
  g_recorder->bwd_tmp_bytes[op] = std::max(g_recorder->bwd_tmp_bytes[op], transient);
  g_recorder->CreditSpan(ctx->op, TrackingAllocator::Instance().window_peak_bytes());
}

void InstallBackwardCallback() {
  static bool installed = [] {
    at::addGlobalCallback(at::RecordFunctionCallback(&OnBackwardStart, &OnBackwardEnd)
                              .scopes({at::RecordScope::BACKWARD_FUNCTION}));
    return true;
  }();
  (void)installed;
}

std::string FirstLine(const std::string& s) { return s.substr(0, s.find('\n')); }

int64_t StorageBytes(const at::Tensor& t) {
  return t.defined() && t.has_storage() ? static_cast<int64_t>(t.storage().nbytes()) : 0;
}

// The ledger's key of a storage: its data, or for a meta storage (no data)
// its allocation context (meta_device.cc).
const void* StorageData(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return nullptr;
  const c10::DataPtr& data = t.storage().data_ptr();
  return data.get() != nullptr ? data.get() : data.get_context();
}

// Measured reps that also time the forward without autograd and the step
// without per-op timers (each rep times the ops).
constexpr int kSecondaryReps = 3;
// Forwards without autograd, cut and whole, each after a step, timed in turn
// for what a recomputation costs in a step (calibration.h).
constexpr int kRecomputePairs = 3;
// `--calibrate pytorch`: the wrapped modules' rounds alone, at least one (a
// small model's more, until 0.6 s of their steps: calibration.cc), so that
// plan() costs a few steps (docs/measurements.md).
constexpr int kModulePairs = 1;

// The value of a node's argument named `dropout_p` (scaled dot-product
// attention: on the CPU a non-zero one takes the math path), else 0.
double DropoutP(const ProgramNode& node, const Environment& env) {
  const c10::FunctionSchema* schema = node.node->maybeSchema();
  if (schema == nullptr) return 0;
  const std::optional<int> index = schema->argumentIndexWithName("dropout_p");
  if (!index || static_cast<size_t>(*index) >= node.node->inputs().size()) return 0;
  const auto it = env.find(node.node->inputs()[static_cast<size_t>(*index)]);
  return it != env.end() && it->second.isDouble() ? it->second.toDouble() : 0;
}

// The value of a node's argument named `name`, where its schema has one.
std::optional<c10::IValue> ArgumentNamed(const ProgramNode& node, const Environment& env, const char* name) {
  const c10::FunctionSchema* schema = node.node->maybeSchema();
  if (schema == nullptr) return std::nullopt;
  const std::optional<int> index = schema->argumentIndexWithName(name);
  if (!index || static_cast<size_t>(*index) >= node.node->inputs().size()) return std::nullopt;
  const auto it = env.find(node.node->inputs()[static_cast<size_t>(*index)]);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

// The arguments the cost model reads besides the tensors: GELU's
// `approximate` (where not `none`), attention's `is_causal`, and a recurrent layer's `batch_first`,
// `num_layers`, `bidirectional` (which of its input's dimensions is time).
void RecordCostArguments(const ProgramNode& node, const Environment& env, OpRecord* op) {
  if (const auto a = ArgumentNamed(node, env, "approximate"); a && a->isString() && a->toStringRef() != "none") {
    op->approximate = a->toStringRef();
  }
  if (const auto c = ArgumentNamed(node, env, "is_causal"); c && c->isBool()) op->is_causal = c->toBool();
  const auto batch_first = ArgumentNamed(node, env, "batch_first");
  const auto layers = ArgumentNamed(node, env, "num_layers");
  const auto bidirectional = ArgumentNamed(node, env, "bidirectional");
  if (batch_first && batch_first->isBool() && layers && layers->isInt() && bidirectional && bidirectional->isBool()) {
    op->recurrent.batch_first = batch_first->toBool();
    op->recurrent.num_layers = static_cast<int>(layers->toInt());
    op->recurrent.bidirectional = bidirectional->toBool();
  }
}

// The tensor a chain of prim::GetAttr from the module (the graph's first
// input) reads, with the chain's names ("wte", "weight"); undefined if none.
at::Tensor AttributeTensor(torch::jit::Module& module, const torch::jit::Value* value,
                           std::vector<std::string>* names) {
  while (value->node()->kind() == c10::prim::GetAttr) {
    names->insert(names->begin(), value->node()->s(c10::attr::name));
    value = value->node()->input(0);
  }
  if (value->node()->kind() != c10::prim::Param || value->offset() != 0) return {};
  c10::IValue current = module._ivalue();
  for (const std::string& name : *names) {
    if (!current.isObject() || !current.toObjectRef().type()->hasAttribute(name)) return {};
    current = current.toObjectRef().getAttr(name);
  }
  return current.isTensor() ? current.toTensor() : at::Tensor();
}

// The embeddings (module path, rows) whose indices model input `input` is,
// itself or through ops that keep its values (views, reshapes, copies).
std::vector<std::pair<std::string, int64_t>> EmbeddingsIndexedBy(GraphProgram& program, size_t input) {
  static const std::set<std::string> kKeepValues = {
      "aten::view",      "aten::reshape", "aten::_unsafe_view", "aten::flatten", "aten::contiguous", "aten::unsqueeze",
      "aten::squeeze",   "aten::clone",   "aten::detach",       "aten::alias",   "aten::to",         "aten::permute",
      "aten::transpose", "aten::t",       "aten::expand",       "aten::slice",   "aten::select"};
  std::unordered_map<const torch::jit::Node*, std::string> module_paths;
  for (const ProgramNode& node : program.nodes()) module_paths[node.node] = node.module_path;
  std::vector<std::pair<std::string, int64_t>> found;
  std::vector<const torch::jit::Value*> pending = {program.InputValue(input)};
  std::set<const torch::jit::Value*> seen;
  while (!pending.empty()) {
    const torch::jit::Value* value = pending.back();
    pending.pop_back();
    if (!seen.insert(value).second) continue;
    for (const torch::jit::Use& use : value->uses()) {
      const std::string kind = use.user->kind().toQualString();
      if (kind == "aten::embedding" && use.offset == 1) {
        std::vector<std::string> names;
        const at::Tensor weight = AttributeTensor(program.module(), use.user->input(0), &names);
        if (!weight.defined() || weight.dim() != 2) continue;
        // The module that ran it (a tied weight's first name may be another's).
        std::string path = module_paths[use.user];
        for (size_t k = 0; path.empty() && k + 1 < names.size(); ++k) path += (k ? "." : "") + names[k];
        found.push_back({path, weight.size(0)});
      } else if (kKeepValues.count(kind) && use.offset == 0) {
        for (const torch::jit::Value* out : use.user->outputs()) pending.push_back(out);
      }
    }
  }
  return found;
}

// Integer inputs given no range: one that indexes embeddings is drawn from
// 0 to the smallest vocabulary (ids as a tokenizer makes them; 0..2 would
// use two rows), any other from the default 0..2; each choice said in one
// line. The range is written into the spec's text too: the profile keeps
// it, and `ckplan run` makes its inputs from it.
std::vector<InputSpec> ChooseIntegerRanges(GraphProgram& program, std::vector<InputSpec> specs,
                                           std::vector<std::string>* warnings) {
  for (size_t i = 0; i < specs.size() && i < program.num_inputs(); ++i) {
    InputSpec& spec = specs[i];
    if (!IsIntegerDtype(spec.dtype) || spec.dtype == "bool" || spec.has_range) continue;
    const std::string given = "--input " + spec.text + " (input " + std::to_string(i + 1) + ")";
    const std::string choose = " (choose others with --input " + spec.text + ":LO..HI)";
    // Embeddings take int64 or int32 indices.
    const auto embeddings = spec.dtype == "int64" || spec.dtype == "int32"
                                ? EmbeddingsIndexedBy(program, i)
                                : std::vector<std::pair<std::string, int64_t>>{};
    if (embeddings.empty()) {
      warnings->push_back(given + ": integers drawn from 0..2, zeros and ones" + choose);
      continue;
    }
    auto smallest = embeddings.front();
    for (const auto& e : embeddings) {
      if (e.second < smallest.second) smallest = e;
    }
    const std::string range = "0.." + std::to_string(smallest.second);
    warnings->push_back(given + " indexes the embedding '" + smallest.first + "': ids drawn from its vocabulary, " +
                        range + choose);
    spec.has_range = true;
    spec.lo = 0;
    spec.hi = static_cast<double>(smallest.second);
    spec.text += ":" + range;
  }
  return specs;
}

// Everything one measured step records about the graph and its memory.
struct StepRecord {
  std::vector<TensorRecord> tensors;
  std::vector<const c10::TensorImpl*> tensor_impls;  // valid while the tensor lives
  std::vector<int64_t> tensor_allocation;             // tracker allocation id of its storage
  std::vector<std::vector<int>> op_inputs, op_outputs;
  std::vector<std::vector<ArgRecord>> op_args;  // every tensor argument, weights included
  std::vector<int64_t> op_fwd_tmp;
  std::vector<int64_t> op_saved;
  std::vector<double> op_dropout_p;  // an argument named dropout_p (attention), else 0
  std::vector<int64_t> op_wrapped_numbers;  // Python numbers eager autograd keeps (ExportWrappedNumberBytes)
  std::vector<OpRecord> op_arguments;  // approximate, recurrent (RecordCostArguments), grad_nodes
  std::vector<int> inputs, outputs;
  std::vector<int> held_outputs;  // the model's other outputs beside its own loss
  std::map<std::string, std::vector<int>> module_inputs;  // module path -> tensors it was called with
  int64_t saved_bytes = 0;
  int64_t output_bytes = 0;
  int64_t peak_bytes = 0;
  int64_t autocast_cache_bytes = 0;  // freed when the autocast region ended (ProfileTotals)
};

class Profiler {
 public:
  Profiler(const ProfileOptions& options, std::vector<std::string>* warnings)
      : options_(options), warnings_(warnings), tracker_(TrackingAllocator::Instance()) {}

  Profile Run() {
    if (options_.reps < 1) throw BadInput("invalid --reps " + std::to_string(options_.reps) + ": must be at least 1");
    if (options_.calibrate != "all" && options_.calibrate != "pytorch" && options_.calibrate != "none") {
      throw BadInput("invalid --calibrate '" + options_.calibrate + "': all, pytorch or none");
    }
    nlohmann::json phases = nlohmann::json::object();
    WallClock::time_point phase_start = WallClock::now();
    auto phase_done = [&](const char* name) {
      const WallClock::time_point now = WallClock::now();
      phases[name] = phases.value(name, 0.0) + std::chrono::duration<double>(now - phase_start).count();
      phase_start = now;
    };
    const bool meta = options_.device == "meta";
    device_ = meta ? OpenMetaDevice() : OpenDevice(options_.device);
    TrackDeviceMemory(device_);
    const std::optional<c10::ScalarType> dtype = ParseProfileDtype(options_.dtype);
    at::set_num_threads(options_.threads);
    const std::string& path = options_.model_path;
    std::string sha256 = Sha256File(path);
    torch::jit::Module module = LoadModel(path);
    if (device_.cuda()) module.to(device_.device);
    if (!meta && HasMetaWeights(module)) {
      throw BadInput(path + ": a shapes-only archive (exported from a model on the meta device): it has no weights; "
                            "profile it with --device meta");
    }
    PrepareModule(module, device_, dtype);
    CheckModel(module);
    GraphProgram program(module);
    if (meta) RetargetConstantsToMeta(program);
    const std::optional<c10::ScalarType> autocast = ResolveAutocast(options_.autocast, ExportAutocastDtype(path));
    program.SetAutocast(autocast, device_.device.type());
    if (program.num_inputs() != options_.inputs.size()) {
      throw BadInput(path + ": forward takes " + std::to_string(program.num_inputs()) + " input(s), got " +
                     std::to_string(options_.inputs.size()) + " --input");
    }
    if (program.num_ops() == 0) throw BadInput(path + ": the forward graph has no tensor ops");
    const std::vector<InputSpec> specs = ChooseIntegerRanges(program, options_.inputs, warnings_);
    std::vector<at::Tensor> inputs = meta ? MakeMetaInputs(specs, dtype) : MakeInputs(specs, options_.seed);
    if (!meta) CastInputs(&inputs, dtype);
    if (device_.cuda()) {
      for (at::Tensor& t : inputs) t = t.to(device_.device);
    }
    // Storages allocated from here on are the forward's; older ones (the
    // parameters, the inputs) are external.
    first_forward_allocation_ = tracker_.NextAllocationId();
    InstallBackwardCallback();

    const size_t ops = static_cast<size_t>(program.num_ops());
    std::vector<std::vector<double>> fwd_ms(ops), bwd_ms(ops), fwd_nograd_ms(ops);
    std::vector<double> step_fwd_ms, step_bwd_ms, step_ms;
    std::vector<int64_t> bwd_tmp(ops, 0), bwd_span(ops, -1);
    StepRecord record;
    const int total = options_.reps + 1;
    for (int rep = 0; rep < total; ++rep) {
      if (options_.progress) options_.progress(rep, total);
      const bool measured = rep > 0;
      const bool detailed = rep == 1;
      BackwardRecorder recorder;
      recorder.bwd_ms.assign(ops, 0);
      recorder.bwd_tmp_bytes.assign(ops, 0);
      recorder.bwd_span_start.assign(ops, -1);
      recorder.bwd_span_peak_bytes.assign(ops, 0);
      std::vector<double> op_ms(ops, 0);
      double forward_ms = 0, backward_ms = 0;
      if (rep == 0) phase_done("load");
      RunStep(program, inputs, &recorder, &op_ms, &forward_ms, &backward_ms, detailed ? &record : nullptr);
      if (!measured) {
        phase_done("warm_up");
        continue;
      }
      // The same forward without autograd, right after (what recomputation
      // costs), and the step without per-op timers: in the first
      // kSecondaryReps measured reps only (their medians settle sooner
      // than the per-op times', and each costs a third of a step or a whole
      // one: profiling took 3.7x the plain steps with them in every rep).
      if (rep <= kSecondaryReps) {
        std::vector<double> nograd_op_ms(ops, 0);
        RunNoGradForward(program, inputs, &nograd_op_ms);
        for (size_t k = 0; k < ops; ++k) fwd_nograd_ms[k].push_back(nograd_op_ms[k]);
        // The step without per-op timers prices the schedule target's loss
        // and backward, which `--calibrate pytorch` leaves to the timed step.
        if (options_.calibrate == "all") step_ms.push_back(TimePlainStep(program, inputs));
      }
      for (size_t k = 0; k < ops; ++k) {
        fwd_ms[k].push_back(op_ms[k]);
        bwd_ms[k].push_back(recorder.bwd_ms[k]);
        bwd_tmp[k] = std::max(bwd_tmp[k], recorder.bwd_tmp_bytes[k]);
        if (recorder.bwd_span_start[k] >= 0) bwd_span[k] = std::max(bwd_span[k], recorder.bwd_span_peak_bytes[k]);
      }
      step_fwd_ms.push_back(forward_ms);
      step_bwd_ms.push_back(backward_ms);
      phase_done("steps");
    }
    std::map<std::string, double> optimizer_step_ms = TimeOptimizers(program.module());
    phase_done("optimizers");
    if (options_.progress) options_.progress(total, total);

    Profile profile;
    profile.model.path = path;
    profile.model.sha256 = sha256;
    profile.model.inputs = specs;
    profile.model.training = module.is_training();
    // Which loss the profile back-propagated: the model's own, or the
    // sum over its outputs (as `ckplan run`'s --loss does).
    // `loss_fn`: the job's own, exported with the model.
    profile.model.loss = program.returns_job_loss() ? "loss_fn" : program.returns_loss() ? "model" : "outputs";
    // Modules the forward never calls (nn.ModuleList, nn.ModuleDict: their
    // children are called one by one): an eager plan cannot wrap them.
    for (const auto& item : module.named_modules()) {
      if (item.name.empty() || !item.value.type()->name()) continue;
      // The class's own name (a trace's `___torch_mangle_5.ModuleList`), or
      // the .pt2 reader's name for a module no op ran in (pt2_model.cc).
      const std::string type = item.value.type()->name()->name();
      const bool container = type == "ModuleList" || type == "ModuleDict" || type == "ParameterList" ||
                             type == "ParameterDict" ||
                             item.value.type()->name()->qualifiedName().rfind("__torch__.ckplan_pt2.Container", 0) == 0;
      if (container) profile.model.containers.push_back(item.name);
    }
    if (!program.output_choice().empty()) profile.model.output_choice = program.output_choice();
    EnvironmentRecord& environment = profile.environment;
    environment.libtorch = LibTorchVersion();
    environment.threads = options_.threads;
    environment.device = device_.name;
    environment.reps = options_.reps;
    environment.seed = static_cast<int64_t>(options_.seed);
    environment.timer = device_.cuda() ? timer_line_
                        : meta         ? "none: meta tensors do no work"
                                       : "thread CPU time (CLOCK_THREAD_CPUTIME_ID)";
    environment.memory = device_.cuda() ? "CUDA caching allocator: its trace per op, its device "
                                          "statistics for the step's peak"
                         : meta         ? "tracking meta allocator: every meta storage counted, none allocated"
                                        : "tracking CPU allocator";
    if (dtype) environment.dtype = std::string(c10::toString(*dtype));
    if (autocast) environment.autocast = TorchDtypeName(*autocast);
    profile.tensors = record.tensors;
    profile.inputs = record.inputs;
    profile.outputs = record.outputs;
    profile.module_inputs = record.module_inputs;
    profile.held_outputs = record.held_outputs;
    // The eager model's own liveness, measured at export on the CPU with the
    // model's dtype: it holds only for the same inputs, device and dtype.
    if (!meta && !device_.cuda() && !dtype && IsExportArchive(path)) {
      profile.module_eager_peak_bytes = ExportEagerModulePeaks(path, inputs);
      phase_done("eager_peaks");
    }
    for (size_t k = 0; k < ops; ++k) {
      const ProgramNode& node = program.nodes()[program.OpNode(static_cast<int>(k))];
      OpRecord op;
      op.id = static_cast<int>(k);
      op.kind = node.node->kind().toQualString();
      op.module = node.module_path;
      op.inputs = record.op_inputs[k];
      op.outputs = record.op_outputs[k];
      op.args = record.op_args[k];
      std::string kind = op.kind;
      op.inplace = kind.size() > 1 && kind.back() == '_' && kind[kind.size() - 2] != '_';
      op.saved_bytes = record.op_saved[k];
      op.fwd_tmp_bytes = record.op_fwd_tmp[k];
      op.bwd_tmp_bytes = bwd_tmp[k];
      if (bwd_span[k] >= 0) op.bwd_span_peak_bytes = bwd_span[k];
      op.fwd_ms = Median(fwd_ms[k]);
      op.bwd_ms = Median(bwd_ms[k]);
      op.fwd_nograd_ms = Median(fwd_nograd_ms[k]);
      op.dropout_p = record.op_dropout_p[k];
      op.wrapped_number_bytes = record.op_wrapped_numbers[k];
      op.approximate = record.op_arguments[k].approximate;
      op.is_causal = record.op_arguments[k].is_causal;
      op.recurrent = record.op_arguments[k].recurrent;
      op.grad_nodes = record.op_arguments[k].grad_nodes;
      profile.ops.push_back(std::move(op));
    }
    profile.totals.param_bytes = param_bytes_;
    profile.parameters = parameters_;
    // Ops that do the same work timed together: the median of all their
    // samples (layers that do the same work cost the same), and the noise.
    if (!meta) {
      const std::vector<int> forward = SameWorkGroups(profile, /*backward=*/false);
      const std::vector<int> backward = SameWorkGroups(profile, /*backward=*/true);
      const PooledTimes fwd = PoolSamples(forward, fwd_ms);
      const PooledTimes bwd = PoolSamples(backward, bwd_ms);
      const PooledTimes nograd = PoolSamples(forward, fwd_nograd_ms);
      for (size_t k = 0; k < ops; ++k) {
        profile.ops[k].fwd_ms = fwd.ms[k];
        profile.ops[k].bwd_ms = bwd.ms[k];
        profile.ops[k].fwd_nograd_ms = nograd.ms[k];
      }
      profile.totals.time_noise_pct = fwd.noise_pct;
    }
    profile.totals.buffer_bytes = buffer_bytes_;
    for (const at::Tensor& t : inputs) profile.totals.input_bytes += StorageBytes(t);
    profile.totals.saved_bytes = record.saved_bytes;
    profile.totals.output_bytes = record.output_bytes;
    profile.totals.fwd_ms = Median(step_fwd_ms);
    profile.totals.bwd_ms = Median(step_bwd_ms);
    profile.totals.peak_bytes = record.peak_bytes;
    profile.totals.autocast_cache_bytes = record.autocast_cache_bytes;
    profile.totals.optimizer_step_ms = optimizer_step_ms;
    if (!step_ms.empty()) profile.totals.step_ms = Median(step_ms);
    // What a recomputation costs as `ckplan run` runs it, on the stages this
    // profile cuts into (meta tensors do no work: nothing to time). A model
    // the executor cannot run stage by stage keeps its profile, without it.
    if (!meta && options_.calibrate != "none") {
      try {
        const bool all = options_.calibrate == "all";
        profile.calibration = MeasureCalibration(profile, program, module, inputs, device_,
                                                 all ? kRecomputePairs : kModulePairs, /*schedules=*/all);
      } catch (const std::exception& e) {
        warnings_->push_back(path + ": recomputation not timed as `ckplan run` runs it (priced at the ops' forward "
                                    "without autograd): " + FirstLine(e.what()));
      }
      phase_done("calibration");
    }
    profile.environment.phase_seconds = phases;
    return profile;
  }

 private:
  void CheckModel(const torch::jit::Module& module) {
    std::set<const void*> seen;
    bool trainable = false;
    for (const auto& p : module.named_parameters()) {
      if (p.value.requires_grad()) trainable = true;
      if (seen.insert(StorageData(p.value)).second) {
        param_bytes_ += StorageBytes(p.value);
        parameters_.push_back(
            {p.name, p.value.sizes().vec(), static_cast<int64_t>(p.value.nbytes()), p.value.requires_grad()});
      }
    }
    for (const auto& b : module.named_buffers()) {
      if (seen.insert(StorageData(b.value)).second) buffer_bytes_ += StorageBytes(b.value);
    }
    if (!trainable) {
      throw BadInput(options_.model_path + ": the model has no parameters that require gradients: nothing to train");
    }
    if (!module.is_training() && IsExportArchive(options_.model_path)) {
      warnings_->push_back(options_.model_path +
                           ": the program was exported in eval mode (dropout and batch norm run as in inference); "
                           "training uses train mode: export it with ckplan_torch.export(model, inputs, path), or "
                           "call model.train() before torch.export.export");
    } else if (!module.is_training()) {
      warnings_->push_back(options_.model_path +
                           ": the model was saved in eval mode; training uses train mode (dropout, batch norm "
                           "statistics): call model.train() before torch.jit.trace and save it again");
    }
  }

  // One forward (node by node) and backward. With `record`, also the tensors
  // of the graph and what each op keeps.
  void RunStep(GraphProgram& program, const std::vector<at::Tensor>& inputs, BackwardRecorder* recorder,
               std::vector<double>* op_ms, double* forward_ms, double* backward_ms, StepRecord* record) {
    for (const auto& p : program.module().parameters()) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
    const size_t ops = static_cast<size_t>(program.num_ops());
    recorder->range_starts.clear();
    recorder->range_ends.clear();
    std::unordered_map<const torch::jit::Value*, std::vector<int>> value_tensors;
    if (record) {
      record->op_inputs.assign(ops, {});
      record->op_args.assign(ops, {});
      record->op_outputs.assign(ops, {});
      record->module_inputs.clear();
      record->op_fwd_tmp.assign(ops, 0);
      record->op_saved.assign(ops, 0);
      record->op_dropout_p.assign(ops, 0.0);
      record->op_wrapped_numbers.assign(ops, 0);
      record->op_arguments.assign(ops, OpRecord{});
    }
    auto new_tensor = [&](const at::Tensor& t, int producer) {
      TensorRecord rec;
      rec.id = static_cast<int>(record->tensors.size());
      rec.shape = t.sizes().vec();
      rec.dtype = std::string(c10::toString(t.scalar_type()));
      rec.bytes = StorageBytes(t);
      rec.nbytes = static_cast<int64_t>(t.numel()) * static_cast<int64_t>(t.element_size());
      rec.requires_grad = t.requires_grad();
      rec.producer = producer;
      record->tensors.push_back(rec);
      record->tensor_impls.push_back(t.unsafeGetTensorImpl());
      record->tensor_allocation.push_back(tracker_.AllocationId(StorageData(t)));
      return rec.id;
    };

    // What the process holds besides the model's state and inputs (the loaded
    // archive's records) is no part of the step's peak.
    int64_t other = tracker_.live_bytes() - param_bytes_ - buffer_bytes_;
    for (const at::Tensor& t : inputs) other -= StorageBytes(t);
    tracker_.ResetPeak();
    const int64_t ledger_kept = tracker_.live_bytes() - other;
    const std::optional<int64_t> device_base = ResetDevicePeak(device_);
    std::unique_ptr<GpuOpTimer> gpu_timer = MakeGpuOpTimer(device_, &timer_line_);
    recorder->gpu_timer = gpu_timer.get();
    Environment env;
    program.BindInputs(env, inputs);
    if (record) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        int id = new_tensor(inputs[i], -1);
        record->inputs.push_back(id);
        value_tensors[program.InputValue(i)] = {id};
      }
    }
    const auto forward_start = Clock::now();
    const auto& nodes = program.nodes();
    for (size_t index = 0; index < nodes.size(); ++index) {
      const ProgramNode& node = nodes[index];
      if (!node.is_op) {
        RunOrExplain(program, index, env, inputs);
        if (record) LinkTensors(node, env, record, &value_tensors);
        program.FreeDeadAfter(index, env);
        continue;
      }
      const size_t op = static_cast<size_t>(node.op_id);
      const uint64_t seq_before = at::sequence_number::peek();
      tracker_.ResetWindowPeak();
      const auto start = Clock::now();
      {
        OwnerScope owner(node.op_id);
        if (gpu_timer) gpu_timer->Begin(node.op_id, /*backward=*/false);
        RunOrExplain(program, index, env, inputs);
        if (gpu_timer) gpu_timer->End(node.op_id, /*backward=*/false);
      }
      (*op_ms)[op] = OpMsSince(start);
      const uint64_t seq_after = at::sequence_number::peek();
      if (seq_after > seq_before) {
        recorder->range_starts.push_back({seq_before, node.op_id});
        recorder->range_ends.push_back(seq_after);
      }
      if (record) {
        for (const torch::jit::Value* in : node.node->inputs()) {  // shapes for the cost model
          auto it = env.find(in);
          std::vector<at::Tensor> args;
          if (it != env.end()) CollectTensors(it->second, &args);
          for (const at::Tensor& t : args) {
            if (t.defined()) record->op_args[op].push_back({t.sizes().vec(), std::string(c10::toString(t.scalar_type()))});
          }
        }
        record->op_fwd_tmp[op] = std::max<int64_t>(0, tracker_.window_peak_bytes() - tracker_.live_bytes());
        record->op_dropout_p[op] = DropoutP(node, env);
        // Kept only where the op made an autograd node; host memory, so
        // counted where the model runs on the host.
        if (seq_after > seq_before && device_.device.is_cpu()) {
          record->op_wrapped_numbers[op] = ExportWrappedNumberBytes(node.node);
        }
        RecordCostArguments(node, env, &record->op_arguments[op]);
        record->op_arguments[op].grad_nodes = static_cast<int>(seq_after - seq_before);
        for (const torch::jit::Value* in : node.node->inputs()) {
          auto it = value_tensors.find(in);
          if (it != value_tensors.end()) {
            for (int id : it->second) record->op_inputs[op].push_back(id);
          }
        }
        for (const torch::jit::Value* out : node.node->outputs()) {
          std::vector<at::Tensor> tensors;
          CollectTensors(env.at(out), &tensors);
          std::vector<int>& ids = value_tensors[out];
          for (const at::Tensor& t : tensors) {
            if (!t.defined()) continue;
            int id = new_tensor(t, node.op_id);
            ids.push_back(id);
            record->op_outputs[op].push_back(id);
          }
        }
      }
      program.FreeDeadAfter(index, env);
    }
    *forward_ms = MsSince(forward_start);

    // Loss: the sum of the model's floating-point outputs, whose gradient is
    // a tensor of each output's size (as a training loss's is; `sum()`'s
    // alone is an expanded scalar, which the last op's backward would then
    // copy whole into its own transient).
    std::vector<at::Tensor> outputs;
    for (const c10::IValue& v : program.Outputs(env)) CollectTensors(v, &outputs);
    at::Tensor loss;
    {
      OwnerScope owner(kOwnerLoss);
      const GraphProgram::AutocastScope autocast(program);  // the loss inside the job's autocast region
      for (const at::Tensor& t : outputs) {
        if (!t.defined() || !t.is_floating_point() || !t.requires_grad()) continue;
        at::Tensor s = (t * at::ones_like(t)).sum().to(at::kFloat);
        loss = loss.defined() ? loss + s : s;
      }
    }
    // The region ends: the weights' casts it cached go, but what autograd
    // saved (a linear's bias cast is cached to here, saved by nothing).
    const int64_t before_end = tracker_.live_bytes();
    program.EndAutocast();
    if (record) record->autocast_cache_bytes = std::max<int64_t>(0, before_end - tracker_.live_bytes());
    if (!loss.defined()) {
      throw BadInput(options_.model_path + ": no output of the model requires gradients: nothing to back-propagate");
    }
    if (record) {
      std::set<const void*> seen;
      for (const torch::jit::Value* v : program.OutputValues()) {
        auto it = value_tensors.find(v);
        if (it == value_tensors.end()) continue;
        for (int id : it->second) record->outputs.push_back(id);
      }
      for (const torch::jit::Value* v : program.held_outputs()) {
        auto it = value_tensors.find(v);
        if (it == value_tensors.end()) continue;
        for (int id : it->second) record->held_outputs.push_back(id);
      }
      for (const at::Tensor& t : outputs) {
        if (seen.insert(StorageData(t)).second) record->output_bytes += StorageBytes(t);
      }
      // The tensors each module was called with (a .pt2 whose export kept
      // the call signatures).
      for (const ProgramNode& node : program.nodes()) {
        for (const auto& [path, value] : ModuleCallInputs(node.node)) {
          auto it = value_tensors.find(value);
          if (it == value_tensors.end()) continue;
          std::vector<int>& ids = record->module_inputs[path];
          for (int id : it->second) {
            if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
          }
        }
      }
    }
    // What survives once the outputs are dropped is what autograd keeps.
    env.clear();
    outputs.clear();
    if (record) {
      for (const auto& a : tracker_.LiveAllocations()) {
        if (a.owner < 0) continue;
        record->op_saved[static_cast<size_t>(a.owner)] += a.bytes;
        record->saved_bytes += a.bytes;
      }
      FinishTensors(record);
      std::set<int64_t> kept;
      for (size_t i = 0; i < record->tensors.size(); ++i) {
        const TensorRecord& t = record->tensors[i];
        if (t.kept && !t.external) kept.insert(record->tensor_allocation[i]);
      }
      recorder->pending.assign(kept.begin(), kept.end());
    }
    recorder->active = true;
    g_recorder = recorder;
    const auto backward_start = Clock::now();
    try {
      torch::autograd::backward({loss});
    } catch (const c10::Error& e) {
      // The model as saved cannot be trained (an in-place write into a value
      // an earlier op saved): PyTorch's eager backward fails the same way.
      recorder->active = false;
      g_recorder = nullptr;
      const std::string what = e.what_without_backtrace();
      throw BadInput(options_.model_path + ": its backward pass fails in PyTorch: " + what.substr(0, what.find('\n')));
    }
    *backward_ms = MsSince(backward_start);
    recorder->active = false;
    g_recorder = nullptr;
    if (record) {
      recorder->NoteReleases();
      for (size_t i = 0; i < record->tensors.size(); ++i) {
        auto it = recorder->released_by.find(record->tensor_allocation[i]);
        if (it != recorder->released_by.end() && record->tensors[i].kept) record->tensors[i].released_by = it->second;
      }
    }
    if (gpu_timer) {
      // Kernel time replaces host time: launches return before kernels end.
      std::fill(op_ms->begin(), op_ms->end(), 0.0);
      std::fill(recorder->bwd_ms.begin(), recorder->bwd_ms.end(), 0.0);
      gpu_timer->Collect(op_ms, &recorder->bwd_ms);
      *forward_ms = std::accumulate(op_ms->begin(), op_ms->end(), 0.0);
      *backward_ms = std::accumulate(recorder->bwd_ms.begin(), recorder->bwd_ms.end(), 0.0);
      recorder->gpu_timer = nullptr;
    }
    if (record) {
      record->peak_bytes = StepPeakBytes(device_, device_base, ledger_kept, tracker_.peak_bytes() - other);
    }
  }

  // One forward without autograd (torch::NoGradGuard), op by op, timed as
  // RunStep times its forward: what a checkpointed forward or a
  // recomputation costs.
  void RunNoGradForward(GraphProgram& program, const std::vector<at::Tensor>& inputs, std::vector<double>* op_ms) {
    torch::NoGradGuard no_grad;
    std::unique_ptr<GpuOpTimer> gpu_timer = MakeGpuOpTimer(device_, &timer_line_);
    Environment env;
    program.BindInputs(env, inputs);
    const auto& nodes = program.nodes();
    for (size_t index = 0; index < nodes.size(); ++index) {
      const ProgramNode& node = nodes[index];
      if (node.is_op) {
        const auto start = Clock::now();
        OwnerScope owner(node.op_id);
        if (gpu_timer) gpu_timer->Begin(node.op_id, /*backward=*/false);
        RunOrExplain(program, index, env, inputs);
        if (gpu_timer) gpu_timer->End(node.op_id, /*backward=*/false);
        (*op_ms)[static_cast<size_t>(node.op_id)] = OpMsSince(start);
      } else {
        RunOrExplain(program, index, env, inputs);
      }
      program.FreeDeadAfter(index, env);
    }
    env.clear();
    program.EndAutocast();
    if (gpu_timer) {
      std::fill(op_ms->begin(), op_ms->end(), 0.0);
      std::vector<double> no_backward(op_ms->size(), 0.0);
      gpu_timer->Collect(op_ms, &no_backward);
    }
  }

  // A forward (node by node), the loss and the backward, timed whole with no
  // per-op timer: the step as `ckplan run` runs it, less the optimizer.
  double TimePlainStep(GraphProgram& program, const std::vector<at::Tensor>& inputs) {
    // Gradients set to None first, as a training step's zero_grad() does
    // (and RunStep, `ckplan run`): autograd then takes each new gradient as
    // `.grad` instead of adding it into the last step's.
    for (const auto& p : program.module().parameters()) {
      if (p.grad().defined()) p.mutable_grad() = at::Tensor();
    }
    SynchronizeDevice(device_);
    const StepTimer timer(device_.cuda());
    at::Tensor loss;
    {
      Environment env;
      program.BindInputs(env, inputs);
      for (size_t index = 0; index < program.nodes().size(); ++index) {
        RunOrExplain(program, index, env, inputs);
        program.FreeDeadAfter(index, env);
      }
      std::vector<at::Tensor> outputs;
      for (const c10::IValue& v : program.Outputs(env)) CollectTensors(v, &outputs);
      const GraphProgram::AutocastScope autocast(program);
      for (const at::Tensor& t : outputs) {
        if (!t.defined() || !t.is_floating_point() || !t.requires_grad()) continue;
        at::Tensor s = t.sum().to(at::kFloat);
        loss = loss.defined() ? loss + s : s;
      }
    }
    program.EndAutocast();
    if (loss.defined()) torch::autograd::backward({loss});
    SynchronizeDevice(device_);
    return timer.Ms();
  }

  // The update `ckplan run` applies (OptimizerStep) for each optimizer the
  // planner knows, on the trainable parameters with the last backward's
  // gradients (the profile is done with them: no copies), its state made
  // beforehand (zeros), then the median of kOptimizerReps updates
  // (memory-bound passes over the parameters, steady from one update to the
  // next: a warm-up and 3 updates each cost resnet18's profile two steps).
  std::map<std::string, double> TimeOptimizers(const torch::jit::Module& module) {
    constexpr int kOptimizerReps = 1;
    const std::vector<at::Tensor> params = UniqueModuleTensors(module).params;
    std::map<std::string, double> result;
    for (const std::string& name : TimedOptimizers()) {
      OptimizerStep optimizer(name, 1e-3);
      optimizer.Prepare(params);
      std::vector<double> ms;
      for (int rep = 0; rep < kOptimizerReps; ++rep) {
        SynchronizeDevice(device_);
        const StepTimer timer(device_.cuda());
        optimizer.Apply(params);
        SynchronizeDevice(device_);
        ms.push_back(timer.Ms());
      }
      result[name] = Median(ms);
    }
    return result;
  }

  // Unpacking and indexing pass tensors through: keep their ids.
  void LinkTensors(const ProgramNode& node, const Environment& env, StepRecord* record,
                   std::unordered_map<const torch::jit::Value*, std::vector<int>>* value_tensors) {
    std::vector<int> candidates;
    for (const torch::jit::Value* in : node.node->inputs()) {
      auto it = value_tensors->find(in);
      if (it != value_tensors->end()) candidates.insert(candidates.end(), it->second.begin(), it->second.end());
    }
    if (candidates.empty()) return;
    for (const torch::jit::Value* out : node.node->outputs()) {
      auto found = env.find(out);
      if (found == env.end()) continue;
      std::vector<at::Tensor> tensors;
      CollectTensors(found->second, &tensors);
      for (const at::Tensor& t : tensors) {
        for (int id : candidates) {
          if (record->tensor_impls[static_cast<size_t>(id)] == t.unsafeGetTensorImpl()) {
            (*value_tensors)[out].push_back(id);
            break;
          }
        }
      }
    }
  }

  // Storage ids from allocation ids; kept = its allocation still lives;
  // external = its storage existed before the forward.
  void FinishTensors(StepRecord* record) {
    std::map<int64_t, int> storage_ids;
    for (size_t i = 0; i < record->tensors.size(); ++i) {
      TensorRecord& t = record->tensors[i];
      int64_t allocation = record->tensor_allocation[i];
      if (allocation < 0) {
        t.storage = -1 - static_cast<int>(i);  // not tracked (empty): its own
        t.external = true;
        continue;
      }
      auto it = storage_ids.find(allocation);
      if (it == storage_ids.end()) it = storage_ids.emplace(allocation, static_cast<int>(storage_ids.size())).first;
      t.storage = it->second;
      t.kept = tracker_.IsLive(allocation);
      t.external = allocation < first_forward_allocation_;
    }
  }

  void RunOrExplain(GraphProgram& program, size_t index, Environment& env, const std::vector<at::Tensor>& inputs) {
    try {
      program.RunNode(index, env);
    } catch (const c10::Error& e) {
      const ProgramNode& node = program.nodes()[index];
      std::string given;
      for (size_t i = 0; i < options_.inputs.size(); ++i) given += (i ? ", " : "") + options_.inputs[i].text;
      throw BadInput(options_.model_path + ": op " + node.node->kind().toQualString() + " in module '" +
                     (node.module_path.empty() ? std::string("<top>") : node.module_path) +
                     "' rejected the inputs (--input " + given + "): " + FirstLine(e.what_without_backtrace()));
    }
  }


  const ProfileOptions& options_;
  DeviceInfo device_;
  std::string timer_line_;
  std::vector<std::string>* warnings_;
  TrackingAllocator& tracker_;
  int64_t param_bytes_ = 0;
  std::vector<ParameterRecord> parameters_;  // for distributed plans (FSDP shards)
  int64_t buffer_bytes_ = 0;
  int64_t first_forward_allocation_ = 0;
};

}  // namespace

Profile ProfileModel(const ProfileOptions& options, std::vector<std::string>* warnings) {
  if (!options.inputs.empty()) return Profiler(options, warnings).Run();
  // No --input: the example's shapes an archive of ckplan_torch.export records.
  ProfileOptions recorded = options;
  const bool archive = IsExportArchive(options.model_path);
  for (const std::string& text : archive ? ExportInputSpecs(options.model_path) : std::vector<std::string>{}) {
    recorded.inputs.push_back(ParseInputSpec(text));
  }
  if (recorded.inputs.empty()) {
    LoadModel(options.model_path);  // a file that is no model says so, not that it lacks --input
    throw BadInput(options.model_path + ": give one --input per model input (SHAPE[:DTYPE[:LO..HI]], e.g. " +
                   "8x3x224x224 or 4x1024:int64:0..50257)" +
                   (archive ? "; this archive records none (an export by ckplan_torch.export records its example's)"
                            : ""));
  }
  return Profiler(recorded, warnings).Run();
}

}  // namespace ckplan
