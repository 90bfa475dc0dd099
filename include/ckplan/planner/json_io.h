#pragma once
/// Reading and writing JSON files with the errors ckplan promises: a missing
/// or malformed file is one line naming the file, and an output is written to
/// a temporary name and renamed, so no half-written file is ever left.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ckplan {

/// Parses the JSON file at `path`. Throws BadInput naming the file (and the
/// byte offset for a syntax error).
nlohmann::json ReadJsonFile(const std::string& path);

/// Writes `text` to `path` atomically (temporary file in the same folder,
/// then rename). Throws Error naming the path if it cannot be written.
void WriteFileAtomic(const std::string& path, const std::string& text);

/// Typed access to fields, with errors that name the file and field path
/// (`stages[3].fwd_ms`).
class JsonReader {
 public:
  JsonReader(const nlohmann::json& node, std::string file, std::string path = "");

  bool Has(const std::string& key) const;
  JsonReader Field(const std::string& key) const;  ///< required object member
  JsonReader Item(size_t index) const;             ///< array element
  size_t ArraySize() const;                        ///< throws if not an array
  void ExpectObject() const;

  std::string String() const;
  double NonNegativeNumber() const;   ///< finite and >= 0
  int64_t NonNegativeBytes() const;   ///< integral and >= 0
  int64_t Integer() const;
  bool Bool() const;

  const nlohmann::json& node() const { return node_; }
  const std::string& path() const { return path_; }
  [[noreturn]] void Fail(const std::string& why) const;

 private:
  const nlohmann::json& node_;
  std::string file_;
  std::string path_;
};

}  // namespace ckplan
