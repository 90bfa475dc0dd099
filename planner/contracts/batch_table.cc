#include "planner/contracts/batch_table.h"

#include "planner/base/json_io.h"

namespace ckplan {

bool BatchPlanFit::operator==(const BatchPlanFit& o) const {
  return peak_bytes == o.peak_bytes && time_ms == o.time_ms && overhead_pct == o.overhead_pct && what == o.what &&
         samples_per_s == o.samples_per_s;
}

bool BatchRow::operator==(const BatchRow& o) const {
  return batch == o.batch && error == o.error && none_peak_bytes == o.none_peak_bytes && none_ms == o.none_ms &&
         none_fits == o.none_fits && none_samples_per_s == o.none_samples_per_s &&
         min_budget_bytes == o.min_budget_bytes && plan == o.plan;
}

bool BatchTable::operator==(const BatchTable& o) const {
  return dimension == o.dimension && model == o.model && budget_bytes == o.budget_bytes && max_batch == o.max_batch && device == o.device &&
         global_batch == o.global_batch && largest_none == o.largest_none && largest_plan == o.largest_plan &&
         fastest_none == o.fastest_none && fastest_plan == o.fastest_plan && chosen == o.chosen && rows == o.rows;
}

nlohmann::json BatchTableToJson(const BatchTable& t) {
  nlohmann::json rows = nlohmann::json::array();
  for (const BatchRow& r : t.rows) {
    nlohmann::json row = {{"batch", r.batch}};
    if (!r.error.empty()) {
      row["error"] = r.error;
      rows.push_back(row);
      continue;
    }
    row["none"] = {{"peak_bytes", r.none_peak_bytes},
                   {"time_ms", r.none_ms},
                   {"fits", r.none_fits},
                   {"samples_per_s", r.none_samples_per_s}};
    row["plan"] = {{"fits", r.plan.has_value()}, {"min_budget_bytes", r.min_budget_bytes}};
    if (r.plan) {
      row["plan"].update({{"peak_bytes", r.plan->peak_bytes},
                          {"time_ms", r.plan->time_ms},
                          {"overhead_pct", r.plan->overhead_pct},
                          {"what", r.plan->what},
                          {"samples_per_s", r.plan->samples_per_s}});
    }
    rows.push_back(row);
  }
  nlohmann::json doc = {{"schema", "ckplan.batches/1"},
                        {"model", t.model},
                        {"budget_bytes", t.budget_bytes},
                        {"max_batch", t.max_batch},
                        {"device", t.device},
                        {"largest_none", t.largest_none},
                        {"largest_plan", t.largest_plan},
                        {"fastest_none", t.fastest_none},
                        {"fastest_plan", t.fastest_plan},
                        {"chosen", t.chosen},
                        {"rows", rows}};
  if (t.global_batch) doc["global_batch"] = *t.global_batch;
  if (t.dimension != "batch") doc["dimension"] = t.dimension;
  return doc;
}

BatchTable BatchTableFromJson(const nlohmann::json& doc, const std::string& file) {
  const JsonReader root(doc, file);
  root.ExpectObject();
  root.ExpectSchema("batches");
  BatchTable t;
  constexpr int kMaxBatch = 1 << 30;
  if (root.Has("dimension")) {
    t.dimension = root.Field("dimension").String();
    if (t.dimension != "batch" && t.dimension != "seq") root.Field("dimension").Fail("expected \"batch\" or \"seq\"");
  }
  t.model = root.Field("model").String();
  t.budget_bytes = root.Field("budget_bytes").NonNegativeBytes();
  t.max_batch = root.Field("max_batch").IntegerIn(1, kMaxBatch);
  t.device = root.Field("device").String();
  if (root.Has("global_batch")) t.global_batch = root.Field("global_batch").IntegerIn(1, kMaxBatch);
  t.largest_none = root.Field("largest_none").IntegerIn(0, kMaxBatch);
  t.largest_plan = root.Field("largest_plan").IntegerIn(0, kMaxBatch);
  t.fastest_none = root.Field("fastest_none").IntegerIn(0, kMaxBatch);
  t.fastest_plan = root.Field("fastest_plan").IntegerIn(0, kMaxBatch);
  t.chosen = root.Field("chosen").IntegerIn(0, kMaxBatch);
  const JsonReader rows = root.Field("rows");
  for (size_t k = 0; k < rows.ArraySize(); ++k) {
    const JsonReader item = rows.Item(k);
    BatchRow r;
    r.batch = item.Field("batch").IntegerIn(1, kMaxBatch);
    if (!t.rows.empty() && r.batch <= t.rows.back().batch) item.Field("batch").Fail("rows must be in increasing batch order");
    if (item.Has("error")) {
      r.error = item.Field("error").String();
      t.rows.push_back(r);
      continue;
    }
    const JsonReader none = item.Field("none");
    r.none_peak_bytes = none.Field("peak_bytes").NonNegativeBytes();
    r.none_ms = none.Field("time_ms").NonNegativeNumber();
    r.none_fits = none.Field("fits").Bool();
    r.none_samples_per_s = none.Field("samples_per_s").NonNegativeNumber(1e15);
    const JsonReader plan = item.Field("plan");
    r.min_budget_bytes = plan.Field("min_budget_bytes").NonNegativeBytes();
    if (plan.Field("fits").Bool()) {
      BatchPlanFit fit;
      fit.peak_bytes = plan.Field("peak_bytes").NonNegativeBytes();
      fit.time_ms = plan.Field("time_ms").NonNegativeNumber();
      fit.overhead_pct = plan.Field("overhead_pct").FiniteNumber();
      fit.what = plan.Field("what").String();
      fit.samples_per_s = plan.Field("samples_per_s").NonNegativeNumber(1e15);
      r.plan = fit;
    }
    t.rows.push_back(r);
  }
  return t;
}

}  // namespace ckplan
