#include "planner/solvers/batch_search.h"

#include <algorithm>
#include <cmath>

namespace ckplan {

double BatchPoint::samples_per_s(bool with_plan) const {
  const double ms = with_plan ? plan_ms : none_ms;
  return ms > 0 ? batch * 1000.0 / ms : 0;
}

namespace {

// Narrows (lo, hi) to the last batch that fits: lo fits (0: none known to),
// hi does not. `figure` decides it (fits when <= budget); it guides the
// guesses only, fitting is what the evaluation says.
void Narrow(BatchSearch* search, int64_t budget, const EvaluateBatch& evaluate, bool (*fits)(const BatchPoint&),
            int64_t (*figure)(const BatchPoint&)) {
  auto& points = search->points;
  auto measured = [&](int b) -> const BatchPoint& {
    auto it = points.find(b);
    if (it == points.end()) it = points.emplace(b, evaluate(b)).first;
    return it->second;
  };
  // The bracket: the largest batch measured to fit, and the first above it measured not to.
  int lo = 0;
  for (const auto& [b, p] : points) {
    if (fits(p)) lo = b;
  }
  int hi = 0;
  for (auto it = points.upper_bound(lo); it != points.end() && hi == 0; ++it) {
    if (!fits(it->second)) hi = it->first;
  }
  if (hi == 0) return;  // nothing above it measured: the doubling stopped at max_batch
  // Interpolate; after a guess that fits, the batch after it (an affine
  // figure's guess is the answer); bisect after an interpolation that does
  // not halve the bracket, then interpolate again.
  enum class Probe { kInterpolate, kNext, kBisect };
  Probe next = Probe::kInterpolate;
  while (hi - lo > 1) {
    const BatchPoint* low = lo > 0 ? &points.at(lo) : nullptr;
    const BatchPoint& high = points.at(hi);
    Probe probe = next;
    if (probe == Probe::kInterpolate &&
        (low == nullptr || !low->error.empty() || !high.error.empty() || figure(high) <= figure(*low))) {
      probe = Probe::kBisect;
    }
    int guess = lo + (hi - lo) / 2;
    if (probe == Probe::kNext) guess = lo + 1;
    if (probe == Probe::kInterpolate) {
      const double slope = static_cast<double>(figure(high) - figure(*low)) / (hi - lo);
      const double steps = std::floor(static_cast<double>(budget - figure(*low)) / slope);
      guess = std::clamp(lo + static_cast<int>(std::min<double>(steps, hi - lo)), lo + 1, hi - 1);
    }
    const int width = hi - lo;
    const bool fit = fits(measured(guess));
    (fit ? lo : hi) = guess;
    if (probe == Probe::kInterpolate) {
      next = fit ? Probe::kNext : (2 * (hi - lo) <= width ? Probe::kInterpolate : Probe::kBisect);
    } else {
      next = probe == Probe::kNext ? Probe::kBisect : Probe::kInterpolate;
    }
  }
}

}  // namespace

void SetAnswers(BatchSearch* search) {
  search->largest_none = search->largest_plan = search->fastest_none = search->fastest_plan = 0;
  double best_plan = 0, best_none = 0;
  for (const auto& [b, p] : search->points) {
    if (!p.error.empty()) continue;
    if (p.plan_fits) {
      search->largest_plan = b;
      if (p.samples_per_s(true) > best_plan) best_plan = p.samples_per_s(true), search->fastest_plan = b;
    }
    if (p.none_fits) {
      search->largest_none = b;
      if (p.samples_per_s(false) > best_none) best_none = p.samples_per_s(false), search->fastest_none = b;
    }
  }
}

BatchSearch SearchBatches(int max_batch, int64_t budget_bytes, const EvaluateBatch& evaluate) {
  BatchSearch search;
  max_batch = std::max(1, max_batch);
  // Doubling until the best plan does not fit.
  for (int64_t b = 1;; b *= 2) {
    const int batch = static_cast<int>(std::min<int64_t>(b, max_batch));
    const BatchPoint& p = search.points.emplace(batch, evaluate(batch)).first->second;
    // A batch the model refuses below one that fits (batch norm at 1) is skipped.
    if ((!p.plan_fits && p.error.empty()) || batch == max_batch) break;
    if (!p.error.empty() && batch > 1) break;
  }
  Narrow(&search, budget_bytes, evaluate, [](const BatchPoint& p) { return p.plan_fits; },
         [](const BatchPoint& p) { return p.min_budget_bytes; });
  Narrow(&search, budget_bytes, evaluate, [](const BatchPoint& p) { return p.none_fits; },
         [](const BatchPoint& p) { return p.none_peak_bytes; });
  SetAnswers(&search);
  return search;
}

}  // namespace ckplan
