"""Apply a ckplan plan to a PyTorch model: wrap the modules the plan names with
torch.utils.checkpoint, and undo it.

    import ckplan_torch
    ckplan_torch.apply_plan(model, "plan.json")   # before training
    ...
    ckplan_torch.remove_plan(model)

and exports a model for `ckplan profile model.pt2` (torch.export, training IR):

    ckplan_torch.export(model, (x,), "model.pt2")

A model built under ``with torch.device("meta")`` (no weights anywhere)
exports shapes-only: the graph and the parameters' shapes and dtypes; the
archive is marked (``extra/ckplan.json``: ``{"shapes_only": true}``), and
``ckplan profile --device meta`` profiles it; ``ckplan run`` refuses it.

The plan (``ckplan.plan/1``, from ``ckplan solve`` on a profile of the model)
lists ``checkpoint_modules``: module paths as in ``model.named_modules()``.
Each is checkpointed on its own: its forward keeps only its inputs and is run
again during backward. Non-reentrant checkpointing where the installed torch
has it; the RNG state is kept, so dropout gives the same masks. No dependency
beyond torch.
"""
from ._apply import apply_plan, apply_rank_plan, checkpointed_modules, remove_plan
from ._compiled import CompiledPlan, CompiledProfile, profile_compiled
from ._checks import check_model, check_optimizer, check_trainable, check_trainable_optimizer
from ._errors import ArgumentError, CkplanError, ExportError, MissingModuleError, PlanError
from ._export import check_autocast, check_loss, export
from ._model import is_meta_model
from ._plan_file import fsdp_units, load_plan, plan_autocast, plan_batch, rank_plan
from ._planning import AUTO_BUDGET_MARGIN, Plan, auto_budget, enable, plan
from ._programs import find_ckplan
from ._selective import measure_sac_dispatch_us

__all__ = ["apply_plan", "remove_plan", "load_plan", "checkpointed_modules", "check_model", "check_optimizer",
           "check_trainable", "check_trainable_optimizer", "plan_autocast", "check_autocast", "check_loss",
           "export", "ExportError", "PlanError", "MissingModuleError", "ArgumentError",
           "rank_plan", "fsdp_units", "apply_rank_plan", "is_meta_model", "plan_batch",
           "plan", "enable", "Plan", "CkplanError", "find_ckplan", "auto_budget", "AUTO_BUDGET_MARGIN",
           "measure_sac_dispatch_us", "CompiledPlan", "CompiledProfile", "profile_compiled"]
