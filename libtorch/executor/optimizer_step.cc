#include "libtorch/executor/optimizer_step.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/script.h>

#include <algorithm>
#include <cmath>
#include <set>

namespace ckplan {

ModuleTensors UniqueModuleTensors(const torch::jit::Module& module) {
  ModuleTensors out;
  std::set<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.params.push_back(p);
  }
  // A frozen parameter is held as a buffer is, never updated.
  for (const auto& p : module.parameters()) {
    if (!p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.buffers.push_back(p);
  }
  for (const auto& b : module.buffers()) {
    if (seen.insert(b.unsafeGetTensorImpl()).second) out.buffers.push_back(b);
  }
  return out;
}

void OptimizerStep::Reset() {
  first_.clear();
  second_.clear();
  steps_.clear();
  max_second_.clear();
}

std::vector<at::Tensor> OptimizerStep::state() const {
  std::vector<at::Tensor> all(first_);
  all.insert(all.end(), second_.begin(), second_.end());
  all.insert(all.end(), steps_.begin(), steps_.end());
  all.insert(all.end(), max_second_.begin(), max_second_.end());
  return all;
}

void OptimizerStep::Prepare(const std::vector<at::Tensor>& params) {
  if (!adam() && name_ != "momentum") return;
  c10::NoGradGuard no_grad;
  MakeState(params);
}

// Zeros as torch.optim's _init_group makes them: momentum buffers; adam's
// moments and float32 `step` counters.
void OptimizerStep::MakeState(const std::vector<at::Tensor>& params) {
  Reset();
  for (const auto& p : params) {
    first_.push_back(at::zeros_like(p));
    if (adam()) {
      second_.push_back(at::zeros_like(p));
      steps_.push_back(at::zeros({}, at::TensorOptions().dtype(at::kFloat)));
      if (flags_.amsgrad) max_second_.push_back(at::zeros_like(p));
    }
  }
}

void OptimizerStep::Apply(const std::vector<at::Tensor>& params) {
  if (name_ == "none") return;
  c10::NoGradGuard no_grad;
  if (adam()) {
    ApplyAdam(params);
    return;
  }
  const double decay = flags_.weight_decay, momentum = 0.9;
  const bool nesterov = name_ == "momentum" && flags_.nesterov;
  if (impl_ == OptimizerImpl::kForeach && (decay != 0 || nesterov)) {
    // As _multi_tensor_sgd: the decayed gradients of the whole group at
    // once; nesterov's look-ahead in place on them (on the gradients
    // themselves without a decay).
    std::vector<at::Tensor> ps, gs, bufs;
    for (size_t k = 0; k < params.size(); ++k) {
      if (!params[k].grad().defined()) continue;
      ps.push_back(params[k]);
      gs.push_back(params[k].grad());
    }
    if (ps.empty()) return;
    if (decay != 0) gs = at::_foreach_add(gs, ps, decay);
    if (name_ == "momentum") {
      if (first_.empty()) MakeState(params);  // from zeros: the first update copies the gradient
      for (size_t k = 0; k < params.size(); ++k) {
        if (params[k].grad().defined()) bufs.push_back(first_[k]);
      }
      at::_foreach_mul_(bufs, momentum);
      at::_foreach_add_(bufs, gs);
      if (nesterov) {
        at::_foreach_add_(gs, bufs, momentum);
      } else {
        gs = bufs;
      }
    }
    at::_foreach_add_(ps, gs, -lr_);
    return;
  }
  for (size_t k = 0; k < params.size(); ++k) {
    at::Tensor p = params[k];
    at::Tensor g = p.grad();
    if (!g.defined()) continue;
    if (decay != 0) g = g.add(p, decay);  // as torch.optim: a new tensor
    if (name_ == "sgd") {
      p.add_(g, -lr_);
    } else if (name_ == "momentum") {  // in place in every implementation
      if (first_.size() <= k) first_.push_back(g.clone());
      else first_[k].mul_(momentum).add_(g);
      if (nesterov) {
        g = g.add(first_[k], momentum);
        p.add_(g, -lr_);
      } else {
        p.add_(first_[k], -lr_);
      }
    }
  }
}

void OptimizerStep::ApplyAdam(const std::vector<at::Tensor>& all_params) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8, decay = name_ == "adamw" ? 0.01 : 0.0;
  const double coupled = name_ == "adam" ? flags_.weight_decay : 0.0;  // Adam's L2: grad + wd * param
  // The state, made on the first update (as torch.optim's _init_group does)
  // unless Prepare made it.
  if (first_.empty()) MakeState(all_params);
  std::vector<at::Tensor> params, grads, m, v, steps, vmax;
  for (size_t k = 0; k < all_params.size(); ++k) {
    if (!all_params[k].grad().defined()) continue;
    params.push_back(all_params[k]);
    grads.push_back(all_params[k].grad());
    m.push_back(first_[k]);
    v.push_back(second_[k]);
    steps.push_back(steps_[k]);
    if (flags_.amsgrad) vmax.push_back(max_second_[k]);
  }
  if (params.empty()) return;
  if (impl_ == OptimizerImpl::kFused) {
    if (decay > 0) {
      at::_fused_adamw_(params, grads, m, v, vmax, steps, lr_, b1, b2, decay, eps, flags_.amsgrad, false);
    } else {
      at::_fused_adam_(params, grads, m, v, vmax, steps, lr_, b1, b2, coupled, eps, flags_.amsgrad, false);
    }
    return;
  }
  if (impl_ == OptimizerImpl::kForLoop) {
    at::Tensor denom;  // the previous parameter's, held until the next is made
    for (size_t k = 0; k < params.size(); ++k) {
      at::Tensor p = params[k];
      at::Tensor g = grads[k];
      if (coupled != 0) g = g.add(p, coupled);  // a new tensor, held through the update
      steps[k].add_(1);
      if (decay > 0) p.mul_(1 - lr_ * decay);
      m[k].lerp_(g, 1 - b1);
      v[k].mul_(b2).addcmul_(g, g, 1 - b2);
      const double step = steps[k].item<double>();
      const double bc1 = 1 - std::pow(b1, step), bc2_sqrt = std::sqrt(1 - std::pow(b2, step));
      if (flags_.amsgrad) at::maximum_out(vmax[k], vmax[k], v[k]);
      at::Tensor next = ((flags_.amsgrad ? vmax[k] : v[k]).sqrt() / bc2_sqrt).add_(eps);
      p.addcdiv_(m[k], next, -lr_ / bc1);
      denom = std::move(next);
    }
    return;
  }
  // foreach: one group per dtype, in order of first appearance.
  std::vector<at::ScalarType> dtypes;
  for (const auto& p : params) {
    if (std::find(dtypes.begin(), dtypes.end(), p.scalar_type()) == dtypes.end()) dtypes.push_back(p.scalar_type());
  }
  std::vector<at::Tensor> roots;  // the previous group's, held until the next group's are made
  for (at::ScalarType dtype : dtypes) {
    std::vector<at::Tensor> gp, gg, gm, gv, gs, gmax;
    for (size_t k = 0; k < params.size(); ++k) {
      if (params[k].scalar_type() != dtype) continue;
      gp.push_back(params[k]);
      gg.push_back(grads[k]);
      gm.push_back(m[k]);
      gv.push_back(v[k]);
      gs.push_back(steps[k]);
      if (flags_.amsgrad) gmax.push_back(vmax[k]);
    }
    at::_foreach_add_(gs, 1);
    if (coupled != 0) gg = at::_foreach_add(gg, gp, coupled);  // the group's decayed gradients
    if (decay > 0) at::_foreach_mul_(gp, 1 - lr_ * decay);
    at::_foreach_lerp_(gm, gg, 1 - b1);
    at::_foreach_mul_(gv, b2);
    at::_foreach_addcmul_(gv, gg, gg, 1 - b2);
    gg.clear();  // dropped before the square roots, as _multi_tensor_adam does
    if (flags_.amsgrad) at::_foreach_maximum_(gmax, gv);
    std::vector<at::Scalar> bc2_sqrt, step_size;
    for (const auto& s : gs) {
      const double step = s.item<double>();
      bc2_sqrt.emplace_back(std::sqrt(1 - std::pow(b2, step)));
      step_size.emplace_back(-lr_ / (1 - std::pow(b1, step)));
    }
    std::vector<at::Tensor> next = at::_foreach_sqrt(flags_.amsgrad ? gmax : gv);
    at::_foreach_div_(next, bc2_sqrt);
    at::_foreach_add_(next, eps);
    at::_foreach_addcdiv_(gp, gm, next, step_size);
    roots = std::move(next);
  }
}

}  // namespace ckplan
