#include "libtorch/executor/module_step.h"

#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include <memory>
#include <unordered_map>
#include <unordered_set>

#include "planner/base/error.h"

namespace ckplan {

using torch::jit::Value;

// One wrapped module's run in one step: what its recomputation needs.
struct WrappedRun {
  GraphProgram* program = nullptr;
  const std::vector<at::Tensor>* model_inputs = nullptr;
  size_t begin = 0, end = 0;                    // its nodes
  std::vector<const Value*> in_values;          // the values it reads from before it
  std::vector<c10::IValue> in;                  // their values, held to its backward's end (as checkpoint does)
  std::vector<bool> written;                    // per input: written in place by its ops (copied first)
  std::vector<const Value*> out_values;         // the values it makes that are read after it
  std::vector<c10::IValue> out_structure;       // their lists and tuples, tensors left undefined
  size_t param_count = 0;                       // the parameters passed to it after its inputs' tensors
  // The tensors that outlive the step (GraphProgram::StaticTensors). One of
  // them among its outputs (a parameter or constant fetched inside it, read
  // after it) is no output of the function: autograd would give that very
  // tensor the function's node as its grad_fn, and the recomputation,
  // reading it again, would re-enter the node it runs in (a deadlock on
  // the node's mutex). It goes to what follows as it is, as in eager.
  const std::unordered_set<const c10::TensorImpl*>* static_tensors = nullptr;
  std::vector<bool> passthrough;                // per tensor of its outputs: a static tensor, not the function's
  std::vector<at::Tensor> passthrough_tensors;  // those tensors, in order
  at::Generator generator;
  at::Tensor rng_state;                         // the random state its forward started from
};

namespace {

// The tensors of `value` replaced, in order, by `tensors` from `*next`.
c10::IValue Rebuild(const c10::IValue& value, const std::vector<at::Tensor>& tensors, size_t* next) {
  if (value.isTensor()) return tensors[(*next)++];
  if (value.isTensorList()) {
    c10::List<at::Tensor> list;
    for (size_t k = 0; k < value.toTensorList().size(); ++k) list.push_back(tensors[(*next)++]);
    return list;
  }
  if (value.isList()) {
    c10::impl::GenericList list(value.toList().elementType());
    for (const c10::IValue& item : value.toList()) list.push_back(Rebuild(item, tensors, next));
    return list;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const c10::IValue& item : value.toTupleRef().elements()) items.push_back(Rebuild(item, tensors, next));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

// Runs the wrapped module's nodes on `in` (model inputs bound too); returns
// the values it makes that are read after it.
std::vector<c10::IValue> RunNodes(WrappedRun& run, const std::vector<c10::IValue>& in) {
  Environment env;
  run.program->BindInputs(env, *run.model_inputs);
  for (size_t k = 0; k < run.in_values.size(); ++k) {
    const c10::IValue& v = in[k];
    env[run.in_values[k]] = run.written[k] && v.isTensor() ? c10::IValue(v.toTensor().clone()) : v;
  }
  for (size_t n = run.begin; n <= run.end; ++n) {
    run.program->RunNode(n, env);
    run.program->FreeDeadAfter(n, env);
  }
  std::vector<c10::IValue> out;
  for (const Value* v : run.out_values) out.push_back(env.at(v));
  return out;
}

// Whether the autograd graph behind `edges` holds a Checkpoint node (below).
bool ReachesCheckpoint(const torch::autograd::edge_list& edges);

// torch.utils.checkpoint for one wrapped module. Its tensor arguments: the
// tensors of the module's inputs, then every parameter (so that its node
// exists when no input requires gradients; their gradients are accumulated
// by the recomputation's own backward, as reentrant checkpointing does).
struct Checkpoint : public torch::autograd::Function<Checkpoint> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, at::TensorList tensors,
                                                int64_t run_address) {
    (void)tensors;
    WrappedRun& run = *reinterpret_cast<WrappedRun*>(run_address);
    ctx->saved_data["run"] = run_address;
    {
      std::lock_guard<std::mutex> lock(run.generator.mutex());
      run.rng_state = run.generator.get_state();
    }
    std::vector<c10::IValue> out = RunNodes(run, run.in);
    std::vector<at::Tensor> all, flat;
    for (const c10::IValue& v : out) CollectTensors(v, &all);
    run.passthrough.clear();
    run.passthrough_tensors.clear();
    for (const at::Tensor& t : all) {
      const bool is_static = t.defined() && run.static_tensors->count(t.unsafeGetTensorImpl()) != 0;
      run.passthrough.push_back(is_static);
      (is_static ? run.passthrough_tensors : flat).push_back(t);
    }
    const std::vector<at::Tensor> none(all.size());
    size_t next = 0;
    run.out_structure.clear();
    for (const c10::IValue& v : out) run.out_structure.push_back(Rebuild(v, none, &next));
    return flat;
  }

  // `grad_outputs` by reference: the gradients are released as the
  // recomputed graph consumes them (see below), not held to its end.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list& grad_outputs) {
    WrappedRun& run = *reinterpret_cast<WrappedRun*>(ctx->saved_data["run"].toInt());
    // Its inputs, detached: their gradients are the module's.
    std::vector<at::Tensor> in_tensors, leaves;
    for (const c10::IValue& v : run.in) CollectTensors(v, &in_tensors);
    for (const at::Tensor& t : in_tensors) {
      leaves.push_back(t.defined() && t.requires_grad() ? t.detach().requires_grad_(true) : t);
    }
    std::vector<c10::IValue> in;
    size_t next = 0;
    for (const c10::IValue& v : run.in) in.push_back(Rebuild(v, leaves, &next));
    std::vector<c10::IValue> out;
    {
      // The same random numbers as the forward's, the random state after
      // it left as it was (checkpoint's preserve_rng_state).
      at::Tensor now;
      {
        std::lock_guard<std::mutex> lock(run.generator.mutex());
        now = run.generator.get_state();
        run.generator.set_state(run.rng_state);
      }
      torch::AutoGradMode grad(true);
      out = RunNodes(run, in);
      run.program->EndAutocast();  // the recomputation's autocast region ends, as checkpoint's does
      std::lock_guard<std::mutex> lock(run.generator.mutex());
      run.generator.set_state(now);
    }
    in.clear();
    run.rng_state = at::Tensor();
    std::vector<at::Tensor> outputs;
    {
      // The function's outputs: the recomputed tensors less the static ones.
      std::vector<at::Tensor> all;
      for (const c10::IValue& v : out) CollectTensors(v, &all);
      for (size_t k = 0; k < all.size(); ++k) {
        if (k >= run.passthrough.size() || !run.passthrough[k]) outputs.push_back(std::move(all[k]));
      }
    }
    out.clear();
    std::vector<at::Tensor> roots, root_grads;
    for (size_t k = 0; k < outputs.size() && k < grad_outputs.size(); ++k) {
      if (!outputs[k].defined() || !outputs[k].requires_grad() || !grad_outputs[k].defined()) continue;
      roots.push_back(outputs[k]);
      root_grads.push_back(std::move(grad_outputs[k]));
    }
    outputs.clear();
    grad_outputs.clear();
    // The backward's caller holds the gradients it starts from to its end;
    // PyTorch's checkpoint lets the module's last op consume its output's
    // gradient and free it. So a root's gradient is released from here when
    // the engine hands it to that op (the engine's own copy goes on).
    // Nor does it hold the module's outputs: the backward starts from their
    // graph's edges.
    if (roots.size() == 1) {
      roots[0].register_hook([&root_grads](const at::Tensor& grad) {
        root_grads.clear();
        return grad;
      });
    }
    torch::autograd::edge_list edges;
    for (const at::Tensor& root : roots) edges.push_back(torch::autograd::impl::gradient_edge(root));
    roots.clear();
    // The recomputed graph starts from detached inputs, parameters and
    // static tensors: it never reaches a wrapped module's node. If it did,
    // the engine would re-enter a node whose mutex is held (this one's, or
    // an outer one's) and block for ever: fail instead (the profile falls
    // back to the ops' forward times and says so).
    if (ReachesCheckpoint(edges)) {
      throw Error(ExitCode::kInternal,
                  "the recomputation of a wrapped module (nodes " + std::to_string(run.begin) + ".." +
                      std::to_string(run.end) + ") reaches a wrapped module's autograd node: it would block");
    }
    if (!edges.empty()) {
      torch::autograd::Engine::get_default_engine().execute(edges, root_grads, /*keep_graph=*/false,
                                                             /*create_graph=*/false, /*accumulate_grad=*/true);
    }
    edges.clear();
    roots.clear();
    root_grads.clear();
    // One gradient per tensor argument (the parameters': accumulated
    // above), one for the run's address.
    torch::autograd::variable_list grads;
    for (size_t k = 0; k < leaves.size(); ++k) {
      grads.push_back(in_tensors[k].defined() && in_tensors[k].requires_grad() ? leaves[k].grad() : at::Tensor());
    }
    const size_t leaves_count = leaves.size();
    leaves.clear();
    in_tensors.clear();
    run.in.clear();  // the inputs held for it: released with its backward
    grads.resize(leaves_count + run.param_count + 1);
    return grads;
  }
};

bool ReachesCheckpoint(const torch::autograd::edge_list& edges) {
  std::vector<torch::autograd::Node*> todo;
  std::unordered_set<torch::autograd::Node*> seen;
  for (const auto& edge : edges) {
    if (edge.function) todo.push_back(edge.function.get());
  }
  while (!todo.empty()) {
    torch::autograd::Node* node = todo.back();
    todo.pop_back();
    if (!seen.insert(node).second) continue;
    if (dynamic_cast<torch::autograd::CppNode<Checkpoint>*>(node) != nullptr) return true;
    for (const auto& edge : node->next_edges()) {
      if (edge.function) todo.push_back(edge.function.get());
    }
  }
  return false;
}

}  // namespace

CheckpointedForward::CheckpointedForward(StagedProgram& staged, const std::vector<at::Tensor>& params,
                                         const std::unordered_set<const c10::TensorImpl*>& static_tensors,
                                         at::Generator generator)
    : staged_(staged), params_(params), static_tensors_(static_tensors), generator_(std::move(generator)) {}

CheckpointedForward::~CheckpointedForward() = default;

void CheckpointedForward::Run(const std::vector<at::Tensor>& inputs,
                              const std::vector<std::pair<size_t, size_t>>& wrapped, Environment& env) {
  GraphProgram& program = staged_.program();
  // Wrapped modules by their first node: their first and last stages.
  std::unordered_map<size_t, std::pair<size_t, size_t>> starts;
  for (const auto& range : wrapped) starts[staged_.begin(range.first)] = range;
  program.BindInputs(env, inputs);
  for (size_t n = 0; n < program.nodes().size();) {
    auto start = starts.find(n);
    if (start == starts.end()) {
      program.RunNode(n, env);
      program.FreeDeadAfter(n, env);
      ++n;
      continue;
    }
    const size_t first_stage = start->second.first, end = staged_.end(start->second.second);
    auto run = std::make_unique<WrappedRun>();
    run->program = &program;
    run->model_inputs = &inputs;
    run->begin = n;
    run->end = end;
    run->generator = generator_;
    // Its inputs: what its nodes read that was made before it; its outputs:
    // what it makes that is read after it.
    std::unordered_set<const Value*> made, read;
    for (size_t k = n; k <= end; ++k) {
      const torch::jit::Node* node = program.nodes()[k].node;
      for (const Value* v : node->inputs()) {
        if (made.count(v) == 0 && env.count(v) != 0 && read.insert(v).second) run->in_values.push_back(v);
      }
      for (const Value* v : node->outputs()) made.insert(v);
    }
    // An input its ops write in place is copied before each run of them
    // (as a stage's is): the recomputation reads what the forward read.
    const std::vector<const Value*>& boundary = staged_.boundary(first_stage);
    for (const Value* v : run->in_values) {
      run->in.push_back(env.at(v));
      bool written = false;
      for (size_t k = 0; k < boundary.size(); ++k) {
        written = written || (boundary[k] == v && staged_.Writes(first_stage, k));
      }
      run->written.push_back(written);
    }
    for (size_t k = n; k <= end; ++k) {
      for (const Value* v : program.nodes()[k].node->outputs()) {
        if (program.LastUse(v) > end) run->out_values.push_back(v);
      }
    }
    std::vector<at::Tensor> tensors;
    for (const c10::IValue& v : run->in) CollectTensors(v, &tensors);
    for (const at::Tensor& p : params_) tensors.push_back(p);
    run->param_count = params_.size();
    // The forward runs without autograd inside the function; its outputs
    // come back as the function's (its node their grad_fn).
    run->static_tensors = &static_tensors_;
    std::vector<at::Tensor> results = Checkpoint::apply(at::TensorList(tensors), reinterpret_cast<int64_t>(run.get()));
    tensors.clear();
    // The output values: the function's tensors and the static ones, in the
    // forward's lists and tuples.
    std::vector<at::Tensor> flat;
    for (size_t k = 0, m = 0, p = 0; k < run->passthrough.size(); ++k) {
      flat.push_back(run->passthrough[k] ? run->passthrough_tensors[p++] : results[m++]);
    }
    results.clear();
    run->passthrough_tensors.clear();
    size_t next = 0;
    for (size_t k = 0; k < run->out_values.size(); ++k) {
      env[run->out_values[k]] = Rebuild(run->out_structure[k], flat, &next);
    }
    flat.clear();
    for (size_t k = n; k <= end; ++k) program.FreeDeadAfter(k, env);
    runs_.push_back(std::move(run));
    n = end + 1;
  }
}

}  // namespace ckplan
