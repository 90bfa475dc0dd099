#include "planner/contracts/input_spec.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include <nlohmann/json.hpp>

#include "planner/base/dtype.h"
#include "planner/base/error.h"
#include "planner/base/json_io.h"

namespace ckplan {
namespace {

bool ParseNumber(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

std::string FormatNumber(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.4g", v);
  return text;
}

}  // namespace

int64_t InputBytes(const InputSpec& spec) {
  int64_t bytes = DtypeBytes(spec.dtype);
  for (int64_t d : spec.shape) bytes *= d;  // bounded by ParseInputSpec (1 PiB)
  return bytes;
}

bool IsIntegerDtype(const std::string& dtype) {
  const Dtype* d = FindPythonDtype(dtype);
  return d != nullptr && d->input && d->integral;
}

int64_t DtypeBytes(const std::string& dtype) {
  const Dtype* d = FindPythonDtype(dtype);
  return d != nullptr && d->input ? d->bytes : 4;
}

InputSpec ParseInputSpec(const std::string& text) {
  auto fail = [&](const std::string& why) { return BadInput("invalid --input '" + text + "': " + why); };
  InputSpec spec;
  spec.text = text;
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t colon = text.find(':', start);
    parts.push_back(text.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() > 3) throw fail("expected SHAPE[:DTYPE[:LO..HI]]");
  // Shape: dims joined by x; "scalar" for a 0-d tensor.
  if (parts[0] != "scalar") {
    size_t pos = 0;
    const std::string& shape = parts[0];
    while (pos <= shape.size()) {
      size_t x = shape.find('x', pos);
      std::string dim = shape.substr(pos, x == std::string::npos ? std::string::npos : x - pos);
      if (dim.empty() || dim.find_first_not_of("0123456789") != std::string::npos) {
        throw fail("shape must be sizes joined by 'x', such as 8x3x224x224");
      }
      long long value = std::atoll(dim.c_str());
      if (value <= 0 || dim.size() > 12) throw fail("sizes must be positive");
      spec.shape.push_back(value);
      if (x == std::string::npos) break;
      pos = x + 1;
    }
  }
  if (parts.size() >= 2) {
    bool known = false;
    for (const Dtype& d : Dtypes()) {
      if (!d.input) continue;
      for (const char* name : {d.python, d.input_alias, d.input_short}) {
        if (name != nullptr && parts[1] == name) {
          spec.dtype = d.python;
          known = true;
        }
      }
    }
    if (!known) throw fail("unknown dtype '" + parts[1] + "' (float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool)");
  }
  if (parts.size() == 3) {
    size_t dots = parts[2].find("..");
    double lo = 0, hi = 0;
    if (dots == std::string::npos || !ParseNumber(parts[2].substr(0, dots), &lo) ||
        !ParseNumber(parts[2].substr(dots + 2), &hi)) {
      throw fail("range must be LO..HI, such as 0..50257");
    }
    if (!(hi > lo)) throw fail("range LO..HI needs HI > LO");
    spec.has_range = true;
    spec.lo = lo;
    spec.hi = hi;
  }
  if (spec.has_range) {
    // Values the dtype holds, and a width the sampler can compute.
    struct Limits {
      const char* dtype;
      double lo, hi;
    };
    static constexpr Limits kLimits[] = {
        {"int64", -9223372036854775808.0, 9223372036854775807.0}, {"int32", -2147483648.0, 2147483648.0},
        {"int16", -32768.0, 32768.0}, {"int8", -128.0, 128.0}, {"uint8", 0.0, 256.0}, {"bool", 0.0, 2.0},
        {"float16", -65504.0, 65504.0}, {"bfloat16", -1e38, 1e38}, {"float32", -1e38, 1e38},
        {"float64", -1e307, 1e307}};
    for (const Limits& l : kLimits) {
      if (spec.dtype != l.dtype) continue;
      if (spec.lo < l.lo || spec.hi > l.hi) {
        throw fail("range " + parts[2] + " does not fit " + spec.dtype + " (use values from " +
                   FormatNumber(l.lo) + " to " + FormatNumber(l.hi) + ")");
      }
    }
    if (IsIntegerDtype(spec.dtype) && (spec.lo != std::floor(spec.lo) || spec.hi != std::floor(spec.hi))) {
      throw fail("an integer range takes whole numbers");
    }
  }
  if (!spec.has_range && !IsIntegerDtype(spec.dtype)) {
    spec.lo = 0;
    spec.hi = 0;
  }
  // The tensor itself must be one a machine can hold (1 PiB at most).
  double bytes = static_cast<double>(DtypeBytes(spec.dtype));
  for (int64_t d : spec.shape) bytes *= static_cast<double>(d);
  if (bytes > static_cast<double>(int64_t{1} << 50)) {
    throw fail("the tensor alone would take " + FormatNumber(bytes) + " bytes, more than any machine has");
  }
  return spec;
}

nlohmann::json InputSpecToJson(const InputSpec& spec) {
  nlohmann::json j = {{"shape", spec.shape}, {"dtype", spec.dtype}, {"text", spec.text}};
  if (spec.has_range || IsIntegerDtype(spec.dtype)) {
    j["lo"] = spec.lo;
    j["hi"] = spec.hi;
  } else {
    j["distribution"] = "normal(0,1)";
  }
  return j;
}

InputSpec InputSpecFromJson(const JsonReader& node) {
  node.ExpectObject();
  InputSpec spec;
  const JsonReader shape = node.Field("shape");
  for (size_t d = 0; d < shape.ArraySize(); ++d) spec.shape.push_back(shape.Item(d).NonNegativeBytes());
  spec.dtype = node.Field("dtype").String();
  spec.text = node.Field("text").String();
  if (node.Has("lo") || node.Has("hi")) {
    spec.has_range = true;
    spec.lo = node.Field("lo").FiniteNumber();
    spec.hi = node.Field("hi").FiniteNumber();
  }
  return spec;
}

}  // namespace ckplan
