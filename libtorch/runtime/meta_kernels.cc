// Meta kernels LibTorch's C++ lacks (PyTorch registers them in Python, in
// torch/_meta_registrations.py, which a C++ program never loads): outputs of
// the shapes, dtypes and layouts the CPU kernels allocate, so that a meta
// profile keeps, op by op, the bytes a CPU profile keeps. Registered when
// `--device meta` is first used (a registration at load time would warn
// about the one kernel replaced, _fused_sdp_choice's).

#include "libtorch/runtime/meta_kernels.h"

#include <ATen/ATen.h>
#include <ATen/OpMathType.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include <limits>
#include <memory>

namespace ckplan {
namespace {

at::Tensor Relu(const at::Tensor& self) { return at::empty_like(self); }

at::Tensor HardtanhBackward(const at::Tensor& grad, const at::Tensor&, const at::Scalar&, const at::Scalar&) {
  return at::empty_like(grad);
}

at::Tensor HardswishBackward(const at::Tensor& grad, const at::Tensor&) { return at::empty_like(grad); }

// Batch statistics in the accumulation type (float for half inputs), one per channel.
std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeBatchNorm(const at::Tensor& input, const std::optional<at::Tensor>&,
                                                               const std::optional<at::Tensor>&,
                                                               const std::optional<at::Tensor>&,
                                                               const std::optional<at::Tensor>&, bool training, double,
                                                               double) {
  const int64_t channels = input.dim() > 1 ? input.size(1) : 1;
  const at::TensorOptions stats = input.options().dtype(at::toOpMathType(input.scalar_type()));
  return {at::empty_like(input, at::MemoryFormat::Contiguous),
          at::empty({training ? channels : 0}, stats), at::empty({training ? channels : 0}, stats)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeBatchNormBackward(
    const at::Tensor& grad, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>&, const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
    const std::optional<at::Tensor>&, bool, double, std::array<bool, 3> mask) {
  const int64_t channels = input.dim() > 1 ? input.size(1) : 1;
  const at::TensorOptions param =
      weight && weight->defined() ? weight->options() : input.options();
  (void)grad;
  return {mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor(),
          mask[1] ? at::empty({channels}, param) : at::Tensor(), mask[2] ? at::empty({channels}, param) : at::Tensor()};
}

// As the CPU kernel: statistics in the input's dtype (bfloat16 in, bfloat16
// mean and rstd; the composite meta path would make them float, as CUDA does).
std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeLayerNorm(const at::Tensor& input,
                                                               c10::SymIntArrayRef normalized_shape,
                                                               const std::optional<at::Tensor>& weight,
                                                               const std::optional<at::Tensor>&, double) {
  const int64_t axis = input.dim() - static_cast<int64_t>(normalized_shape.size());
  int64_t rows = 1;
  std::vector<int64_t> stat_shape;
  for (int64_t d = 0; d < input.dim(); ++d) {
    if (d < axis) rows *= input.size(d);
    stat_shape.push_back(d < axis ? input.size(d) : 1);
  }
  const at::ScalarType type =
      weight && weight->defined() && weight->scalar_type() != input.scalar_type() ? at::kFloat : input.scalar_type();
  return {at::empty_like(input, at::MemoryFormat::Contiguous),
          at::empty({rows}, input.options().dtype(type)).view(stat_shape),
          at::empty({rows}, input.options().dtype(type)).view(stat_shape)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> NativeLayerNormBackward(
    const at::Tensor& grad, const at::Tensor& input, c10::SymIntArrayRef, const at::Tensor&, const at::Tensor&,
    const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias, std::array<bool, 3> mask) {
  (void)grad;
  const bool has_weight = weight && weight->defined(), has_bias = bias && bias->defined();
  return {mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor(),
          mask[1] && has_weight ? at::empty_like(*weight, at::MemoryFormat::Contiguous) : at::Tensor(),
          mask[2] && has_bias ? at::empty_like(*bias, at::MemoryFormat::Contiguous) : at::Tensor()};
}

at::Tensor EmbeddingDenseBackward(const at::Tensor& grad, const at::Tensor&, c10::SymInt num_weights, c10::SymInt,
                                  bool) {
  return at::empty({num_weights.expect_int(), grad.size(-1)}, grad.options());
}

at::Tensor IndexSelect(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  std::vector<int64_t> sizes = self.sizes().vec();
  if (!sizes.empty()) sizes[static_cast<size_t>(c10::maybe_wrap_dim(dim, self.dim()))] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor WhereSelf(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  const std::vector<int64_t> sizes = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(sizes, self.options().dtype(at::result_type(self, other)));
}

at::Tensor FloorDivide(const at::Tensor& self, const at::Tensor& other) {
  return at::empty(at::infer_size(self.sizes(), other.sizes()), self.options().dtype(at::result_type(self, other)));
}

// Out-variant: the result allocated (and counted) like a fresh one, then
// taken by `out` (a meta resize_ would only change the storage's byte count).
at::Tensor& WhereSelfOut(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  out.set_(WhereSelf(condition, self, other));
  return out;
}

// Convolutions on meta tensors take the "overrideable" backend, which has no
// meta kernel: the output of the shape the CPU kernel makes (contiguous).
at::Tensor ConvolutionOverrideable(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>&,
                                   c10::SymIntArrayRef stride, c10::SymIntArrayRef padding,
                                   c10::SymIntArrayRef dilation, bool transposed, c10::SymIntArrayRef output_padding,
                                   c10::SymInt groups) {
  const size_t spatial = static_cast<size_t>(input.dim() - 2);
  auto at_or_last = [](c10::SymIntArrayRef a, size_t k) { return a.empty() ? 0 : a[std::min(k, a.size() - 1)].expect_int(); };
  std::vector<int64_t> sizes = {input.size(0), transposed ? weight.size(1) * groups.expect_int() : weight.size(0)};
  for (size_t k = 0; k < spatial; ++k) {
    const int64_t in = input.size(static_cast<int64_t>(k) + 2), kernel = weight.size(static_cast<int64_t>(k) + 2);
    const int64_t s = at_or_last(stride, k), p = at_or_last(padding, k), d = at_or_last(dilation, k);
    sizes.push_back(transposed ? (in - 1) * s - 2 * p + d * (kernel - 1) + at_or_last(output_padding, k) + 1
                               : (in + 2 * p - d * (kernel - 1) - 1) / s + 1);
  }
  return at::empty(sizes, input.options());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> ConvolutionBackwardOverrideable(
    const at::Tensor&, const at::Tensor& input, const at::Tensor& weight, c10::SymIntArrayRef, c10::SymIntArrayRef,
    c10::SymIntArrayRef, bool transposed, c10::SymIntArrayRef, c10::SymInt groups, std::array<bool, 3> mask) {
  const int64_t out_channels = transposed ? weight.size(1) * groups.expect_int() : weight.size(0);
  return {mask[0] ? at::empty_like(input, at::MemoryFormat::Contiguous) : at::Tensor(),
          mask[1] ? at::empty_like(weight, at::MemoryFormat::Contiguous) : at::Tensor(),
          mask[2] ? at::empty({out_channels}, weight.options()) : at::Tensor()};
}

// scaled_dot_product_attention is composite: on meta tensors it takes the
// math path (the attention matrix, softmax kept), since the backend choice is
// a per-device stub meta lacks. This kernel, registered for AutogradMeta
// (where a composite runs), takes the CPU's choice instead, as the composite
// does on the CPU: CPU flash attention where it applies, whose saved output
// and logsumexp are what CUDA's flash kernel keeps.
at::Tensor ScaledDotProductAttention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                     const std::optional<at::Tensor>& mask, double dropout, bool causal,
                                     std::optional<double> scale, bool gqa) {
  const int64_t choice = at::native::_fused_sdp_choice_cpp(query, key, value, mask, dropout, causal, scale, gqa);
  std::optional<at::Tensor> float_mask = mask;
  if (mask && mask->defined() && mask->scalar_type() == at::kBool) {
    const at::TensorOptions options = query.options();
    float_mask = at::where(*mask, at::scalar_tensor(0.0, options),
                           at::scalar_tensor(-std::numeric_limits<double>::infinity(), options));
  }
  if (choice == 1) {  // sdp::SDPBackend::flash_attention
    return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout, causal, float_mask,
                                                                       scale));
  }
  return std::get<0>(
      at::_scaled_dot_product_attention_math(query, key, value, float_mask, dropout, causal, std::nullopt, scale, gqa));
}

// The backend the CPU would choose (flash attention for CPU where it applies):
// what it keeps (output, logsumexp) is what CUDA's flash kernel keeps.
int64_t FusedSdpChoice(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                       const std::optional<at::Tensor>& mask, double dropout, bool causal, std::optional<double> scale,
                       bool gqa) {
  return at::native::_fused_sdp_choice_cpp(query, key, value, mask, dropout, causal, scale, gqa);
}

// As the CPU kernel: the output laid out [B, L, H, D] and seen as [B, H, L, D];
// logsumexp [B, L, H] in the accumulation type, seen as [B, H, L].
std::tuple<at::Tensor, at::Tensor> FlashAttentionCpu(const at::Tensor& query, const at::Tensor&,
                                                     const at::Tensor& value, double, bool,
                                                     const std::optional<at::Tensor>&, std::optional<double>) {
  const int64_t batch = query.size(0), heads = query.size(1), length = query.size(2), dv = value.size(3);
  at::Tensor output = at::empty({batch, length, heads, dv}, query.options()).transpose(1, 2);
  at::Tensor logsumexp =
      at::empty({batch, length, heads}, query.options().dtype(at::toOpMathType(query.scalar_type()))).transpose(1, 2);
  return {output, logsumexp};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> FlashAttentionCpuBackward(
    const at::Tensor&, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, const at::Tensor&,
    const at::Tensor&, double, bool, const std::optional<at::Tensor>&, std::optional<double>) {
  return {at::empty_like(query), at::empty_like(key), at::empty_like(value)};
}

}  // namespace

void RegisterMetaKernels() {
  static auto* library = [] {
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::Meta, __FILE__, __LINE__);
    lib->impl("relu", &Relu);
    lib->impl("hardtanh_backward", &HardtanhBackward);
    lib->impl("hardswish_backward", &HardswishBackward);
    lib->impl("native_batch_norm", &NativeBatchNorm);
    lib->impl("native_batch_norm_backward", &NativeBatchNormBackward);
    lib->impl("native_layer_norm", &NativeLayerNorm);
    lib->impl("native_layer_norm_backward", &NativeLayerNormBackward);
    lib->impl("embedding_dense_backward", &EmbeddingDenseBackward);
    lib->impl("index_select", &IndexSelect);
    lib->impl("where.self", &WhereSelf);
    lib->impl("where.self_out", &WhereSelfOut);
    lib->impl("convolution_overrideable", &ConvolutionOverrideable);
    lib->impl("convolution_backward_overrideable", &ConvolutionBackwardOverrideable);
    lib->impl("floor_divide", &FloorDivide);
    lib->impl("_fused_sdp_choice", &FusedSdpChoice);
    lib->impl("_scaled_dot_product_flash_attention_for_cpu", &FlashAttentionCpu);
    lib->impl("_scaled_dot_product_flash_attention_for_cpu_backward", &FlashAttentionCpuBackward);
    return lib;
  }();
  static auto* autograd = [] {
    auto* lib = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::AutogradMeta, __FILE__, __LINE__);
    lib->impl("scaled_dot_product_attention", &ScaledDotProductAttention);
    return lib;
  }();
  (void)library;
  (void)autograd;
}

}  // namespace ckplan
