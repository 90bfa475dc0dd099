// The dtype table (planner/base/dtype.h) against LibTorch's own: each
// entry's ScalarType, size and kind; the flags' spellings through it.
// LibTorch's logging defines CHECK, so doctest's macros go by their long names.

#include "libtorch/runtime/scalar_type.h"

#include <string>

#include "planner/base/error.h"
#include "libtorch/runtime/graph_program.h"
#include "libtorch/runtime/meta_device.h"

#define DOCTEST_CONFIG_NO_SHORT_MACRO_NAMES
#include <doctest/doctest.h>

using namespace ckplan;

DOCTEST_TEST_CASE("the dtype table agrees with LibTorch: each entry's ScalarType, size and kind") {
  for (const Dtype& d : Dtypes()) {
    DOCTEST_CAPTURE(d.libtorch);
    const c10::ScalarType type = ToScalarType(d);
    DOCTEST_CHECK(std::string(c10::toString(type)) == d.libtorch);
    DOCTEST_CHECK(DtypeOf(type) == &d);
    DOCTEST_CHECK(static_cast<int64_t>(c10::elementSize(type)) == d.bytes);
    DOCTEST_CHECK(c10::isFloatingType(type) == d.floating);
    const bool integral = c10::isIntegralType(type, /*includeBool=*/true);
    DOCTEST_CHECK(integral == d.integral);
  }
  DOCTEST_CHECK(TorchDtypeName(c10::ScalarType::BFloat16) == "bfloat16");
  DOCTEST_CHECK(TorchDtypeName(c10::ScalarType::Float) == "float32");
}

DOCTEST_TEST_CASE("--dtype and --autocast take their spellings, and name the others") {
  DOCTEST_CHECK(ParseProfileDtype("") == std::nullopt);
  DOCTEST_CHECK(ParseProfileDtype("bf16") == c10::ScalarType::BFloat16);
  DOCTEST_CHECK(ParseProfileDtype("half") == c10::ScalarType::Half);
  DOCTEST_CHECK(ParseProfileDtype("float") == c10::ScalarType::Float);
  DOCTEST_CHECK_THROWS_WITH_AS(ParseProfileDtype("f16"), "invalid --dtype 'f16': use bf16, fp16 or fp32", Error);
  DOCTEST_CHECK(ParseAutocast("bfloat16") == c10::ScalarType::BFloat16);
  DOCTEST_CHECK(ParseAutocast("fp16") == c10::ScalarType::Half);
  DOCTEST_CHECK(ParseAutocast("off") == std::nullopt);
  DOCTEST_CHECK(ParseAutocast("fp32") == std::nullopt);
  DOCTEST_CHECK_THROWS_AS(ParseAutocast("float"), Error);
  DOCTEST_CHECK_THROWS_AS(ParseAutocast("float64"), Error);
}
