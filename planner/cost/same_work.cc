#include "planner/cost/same_work.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <utility>

namespace ckplan {
namespace {

std::string ShapeKey(const std::vector<int64_t>& shape, const std::string& dtype) {
  std::string key = dtype + "[";
  for (int64_t d : shape) key += std::to_string(d) + ",";
  return key + "]";
}

double MedianOf(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

std::vector<int> SameWorkGroups(const Profile& profile, bool backward) {
  // Modules whose own parameters train, and those whose own are frozen.
  std::set<std::string> trained, frozen;
  for (const ParameterRecord& p : profile.parameters) {
    const size_t dot = p.name.rfind('.');
    const std::string module = dot == std::string::npos ? "" : p.name.substr(0, dot);
    (p.requires_grad ? trained : frozen).insert(module);
  }
  std::map<std::string, int> first;
  std::vector<int> groups;
  for (const OpRecord& op : profile.ops) {
    std::string key = op.kind + "|";
    if (!op.args.empty()) {
      for (const ArgRecord& a : op.args) key += ShapeKey(a.shape, a.dtype);
    }
    key += "|";
    for (const std::vector<int>* ids : {&op.inputs, &op.outputs}) {
      for (int t : *ids) {
        if (t < 0 || static_cast<size_t>(t) >= profile.tensors.size()) continue;
        const TensorRecord& r = profile.tensors[static_cast<size_t>(t)];
        key += ShapeKey(r.shape, r.dtype) + (backward && r.requires_grad ? "g" : "");
      }
      key += "|";
    }
    key += std::to_string(op.dropout_p) + "|" + op.approximate + "|" + (op.is_causal ? "causal" : "") + "|" +
           std::to_string(op.recurrent.num_layers) + (op.recurrent.bidirectional ? "b" : "") +
           (op.recurrent.batch_first ? "f" : "");
    if (backward) key += std::string("|") + (trained.count(op.module) ? "t" : "") + (frozen.count(op.module) ? "f" : "");
    groups.push_back(first.emplace(key, op.id).first->second);
  }
  return groups;
}

PooledTimes PoolSamples(const std::vector<int>& groups, const std::vector<std::vector<double>>& samples) {
  std::map<int, std::vector<double>> pooled;
  for (size_t k = 0; k < groups.size() && k < samples.size(); ++k) {
    auto& all = pooled[groups[k]];
    all.insert(all.end(), samples[k].begin(), samples[k].end());
  }
  std::map<int, double> median;
  for (const auto& [group, all] : pooled) median[group] = MedianOf(all);
  PooledTimes result;
  std::vector<std::pair<double, double>> deviations;  // (relative deviation, weight)
  double weight = 0;
  for (size_t k = 0; k < groups.size(); ++k) {
    const double m = median[groups[k]];
    result.ms.push_back(m);
    if (pooled[groups[k]].size() < 2 || m <= 0 || k >= samples.size()) continue;
    for (double s : samples[k]) {
      deviations.push_back({std::fabs(s - m) / m, m});
      weight += m;
    }
  }
  if (deviations.empty() || weight <= 0) return result;
  std::sort(deviations.begin(), deviations.end());
  double seen = 0;
  for (const auto& [deviation, w] : deviations) {
    seen += w;
    if (seen >= weight / 2) {
      result.noise_pct = 100 * deviation;
      break;
    }
  }
  return result;
}

}  // namespace ckplan
