#include "planner/base/dtype.h"

#include <algorithm>
#include <cctype>

namespace ckplan {
namespace {

bool EqualIgnoringCase(const std::string& a, const char* b) {
  const std::string other = b;
  return a.size() == other.size() && std::equal(a.begin(), a.end(), other.begin(), [](unsigned char x, unsigned char y) {
           return std::tolower(x) == std::tolower(y);
         });
}

}  // namespace

const std::vector<Dtype>& Dtypes() {
  // LibTorch, Python, bytes, floating, integral; then what --input, --dtype and --autocast take.
  static const std::vector<Dtype> kDtypes = {
      {"Byte", "uint8", 1, false, true, true},
      {"Char", "int8", 1, false, true, true},
      {"Short", "int16", 2, false, true, true},
      {"Int", "int32", 4, false, true, true, "int"},
      {"Long", "int64", 8, false, true, true, "long"},
      {"Half", "float16", 2, true, false, true, "half", "f16", "fp16"},
      {"Float", "float32", 4, true, false, true, "float", "f32", "fp32"},
      {"Double", "float64", 8, true, false, true, "double", "f64"},
      {"ComplexHalf", "complex32", 4, false, false},
      {"ComplexFloat", "complex64", 8, false, false},
      {"ComplexDouble", "complex128", 16, false, false},
      {"Bool", "bool", 1, false, true, true},
      {"QInt8", "qint8", 1, false, false},
      {"QUInt8", "quint8", 1, false, false},
      {"QInt32", "qint32", 4, false, false},
      {"BFloat16", "bfloat16", 2, true, false, true, nullptr, "bf16", "bf16"},
      {"QUInt4x2", "quint4x2", 1, false, false},
      {"QUInt2x4", "quint2x4", 1, false, false},
      {"Bits1x8", "bits1x8", 1, false, false},
      {"Bits2x4", "bits2x4", 1, false, false},
      {"Bits4x2", "bits4x2", 1, false, false},
      {"Bits8", "bits8", 1, false, false},
      {"Bits16", "bits16", 2, false, false},
      {"Float8_e5m2", "float8_e5m2", 1, true, false},
      {"Float8_e4m3fn", "float8_e4m3fn", 1, true, false},
      {"Float8_e5m2fnuz", "float8_e5m2fnuz", 1, true, false},
      {"Float8_e4m3fnuz", "float8_e4m3fnuz", 1, true, false},
      {"UInt16", "uint16", 2, false, true},
      {"UInt32", "uint32", 4, false, true},
      {"UInt64", "uint64", 8, false, true},
      {"Float8_e8m0fnu", "float8_e8m0fnu", 1, true, false},
      {"Float4_e2m1fn_x2", "float4_e2m1fn_x2", 1, true, false},
  };
  return kDtypes;
}

const Dtype* FindLibTorchDtype(const std::string& name) {
  for (const Dtype& d : Dtypes()) {
    if (name == d.libtorch) return &d;
  }
  return nullptr;
}

const Dtype* FindPythonDtype(const std::string& name) {
  for (const Dtype& d : Dtypes()) {
    if (name == d.python) return &d;
  }
  return nullptr;
}

const Dtype* FindDtypeIgnoringCase(const std::string& name) {
  for (const Dtype& d : Dtypes()) {
    if (EqualIgnoringCase(name, d.libtorch) || EqualIgnoringCase(name, d.python)) return &d;
  }
  return nullptr;
}

const Dtype* FindPrecision(const std::string& text) {
  for (const Dtype& d : Dtypes()) {
    if (d.precision == nullptr) continue;
    if (text == d.precision || text == d.python || (d.input_alias != nullptr && text == d.input_alias)) return &d;
  }
  return nullptr;
}

}  // namespace ckplan
