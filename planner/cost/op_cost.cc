#include "planner/cost/op_cost.h"

#include <array>
#include <cmath>
#include <limits>

namespace ckplan {
namespace {

constexpr int kFeatures = 4;  // fixed (per call), FLOPs, bytes, weight bytes

std::array<double, kFeatures> Row(const OpFeatures& f) { return {f.calls, f.flops, f.bytes, f.weight_bytes}; }

// Least squares over the columns in `mask`, rows weighted by 1 / us;
// false where the system is singular or a coefficient is negative.
bool Solve(const std::vector<OpCostSample>& samples, unsigned mask, std::array<double, kFeatures>* coef) {
  std::vector<int> cols;
  for (int c = 0; c < kFeatures; ++c) {
    if (mask & (1u << c)) cols.push_back(c);
  }
  const size_t n = cols.size();
  if (n == 0 || n > samples.size()) return false;
  // Columns scaled to unit size (FLOPs are ~1e9, the constant 1) before the normal equations.
  std::array<double, kFeatures> scale{};
  for (size_t i = 0; i < n; ++i) {
    for (const OpCostSample& s : samples) scale[i] = std::max(scale[i], std::abs(Row(s.features)[cols[i]]));
    if (scale[i] == 0) return false;
  }
  std::vector<std::vector<double>> a(n, std::vector<double>(n + 1, 0.0));
  for (const OpCostSample& s : samples) {
    if (s.us <= 0) continue;
    const auto row = Row(s.features);
    for (size_t i = 0; i < n; ++i) {
      const double xi = row[cols[i]] / scale[i] / s.us;
      for (size_t j = 0; j < n; ++j) a[i][j] += xi * row[cols[j]] / scale[j] / s.us;
      a[i][n] += xi * 1.0;  // the target, us / us
    }
  }
  for (size_t i = 0; i < n; ++i) {  // Gaussian elimination with partial pivoting
    size_t pivot = i;
    for (size_t r = i + 1; r < n; ++r) {
      if (std::abs(a[r][i]) > std::abs(a[pivot][i])) pivot = r;
    }
    if (std::abs(a[pivot][i]) < 1e-12) return false;
    std::swap(a[i], a[pivot]);
    for (size_t r = 0; r < n; ++r) {
      if (r == i) continue;
      const double f = a[r][i] / a[i][i];
      for (size_t c = i; c <= n; ++c) a[r][c] -= f * a[i][c];
    }
  }
  coef->fill(0);
  for (size_t i = 0; i < n; ++i) {
    const double v = a[i][n] / a[i][i] / scale[i];
    if (!(v >= 0)) return false;
    (*coef)[cols[i]] = v;
  }
  return true;
}

}  // namespace

LinearOpCost FitOpCost(const std::vector<OpCostSample>& samples) {
  LinearOpCost best;
  double best_error = std::numeric_limits<double>::infinity();
  for (int size = 1; size <= kFeatures; ++size) {  // fewer features first: they win a tie
    for (unsigned mask = 1; mask < (1u << kFeatures); ++mask) {
      if (__builtin_popcount(mask) != size) continue;
      std::array<double, kFeatures> coef{};
      if (!Solve(samples, mask, &coef)) continue;
      const LinearOpCost law{coef[0], coef[1], coef[2], coef[3]};
      double error = 0;
      for (const OpCostSample& s : samples) {
        if (s.us > 0) error += std::pow((law.Us(s.features) - s.us) / s.us, 2);
      }
      if (error < best_error * (1 - 1e-9) - 1e-15) {
        best_error = error;
        best = law;
      }
    }
  }
  return best;
}

}  // namespace ckplan
