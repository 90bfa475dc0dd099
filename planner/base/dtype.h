#pragma once
/// Tensor element types, in one table: the names LibTorch and torch's Python
/// give each, the names ckplan's flags take, its bytes and whether it is
/// floating point. Torch-free; the LibTorch side maps an entry to its
/// c10::ScalarType by name (libtorch/runtime/scalar_type.h).
///
/// A profile writes both vocabularies: LibTorch's (`Float`) in `tensors`,
/// `args` and `environment.dtype`, torch's Python names (`float32`) in
/// `model.inputs` and `environment.autocast`; each is the contract's spelling.

#include <cstdint>
#include <string>
#include <vector>

namespace ckplan {

struct Dtype {
  const char* libtorch;  ///< c10::toString's name: `Float`, `BFloat16`
  const char* python;    ///< torch's Python name: `float32`, `bfloat16`
  int64_t bytes;         ///< per element (c10::elementSize)
  bool floating;         ///< torch.is_floating_point: float, double, half, bfloat16, the float8s
  bool integral;         ///< an integer or bool (c10::isIntegralType(t, /*includeBool=*/true))
  /// The ten `--input` makes, and its other spellings of them: torch's
  /// older Python name (`float`, `double`, `half`, `long`, `int`) and a
  /// short one (`f32`, `f64`, `f16`, `bf16`); nullptr for none.
  bool input = false;
  const char* input_alias = nullptr;
  const char* input_short = nullptr;
  /// The precision `--dtype` and `--autocast` name: `bf16`, `fp16`, `fp32`.
  const char* precision = nullptr;
};

/// Every entry, in c10::ScalarType's order.
const std::vector<Dtype>& Dtypes();

/// The entry with this LibTorch name (`Float`), exactly as written; null for none.
const Dtype* FindLibTorchDtype(const std::string& name);

/// The entry with this Python name (`float32`), exactly as written; null for none.
const Dtype* FindPythonDtype(const std::string& name);

/// The entry with this LibTorch or Python name in any case (`float`,
/// `FLOAT32`, `BFloat16`, `bfloat16`); null for none.
const Dtype* FindDtypeIgnoringCase(const std::string& name);

/// The entry `--dtype` or `--autocast` names: its precision (`bf16`), its
/// Python name (`bfloat16`) or its older one (`half`, `float`); null for none.
const Dtype* FindPrecision(const std::string& text);

}  // namespace ckplan
