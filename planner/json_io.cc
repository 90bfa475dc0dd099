#include "ckplan/planner/json_io.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <unistd.h>

#include "ckplan/planner/error.h"

namespace ckplan {

nlohmann::json ReadJsonFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw BadInput(path + ": cannot open: " + std::strerror(errno));
  std::stringstream buffer;
  buffer << in.rdbuf();
  try {
    return nlohmann::json::parse(buffer.str());
  } catch (const nlohmann::json::parse_error& e) {
    throw BadInput(path + ": malformed JSON at byte " + std::to_string(e.byte));
  }
}

void WriteFileAtomic(const std::string& path, const std::string& text) {
  std::string temporary = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    if (!out) throw BadInput(path + ": cannot write: " + std::strerror(errno));
    out << text;
    out.flush();
    if (!out) {
      std::remove(temporary.c_str());
      throw Error(ExitCode::kInternal, path + ": write failed");
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    int saved_errno = errno;
    std::remove(temporary.c_str());
    throw BadInput(path + ": cannot write: " + std::strerror(saved_errno));
  }
}

JsonReader::JsonReader(const nlohmann::json& node, std::string file, std::string path)
    : node_(node), file_(std::move(file)), path_(std::move(path)) {}

void JsonReader::Fail(const std::string& why) const {
  throw BadInput(file_ + ": field '" + (path_.empty() ? "<root>" : path_) + "': " + why);
}

void JsonReader::ExpectObject() const {
  if (!node_.is_object()) Fail("expected an object");
}

bool JsonReader::Has(const std::string& key) const {
  return node_.is_object() && node_.contains(key);
}

JsonReader JsonReader::Field(const std::string& key) const {
  ExpectObject();
  std::string child = path_.empty() ? key : path_ + "." + key;
  auto it = node_.find(key);
  if (it == node_.end()) {
    throw BadInput(file_ + ": field '" + child + "': missing");
  }
  return JsonReader(*it, file_, child);
}

size_t JsonReader::ArraySize() const {
  if (!node_.is_array()) Fail("expected an array");
  return node_.size();
}

JsonReader JsonReader::Item(size_t index) const {
  if (!node_.is_array() || index >= node_.size()) Fail("expected an array element");
  return JsonReader(node_[index], file_, path_ + "[" + std::to_string(index) + "]");
}

std::string JsonReader::String() const {
  if (!node_.is_string()) Fail("expected a string");
  return node_.get<std::string>();
}

double JsonReader::NonNegativeNumber() const {
  if (!node_.is_number()) Fail("expected a number");
  double value = node_.get<double>();
  if (!std::isfinite(value)) Fail("expected a finite number");
  if (value < 0) Fail("must not be negative, got " + node_.dump());
  return value;
}

int64_t JsonReader::NonNegativeBytes() const {
  if (!node_.is_number()) Fail("expected a byte count");
  if (node_.is_number_unsigned()) {
    uint64_t v = node_.get<uint64_t>();
    if (v > static_cast<uint64_t>(INT64_MAX)) Fail("too large");
    return static_cast<int64_t>(v);
  }
  if (node_.is_number_integer()) {
    int64_t v = node_.get<int64_t>();
    if (v < 0) Fail("must not be negative, got " + node_.dump());
    return v;
  }
  double v = node_.get<double>();
  if (!std::isfinite(v)) Fail("expected a finite byte count");
  if (v < 0) Fail("must not be negative, got " + node_.dump());
  if (v != std::floor(v) || v > 9.2e18) Fail("expected a whole number of bytes, got " + node_.dump());
  return static_cast<int64_t>(v);
}

int64_t JsonReader::Integer() const {
  if (!node_.is_number_integer()) Fail("expected an integer");
  return node_.get<int64_t>();
}

bool JsonReader::Bool() const {
  if (!node_.is_boolean()) Fail("expected true or false");
  return node_.get<bool>();
}

}  // namespace ckplan
