"""The one harness that judges every planner the same way.

Every planner ranks plans with its own formula; :func:`run_planner` re-prices the planner's top-k with
``CostModel.estimate`` and returns the best plan that fits, so all planners are judged by the same model.
:func:`run_compare` runs several planners side by side on the same inputs."""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable

from arachne.cost import CostModel, Estimate
from arachne.cost.feasibility import memory_shortfall_message, model_state_bounds
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.plan import Plan, validate_plan
from arachne.planners.objective import Objective
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
from arachne.spec.runtimes import Legality, megatron_split_error


def best_priced(plans: list[Plan], cost_model: CostModel, legality: Legality | None = None,
                objective: Objective | None = None) -> tuple[Plan, Estimate] | None:
    """The best plan that fits among ``plans`` under the common cost model: the fastest, or with ``objective``
    the best by its score within its limits; with ``legality`` only plans that satisfy it (a plan whose ZeRO
    stage or Megatron layer split alone breaks the rules is also tried in its nearest legal forms)."""
    return select(plans, cost_model, legality, objective)[0]


def select(plans: list[Plan], cost_model: CostModel, legality: Legality | None = None,
           objective: Objective | None = None) -> tuple[tuple[Plan, Estimate] | None, str | None]:
    """:func:`best_priced`, plus (when nothing qualifies but some plan fits) the first rule or limit that the
    fitting plans break, in words. Every plan is priced first without the format's checks (a planner's own
    plans are valid, and checking a plan of a thousand GPUs costs several estimates); the checks then run on
    the best first, and the first plan that passes them is the one returned, as if every plan had been
    checked before pricing."""
    rules = legality if legality is not None and not legality.free else None
    goal = objective or Objective()
    why: str | None = None
    cluster = cost_model.cluster
    within: list[tuple[float, int, Plan, Estimate]] = []  # fitting plans within the objective's limits
    beyond: list[Estimate] = []  # fitting (and checked) plans outside them
    for p in plans:
        for cand in (legal_variants(p, rules) if rules is not None else [p]):
            if rules is not None and (errs := rules.errors(cand, cluster)):
                if why is None and _fits(cost_model, cand):  # say which rule only where memory is not the reason
                    why = f"{errs[0][0]}: {errs[0][1]}"
                continue
            est = _price(cost_model, cand)
            if est is None or not est.fits:
                continue
            if goal.limit_error(est) is None:
                within.append((goal.score(est), len(within), cand, est))
            elif _valid(cost_model, cand):
                beyond.append(est)
    for _, _, cand, est in sorted(within, key=lambda x: x[:2]):  # best first; ties keep the planner's order
        if _valid(cost_model, cand):
            return (cand, est), None
    closest: Estimate | None = None  # the best fitting, legal plan outside the objective's limits
    for est in beyond:
        if closest is None or _nearer(goal, est, closest):
            closest = est
    if closest is not None:
        why = f"no plan meets {goal.limit_error(closest)}"
    return None, why


def _price(cost_model: CostModel, plan: Plan) -> Estimate | None:
    """The plan's estimate without the format's checks, or None where it cannot be priced. A plan whose
    unchecked pricing fails is priced again with the checks, which name what is wrong (``InputError``: None)
    or let a genuine fault surface."""
    try:
        return cost_model.estimate(plan, validate=False)
    except Exception:
        try:
            return cost_model.estimate(plan)
        except InputError:
            return None


def _valid(cost_model: CostModel, plan: Plan) -> bool:
    """Whether ``plan`` passes the format's checks on the cost model's cluster."""
    try:
        validate_plan(plan, cost_model.cluster, cost_model.resolve_model(plan))
    except InputError:
        return False
    return True


def _fits(cost_model: CostModel, plan: Plan) -> bool:
    try:
        return cost_model.estimate(plan).fits
    except InputError:
        return False


def _nearer(goal: Objective, a: Estimate, b: Estimate) -> bool:
    """Whether ``a`` is nearer the objective's limits than ``b``: cheaper under a cost limit, else faster."""
    if goal.max_cost_per_hour is not None:
        return (a.cost_per_hour or float("inf")) < (b.cost_per_hour or float("inf"))
    return a.tokens_per_s > b.tokens_per_s


def legal_variants(plan: Plan, legality: Legality) -> list[Plan]:
    """``plan`` and, where its ZeRO stage or (Megatron) layer split breaks ``legality``, the same plan at each
    allowed ZeRO stage and with the nearest Megatron-expressible splits (the harness prices them all)."""
    out = [plan]
    zs = legality.constraints.zero_stages
    if zs is not None and plan.zero_stage not in zs:
        out = [plan.model_copy(update={"zero_stage": z}) for z in sorted(zs)]
    if legality.runtime.megatron_split and all(p.virtual_stages == 1 for p in plan.pipelines):
        ref = [s.num_layers for s in plan.pipelines[0].stages]
        if megatron_split_error(ref) is not None:
            out = [v for p in out for v in [p, *(_resplit(p, c) for c in _megatron_splits(ref))]]
    return out


def _megatron_splits(counts: list[int]) -> list[list[int]]:
    """Per-stage layer counts near ``counts`` whose middle stages are equal (at most six)."""
    S, L = len(counts), sum(counts)
    mid = sum(counts[1:-1]) / (S - 2)
    found: list[list[int]] = []
    for m in sorted({int(mid), int(mid) + 1} - {0}):
        rest = L - m * (S - 2)
        for first in (counts[0], counts[0] - 1, counts[0] + 1, rest - counts[-1]):
            c = [first, *[m] * (S - 2), rest - first]
            if min(c) >= 1 and c not in found:
                found.append(c)
    return found[:6]


def _resplit(plan: Plan, counts: list[int]) -> Plan:
    """``plan`` with every pipeline's stages holding ``counts`` layers (pipelines of that many stages)."""
    pipes = []
    for p in plan.pipelines:
        if len(p.stages) != len(counts):
            pipes.append(p)
            continue
        edges, stages = 0, []
        for st, c in zip(p.stages, counts):
            stages.append(st.model_copy(update={"layers": (edges, edges + c)}))
            edges += c
        pipes.append(p.model_copy(update={"stages": tuple(stages)}))
    return plan.model_copy(update={"pipelines": tuple(pipes)})


@contextmanager
def collector_paused():
    """Python's cyclic garbage collector off while a planner searches (and back on after, if it was on).

    A search builds large caches of small objects (stages, pipeline signatures, priced rows) that live until
    it returns; each full pass of the collector walks all of them, and these passes took 15-25% of a
    1,024-GPU plan's time. Planning makes almost no reference cycles (after a 1,024-GPU arachne plan, 4-301
    unreachable objects; after 10 s of Metis or 20 s of the exhaustive oracle, 494 and 6), so nothing
    accumulates: reference counting frees the rest as usual. Every planner runs under it (:func:`run_planner`)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def run_planner(name: str, cluster: Cluster, model: ModelSpec, job: Job, cost_model: CostModel | None = None,
                budget: SearchBudget = SearchBudget(), legality: Legality | None = None,
                objective: Objective | None = None, **options: Any) -> tuple[Plan, Estimate, PlannerResult]:
    """Plan, re-price the top-k with the common cost model, and stamp the winner.

    ``legality`` (runtime preset and constraints) and ``objective`` are applied here, the same way for every
    planner; a planner with a ``restrict(legality, objective)`` method is also told them before it searches.
    Raises :class:`NoFeasiblePlanError` (saying by how much memory falls short, or which rule or limit no
    plan met) when nothing qualifies, and :class:`InputError` when the objective needs a price the cluster
    lacks."""
    cost_model = cost_model or CostModel(cluster)
    planner = get_planner(name, **options)
    if (why := sequence_error(job.sequence_length, model)) is not None:
        raise InputError("", "sequence_length", why)
    if objective is not None:
        objective.check_prices(cluster)
    need, have = model_state_bounds(cluster, model, job)
    if need > have:  # no layout can fit: say so now instead of searching the whole budget
        raise NoFeasiblePlanError(memory_shortfall_message(cluster, model, job, name))
    restricted = (legality is not None and not legality.free) or (objective is not None and not objective.default)
    if restricted and hasattr(planner, "restrict"):
        planner.restrict(legality, objective)
    t0 = time.perf_counter()
    before = cost_model.estimates
    with collector_paused():
        result = planner.plan(cluster, model, job, cost_model, budget)
        chosen, why = select(result.plans if restricted else result.plans[: max(1, budget.top_k)], cost_model,
                             legality, objective)
    elapsed = time.perf_counter() - t0
    result.stats.wall_time_s = elapsed
    result.stats.plans_priced = cost_model.estimates - before
    if chosen is None:
        if why is not None:
            runtime = f" (runtime {legality.runtime.name})" if legality is not None else ""
            raise NoFeasiblePlanError(f"{name}: no plan that fits satisfies the rules{runtime}: {why}"
                                      if not why.startswith("no plan meets") else f"{name}: {why}", result.stats)
        gave_up = result.stats.notes.get("gave_up")
        if gave_up:  # the planner cannot search this input at all (e.g. FlashFlex's graph past its size)
            raise NoFeasiblePlanError(f"{name} found no plan: {gave_up}", result.stats)
        if result.stats.candidates == 0 and result.stats.plans_priced == 0:  # the cost model never saw a layout
            raise NoFeasiblePlanError(
                f"{name} found no plan within the time budget: it priced no layout" if result.stats.timed_out else
                f"{name} found no plan: it priced no layout (none of its search space passed its own shape and "
                f"memory checks for {cluster.num_gpus:,} GPUs, a global batch of {job.global_batch_size} and "
                f"{model.num_layers} layers)", result.stats)
        msg = memory_shortfall_message(cluster, model, job, name, result.stats.notes.get("closest_unfit"),
                                       result.stats.timed_out)
        if legality is not None and not legality.free:
            msg += f" (searching only plans the {legality.runtime.name} runtime and the constraints allow)"
        raise NoFeasiblePlanError(msg, result.stats)
    plan, est = chosen
    if plan.planner and plan.planner != name:  # a planner may offer another's plans (arachne: a framework's grid)
        result.stats.notes["chosen_from"] = plan.planner
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
                on_start: Callable[[str], None] | None = None, legality: Legality | None = None,
                objective: Objective | None = None) -> list[CompareRow]:
    """Run each planner with the same inputs, budget, rules and objective; one row per planner, in order."""
    make = cost_model or (lambda: CostModel(cluster))
    rows = []
    for name in planners:
        if on_start:
            on_start(name)
        cm = make()
        t0 = time.perf_counter()
        try:
            plan, est, result = run_planner(name, cluster, model, job, cm, budget, legality, objective)
            stats = result.stats
            rows.append(CompareRow(name, plan, est, stats.wall_time_s, stats.plans_priced, None, stats.timed_out,
                                   stats.candidates, dict(stats.notes)))
        except NoFeasiblePlanError as exc:  # the search's own statistics where it ran (timed out, candidates)
            st = exc.stats
            rows.append(CompareRow(name, None, None, time.perf_counter() - t0, cm.estimates, str(exc),
                                   st.timed_out if st is not None else False, st.candidates if st is not None else 0,
                                   dict(st.notes) if st is not None else {}))
    return rows


def best_throughput(rows: list[CompareRow]) -> float:
    return max((r.estimate.tokens_per_s for r in rows if r.estimate is not None), default=0.0)


# ---- rendering ---------------------------------------------------------------------------------------
