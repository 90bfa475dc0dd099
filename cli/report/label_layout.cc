#include "cli/report/label_layout.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace ckplan {
namespace {

// DejaVu Sans advance widths in font units (2048 to the em), ' ' to '~'.
constexpr int kAdvance[95] = {
    651,  821,  942,  1716, 1303, 1946, 1597, 563,  799,  799,  1024, 1716, 651,  739,  651,  690,  1303, 1303, 1303,
    1303, 1303, 1303, 1303, 1303, 1303, 1303, 690,  690,  1716, 1716, 1716, 1087, 2048, 1401, 1405, 1430, 1577, 1294,
    1178, 1587, 1540, 604,  604,  1343, 1141, 1767, 1532, 1612, 1235, 1612, 1423, 1300, 1251, 1499, 1401, 2025, 1403,
    1251, 1403, 799,  690,  799,  1716, 1024, 1024, 1255, 1300, 1126, 1300, 1260, 721,  1300, 1298, 569,  569,  1186,
    569,  1995, 1298, 1253, 1300, 1300, 842,  1067, 803,  1298, 1212, 1675, 1212, 1212, 1075, 1303, 690,  1303, 1716};

// The font's ascent and descent as fractions of its size (DejaVu Sans: 0.928
// and 0.236), with a little room.
constexpr double kAscent = 0.95, kDescent = 0.26;
// Space kept free around a label, in pixels.
constexpr double kGapPx = 1.5;

double Overlap(const Box& a, const Box& b) {
  const double w = std::min(a.right, b.right) - std::max(a.left, b.left);
  const double h = std::min(a.bottom, b.bottom) - std::max(a.top, b.top);
  return w > 0 && h > 0 ? w * h : 0;
}

}  // namespace

bool Box::Intersects(const Box& other, double gap) const {
  return left < other.right + gap && other.left < right + gap && top < other.bottom + gap && other.top < bottom + gap;
}

bool Box::Inside(const Box& frame) const {
  return left >= frame.left && right <= frame.right && top >= frame.top && bottom <= frame.bottom;
}

namespace {

// A byte's advance in font units (2048 per em): ASCII from the table, the
// first byte of a character outside ASCII a full em, continuation bytes 0.
double ByteUnits(unsigned char c) {
  if (c >= 32 && c < 127) return kAdvance[c - 32];
  return (c & 0xC0) != 0x80 ? 2048 : 0;
}

double UnitsToPx(double units, double font_px) { return units / 2048.0 * font_px * 1.03; }

}  // namespace

double TextWidthPx(const std::string& text, double font_px) {
  double units = 0;
  for (unsigned char c : text) units += ByteUnits(c);
  return UnitsToPx(units, font_px);
}

Box TextBox(double x, double baseline_y, const std::string& text, double font_px, bool anchor_end) {
  const double width = TextWidthPx(text, font_px);
  const double left = anchor_end ? x - width : x;
  return {left, baseline_y - kAscent * font_px, left + width, baseline_y + kDescent * font_px};
}

std::string ElideMiddle(const std::string& text, double font_px, double max_px) {
  if (TextWidthPx(text, font_px) <= max_px) return text;
  // Whole characters only: cut at UTF-8 lead bytes.
  auto lead = [&text](size_t i) { return i >= text.size() || (static_cast<unsigned char>(text[i]) & 0xC0) != 0x80; };
  // Widths of every prefix, so each try costs O(1) (a name can be long).
  std::vector<double> prefix(text.size() + 1, 0);
  for (size_t i = 0; i < text.size(); ++i) prefix[i + 1] = prefix[i] + ByteUnits(static_cast<unsigned char>(text[i]));
  const double dots = 3 * ByteUnits('.');
  size_t head = text.size() / 2, tail = text.size() / 2;
  while (head > 0) {
    while (head > 0 && !lead(head)) --head;
    while (tail < text.size() && !lead(tail)) ++tail;
    const double units = prefix[head] + dots + (prefix[text.size()] - prefix[tail]);
    if (UnitsToPx(units, font_px) <= max_px) return text.substr(0, head) + "..." + text.substr(tail);
    // Drop one character from each side, the tail first (it is what differs
    // between sibling modules: keep more of it).
    --head;
    if (tail < text.size()) ++tail;
  }
  return "...";
}

double LabelLayout::Covered(const Box& box) const {
  double covered = 0;
  for (const Box& t : taken_)
    covered += Overlap(box, {t.left - kGapPx, t.top - kGapPx, t.right + kGapPx, t.bottom + kGapPx});
  // Outside the figure costs more than covering another label.
  const double area = (box.right - box.left) * (box.bottom - box.top);
  covered += 10 * (area - Overlap(box, frame_));
  return covered;
}

LabelPlace LabelLayout::Choose(const std::vector<LabelPlace>& candidates) {
  const LabelPlace* best = nullptr;
  double best_covered = std::numeric_limits<double>::infinity();
  for (const LabelPlace& c : candidates) {
    const double covered = Covered(c.box);
    if (covered <= 0) {
      best = &c;
      break;
    }
    if (covered < best_covered) {
      best_covered = covered;
      best = &c;
    }
  }
  LabelPlace chosen = *best;
  taken_.push_back(chosen.box);
  return chosen;
}

LabelPlace LabelLayout::PlaceNearPoint(double px, double py, const std::string& text, double font_px) {
  const double line = (kAscent + kDescent) * font_px + 2;
  const double above = py - 6, below = py + 6 + kAscent * font_px;
  std::vector<LabelPlace> candidates;
  auto add = [&](double x, double y, bool anchor_end, bool moved) {
    candidates.push_back({x, y, anchor_end, moved, TextBox(x, y, text, font_px, anchor_end)});
  };
  add(px + 8, above, false, false);
  add(px + 8, below, false, false);
  add(px - 8, above, true, false);
  add(px - 8, below, true, false);
  const int steps = static_cast<int>((frame_.bottom - frame_.top) / line) + 1;
  for (int k = 1; k <= steps; ++k) {
    add(px + 14, above - k * line, false, true);
    add(px + 14, below + k * line, false, true);
    add(px - 14, above - k * line, true, true);
    add(px - 14, below + k * line, true, true);
  }
  return Choose(candidates);
}

LabelPlace LabelLayout::PlaceOnHorizontalLine(double x_right, double y, const std::string& text, double font_px) {
  const double line = (kAscent + kDescent) * font_px + 2;
  const double above = y - 5, below = y + 5 + kAscent * font_px;
  std::vector<LabelPlace> candidates;
  auto add = [&](double base, bool moved) {
    candidates.push_back({x_right, base, true, moved, TextBox(x_right, base, text, font_px, true)});
  };
  add(above, false);
  add(below, false);
  const int steps = static_cast<int>((frame_.bottom - frame_.top) / line) + 1;
  for (int k = 1; k <= steps; ++k) {
    add(above - k * line, true);
    add(below + k * line, true);
  }
  return Choose(candidates);
}

LabelPlace LabelLayout::PlaceOnVerticalLine(double x, double y, const std::string& text, double font_px) {
  const double line = (kAscent + kDescent) * font_px + 2;
  std::vector<LabelPlace> candidates;
  const int steps = static_cast<int>((frame_.bottom - frame_.top) / line) + 1;
  for (int k = 0; k <= steps; ++k) {
    const double base = y + k * line;
    candidates.push_back({x + 4, base, false, false, TextBox(x + 4, base, text, font_px, false)});
    candidates.push_back({x - 4, base, true, false, TextBox(x - 4, base, text, font_px, true)});
  }
  return Choose(candidates);
}

}  // namespace ckplan
