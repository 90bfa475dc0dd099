#include "planner/contracts/sweep_document.h"

#include "planner/base/json_io.h"

namespace ckplan {

bool SweepPoint::operator==(const SweepPoint& o) const {
  return budget_bytes == o.budget_bytes && time_ms == o.time_ms && overhead_pct == o.overhead_pct;
}

bool SweepDocument::operator==(const SweepDocument& o) const {
  return source == o.source && slots == o.slots && slot_bytes == o.slot_bytes && fixed_bytes == o.fixed_bytes &&
         no_recompute_ms == o.no_recompute_ms && points == o.points;
}

nlohmann::json SweepToJson(const SweepDocument& s) {
  nlohmann::json points = nlohmann::json::array();
  for (const SweepPoint& point : s.points) {
    points.push_back({{"budget_bytes", point.budget_bytes}, {"time_ms", point.time_ms}, {"overhead_pct", point.overhead_pct}});
  }
  return {{"schema", "ckplan.sweep/1"}, {"source", PlanSourceToJson(s.source)}, {"slots", s.slots},
          {"slot_bytes", s.slot_bytes}, {"fixed_bytes", s.fixed_bytes}, {"no_recompute_ms", s.no_recompute_ms},
          {"points", points}};
}

SweepDocument SweepFromJson(const nlohmann::json& json, const std::string& file) {
  JsonReader root(json, file);
  root.ExpectObject();
  if (root.Field("schema").String() != "ckplan.sweep/1") root.Field("schema").Fail("expected \"ckplan.sweep/1\"");
  SweepDocument s;
  s.source = PlanSourceFromJson(root.Field("source").node(), file, "source");
  s.slots = root.Field("slots").IntegerIn(0, 1 << 30);
  s.slot_bytes = root.Field("slot_bytes").NonNegativeBytes();
  s.fixed_bytes = root.Field("fixed_bytes").NonNegativeBytes();
  s.no_recompute_ms = root.Field("no_recompute_ms").NonNegativeNumber();
  JsonReader points = root.Field("points");
  for (size_t k = 0; k < points.ArraySize(); ++k) {
    JsonReader point = points.Item(k);
    s.points.push_back({point.Field("budget_bytes").NonNegativeBytes(), point.Field("time_ms").NonNegativeNumber(),
                        point.Field("overhead_pct").FiniteNumber()});
  }
  return s;
}

}  // namespace ckplan
