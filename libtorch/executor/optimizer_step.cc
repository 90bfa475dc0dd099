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
  for (const auto& b : module.buffers()) {
    if (seen.insert(b.unsafeGetTensorImpl()).second) out.buffers.push_back(b);
  }
  return out;
}

void OptimizerStep::Reset() {
  steps_ = 0;
  first_.clear();
  second_.clear();
}

void OptimizerStep::Prepare(const std::vector<at::Tensor>& params) {
  if (name_ != "adam" && name_ != "momentum") return;
  c10::NoGradGuard no_grad;
  first_.clear();
  second_.clear();
  for (const auto& p : params) {
    first_.push_back(at::zeros_like(p));
    if (name_ == "adam") second_.push_back(at::zeros_like(p));
  }
}

void OptimizerStep::Apply(const std::vector<at::Tensor>& params) {
  if (name_ == "none") return;
  c10::NoGradGuard no_grad;
  ++steps_;
  if (name_ == "adam" && first_.empty()) {
    for (const auto& p : params) {
      first_.push_back(at::zeros_like(p));
      second_.push_back(at::zeros_like(p));
    }
  }
  for (size_t k = 0; k < params.size(); ++k) {
    at::Tensor p = params[k];
    const at::Tensor& g = p.grad();
    if (!g.defined()) continue;
    if (name_ == "sgd") {
      p.add_(g, -lr_);
    } else if (name_ == "momentum") {
      if (first_.size() <= k) first_.push_back(g.clone());
      else first_[k].mul_(0.9).add_(g);
      p.add_(first_[k], -lr_);
    } else if (name_ == "adam") {
      const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
      first_[k].mul_(b1).add_(g, 1 - b1);
      second_[k].mul_(b2).addcmul_(g, g, 1 - b2);
      const double bc1 = 1 - std::pow(b1, steps_), bc2 = 1 - std::pow(b2, steps_);
      // In slices: the update's temporary stays small (at most 256 KiB in
      // float32) instead of the size of the largest parameter, which on a
      // model with a large classifier outgrew the activations' peak.
      const bool flat = p.is_contiguous() && first_[k].is_contiguous() && second_[k].is_contiguous();
      const int64_t kSlice = flat ? int64_t{1} << 16 : p.numel();
      at::Tensor pf = flat ? p.view({-1}) : p, af = flat ? first_[k].view({-1}) : first_[k],
                 bf = flat ? second_[k].view({-1}) : second_[k];
      for (int64_t i = 0; i < pf.numel(); i += kSlice) {
        const int64_t len = std::min(kSlice, pf.numel() - i);
        auto slice = [&](const at::Tensor& t) { return flat ? t.narrow(0, i, len) : t; };
        at::Tensor denom = slice(bf).sqrt();
        denom.div_(std::sqrt(bc2)).add_(eps);
        slice(pf).addcdiv_(slice(af), denom, -lr_ / bc1);
      }
    }
  }
}

}  // namespace ckplan
