"""The planner protocol, results, time budgets, progress, the registry and the final pricing.

Every planner ranks plans with its own formula; the harness (``run_planner``) re-prices the
planner's top-k with ``CostModel.estimate`` and returns the best plan that fits, so all planners
are judged by the same model.
"""

from __future__ import annotations

import importlib
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, runtime_checkable

from arachne.cost import CostModel, Estimate
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.plan import Plan
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec


@dataclass(frozen=True)
class SearchBudget:
    """How long a planner may search, its seed, and how many ranked plans it returns."""

    time_budget_s: float = 60.0
    seed: int = 0
    top_k: int = 16
    progress: bool = False  # show a rich progress bar on stderr

    def deadline(self) -> "Deadline":
        return Deadline(self.time_budget_s)


class Deadline:
    """A budget of ``seconds`` started at construction, on the wall clock or on another ``clock``
    (e.g. the arachne planner's :class:`~arachne.planners.work.WorkClock`); with ``cap`` it also
    expires when that (wall) deadline does."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.perf_counter,
                 cap: Deadline | None = None):
        self.clock = clock
        self.start = clock()
        self.seconds = seconds
        self.cap = cap

    @property
    def elapsed(self) -> float:
        return self.clock() - self.start

    def expired(self) -> bool:
        return self.elapsed >= self.seconds or (self.cap is not None and self.cap.expired())

    @property
    def remaining(self) -> float:
        own = max(0.0, self.seconds - self.elapsed)
        return own if self.cap is None else min(own, self.cap.remaining)

    def child(self, seconds: float) -> Deadline:
        """``seconds`` from now on the same clock, ending no later than this deadline."""
        return Deadline(max(0.0, min(seconds, self.remaining)), self.clock, self)


@dataclass
class SearchStats:
    wall_time_s: float = 0.0
    candidates: int = 0
    plans_priced: int = 0
    timed_out: bool = False
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class PlannerResult:
    """Ranked plans (best first by the planner's own formula) and their native scores."""

    plans: list[Plan]
    scores: list[float]
    stats: SearchStats


@runtime_checkable
class Planner(Protocol):
    name: str

    def plan(self, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel,
             budget: SearchBudget) -> PlannerResult: ...


_REGISTRY: dict[str, Callable[..., Planner]] = {}
# modules that register planners when imported (kept lazy so `arachne --help` stays fast)
PLANNER_MODULES = {
    "arachne": "arachne.planners.arachne.planner",
    "megatron": "arachne.planners.megatron",
    "megatron-oblivious": "arachne.planners.megatron",
    "amp": "arachne.planners.amp",
    "metis": "arachne.planners.metis",
    "flashflex": "arachne.planners.flashflex",
    "sailor": "arachne.planners.sailor",
    "amp+ep": "arachne.planners.amp",
    "metis+ep": "arachne.planners.metis",
    "flashflex+ep": "arachne.planners.flashflex",
    "sailor+ep": "arachne.planners.sailor",
    "exhaustive": "arachne.planners.exhaustive",
}


def register(name: str) -> Callable[[Callable[..., Planner]], Callable[..., Planner]]:
    """Class decorator: make a planner available as ``--planner NAME``."""

    def deco(factory: Callable[..., Planner]) -> Callable[..., Planner]:
        _REGISTRY[name] = factory
        return factory

    return deco


def planner_names() -> list[str]:
    """Planners whose modules exist in this installation."""
    names = []
    for name, mod in PLANNER_MODULES.items():
        if "+" in name:  # variants (e.g. the EP post-pass) are listed by their base planner's users
            continue
        if importlib.util.find_spec(mod) is not None:
            names.append(name)
    return names


def get_planner(name: str, **options: Any) -> Planner:
    if name not in _REGISTRY:
        mod = PLANNER_MODULES.get(name) or PLANNER_MODULES.get(name.split("+")[0])
        if mod is not None and importlib.util.find_spec(mod) is not None:
            importlib.import_module(mod)
    if name not in _REGISTRY:
        raise InputError("", "--planner", f"unknown planner {name!r} (available: {', '.join(planner_names())})")
    return _REGISTRY[name](**options)


@contextmanager
def progress_bar(enabled: bool, description: str, total: float | None = None) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr (never stdout); yields ``advance(n=1, description=None)``."""
    if not enabled:
        yield lambda *a, **k: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as prog:
        task = prog.add_task(description, total=total)

        def advance(n: float = 1, description: str | None = None) -> None:
            prog.update(task, advance=n, **({"description": description} if description else {}))

        yield advance


def best_priced(plans: list[Plan], cost_model: CostModel) -> tuple[Plan, Estimate] | None:
    """The fastest plan that fits among ``plans`` under the common cost model."""
    best: tuple[Plan, Estimate] | None = None
    for p in plans:
        try:
            est = cost_model.estimate(p)
        except InputError:
            continue
        if est.fits and (best is None or est.iteration_time_s < best[1].iteration_time_s):
            best = (p, est)
    return best


def run_planner(name: str, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel | None = None,
                budget: SearchBudget = SearchBudget(), **options: Any) -> tuple[Plan, Estimate, PlannerResult]:
    """Plan, re-price the top-k with the common cost model, and stamp the winner.

    Raises :class:`NoFeasiblePlanError` (saying by how much memory falls short) when nothing fits."""
    cost_model = cost_model or CostModel(cluster)
    planner = get_planner(name, **options)
    need, have = model_state_bounds(cluster, model, job)
    if need > have:  # no layout can fit: say so now instead of searching the whole budget
        raise NoFeasiblePlanError(memory_shortfall_message(cluster, model, job, name))
    t0 = time.perf_counter()
    before = cost_model.estimates
    result = planner.plan(cluster, model, job, cost_model, budget)
    chosen = best_priced(result.plans[: max(1, budget.top_k)], cost_model)
    elapsed = time.perf_counter() - t0
    result.stats.wall_time_s = elapsed
    result.stats.plans_priced = cost_model.estimates - before
    if chosen is None:
        raise NoFeasiblePlanError(memory_shortfall_message(cluster, model, job, name,
                                                           result.stats.notes.get("closest_unfit"),
                                                           result.stats.timed_out))
    plan, est = chosen
    plan = plan.model_copy(update={"planner": name, "planning_time_s": round(elapsed, 6),
                                   "estimate": est.to_doc(details=False)})
    return plan, est, result


def model_state_bounds(cluster: Cluster, model: ModelSpec, job: Job) -> tuple[float, float]:
    """(bytes any plan needs at least: one copy of weights, gradients and optimizer state plus each GPU's
    runtime overhead, bytes the cluster has); a plan on fewer GPUs saves their overhead and loses more."""
    from arachne.cost.calibration import DEFAULT_CALIBRATION
    from arachne.cost.memory import state_bytes_per_param

    cal = DEFAULT_CALIBRATION.memory
    w, g, o = state_bytes_per_param(job.precision, cal)
    extra = cal.fp32_grad_buffer if job.precision == "fp32" else 0.0
    overhead = (cal.fp32_overhead_bytes if job.precision == "fp32" else cal.mixed_overhead_bytes) * cluster.num_gpus
    return model.num_params * (w + g + o + extra) + overhead, cluster.total_memory_bytes


def memory_shortfall_message(cluster: Cluster, model: ModelSpec, job: Job, planner: str,
                             closest: str | None = None, timed_out: bool = False) -> str:
    """Why nothing fits, with numbers: the model state against the cluster's memory, or the nearest miss."""
    need, have = model_state_bounds(cluster, model, job)
    if need > have:
        return (f"no plan fits: {model.name} needs at least {need / 1e9:.0f} GB for weights, gradients, optimizer "
                f"state ({job.precision}, Adam, one copy even with ZeRO-1) and per-GPU runtime overhead, but the "
                f"cluster has {have / 1e9:.0f} GB in total (short by {(need - have) / 1e9:.0f} GB)")
    why = f"; {closest}" if closest else ""
    budget = " within the time budget" if timed_out else ""
    return (f"{planner} found no plan that fits in memory{budget}: the model state needs {need / 1e9:.0f} GB of the "
            f"cluster's {have / 1e9:.0f} GB, but no layout it tried keeps every GPU under its capacity with "
            f"activations for micro-batches of {job.sequence_length} tokens{why}")


def _stderr_is_tty() -> bool:
    return sys.stderr.isatty()
