#pragma once
/// Model inputs as the user gives them: `8x3x224x224`, `4x1024:int64:0..50257`.

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace ckplan {

struct InputSpec {
  std::vector<int64_t> shape;
  std::string dtype = "float32";  ///< canonical name: float32, float64, float16, bfloat16, int64, int32, int16, int8, uint8, bool
  bool has_range = false;         ///< LO..HI given
  double lo = 0;                  ///< integers: drawn from [lo, hi) like torch.randint
  double hi = 2;                  ///< default 0..2: zeros and ones
  std::string text;               ///< as written
};

/// Parses `SHAPE[:DTYPE[:LO..HI]]`. Throws BadInput quoting the text, also
/// for a range the dtype cannot hold and a tensor over 1 PiB.
InputSpec ParseInputSpec(const std::string& text);

/// Bytes of the tensor the spec describes.
int64_t InputBytes(const InputSpec& spec);

/// True for integer and bool dtypes.
bool IsIntegerDtype(const std::string& dtype);

/// Bytes per element of a canonical dtype.
int64_t DtypeBytes(const std::string& dtype);

/// {"shape":[..],"dtype":..,"text":..,"lo":..,"hi":..} (or
/// "distribution" for a float input drawn from a standard normal): a
/// profile's `model.inputs[]`.
nlohmann::json InputSpecToJson(const InputSpec& spec);

class JsonReader;
/// Reads what InputSpecToJson writes: `shape`, `dtype` and `text` required,
/// `lo` and `hi` together or neither (a range given or chosen). Throws
/// BadInput naming the field.
InputSpec InputSpecFromJson(const JsonReader& node);

}  // namespace ckplan
