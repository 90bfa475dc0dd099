#pragma once
/// Reading and writing JSON files with the errors ckplan promises: a missing
/// or malformed file is one line naming the file, and an output is written to
/// a temporary name and renamed, so no half-written file is ever left.

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace ckplan {

/// Limits on what ckplan reads: values no real model can have are refused
/// with the field named, so that every sum the planner makes of valid values
/// fits in an int64.
inline constexpr int64_t kMaxInputFileBytes = int64_t{1} << 30;  ///< 1 GiB
inline constexpr int kMaxJsonDepth = 64;                         ///< nested objects and arrays
inline constexpr int64_t kMaxFieldBytes = int64_t{1} << 50;      ///< one byte field: 1 PiB
inline constexpr int64_t kMaxTotalBytes = int64_t{1} << 56;      ///< all byte fields of a file together: 64 PiB
inline constexpr double kMaxFieldMs = 1e9;                       ///< one time field: 1e9 ms (11.6 days)

/// Parses the JSON file at `path`. Throws BadInput naming the file: for a
/// missing file, a directory, a device, a file above kMaxInputFileBytes, a
/// syntax error (with the byte offset), nesting deeper than kMaxJsonDepth
/// and a number out of the range of a double (with the field's path). A FIFO
/// or pipe is read to its end; one nobody writes to is refused after a
/// 5-second wait instead of blocking.
nlohmann::json ReadJsonFile(const std::string& path);

/// Parses `text` as ReadJsonFile does; `file` names it in errors.
nlohmann::json ParseJsonText(const std::string& text, const std::string& file);

/// Refuses (BadInput) an output path that cannot be written: its folder is
/// missing or not a folder, or the path is a folder. Call it before long
/// work so that a typo fails at once. `-` and "" (stdout, nowhere) pass.
void CheckOutputPath(const std::string& path);

/// Writes `text` to `path` atomically (temporary file in the same folder,
/// then rename). A path that exists and is not a regular file (a device,
/// a FIFO) is written directly, never replaced. SIGINT/SIGTERM while the
/// temporary file exists remove it. Throws Error naming the path if it
/// cannot be written (a full disk included).
void WriteFileAtomic(const std::string& path, const std::string& text);

/// Writes `text` to stdout; throws Error if it cannot (a full disk, a
/// closed pipe).
void WriteStdout(const std::string& text);

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
  /// This object's `schema` is `ckplan.KIND/1`; one of a later version
  /// fails saying it was made by a newer ckplan, anything else as expected.
  void ExpectSchema(const std::string& kind) const;

  std::string String() const;
  /// Finite, >= 0 and at most `max` (by default kMaxFieldMs: the fields read
  /// this way are times).
  double NonNegativeNumber(double max = kMaxFieldMs) const;
  /// Any finite number, of either sign (a percentage).
  double FiniteNumber() const;
  int64_t NonNegativeBytes() const;   ///< integral, >= 0 and at most kMaxFieldBytes
  int64_t Integer() const;            ///< any int64
  int IntegerIn(int64_t lo, int64_t hi) const;  ///< an integer in [lo, hi] (within int)
  bool Bool() const;

  const nlohmann::json& node() const { return node_; }
  const std::string& path() const { return path_; }
  const std::string& file() const { return file_; }
  [[noreturn]] void Fail(const std::string& why) const;

 private:
  const nlohmann::json& node_;
  std::string file_;
  std::string path_;
};

/// Adds byte counts without overflow: the sum, or a value above
/// kMaxTotalBytes once it passes it (saturating at INT64_MAX).
int64_t SaturatingAdd(int64_t a, int64_t b);

/// FormatBytes-style text of a limit, for messages: `1 PiB`.
std::string LimitText(int64_t bytes);

}  // namespace ckplan
