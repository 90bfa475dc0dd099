#include "planner/base/units.h"

#include <doctest/doctest.h>

#include "planner/base/error.h"

using namespace ckplan;

TEST_CASE("budgets parse in decimal and binary units") {
  CHECK(ParseBytes("24GB").bytes == 24000000000LL);
  CHECK(ParseBytes("24GB").style == UnitStyle::kDecimal);
  CHECK(ParseBytes("24GiB").bytes == 24LL << 30);
  CHECK(ParseBytes("24GiB").style == UnitStyle::kBinary);
  CHECK(ParseBytes("512MiB").bytes == 512LL << 20);
  CHECK(ParseBytes("1.5e9").bytes == 1500000000LL);
  CHECK(ParseBytes("123456").bytes == 123456);
  CHECK(ParseBytes("2.5gib").bytes == 2684354560LL);
  CHECK(ParseBytes("10 MB").bytes == 10000000);
  CHECK(ParseBytes("64KiB").bytes == 65536);
}

TEST_CASE("bad budgets are errors that quote the text") {
  for (const char* bad : {"", "abc", "24XB", "0", "-5GB", "0GiB", "nan", "inf", "1e30", "GB", "24 G B"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(ParseBytes(bad), Error);
  }
  CHECK_THROWS_WITH(ParseBytes("24XB"), doctest::Contains("'24XB'"));
  CHECK_THROWS_WITH(ParseBytes("-1GB"), doctest::Contains("must be positive"));
  CHECK_THROWS_WITH(ParseBytes("9EiB"), doctest::Contains("too large: at most 9.2e18 bytes"));
  // Every refusal is bad input (exit 2); a parse that returns fails the test.
  for (const char* bad : {"0", "-5GB", "24XB", "9EiB"}) {
    CAPTURE(bad);
    ExitCode code = ExitCode::kOk;
    try {
      ParseBytes(bad);
      FAIL("parsed");
    } catch (const Error& e) {
      code = e.code();
    }
    CHECK(code == ExitCode::kBadInput);
  }
}

TEST_CASE("bytes format for people, rounded up unless asked to round to nearest") {
  CHECK(FormatBytes(512) == "512 B");
  CHECK(FormatBytes(1536) == "1.50 KiB");
  CHECK(FormatBytes(24LL << 30) == "24.0 GiB");
  CHECK(FormatBytes(2612345678LL, UnitStyle::kDecimal) == "2.62 GB");
  CHECK(FormatBytes(2612345678LL, UnitStyle::kDecimal, false) == "2.61 GB");
  CHECK(FormatBytesCompact(2610000000LL, UnitStyle::kDecimal) == "2.61GB");
  CHECK(ParseBytes(FormatBytesCompact(123456789, UnitStyle::kBinary)).bytes >= 123456789);
}

TEST_CASE("every size a plan can name formats in a unit that parses back") {
  // 1e15 B once printed as "1.00PB", which the parser refused ("unknown unit 'pb'").
  CHECK(FormatBytes(1000000000000000LL, UnitStyle::kDecimal) == "1.00 PB");
  CHECK(FormatBytes(int64_t{3} << 60) == "3.00 EiB");
  CHECK(ParseBytes("2PB").bytes == 2000000000000000LL);
  CHECK(ParseBytes("1PiB").bytes == int64_t{1} << 50);
  CHECK(ParseBytes("1EiB").bytes == int64_t{1} << 60);
  for (UnitStyle style : {UnitStyle::kDecimal, UnitStyle::kBinary}) {
    for (int shift = 0; shift <= 62; ++shift) {
      for (int64_t value : {int64_t{1} << shift, (int64_t{1} << shift) + (int64_t{1} << shift) / 3}) {
        CAPTURE(value);
        const std::string text = FormatBytesCompact(value, style);
        CAPTURE(text);
        CHECK(ParseBytes(text).bytes >= value);
      }
    }
  }
}

TEST_CASE("a budget written in bytes is answered in bytes") {
  CHECK(WrittenInBytes(ParseBytes("182868200")));
  CHECK(WrittenInBytes(ParseBytes(" 182868200 B")));
  CHECK(!WrittenInBytes(ParseBytes("183MB")));
  CHECK(!WrittenInBytes(ParseBytes("1.5e9")));
  CHECK(!WrittenInBytes(ParseBytes("24GiB")));
  CHECK(FormatLikeBudget(182869224, ParseBytes("182868200")) == "182869224");
  CHECK(FormatLikeBudget(182869224, ParseBytes("182MB")) == "183MB");
}
