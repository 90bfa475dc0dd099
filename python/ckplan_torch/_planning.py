"""One call from a training script: export, ``ckplan profile``, ``ckplan solve``.

    plan = ckplan_torch.plan(model, (ids,), budget="24GB", kwargs={"labels": ids})
    plan.apply(model)            # or: ckplan_torch.enable(model, (ids,), budget="24GB", kwargs=...)
    print(plan)                  # the prediction and the strategy table

The ``ckplan`` program does the work; this module finds it (``pip install``
puts it beside the environment's python), runs it, and turns its one-line
errors into ``CkplanError``.
"""
import contextlib
import json
import os
import tempfile
import threading
import time
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch

from ._apply import apply_plan
from ._arguments import budget_text, call_folder, check_gpu, check_optimizer_choice
from ._checks import check_optimizer, check_trainable_optimizer
from ._diagnosis import in_python_terms
from ._errors import ArgumentError, CkplanError, ExportError, PlanError
from ._export import _export, check_autocast, check_loss, forward_fails, named_specs
from ._model import _first_batch, _model_device, is_meta_model
from ._optimizer import OptimizerChoice, plan_groups_flags
from ._plan_file import _describe_bytes, _write_json, plan_batch, schema_refusal
from ._programs import _run, find_ckplan
from ._selective import measure_sac_dispatch_us
from ._transformers import _cache_configs


# budget="auto" on a CUDA device: what the device could hold for this step less this share of its
# memory (at least AUTO_BUDGET_MIN_MARGIN bytes): the caching allocator's fragmentation, and the
# cuBLAS/cuDNN workspaces and the CUDA context, none of which a profile counts.
AUTO_BUDGET_MARGIN = 0.10
AUTO_BUDGET_MIN_MARGIN = 1 << 30

# plan()'s profile: measured steps after the warm-up (`ckplan profile --reps`). Memory needs one, and
# ops that do the same work are timed together (a transformer's layers, a ResNet's blocks); the noise
# one step leaves is measured, and plans within it are ties (Plan.time_noise_pct).
PLAN_PROFILE_REPS = 1

_EXPORT_LOCK = threading.Lock()


def auto_budget(device: Union[str, torch.device]) -> int:
    """The budget ``budget="auto"`` plans for.

    Args:
        device: a CUDA device.

    Returns:
        What this process could hold there (the free memory plus what PyTorch's caching allocator
        already holds, the model's weights included) less AUTO_BUDGET_MARGIN of the device's memory
        (at least 1 GiB), in bytes.

    Raises:
        ValueError: a device that is not CUDA, or one with less free memory than the margin.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"budget='auto' needs a model on a CUDA device (this one is on {device.type}): "
                         "give the budget, e.g. budget='24GB'")
    free, total = torch.cuda.mem_get_info(device)
    margin = max(int(total * AUTO_BUDGET_MARGIN), AUTO_BUDGET_MIN_MARGIN)
    available = free + torch.cuda.memory_reserved(device) - margin
    if available <= 0:
        raise ValueError(f"budget='auto': {device} has {_describe_bytes(free, 'binary')} free, less than the "
                         f"{_describe_bytes(margin, 'binary')} margin; give the budget")
    return available


def _check_target(target):
    if target not in ("pytorch", "sac", "schedule"):
        raise ValueError(f"target={target!r}: 'pytorch' (modules to wrap, Plan.apply), 'sac' (modules to wrap and "
                         "ops to save in them, Plan.apply) or 'schedule' (ckplan run)")
    return target


def _sac_flag(flags):
    """The ``--sac-dispatch-us`` value in ``flags``, or None."""
    for i, flag in enumerate(flags[:-1]):
        if flag == "--sac-dispatch-us":
            return float(flags[i + 1])
    return None


def _without_sac_flag(flags):
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag == "--sac-dispatch-us":
            skip = True
        else:
            out.append(flag)
    return out


class Plan:
    """A solved plan (``ckplan.plan/1``) with the profile it was solved from.

    ``checkpoint_modules``: the module paths to wrap; ``budget_bytes``; ``peak_bytes`` and
    ``time_ms``/``overhead_pct``: the predicted step (for the PyTorch target, eager PyTorch under
    ``apply``); ``min_budget_bytes``: the smallest budget any plan of this target fits;
    ``strategies``: the strategy table at the budget, one dict per row (``name``, ``peak_bytes``,
    ``time_ms``, ``overhead_pct``, ``fits``); ``doc``: the plan as JSON; ``profile``: the profile;
    ``workdir``: the folder of the call's files under ``plan(workdir=...)``, or None.

    Args:
        doc: the plan document (``ckplan.plan/1``).
        profile: the profile (``ckplan.profile/1``) it was solved from, if known.
        ckplan: the ``ckplan`` program that solved it (``report`` runs it; None: find_ckplan).
        solve_flags: the optimizer's flags (and ``--sac-dispatch-us``) it was solved with, which
            ``report`` passes on.
        batches: the batch or sequence table (``ckplan.batches/1``) of a search, if any.
        workdir: the folder of the call's files (``plan(workdir=...)``), if kept.

    Raises:
        PlanError: a profile that is not ``ckplan.profile/1`` (one of a newer ckplan says so).
    """

    def __init__(self, doc: Dict[str, Any], profile: Optional[Dict[str, Any]] = None, ckplan: Optional[str] = None,
                 solve_flags: Sequence[str] = (), batches: Optional[Dict[str, Any]] = None,
                 workdir: Optional[str] = None, seconds: Optional[Dict[str, float]] = None):
        if profile is not None:
            refusal = schema_refusal(profile, "profile", "ckplan profile") if isinstance(profile, dict) else \
                f"not a ckplan profile (a {type(profile).__name__}, expected a dict)"
            if refusal is not None:
                raise PlanError(f"the plan's profile: {refusal}")
        self.doc = doc
        self.batches = batches
        self.profile = profile
        self.workdir = workdir
        self._ckplan = ckplan
        self._solve_flags = list(solve_flags)
        self.seconds = dict(seconds or {})

    @property
    def phase_seconds(self) -> Dict[str, float]:
        """What making the plan took, in seconds of wall time: ``plan``'s phases (``export``,
        ``profile``, ``solve``, ``sac_dispatch``; ``replan``: ``solve`` alone) and, under
        ``profile.``, the profile's own (``load``, ``warm_up``, ``steps``, ``optimizers``,
        ``calibration``, ...), where known."""
        phases = dict(self.seconds)
        if "profile" not in phases:  # a replan measured nothing
            return phases
        environment = (self.profile or {}).get("environment") or {}
        for name, value in (environment.get("phase_seconds") or {}).items():
            phases[f"profile.{name}"] = value
        return phases

    @property
    def time_noise_pct(self) -> Optional[float]:
        """How far the profile's op times' samples lay from its times, in percent: plans whose
        recomputation differs by less are tied, and the one with the larger peak (then the earlier
        modules) is chosen; None where not measured."""
        return (self.doc.get("solver") or {}).get("time_noise_pct")

    def replan(self, budget: Union[int, str], target: Optional[str] = None,
               optimizer: Union[str, torch.optim.Optimizer, None] = None, optimizer_impl: str = "auto",
               sac_dispatch_us: Optional[float] = None, model: Optional[torch.nn.Module] = None) -> "Plan":
        """A plan at another budget (or target, or optimizer) from this plan's profile, with no new
        measurement: ``ckplan solve`` alone, in well under a second. Equals ``plan(...)`` with these
        arguments on the same profile.

        Args:
            budget: as ``plan`` takes it (not ``"auto"``: give the bytes).
            target: ``"pytorch"``, ``"sac"`` or ``"schedule"``; None: this plan's.
            optimizer: as ``plan`` takes it; None: the one this plan was priced for.
            optimizer_impl: with an optimizer's name, its implementation.
            sac_dispatch_us: for ``"sac"``, as ``plan`` takes it; None: this plan's, or measured.
            model: with a torch.optim optimizer of several param groups, the model (its parameters
                name the groups').

        Returns:
            The new Plan, with the same profile.

        Raises:
            PlanError: the plan was loaded without its profile.
            CkplanError: ``ckplan solve`` refused (``exit_code`` 3: the budget is below the smallest).
            TypeError, ValueError: an argument not as ``plan`` takes it.
        """
        if self.profile is None:
            raise PlanError("this plan was loaded without its profile: replan needs the plan from "
                            "ckplan_torch.plan(...), or run `ckplan solve PROFILE --budget ...`")
        target = self.target if target is None else _check_target(target)
        budget = budget_text(budget)
        choice = None  # None: this plan's optimizer, its param groups too
        if optimizer is None:
            flags = _without_sac_flag(self._solve_flags)
        else:
            choice = OptimizerChoice.of(optimizer, optimizer_impl, model)
            check_optimizer_choice(optimizer, choice.name, choice.impl)
            if choice.groups and model is None:
                raise ValueError("Plan.replan: an optimizer of several param groups is priced group by group: "
                                 "give model= too, whose parameters name the groups'")
            flags = choice.solve_flags()
        if target == "sac":
            old = _sac_flag(self._solve_flags)
            per_op = (float(sac_dispatch_us) if sac_dispatch_us is not None else
                      old if old is not None else measure_sac_dispatch_us())
            flags += ["--sac-dispatch-us", f"{per_op:.2f}"]
        calibration = self.profile.get("calibration") or {}
        if target == "schedule" and calibration and "run_step_ms" not in calibration:
            warnings.warn("Plan.replan: this profile timed recomputation as apply runs it, not as `ckplan run` runs "
                          "a schedule: the schedule's recomputation is priced at its ops' forward without autograd; "
                          "plan(target='schedule') measures it", stacklevel=2)
        start = time.perf_counter()
        program = self._ckplan or find_ckplan()
        with self._profile_file() as (work, profile):
            plan_path = os.path.join(work, "plan.json")
            groups = plan_groups_flags(self.doc, work) if choice is None else choice.groups_flags(work)
            _run(program, "solve", profile, "--budget", budget, "--target", target, *flags, *groups, "-o", plan_path)
            with open(plan_path) as f:
                doc = json.load(f)
        return Plan(doc, self.profile, ckplan=program, solve_flags=flags, batches=None,
                    seconds={"solve": time.perf_counter() - start})

    @contextlib.contextmanager
    def _profile_file(self):
        """A temporary folder holding the plan's profile: (the folder, the profile's path)."""
        with tempfile.TemporaryDirectory(prefix="ckplan-") as work:
            profile = os.path.join(work, "profile.json")
            _write_json(profile, self.profile)
            yield work, profile

    @property
    def batch(self) -> Optional[int]:
        """The batch the plan is for (the micro-batch with ``global_batch``)."""
        return plan_batch(self.doc)

    @property
    def checkpoint_modules(self) -> List[str]:
        """The module paths to wrap."""
        return list(self.doc["checkpoint_modules"])

    @property
    def budget_bytes(self) -> int:
        """The budget the plan was solved for, in bytes."""
        return self.doc["budget_bytes"]

    @property
    def target(self) -> str:
        """What the plan is for: ``"pytorch"``, ``"sac"`` (``apply``) or ``"schedule"`` (``ckplan run``)."""
        return self.doc.get("target", "schedule")

    def _predicted(self):
        return self.doc["pytorch"]["predicted"] if self.target in ("pytorch", "sac") else self.doc["predicted"]

    @property
    def peak_bytes(self) -> int:
        """The predicted step's peak memory, in bytes."""
        return self._predicted()["peak_bytes"]

    @property
    def time_ms(self) -> float:
        """The predicted step's time, in milliseconds."""
        return self._predicted()["time_ms"]

    @property
    def overhead_pct(self) -> float:
        """What the recomputation adds to the step's time without checkpointing, in percent."""
        return self._predicted()["overhead_pct"]

    @property
    def min_budget_bytes(self) -> Optional[int]:
        """The smallest budget any plan of this target fits, in bytes (None where not written)."""
        return self.doc.get("min_budget_bytes")

    @property
    def saved_ops(self) -> Dict[str, List[Tuple[str, int, str]]]:
        """For the sac target: per wrapped module, the ops its policy saves, as
        ``(family, occurrence, kind)``; empty for the others."""
        return {e["module"]: [(s["family"], s["occurrence"], s["kind"]) for s in e["save"]]
                for e in self.doc.get("pytorch", {}).get("sac") or []}

    @property
    def loss(self) -> Optional[str]:
        """The loss the plan was profiled with: ``"loss_fn"`` (the job's, exported with the model),
        ``"model"`` (the model's own, given its labels), ``"outputs"`` (ckplan's: the outputs summed,
        which keeps nothing for backward); None when the profile does not say."""
        return ((self.profile or {}).get("model") or {}).get("loss")

    def _output_bytes(self):
        tensors = (self.profile or {}).get("tensors") or []
        ids = (self.profile or {}).get("outputs") or []
        return sum(tensors[i].get("nbytes", tensors[i].get("bytes", 0)) for i in ids if 0 <= i < len(tensors))

    @property
    def strategies(self) -> List[Dict[str, Any]]:
        """The strategy table at the budget, one dict per row (``name``, ``peak_bytes``, ``time_ms``,
        ``overhead_pct``, ``fits``)."""
        return [dict(row) for row in self.doc.get("strategies", [])]

    def apply(self, model: torch.nn.Module, optimizer: Optional[torch.optim.Optimizer] = None,
              strict: bool = True) -> List[str]:
        """Wraps the plan's modules of ``model``: ``apply_plan(model, self, optimizer, strict)``.

        Args:
            model: the model the plan was made for.
            optimizer: the job's torch.optim optimizer, checked against the plan's.
            strict: check the model's parameters against the plan's profile.

        Returns:
            The wrapped modules' paths.
        """
        return apply_plan(model, self.doc, optimizer=optimizer, strict=strict)

    def save(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the plan (``ckplan.plan/1``), for ``apply_plan(model, path)`` or ``ckplan run``.

        Args:
            path: the file to write (written beside and renamed: a failure leaves none).

        Raises:
            ArgumentError: ``path`` cannot be written (its folder does not exist, ...), naming it.
        """
        _write_json(path, self.doc)

    def save_profile(self, path: Union[str, os.PathLike[str]]) -> None:
        """Writes the profile the plan was solved from (``ckplan.profile/1``).

        Args:
            path: the file to write.

        Raises:
            PlanError: the plan was made without its profile.
            ArgumentError: ``path`` cannot be written, naming it.
        """
        if self.profile is None:
            raise PlanError("this plan was loaded without its profile")
        _write_json(path, self.profile)

    def report(self, path: Union[str, os.PathLike[str]]) -> Union[str, os.PathLike[str]]:
        """Writes ``ckplan report`` of the profile at the plan's budget and optimizer: the
        memory/time trade-off and the strategies compared.

        Args:
            path: the report to write, ``.html``, ``.md`` or ``.json``.

        Returns:
            ``path``.

        Raises:
            PlanError: the plan was made without its profile.
            CkplanError: ``ckplan report`` failed.
        """
        if self.profile is None:
            raise PlanError("this plan was loaded without its profile: run `ckplan report PROFILE` instead")
        with self._profile_file() as (work, profile):
            _run(self._ckplan or find_ckplan(), "report", profile, "--budget", self.budget_bytes,
                 *self._solve_flags, *plan_groups_flags(self.doc, work), "-o", os.fspath(path))
        return path

    def __repr__(self):
        style = self.doc.get("unit_style", "binary")
        peak, budget = _describe_bytes(self.peak_bytes, style), _describe_bytes(self.budget_bytes, style)
        saves = sum(len(ops) for ops in self.saved_ops.values())
        lines = [f"ckplan plan ({self.target} target): wrap {len(self.checkpoint_modules)} modules"
                 f"{f' saving {saves} ops in them' if self.target == 'sac' else ''}; "
                 f"predicted peak {peak} of a {budget} budget, step {self.time_ms:.2f} ms (+{self.overhead_pct:.1f}%)"]
        if self.min_budget_bytes is not None:
            lines[0] += f"; smallest budget {_describe_bytes(self.min_budget_bytes, style)} (Plan.replan(budget))"
        solver = self.doc.get("solver") or {}
        if solver.get("tied_plans"):
            lines.append(f"  {solver['tied_plans']} other plan(s) within the profile's time noise "
                         f"({solver['time_noise_pct']:.1f}% of the recomputation, {solver['tie_ms']:.2f} ms): "
                         f"chose the largest peak, then the earliest modules")
        source = self.doc.get("source") or {}
        if source.get("trainable_count") is not None:  # some parameters frozen
            lines.append(f"  trains {_describe_bytes(source['trainable_bytes'], style)} of "
                         f"{_describe_bytes(source.get('param_bytes', 0), style)} of parameters "
                         f"({source['trainable_count']} of {source.get('param_count')} tensors)")
        if source.get("autocast"):
            lines.append(f"  forward and loss under torch.autocast(dtype=torch.{source['autocast']})")
        if self.loss == "outputs":
            lines.append(f"  loss: ckplan's own (the output summed, which keeps nothing for backward); a loss that "
                         f"keeps its input, as a cross-entropy or pow(2).mean() does, adds about "
                         f"{_describe_bytes(self._output_bytes(), style)}: plan with loss_fn= and targets=")
        if self.strategies:
            lines.append(f"  {'strategy':<20} {'peak':>12} {'step':>12} {'overhead':>9}  fits")
            for row in self.strategies:
                row_peak = _describe_bytes(row["peak_bytes"], style)
                lines.append(f"  {row['name']:<20} {row_peak:>12} {row['time_ms']:>9.2f} ms "
                             f"{row['overhead_pct']:>8.1f}%  {'yes' if row['fits'] else 'no'}")
            if any(row["name"] == "optimal (schedule)" for row in self.strategies):
                lines.append("  (optimal (schedule): the nested schedule `ckplan run` executes, not apply's modules)")
        return "\n".join(lines)


def plan(model: torch.nn.Module, example_inputs: Union[torch.Tensor, Sequence[Any]], budget: Union[int, str],
         kwargs: Optional[Dict[str, Any]] = None, gpu: Optional[str] = None,
         optimizer: Union[str, torch.optim.Optimizer] = "adamw", target: str = "pytorch", optimizer_impl: str = "auto",
         ckplan: Optional[str] = None, workdir: Union[str, os.PathLike[str], None] = None,
         batch: Union[int, str, None] = None, max_batch: Optional[int] = None, global_batch: Optional[int] = None,
         seq: Union[int, str, None] = None, max_seq: Optional[int] = None, sac_dispatch_us: Optional[float] = None,
         autocast: Optional[torch.dtype] = None, loss_fn: Optional[Callable[..., torch.Tensor]] = None,
         targets: Union[torch.Tensor, Sequence[torch.Tensor]] = (),
         compile: Union[bool, Dict[str, Any], None] = None) -> Plan:
    """Plans checkpointing for ``model`` under a memory ``budget``, in one call.

    The model is exported (``export``: train mode, caches off, shapes-only when it is on the meta
    device), profiled (``ckplan profile``: on its device, CPU or CUDA; a meta model on meta tensors
    with times from ``gpu``'s cost model) and solved (``ckplan solve``). Frozen parameters
    (``requires_grad_(False)``: LoRA's base weights, a frozen backbone) are read from the model as it
    is: no gradient, no optimizer state, and what autograd saves with them frozen.

    Every argument is checked before the model is exported (the budget's text as ``ckplan solve``
    reads it, the optimizer, ``gpu``, ``workdir``). torch's log of the export goes to a file, not the
    terminal: ``export.log`` in the call's folder under ``workdir``, else a temporary file kept when
    the export fails; the error names it.

    Args:
        model: the model, on the device it trains on (or the meta device).
        example_inputs: as ``torch.export.export`` takes them (a tuple of tensors, or one tensor), at
            the shapes the job trains with; the first dimension of every input is the batch.
        budget: the whole training step's memory (weights, gradients, optimizer state, activations):
            bytes (an int, or a float such as ``24e9``), or text as ``ckplan solve --budget`` takes
            it (``"24GB"``, ``"24GiB"``), or ``"auto"`` on a CUDA device (auto_budget: its free
            memory less a margin).
        kwargs: tensors by forward's parameter names (a Hugging Face model's ``labels`` and
            ``attention_mask``).
        gpu: a cost model's device (``"h100-sxm-80gb"``, ...; ``ckplan profile --help``) for the op
            times instead of measured ones; required for a model on the meta device.
        optimizer: the job's torch.optim optimizer itself (checked to hold exactly the trainable
            parameters; several param groups priced each with its own options), or its name (``"adamw"``, ``"adam"``, ``"sgd"``, ``"momentum"``,
            ``"none"``).
        target: ``"pytorch"`` (modules to wrap, what ``Plan.apply`` does), ``"sac"`` (the same, and
            inside each the ops whose outputs a selective-checkpointing policy saves:
            ``Plan.apply`` builds it) or ``"schedule"`` (for ``ckplan run``).
        optimizer_impl: with an optimizer's name, its implementation (``"auto"``, ``"for-loop"``,
            ``"foreach"``, ``"fused"``).
        ckplan: the program's path (find_ckplan).
        workdir: keep the call's files in a folder of its own there, ``MODEL-YYYYmmdd-HHMMSS-PID``
            (``Plan.workdir``; ``-2``, ``-3``... after it when taken): the archive ``model.pt2``,
            ``profile.json``, ``plan.json`` and ``export.log`` (torch's log of the export, when it
            logged anything), and with ``batch`` or ``seq`` the ``profiles`` and ``batches.json``
            of the search. Calls at once with one ``workdir`` (a sweep, several ranks) never share
            a file. Default: a temporary folder, removed.
        batch: None plans the example inputs' batch. ``"auto"`` profiles the model at the batches
            needed to find the largest that fits the budget, with and without checkpointing, and
            plans the batch that trains the most samples per second (``ckplan solve MODEL --batch
            auto``); ``"largest"`` the largest that fits; a number that batch. ``Plan.batch`` is the
            batch planned, ``Plan.batches`` the table (``ckplan.batches/1``).
        max_batch: caps the search of ``batch="auto"`` or ``"largest"`` (default 4096).
        global_batch: samples per optimizer step, reached by accumulating micro-batches that divide
            it; without ``batch``, micro-batches of the example's batch, which must divide it.
        seq: ``"auto"``, ``"largest"`` or a number: searches the sequence length instead, at the
            example's batch (the model exported with a dynamic sequence: the second dimension of
            its integer inputs), in tokens per second.
        max_seq: caps the search of ``seq``.
        sac_dispatch_us: for ``"sac"``, what the policy costs per op of a wrapped forward, in
            microseconds (None: measured in this Python, ``measure_sac_dispatch_us()``; 0 where the
            GPU's kernels hide it).
        autocast: the dtype the job's forward and loss run in under ``torch.autocast`` (mixed
            precision: ``torch.bfloat16``, as transformers' Trainer with ``bf16=True``, or
            ``torch.float16``, with ``torch.amp.GradScaler``), the weights kept in their own dtype;
            None (fp32) for none. The profile runs them so (``ckplan profile --autocast``);
            ``Plan.apply`` warns when the job's forward runs otherwise.
        loss_fn: the job's loss, ``loss_fn(output, *targets)`` (``nn.CrossEntropyLoss()``, ``lambda
            out, y: F.mse_loss(out, y)``), exported and profiled with the model (``export``): what
            it keeps for backward is counted (a cross-entropy's log-probabilities, the size of the
            output), and the output is held as the loop holds it through ``optimizer.step()``.
            Without it, a model given its labels in ``kwargs`` trains with its own loss, and any
            other is planned with ckplan's (the output summed, which keeps nothing): ``Plan.loss``
            says which, and ``print(plan)`` what a loss that keeps its input would add.
        targets: the tensors ``loss_fn`` takes beside the output, batch first.
        compile: for a job that trains ``torch.compile(model, ...)``: True, or a dict of torch.compile's
            arguments (``mode``, ``options``, ``dynamic``, ``fullgraph``; Inductor only). The plan is then
            of the compiled step (a ``CompiledPlan``): which values each compiled graph saves for the
            backward, measured under torch.compile; ``CompiledPlan.apply(model)`` returns the model
            compiled to follow it. ``target``, ``gpu``, ``batch`` and ``seq`` are refused with it.

    Returns:
        The Plan, with the profile it was solved from.

    Raises:
        CkplanError: ckplan's one-line message (``exit_code`` 3: the budget is below the smallest
            that fits; the message gives it), its ``--input`` told as the argument's name.
        ExportError: the model's own forward (or loss) fails on the example inputs or returns no
            tensor (what it raised, in which module, on which input, and the fix), or the model does
            not export.
        ArgumentError: a budget, optimizer or ``gpu`` ckplan refuses, or a ``workdir`` that cannot be
            made or written (also a ValueError), before anything is exported.
        TypeError, ValueError: an argument not as described.
    """
    program = find_ckplan(ckplan)
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    kwargs = dict(kwargs or {})
    # Every argument is checked before the model is exported: an export and a profile take minutes on a
    # large model.
    _check_target(target)
    device = _model_device(model)
    if isinstance(budget, str) and budget == "auto":
        budget = auto_budget(device)
    budget = budget_text(budget)
    autocast = check_autocast(autocast)
    targets = check_loss(loss_fn, targets)
    if batch is not None and seq is not None:
        raise ValueError("batch= and seq= search one dimension each: give one")
    for name, value in (("batch", batch), ("seq", seq)):
        if value is not None and (isinstance(value, bool) or not (value in ("auto", "largest") or
                                                                  (isinstance(value, int) and value > 0))):
            raise ValueError(f"{name}={value!r}: 'auto' (the fastest that fits), 'largest' or a number")
    if max_batch is not None and batch not in ("auto", "largest"):
        raise ValueError(f"max_batch={max_batch!r} caps the search of batch='auto' or 'largest'; "
                         f"with batch={batch!r} there is none: drop it or search")
    if max_seq is not None and seq not in ("auto", "largest"):
        raise ValueError(f"max_seq={max_seq!r} caps the search of seq='auto' or 'largest'; "
                         f"with seq={seq!r} there is none: drop it or search")
    if global_batch is not None:
        if isinstance(global_batch, bool) or not isinstance(global_batch, int) or global_batch < 1:
            raise ValueError(f"global_batch={global_batch!r}: the samples per optimizer step, a positive int")
        if seq is not None:
            raise ValueError("global_batch= accumulates batches, and seq= searches the sequence: give one")
        if batch is None:
            # Accumulation at the example's batch: planned as ckplan solve --batch B --global-batch G.
            batch = _first_batch(example_inputs, kwargs)
            if batch is None or global_batch % batch != 0:
                raise ValueError(f"global_batch={global_batch} is not a multiple of the example's batch ({batch}): "
                                 f"give a global batch it divides, or batch='auto' to choose the micro-batch")
    if compile is not None and compile is not False:
        # The compiled step is measured as the job runs it (a cache it keeps, counted): no use_cache warning.
        choice = OptimizerChoice.of(optimizer, optimizer_impl, model)
        check_optimizer_choice(optimizer, choice.name, choice.impl)
        return _plan_compiled_call(model, example_inputs, budget, kwargs, optimizer, compile, autocast, loss_fn,
                                   targets, workdir, target=target, gpu=gpu, batch=batch, seq=seq,
                                   global_batch=global_batch, sac_dispatch_us=sac_dispatch_us)
    if _cache_configs(model):
        # T5 gives its decoder a copy of the config: use_cache stays on there after model.config's is off.
        warnings.warn("ckplan_torch.plan: the model's config has use_cache=True: a training step run so keeps a "
                      "key-value cache, which the plan does not count (a step keeps none); Plan.apply turns it off, "
                      "as gradient_checkpointing_enable() does, or set use_cache=False on every config of the "
                      "model (T5's decoder has its own) or pass it to forward", stacklevel=2)
    choice = OptimizerChoice.of(optimizer, optimizer_impl, model)
    check_optimizer_choice(optimizer, choice.name, choice.impl)
    solve_flags = choice.solve_flags()
    if isinstance(optimizer, torch.optim.Optimizer):
        check_trainable_optimizer(model, optimizer)
    seconds = {}
    inputs = list(example_inputs) + list(kwargs.values())
    meta = is_meta_model(model, [x for x in inputs if isinstance(x, torch.Tensor)])
    check_gpu(program, gpu, meta)
    profile_flags = []
    if meta:
        profile_flags += ["--device", "meta"]
    elif device.type == "cuda":
        profile_flags += ["--device", str(device)]
    if gpu is not None:
        profile_flags += ["--gpu", gpu]

    with tempfile.TemporaryDirectory(prefix="ckplan-") as temporary:
        work = call_folder(workdir, type(model).__name__) if workdir is not None else temporary
        if target == "sac":
            start = time.perf_counter()
            per_op = measure_sac_dispatch_us() if sac_dispatch_us is None else float(sac_dispatch_us)
            solve_flags += ["--sac-dispatch-us", f"{per_op:.2f}"]
            seconds["sac_dispatch"] = time.perf_counter() - start
        archive = os.path.join(work, "model.pt2")
        profile = os.path.join(work, "profile.json")
        plan_path = os.path.join(work, "plan.json")
        start = time.perf_counter()
        with _EXPORT_LOCK:  # torch.export is not thread-safe: calls from threads take turns
            _export(model, example_inputs, archive, kwargs=kwargs, dynamic_seq=seq is not None, autocast=autocast,
                    loss_fn=loss_fn, targets=targets,
                    log=os.path.join(work, "export.log") if workdir is not None else None,
                    args_name="example_inputs", load_back=False)
        seconds["export"] = time.perf_counter() - start

        def measure(*args):
            """``ckplan ARGS`` on the archive: its errors about the model told in this call's terms."""
            try:
                return _run(program, *args)
            except CkplanError as error:
                raise _told_in_python(error, model, archive, example_inputs, kwargs, autocast, loss_fn,
                                      targets) from None

        batches = None
        if batch is None and seq is None:
            # One measured step (memory needs one; ops that do the same work are timed together), and
            # recomputation timed for the target's own runs only (Plan.replan to another target
            # prices the schedule's at its ops' forward without autograd).
            start = time.perf_counter()
            measure("profile", archive, *profile_flags, "--reps", PLAN_PROFILE_REPS,
                    "--calibrate", "all" if target == "schedule" else "pytorch", "-o", profile)
            seconds["profile"] = time.perf_counter() - start
            start = time.perf_counter()
            _run(program, "solve", profile, "--budget", budget, "--target", target, *solve_flags,
                 *choice.groups_flags(work), "-o", plan_path)
            seconds["solve"] = time.perf_counter() - start
        else:
            name, value, cap = ("seq", seq, max_seq) if seq is not None else ("batch", batch, max_batch)
            profiles = os.path.join(work, "profiles")
            table = os.path.join(work, "batches.json")
            flags = [f"--{name}", str(value), "--profiles", profiles, "--batch-table", table]
            if cap is not None:
                flags += [f"--max-{name}", str(cap)]
            if global_batch is not None:
                flags += ["--global-batch", str(global_batch)]
            measure("solve", archive, "--budget", budget, "--target", target, *profile_flags, *flags,
                    *solve_flags, *choice.groups_flags(work), "-o", plan_path)
            with open(table) as f:
                batches = json.load(f)
            profile = os.path.join(profiles, f"{name}-{batches['chosen']}.json")
        with open(profile) as f:
            profile_doc = json.load(f)
        with open(plan_path) as f:
            plan_doc = json.load(f)
    if isinstance(optimizer, torch.optim.Optimizer) and any(g.get("maximize") for g in optimizer.param_groups):
        check_optimizer(optimizer, plan_doc)  # the warning apply gives: maximize=True is priced by no plan
    return Plan(plan_doc, profile_doc, ckplan=program, solve_flags=solve_flags, batches=batches,
                workdir=work if workdir is not None else None, seconds=seconds)


def _plan_compiled_call(model, example_inputs, budget, kwargs, optimizer, compile, autocast, loss_fn, targets,
                        workdir, **others):
    """plan(compile=...): the arguments it cannot take refused, then _compiled.plan_compiled."""
    from ._compiled import _compile_options, plan_compiled
    given = {"target": others["target"] != "pytorch", "gpu": others["gpu"] is not None,
             "batch": others["batch"] is not None, "seq": others["seq"] is not None,
             "global_batch": others["global_batch"] is not None,
             "sac_dispatch_us": others["sac_dispatch_us"] is not None}
    refused = [name for name, set_ in given.items() if set_]
    if refused:
        raise ArgumentError(f"compile=: {', '.join(refused)} plan(s) eager jobs only; a compiled plan is of the "
                            "compiled step at the example's batch: leave it out")
    _compile_options(compile)
    if _model_device(model).type == "meta":
        raise ArgumentError("compile=: the model is on the meta device; a compiled plan measures the compiled "
                            "step: build it on the device it trains on")
    why = forward_fails(model, example_inputs, kwargs, autocast, loss_fn, targets, args_name="example_inputs")
    if why is not None:
        raise ExportError(why)
    work = call_folder(workdir, type(model).__name__) if workdir is not None else None
    return plan_compiled(model, example_inputs, budget, kwargs, optimizer, compile, autocast, loss_fn, targets,
                         workdir=work)


def _told_in_python(error, model, archive, example_inputs, kwargs, autocast, loss_fn, targets):
    """ckplan's error about the archive plan() exported, told as the Python call made it: ExportError when the
    model's own forward fails on the example inputs in Python too (what it raised, where, on which input);
    else ckplan's message with the model's name for the archive and the arguments' names for its ``--input``."""
    if "rejected the inputs" in str(error):
        message = forward_fails(model, example_inputs, kwargs, autocast=autocast, loss_fn=loss_fn, targets=targets,
                                args_name="example_inputs")
        if message is not None:
            return ExportError(message)
    specs = named_specs(example_inputs, kwargs, targets, args_name="example_inputs")
    message = in_python_terms(str(error), archive, type(model).__name__, specs)
    if "rejected the inputs" in message:
        message += "; give example_inputs as the training step passes them, on the model's device"
    return CkplanError(message, error.exit_code)


def enable(model: torch.nn.Module, example_inputs: Union[torch.Tensor, Sequence[Any]], budget: Union[int, str],
           kwargs: Optional[Dict[str, Any]] = None, optimizer: Union[str, torch.optim.Optimizer] = "adamw",
           **options: Any) -> Plan:
    """The one-line analogue of ``model.gradient_checkpointing_enable()``: plans and applies the plan
    to ``model``. ``remove_plan(model)`` undoes it.

    Args:
        model: the model.
        example_inputs: as ``plan`` takes them.
        budget: as ``plan`` takes it.
        kwargs: as ``plan`` takes them.
        optimizer: as ``plan`` takes it; a torch.optim optimizer is also checked as ``apply_plan``
            checks it.
        **options: ``plan``'s other arguments.

    Returns:
        The Plan, applied.

    Raises:
        CkplanError, ExportError, TypeError, ValueError: as ``plan`` raises them.
    """
    if options.get("compile") not in (None, False):
        raise ArgumentError("enable(compile=...): enable changes the model in place, and a compiled plan is a new "
                            "compiled model: plan = plan(..., compile=...), then compiled = plan.apply(model)")
    solved = plan(model, example_inputs, budget, kwargs=kwargs, optimizer=optimizer, **options)
    solved.apply(model, optimizer=optimizer if isinstance(optimizer, torch.optim.Optimizer) else None)
    return solved
