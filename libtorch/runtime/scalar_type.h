#pragma once
/// The dtype table's entries (planner/base/dtype.h) as LibTorch's
/// c10::ScalarType, and back: matched by LibTorch's name for each.

#include <c10/core/ScalarType.h>

#include "planner/base/dtype.h"

namespace ckplan {

/// The ScalarType of an entry. Throws BadInput for one this LibTorch lacks.
c10::ScalarType ToScalarType(const Dtype& dtype);

/// The entry of a ScalarType; null for one the table lacks.
const Dtype* DtypeOf(c10::ScalarType type);

}  // namespace ckplan
