#pragma once
/// Byte quantities as people write them: `24GB`, `24GiB`, `512MiB`, `1.5e9`.

#include <cstdint>
#include <optional>
#include <string>

namespace ckplan {

/// How a byte count was written, so answers can use the same style.
enum class UnitStyle { kDecimal, kBinary };

struct ByteQuantity {
  int64_t bytes = 0;
  UnitStyle style = UnitStyle::kDecimal;
  std::string text;  ///< as the user wrote it, for messages; may be empty
};

/// Parses `24GB` (10^9), `24GiB` (2^30), `512MiB`, `1.5e9`, `1000`, with an
/// optional `B` and unit letters in any case (`kB`, `KiB`, `M`, `MB`, `G`...).
/// Throws BadInput quoting `text` for anything else, and for zero or negative
/// values. Fractional byte counts are rounded down.
ByteQuantity ParseBytes(const std::string& text, const std::string& what = "budget");

/// The name a plan records for a style (`unit_style`: "decimal", "binary"),
/// and back (nullopt for any other text).
const char* UnitStyleName(UnitStyle style);
std::optional<UnitStyle> UnitStyleFromName(const std::string& name);

/// Formats bytes for people: `2.61 GiB` (binary) or `2.80 GB` (decimal);
/// below 1 KB/KiB, `123 B`. One rounding rule for every figure printed: the
/// last digit rounds up (`round_up`), so that a peak or a minimum typed
/// back as a budget is feasible, and a minimum and a plan's peak of the same
/// bytes print alike. `round_up = false` rounds to nearest.
std::string FormatBytes(int64_t bytes, UnitStyle style = UnitStyle::kBinary,
                        bool round_up = true);

/// The same quantity in the form ParseBytes accepts without spaces
/// (`2.61GiB`), rounded up to 3 significant decimals.
std::string FormatBytesCompact(int64_t bytes, UnitStyle style);

/// Whether `quantity` was written as a whole count of bytes (`182868200`,
/// `182868200B`): a budget given so is answered in bytes.
bool WrittenInBytes(const ByteQuantity& quantity);

/// `bytes` in the form `budget` was written in: the exact count where it
/// was written in bytes (WrittenInBytes), else FormatBytesCompact in its style.
std::string FormatLikeBudget(int64_t bytes, const ByteQuantity& budget);

}  // namespace ckplan
