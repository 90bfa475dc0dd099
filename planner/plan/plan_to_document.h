#pragma once
/// A plan as the contracts write it: the plan document (`ckplan.plan/1`)
/// and the sweep (`ckplan.sweep/1`).

#include <nlohmann/json_fwd.hpp>

#include "planner/contracts/chain.h"
#include "planner/contracts/plan_document.h"
#include "planner/contracts/sweep_document.h"
#include "planner/plan/plan.h"

namespace ckplan {

/// The `ckplan.plan/1` document of `plan` (plan_document.h). `source` says
/// where the chain came from (`{"kind":"chain","path":..}` or, for a profile,
/// the model's sha256 and inputs, so that `ckplan run` can refuse a plan made
/// for another model).
PlanDocument MakePlanDocument(const Plan& plan, const Chain& chain, const PlanSource& source);

/// What a torch.compile'd job should expect of a PyTorch-target plan's
/// prediction, which is made for eager PyTorch (`pytorch.under_torch_compile`).
const std::string& UnderTorchCompile();

/// PlanToJson(MakePlanDocument(plan, chain, source)).
nlohmann::json PlanToJson(const Plan& plan, const Chain& chain, const PlanSource& source);

/// The sweep of an optimal plan made with PlanRequest::sweep (its `curve`).
SweepDocument MakeSweepDocument(const Plan& plan, const PlanSource& source);

}  // namespace ckplan
