#include "planner/base/dtype.h"

#include <doctest/doctest.h>

#include <set>
#include <string>

using namespace ckplan;

TEST_CASE("the dtype table names each dtype once in each vocabulary") {
  std::set<std::string> libtorch, python;
  for (const Dtype& d : Dtypes()) {
    CHECK(libtorch.insert(d.libtorch).second);
    CHECK(python.insert(d.python).second);
    CHECK(d.bytes >= 1);
    CHECK_FALSE((d.floating && d.integral));
    CHECK(FindLibTorchDtype(d.libtorch) == &d);
    CHECK(FindPythonDtype(d.python) == &d);
  }
  CHECK(FindLibTorchDtype("float32") == nullptr);
  CHECK(FindPythonDtype("Float") == nullptr);
  CHECK(FindLibTorchDtype("Complex") == nullptr);
}

TEST_CASE("the dtype table: sizes and kinds as torch has them") {
  CHECK(FindLibTorchDtype("Float")->bytes == 4);
  CHECK(std::string(FindLibTorchDtype("Float")->python) == "float32");
  CHECK(std::string(FindPythonDtype("bfloat16")->libtorch) == "BFloat16");
  CHECK(FindLibTorchDtype("BFloat16")->bytes == 2);
  CHECK(FindLibTorchDtype("ComplexDouble")->bytes == 16);
  CHECK(FindLibTorchDtype("ComplexHalf")->bytes == 4);
  CHECK(FindLibTorchDtype("UInt64")->bytes == 8);
  CHECK(FindLibTorchDtype("Float8_e4m3fn")->floating);
  CHECK_FALSE(FindLibTorchDtype("ComplexFloat")->floating);
  CHECK(FindLibTorchDtype("Bool")->integral);
  CHECK(FindLibTorchDtype("Long")->integral);
}

TEST_CASE("the dtype table ignoring case takes both vocabularies") {
  CHECK(FindDtypeIgnoringCase("float") == FindLibTorchDtype("Float"));
  CHECK(FindDtypeIgnoringCase("FLOAT32") == FindLibTorchDtype("Float"));
  CHECK(FindDtypeIgnoringCase("bfloat16") == FindLibTorchDtype("BFloat16"));
  CHECK(FindDtypeIgnoringCase("complexdouble") == FindLibTorchDtype("ComplexDouble"));
  CHECK(FindDtypeIgnoringCase("f16") == nullptr);
  CHECK(FindDtypeIgnoringCase("") == nullptr);
}

TEST_CASE("the dtype table: what --input, --dtype and --autocast take") {
  int inputs = 0;
  for (const Dtype& d : Dtypes()) inputs += d.input;
  CHECK(inputs == 10);
  CHECK(std::string(FindPythonDtype("float16")->input_short) == "f16");
  CHECK(std::string(FindPythonDtype("float16")->input_alias) == "half");
  CHECK(FindPythonDtype("int16")->input_alias == nullptr);
  // --dtype and --autocast: fp16 (not f16), float16, half.
  CHECK(FindPrecision("fp16") == FindPythonDtype("float16"));
  CHECK(FindPrecision("half") == FindPythonDtype("float16"));
  CHECK(FindPrecision("bf16") == FindPythonDtype("bfloat16"));
  CHECK(FindPrecision("float") == FindPythonDtype("float32"));
  CHECK(FindPrecision("f16") == nullptr);
  CHECK(FindPrecision("float64") == nullptr);
  CHECK(FindPrecision("Float") == nullptr);
}
