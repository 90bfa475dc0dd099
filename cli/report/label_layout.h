#pragma once
/// Where the report's text labels go: next to their point where there is room,
/// else moved up or down (the caller then draws a leader line), never over
/// another label and never outside the figure. Torch-free, no SVG here: boxes
/// in the figure's pixels, y growing downwards.

#include <string>
#include <vector>

namespace ckplan {

struct Box {
  double left = 0, top = 0, right = 0, bottom = 0;
  bool Intersects(const Box& other, double gap = 0) const;
  bool Inside(const Box& frame) const;
};

/// An upper bound on the width of `text` drawn at `font_px` in the browser's
/// sans-serif font (DejaVu Sans' advance widths, the widest of the common
/// ones; unknown characters count as 1 em).
double TextWidthPx(const std::string& text, double font_px);

/// The box of `text` with its baseline at `baseline_y`, starting at `x`
/// (`anchor_end`: ending at `x`, as SVG's text-anchor="end").
Box TextBox(double x, double baseline_y, const std::string& text, double font_px, bool anchor_end = false);

/// `text` shortened in the middle with "..." so that it is at most `max_px`
/// wide at `font_px` (unchanged when it fits).
std::string ElideMiddle(const std::string& text, double font_px, double max_px);

/// A label's place: the SVG text's x, baseline y and anchor; `moved` when it
/// is away from its point (draw a leader line from the point to `box`).
struct LabelPlace {
  double x = 0, y = 0;
  bool anchor_end = false;
  bool moved = false;
  Box box;
};

class LabelLayout {
 public:
  /// Labels stay inside `frame`.
  explicit LabelLayout(Box frame) : frame_(frame) {}
  /// Something labels must not cover (a marker, a legend, a fixed label).
  void Block(const Box& box) { taken_.push_back(box); }
  /// A label for the point (px, py): right of it and above, right and below,
  /// left above, left below; then the same sides moved up and down in steps
  /// of a line. The first place that is free wins; if none is (a figure
  /// with more labels than room), the one covering the least.
  LabelPlace PlaceNearPoint(double px, double py, const std::string& text, double font_px);
  /// A label for a horizontal line at y, right-aligned at x_right: above the
  /// line, below it, then moved up and down.
  LabelPlace PlaceOnHorizontalLine(double x_right, double y, const std::string& text, double font_px);
  /// A label for a vertical line at x, near the top at baseline y: right of
  /// the line, left of it, then moved down.
  LabelPlace PlaceOnVerticalLine(double x, double y, const std::string& text, double font_px);

 private:
  LabelPlace Choose(const std::vector<LabelPlace>& candidates);
  double Covered(const Box& box) const;
  Box frame_;
  std::vector<Box> taken_;
};

}  // namespace ckplan
