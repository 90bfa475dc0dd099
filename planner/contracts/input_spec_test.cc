#include "planner/contracts/input_spec.h"

#include <doctest/doctest.h>

#include "planner/base/error.h"

using namespace ckplan;

TEST_CASE("input specs parse shape, dtype and range") {
  InputSpec a = ParseInputSpec("8x3x224x224");
  CHECK(a.shape == std::vector<int64_t>{8, 3, 224, 224});
  CHECK(a.dtype == "float32");
  CHECK_FALSE(a.has_range);
  InputSpec b = ParseInputSpec("4x1024:int64:0..50257");
  CHECK(b.shape == std::vector<int64_t>{4, 1024});
  CHECK(b.dtype == "int64");
  CHECK(b.lo == 0);
  CHECK(b.hi == 50257);
  InputSpec c = ParseInputSpec("2x5:long");
  CHECK(c.dtype == "int64");
  CHECK(c.lo == 0);
  CHECK(c.hi == 2);
  CHECK(ParseInputSpec("scalar").shape.empty());
  CHECK(DtypeBytes("bfloat16") == 2);
}

TEST_CASE("bad input specs quote the text") {
  for (const char* bad : {"", "8x", "x3", "8x-3", "8x0", "8x3:float99", "8x3:int64:5", "8x3:int64:9..2", "a:b:c:d"}) {
    CAPTURE(bad);
    std::string quoted = "'" + std::string(bad) + "'";
    CHECK_THROWS_WITH_AS(ParseInputSpec(bad), doctest::Contains(quoted.c_str()), Error);
  }
}

TEST_CASE("ranges a dtype cannot hold and impossible sizes are refused, quoting the text") {
  CHECK_THROWS_WITH_AS(ParseInputSpec("2x3:int64:0..1e300"), doctest::Contains("range 0..1e300 does not fit int64"),
                       Error);
  CHECK_THROWS_WITH_AS(ParseInputSpec("2x3:float32:-1e308..1e308"), doctest::Contains("does not fit float32"), Error);
  CHECK_THROWS_WITH_AS(ParseInputSpec("2x3:int32:0..0.5"), doctest::Contains("whole numbers"), Error);
  CHECK_THROWS_WITH_AS(ParseInputSpec("999999999999x999999999999"),
                       doctest::Contains("the tensor alone would take 4e+24 bytes"), Error);
  CHECK(InputBytes(ParseInputSpec("4x1024:int64:0..50257")) == 4 * 1024 * 8);
  CHECK(ParseInputSpec("2x3:uint8:0..256").hi == 256);
}
