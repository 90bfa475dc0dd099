"""Checks of a model and its optimizer against the plan made for them: the parameters the plan's
profile listed, the trainable ones, the optimizer it was priced for."""
import warnings
from typing import Optional

import torch

from ._errors import PlanError
from ._model import _eager
from ._optimizer import OptimizerChoice
from ._plan_file import PlanSource, _describe_bytes, load_plan


def check_model(model: torch.nn.Module, plan: PlanSource) -> None:
    """Checks that ``model`` has the parameters the plan's profile listed (how many tensors, and
    their bytes, each tensor once): a plan made for another model, or for this one at another size
    or dtype, predicts nothing for it, even where its module paths happen to exist. Then warns as
    ``check_trainable`` does. A rank's plan (pipeline or data-parallel) is not checked: the rank
    holds its shards or its stage's modules.

    Args:
        model: the model (``torch.compile``d or not).
        plan: the plan (as ``load_plan`` takes it).

    Raises:
        PlanError: the model's parameters are not the plan's, or the plan's ``source`` is malformed.
    """
    doc = load_plan(plan)
    source = doc.get("source", {})
    if not isinstance(source, dict):
        raise PlanError("the plan's 'source' is not an object: make the plan again with `ckplan solve`")
    count, nbytes = source.get("param_count"), source.get("param_bytes")
    if count is None or nbytes is None:
        return  # an older plan, or one made from a chain
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in (count, nbytes)):
        raise PlanError("the plan's 'source.param_count' and 'source.param_bytes' are not byte counts: "
                        "make the plan again with `ckplan solve`")
    if "pipeline_stage" in doc or "distributed" in doc:
        return  # a rank holds its shards or its stage's modules, not the whole model's parameters
    params = list(_eager(model).parameters())  # each tensor once (tied weights too)
    have_count, have_bytes = len(params), sum(p.numel() * p.element_size() for p in params)
    if (have_count, have_bytes) != (count, nbytes):
        raise PlanError(f"the plan was made for a model with {count} parameter tensors of "
                        f"{_describe_bytes(nbytes)} ({source.get('model_path', 'its profile')}); this model has "
                        f"{have_count} of {_describe_bytes(have_bytes)}: profile and solve for this model, or pass "
                        "strict=False to apply it anyway")
    check_trainable(model, doc)


def _trainable(params):
    """(count, bytes) of the parameters that require grad, each tensor once."""
    seen, count, nbytes = set(), 0, 0
    for p in params:
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            count += 1
            nbytes += p.numel() * p.element_size()
    return count, nbytes


def check_trainable(model: torch.nn.Module, plan: PlanSource) -> Optional[str]:
    """Warns when ``model`` trains other parameters than the plan was profiled with (its
    ``source.trainable_count`` and ``trainable_bytes``; absent: every parameter): a frozen parameter
    has no gradient, no optimizer state and saves less for backward, so a plan made with the weights
    frozen predicts too little for a job that trains them, and one made with them trained too much.

    Args:
        model: the model, its parameters frozen (``requires_grad_(False)``) as the job freezes them.
        plan: the plan (as ``load_plan`` takes it).

    Returns:
        The warning's text, or None when they agree.
    """
    doc = load_plan(plan)
    source = doc.get("source", {})
    if not isinstance(source, dict) or source.get("param_count") is None or "distributed" in doc:
        return None
    want = (source.get("trainable_count", source["param_count"]), source.get("trainable_bytes", source.get("param_bytes")))
    have = _trainable(_eager(model).parameters())
    if want == have:
        return None
    text = (f"ckplan_torch: the plan was profiled with {want[0]} trainable parameter tensors "
            f"({_describe_bytes(want[1])}) and the model trains {have[0]} ({_describe_bytes(have[1])}): gradients, "
            "optimizer state and what backward saves differ, so the step may not be what the plan predicts; freeze "
            "the model's parameters as the job does before ckplan_torch.plan (requires_grad_(False))")
    warnings.warn(text)
    return text


def check_trainable_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Optional[str]:
    """Warns when the job's optimizer does not update exactly the model's trainable parameters
    (those that require grad): parameters it holds that the model does not have or that are frozen
    get state no plan counts; trainable ones it lacks get gradients that nothing frees.

    Args:
        model: the model.
        optimizer: the job's optimizer (anything with torch.optim's ``param_groups``).

    Returns:
        The warning's text, or None when they agree.
    """
    trainable = {id(p) for p in _eager(model).parameters() if p.requires_grad}
    everything = {id(p) for p in _eager(model).parameters()}
    tensors = {id(p): p for g in optimizer.param_groups for p in g["params"]}
    held = set(tensors)
    outside = held - everything
    foreign = len(outside)
    frozen = len((held & everything) - trainable)
    missing = len(trainable - held)
    if not (foreign or frozen or missing):
        return None
    parts = []
    if foreign:
        nbytes = sum(tensors[i].numel() * tensors[i].element_size() for i in outside)
        parts.append(f"holds {foreign} parameter{'s' if foreign != 1 else ''} ({_describe_bytes(nbytes)}) that "
                     f"{'are' if foreign != 1 else 'is'} not the model's")
    if frozen:
        parts.append(f"holds {frozen} that the model froze (requires_grad False)")
    if missing:
        parts.append(f"leaves out {missing} of the model's {len(trainable)} trainable parameters")
    text = ("ckplan_torch: the optimizer " + "; ".join(parts) + ": the plan counts a gradient and optimizer "
            "state for each trainable parameter of the model, and none for others; give the optimizer the "
            "parameters that require grad (filter(lambda p: p.requires_grad, model.parameters()))")
    warnings.warn(text)
    return text


def check_optimizer(optimizer: torch.optim.Optimizer, plan: PlanSource,
                    model: Optional[torch.nn.Module] = None) -> Optional[str]:
    """Warns when the job's optimizer is not the one the plan was priced for:
    its state and its update's temporaries at the step's end are in the plan's
    prediction (``ckplan solve --optimizer NAME --optimizer-impl IMPL`` and
    the options that change them: ``--weight-decay``, ``--amsgrad``,
    ``--nesterov``; with several param groups, each group's options and
    parameters, ``--optimizer-groups``), and ``maximize=True`` (a negated
    gradient per parameter) is priced by none.

    Args:
        optimizer: the job's optimizer (anything with torch.optim's ``param_groups``).
        plan: the plan (as ``load_plan`` takes it).
        model: the model, whose parameter names tell which parameters each group holds; without
            it, the groups' options are compared and not their parameters.

    Returns:
        The warning's text, or None when they agree (or the plan names no optimizer).
    """
    fixed = load_plan(plan).get("fixed", {})
    have = OptimizerChoice.from_torch(optimizer, model)
    maximize = any(g.get("maximize") for g in optimizer.param_groups)
    want = OptimizerChoice.from_plan(fixed)
    if want is None or (want.prices_like(have) and not maximize):
        return None
    if maximize and want.prices_like(have):
        text = ("ckplan_torch: the job's optimizer has maximize=True, which makes a negated gradient per parameter "
                "that no plan prices: the step may go over the plan's budget by the largest parameter's size")
    elif want.groups or have.groups:
        text = (f"ckplan_torch: the plan was priced for {want.describe()} but the job's optimizer is "
                f"{have.describe()}: its state and its update's temporaries differ, so the step may not fit the "
                "plan's budget; plan with the job's optimizer (ckplan_torch.plan(..., optimizer=optimizer) prices "
                "each param group with its own options)")
    else:
        wanted, had = want.describe(), have.describe()
        text = (f"ckplan_torch: the plan was priced for {wanted} but the job's optimizer is {had}: its state and "
                f"its update's temporaries differ, so the step may not fit the plan's budget; solve with {had}")
    warnings.warn(text)
    return text
