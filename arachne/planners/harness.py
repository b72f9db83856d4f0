"""The one harness that judges every planner the same way.

Every planner ranks plans with its own formula; :func:`run_planner` re-prices the planner's top-k with
``CostModel.estimate`` and returns the best plan that fits, so all planners are judged by the same model.
:func:`run_compare` runs several planners side by side on the same inputs."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from arachne.cost import CostModel, Estimate
from arachne.cost.feasibility import memory_shortfall_message, model_state_bounds
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.plan import Plan
from arachne.planners.protocol import PlannerResult, SearchBudget
from arachne.planners.registry import (
    PLANNERS,
    get_planner,
    planner_factory,
    planner_names,
    variants_of,
)
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job, sequence_error
from arachne.spec.model import ModelSpec


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
    if (why := sequence_error(job.sequence_length, model)) is not None:
        raise InputError("", "sequence_length", why)
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


@dataclass
class CompareRow:
    """One planner's outcome: its chosen plan and estimate, or why it has none."""

    planner: str
    plan: Plan | None
    estimate: Estimate | None
    planning_time_s: float
    plans_priced: int
    error: str | None = None
    timed_out: bool = False
    candidates: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def to_doc(self) -> dict[str, Any]:
        return {"planner": self.planner,
                "plan": self.plan.to_doc() if self.plan is not None else None,
                "estimate": self.estimate.to_doc(details=False) if self.estimate is not None else None,
                "planning_time_s": self.planning_time_s, "plans_priced": self.plans_priced, "error": self.error}


# ---- running planners side by side ---------------------------------------------------------------------------------
def default_planners(model: ModelSpec) -> list[str]:
    """Every installed planner; the baselines' EP post-pass variants only for MoE models (on a dense
    model they equal their base planner), each right after its base."""
    names: list[str] = []
    for name in planner_names():
        names.append(name)
        names += [v for v in variants_of(name) if model.is_moe or not PLANNERS[v].moe_only]
    return names


def parse_planners(text: str | None, model: ModelSpec) -> list[str]:
    """``a,b,c`` -> names (checked); ``None`` -> :func:`default_planners`."""
    names = default_planners(model) if not text else [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("", "--planners", "no planner given")
    for n in names:
        try:
            planner_factory(n)
        except InputError:
            raise InputError("", "--planners", f"unknown planner {n!r} (available: "
                                               f"{', '.join(default_planners(model))})") from None
    return names


def run_compare(cluster: Cluster, model: ModelSpec, job: Job, planners: list[str], budget: SearchBudget,
                cost_model: Callable[[], CostModel] | None = None,
                on_start: Callable[[str], None] | None = None) -> list[CompareRow]:
    """Run each planner with the same inputs and budget; one row per planner, in the given order."""
    make = cost_model or (lambda: CostModel(cluster))
    rows = []
    for name in planners:
        if on_start:
            on_start(name)
        cm = make()
        t0 = time.perf_counter()
        try:
            plan, est, result = run_planner(name, cluster, model, job, cm, budget)
            stats = result.stats
            rows.append(CompareRow(name, plan, est, stats.wall_time_s, stats.plans_priced, None, stats.timed_out,
                                   stats.candidates, dict(stats.notes)))
        except NoFeasiblePlanError as exc:
            rows.append(CompareRow(name, None, None, time.perf_counter() - t0, cm.estimates, str(exc)))
    return rows


def best_throughput(rows: list[CompareRow]) -> float:
    return max((r.estimate.tokens_per_s for r in rows if r.estimate is not None), default=0.0)


# ---- rendering ---------------------------------------------------------------------------------------
