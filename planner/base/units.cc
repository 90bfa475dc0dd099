#include "planner/base/units.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "planner/base/error.h"

namespace ckplan {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct Unit {
  const char* name;
  double factor;
  UnitStyle style;
};

constexpr Unit kUnits[] = {
    {"", 1.0, UnitStyle::kDecimal},          {"b", 1.0, UnitStyle::kDecimal},
    {"k", 1e3, UnitStyle::kDecimal},         {"kb", 1e3, UnitStyle::kDecimal},
    {"m", 1e6, UnitStyle::kDecimal},         {"mb", 1e6, UnitStyle::kDecimal},
    {"g", 1e9, UnitStyle::kDecimal},         {"gb", 1e9, UnitStyle::kDecimal},
    {"t", 1e12, UnitStyle::kDecimal},        {"tb", 1e12, UnitStyle::kDecimal},
    {"kib", 1024.0, UnitStyle::kBinary},     {"mib", 1048576.0, UnitStyle::kBinary},
    {"gib", 1073741824.0, UnitStyle::kBinary}, {"tib", 1099511627776.0, UnitStyle::kBinary},
    {"ki", 1024.0, UnitStyle::kBinary},      {"mi", 1048576.0, UnitStyle::kBinary},
    {"gi", 1073741824.0, UnitStyle::kBinary}, {"ti", 1099511627776.0, UnitStyle::kBinary},
    {"p", 1e15, UnitStyle::kDecimal},        {"pb", 1e15, UnitStyle::kDecimal},
    {"e", 1e18, UnitStyle::kDecimal},        {"eb", 1e18, UnitStyle::kDecimal},
    {"pib", 1125899906842624.0, UnitStyle::kBinary}, {"pi", 1125899906842624.0, UnitStyle::kBinary},
    {"eib", 1152921504606846976.0, UnitStyle::kBinary}, {"ei", 1152921504606846976.0, UnitStyle::kBinary},
};

}  // namespace

ByteQuantity ParseBytes(const std::string& text, const std::string& what) {
  auto fail = [&](const std::string& why) {
    return BadInput("invalid " + what + " '" + text + "': " + why);
  };
  size_t begin = text.find_first_not_of(" \t");
  size_t end = text.find_last_not_of(" \t");
  if (begin == std::string::npos) throw fail("empty");
  std::string s = text.substr(begin, end - begin + 1);
  const char* start = s.c_str();
  char* number_end = nullptr;
  double value = std::strtod(start, &number_end);
  if (number_end == start) throw fail("expected a number such as 24GB, 24GiB, 512MiB or 1.5e9");
  std::string unit = s.substr(static_cast<size_t>(number_end - start));
  size_t unit_begin = unit.find_first_not_of(' ');
  unit = unit_begin == std::string::npos ? "" : Lower(unit.substr(unit_begin));
  const Unit* found = nullptr;
  for (const Unit& u : kUnits) {
    if (unit == u.name) found = &u;
  }
  if (found == nullptr) {
    throw fail("unknown unit '" + unit + "' (use B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB or PiB)");
  }
  if (!std::isfinite(value)) throw fail("not a finite number");
  if (value <= 0) throw fail("must be positive");
  double bytes = value * found->factor;
  if (bytes >= 9.2e18) throw fail("too large: at most 9.2e18 bytes (8 EiB)");
  if (bytes < 1) throw fail("less than one byte");
  return ByteQuantity{static_cast<int64_t>(std::floor(bytes)), found->style, text};
}

bool WrittenInBytes(const ByteQuantity& quantity) {
  const std::string& t = quantity.text;
  size_t i = t.find_first_not_of(" \t");
  if (i == std::string::npos || !std::isdigit(static_cast<unsigned char>(t[i]))) return false;
  while (i < t.size() && std::isdigit(static_cast<unsigned char>(t[i]))) ++i;
  while (i < t.size() && t[i] == ' ') ++i;
  if (i < t.size() && (t[i] == 'b' || t[i] == 'B')) ++i;
  return t.find_first_not_of(" \t", i) == std::string::npos;
}

std::string FormatLikeBudget(int64_t bytes, const ByteQuantity& budget) {
  return WrittenInBytes(budget) ? std::to_string(bytes) : FormatBytesCompact(bytes, budget.style);
}

std::string FormatBytes(int64_t bytes, UnitStyle style, bool round_up) {
  const double base = style == UnitStyle::kBinary ? 1024.0 : 1000.0;
  // Up to exa: an int64 is below 9.3 EB, so every unit printed also parses.
  static const char* kBinary[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  static const char* kDecimal[] = {"B", "KB", "MB", "GB", "TB", "PB", "EB"};
  const char** names = style == UnitStyle::kBinary ? kBinary : kDecimal;
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= base && unit < 6) {
    value /= base;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof(buffer), "%lld B", static_cast<long long>(bytes));
    return buffer;
  }
  // Two decimals below 10, one below 100, none above: three significant digits.
  int decimals = value < 10 ? 2 : (value < 100 ? 1 : 0);
  double scale = std::pow(10.0, decimals);
  double shown = round_up ? std::ceil(value * scale - 1e-9) / scale : value;
  std::snprintf(buffer, sizeof(buffer), "%.*f %s", decimals, shown, names[unit]);
  return buffer;
}

std::string FormatBytesCompact(int64_t bytes, UnitStyle style) {
  std::string s = FormatBytes(bytes, style, /*round_up=*/true);
  std::string out;
  for (char c : s) {
    if (c != ' ') out += c;
  }
  return out;
}

const char* UnitStyleName(UnitStyle style) { return style == UnitStyle::kDecimal ? "decimal" : "binary"; }

std::optional<UnitStyle> UnitStyleFromName(const std::string& name) {
  if (name == "decimal") return UnitStyle::kDecimal;
  if (name == "binary") return UnitStyle::kBinary;
  return std::nullopt;
}

}  // namespace ckplan
