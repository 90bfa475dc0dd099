#include "cli/report/label_layout.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

namespace ckplan {
namespace {

TEST_CASE("text widths: wider letters are wider, longer texts longer") {
  CHECK(TextWidthPx("mmmm", 12) > TextWidthPx("iiii", 12));
  CHECK(TextWidthPx("every-2", 12) > TextWidthPx("every", 12));
  CHECK(TextWidthPx("every", 24) == doctest::Approx(2 * TextWidthPx("every", 12)));
  // A character outside ASCII counts once, as 1 em, whatever its byte count.
  CHECK(TextWidthPx("\xc3\xa9", 10) == doctest::Approx(10 * 1.03));
}

TEST_CASE("a long name loses its middle, keeps both ends, and fits") {
  const std::string name = "features.denseblock4.denselayer16.conv2.bottleneck_projection";
  const std::string short_name = ElideMiddle(name, 11, 150);
  CHECK(TextWidthPx(short_name, 11) <= 150);
  CHECK(short_name.find("...") != std::string::npos);
  CHECK(short_name.rfind("feat", 0) == 0);
  CHECK(short_name.substr(short_name.size() - 4) == "tion");
  CHECK(ElideMiddle("layer1", 11, 150) == "layer1");
}

TEST_CASE("labels of points at one place are stacked, none over another, all inside the frame") {
  const Box frame{70, 34, 650, 364};
  LabelLayout layout(frame);
  std::vector<Box> boxes;
  for (int k = 0; k < 12; ++k) {
    LabelPlace at = layout.PlaceNearPoint(400, 200 + 0.5 * k, "every-" + std::to_string(k), 12);
    CHECK(at.box.Inside(frame));
    if (k >= 4) CHECK(at.moved);  // four places touch the point; the rest moved
    for (const Box& other : boxes) CHECK_FALSE(at.box.Intersects(other));
    boxes.push_back(at.box);
  }
}

TEST_CASE("a label with room stays beside its point, near the right edge it goes left") {
  LabelLayout layout({0, 0, 600, 300});
  LabelPlace free = layout.PlaceNearPoint(100, 100, "none", 12);
  CHECK_FALSE(free.moved);
  CHECK_FALSE(free.anchor_end);
  CHECK(free.box.left > 100);
  LabelPlace edge = layout.PlaceNearPoint(590, 200, "optimal", 12);
  CHECK(edge.anchor_end);
  CHECK(edge.box.right < 590);
}

TEST_CASE("two horizontal lines close together: one label above, the other below") {
  LabelLayout layout({0, 0, 600, 300});
  LabelPlace budget = layout.PlaceOnHorizontalLine(590, 150, "budget 278 MB", 12);
  LabelPlace fixed = layout.PlaceOnHorizontalLine(590, 152, "fixed 256 MB", 12);
  CHECK_FALSE(budget.box.Intersects(fixed.box));
  CHECK(budget.box.bottom <= 150);
  CHECK(fixed.box.top >= 152);
}

TEST_CASE("a marker is not covered by a label") {
  LabelLayout layout({0, 0, 600, 300});
  const Box marker{104, 80, 116, 92};  // where the first choice would go
  layout.Block(marker);
  LabelPlace at = layout.PlaceNearPoint(100, 100, "sqrt (n=4)", 12);
  CHECK_FALSE(at.box.Intersects(marker));
}

}  // namespace
}  // namespace ckplan
