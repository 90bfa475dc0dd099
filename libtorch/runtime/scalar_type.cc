#include "libtorch/runtime/scalar_type.h"

#include <cstring>

#include "planner/base/error.h"

namespace ckplan {

c10::ScalarType ToScalarType(const Dtype& dtype) {
#define CKPLAN_SCALAR_TYPE_NAMED(_, name) \
  if (std::strcmp(dtype.libtorch, #name) == 0) return c10::ScalarType::name;
  AT_FORALL_SCALAR_TYPES_WITH_COMPLEX_AND_QINTS(CKPLAN_SCALAR_TYPE_NAMED)
#undef CKPLAN_SCALAR_TYPE_NAMED
  throw BadInput(std::string("this LibTorch has no dtype ") + dtype.libtorch);
}

const Dtype* DtypeOf(c10::ScalarType type) { return FindLibTorchDtype(c10::toString(type)); }

}  // namespace ckplan
