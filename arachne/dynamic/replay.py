"""Replaying a trace: every planner follows the cluster's changes, and the tokens it trains are counted.

At the start each planner plans; at every event it re-plans from its running plan with
:func:`arachne.dynamic.replan` (the same protocol for all: keep the running plan when it still runs and
nothing planned is faster, else move to the new plan). A segment (one planner, from one event to the next)
trains at the rate of the plan it adopts, less its downtime:

- **planning**: the planner's measured wall time. While the running plan still runs on the changed cluster
  it keeps training during planning (at its rate there); when it cannot (a GPU it used is gone, or it no
  longer fits), or at the start, nothing trains while planning.
- **migration**: when the planner moves to a new plan, the model state the new plan's GPUs lack, sent at
  their nodes' network bandwidth (:func:`arachne.dynamic.migration_cost`); nothing trains meanwhile.

Downtime longer than the segment is cut at the segment's end (the next event re-plans from the adopted plan).
When no plan fits, the segment trains nothing and the next event plans afresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arachne.cost import CostModel
from arachne.dynamic.replan import replan
from arachne.dynamic.trace import Snapshot, Trace
from arachne.errors import NoFeasiblePlanError
from arachne.plan import Plan
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec

ACTIONS = ("plan", "keep", "move", "none")
"""What a planner did at the start of a segment: first plan (or a plan after a segment without one), kept
its running plan, moved to a new plan, or found no plan that fits."""


@dataclass(frozen=True)
class Segment:
    """One planner from one event (or the start) to the next event (or the end of the trace)."""

    index: int
    start_s: float
    end_s: float
    gpus: int
    action: str
    tokens_per_s: float          # the adopted plan's rate (0 when no plan fits)
    planning_s: float            # measured wall time of the planning call
    migration_s: float           # the migration model's time to move to the adopted plan (0 when kept)
    downtime_s: float            # no training: blocking planning + migration, cut at the segment's end
    overlap_s: float = 0.0       # planning while the running plan kept training on the changed cluster
    overlap_tokens_per_s: float = 0.0  # that plan's rate on the changed cluster
    bytes_moved: float = 0.0
    forced: bool = True          # training stopped to plan: the start, or the running plan could not continue

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def tokens(self) -> float:
        """Tokens trained: during the overlap at the old rate, then after the downtime at the new rate."""
        return (self.overlap_s * self.overlap_tokens_per_s
                + max(0.0, self.duration_s - self.overlap_s - self.downtime_s) * self.tokens_per_s)

    def steps(self) -> list[tuple[float, float, float]]:
        """(start, end, tokens/s) pieces of the segment, in time order (empty pieces left out)."""
        t, out = self.start_s, []
        for length, rate in ((self.overlap_s, self.overlap_tokens_per_s), (self.downtime_s, 0.0),
                             (self.duration_s - self.overlap_s - self.downtime_s, self.tokens_per_s)):
            if length > 0:
                out.append((t, min(self.end_s, t + length), rate))
                t += length
        return out

    def to_doc(self) -> dict[str, Any]:
        return {"index": self.index, "start_s": self.start_s, "end_s": self.end_s, "gpus": self.gpus,
                "action": self.action, "tokens_per_s": self.tokens_per_s, "planning_s": self.planning_s,
                "migration_s": self.migration_s, "downtime_s": self.downtime_s, "overlap_s": self.overlap_s,
                "overlap_tokens_per_s": self.overlap_tokens_per_s, "bytes_moved": self.bytes_moved,
                "forced": self.forced, "tokens": self.tokens}


@dataclass(frozen=True)
class PlannerReplay:
    """One planner over the whole trace."""

    planner: str
    segments: tuple[Segment, ...]

    @property
    def tokens(self) -> float:
        return sum(s.tokens for s in self.segments)

    @property
    def downtime_s(self) -> float:
        return sum(s.downtime_s for s in self.segments)

    @property
    def planning_s(self) -> float:
        return sum(s.planning_s for s in self.segments)

    @property
    def migration_s(self) -> float:
        return sum(s.migration_s for s in self.segments)

    @property
    def moves(self) -> int:
        """Events at which the planner moved to a new plan (forced or chosen)."""
        return sum(s.action == "move" for s in self.segments)

    @property
    def replans(self) -> int:
        """Events at which the running plan could not continue (or there was none), so training stopped to
        re-plan."""
        return sum(s.index > 0 and s.forced for s in self.segments)

    @property
    def no_plan(self) -> int:
        return sum(s.action == "none" for s in self.segments)

    def to_doc(self, reference: float | None = None) -> dict[str, Any]:
        return {"planner": self.planner, "tokens": self.tokens,
                "vs_arachne": self.tokens / reference if reference else None,
                "downtime_s": self.downtime_s, "planning_s": self.planning_s, "migration_s": self.migration_s,
                "replans": self.replans, "moves": self.moves, "no_plan": self.no_plan,
                "segments": [s.to_doc() for s in self.segments]}


@dataclass(frozen=True)
class ReplayResult:
    """Every planner over one trace, for one model and job."""

    trace: Trace
    model: str
    job: Job
    time_budget_s: float
    planners: tuple[PlannerReplay, ...]

    def get(self, planner: str) -> PlannerReplay:
        return next(p for p in self.planners if p.planner == planner)

    @property
    def reference(self) -> float | None:
        """arachne's tokens (the ratios' denominator), None when arachne was not replayed or trained nothing."""
        ref = next((p.tokens for p in self.planners if p.planner == "arachne"), None)
        return ref or None

    def to_doc(self) -> dict[str, Any]:
        return {"format": "arachne-replay/1", "trace": self.trace.to_doc(), "model": self.model,
                "global_batch_size": self.job.global_batch_size, "sequence_length": self.job.sequence_length,
                "precision": self.job.precision, "time_budget_s": self.time_budget_s,
                "events_s": self.trace.event_times,
                "planners": [p.to_doc(self.reference) for p in self.planners]}


# ---- following the trace --------------------------------------------------------------------------------------------
def rename(plan: Plan, names: dict[str, str]) -> Plan:
    """``plan`` with its devices renamed by ``names`` (a device not in it becomes ``node:gone-...``, so a plan
    on a GPU that left no longer runs)."""
    def new(d: str) -> str:
        node, _, idx = d.partition(":")
        return names.get(d, f"{node}:gone-{idx}")

    pipes = tuple(p.model_copy(update={"stages": tuple(s.model_copy(update={"devices": tuple(map(new, s.devices))})
                                                       for s in p.stages)}) for p in plan.pipelines)
    return plan.model_copy(update={"pipelines": pipes})


def _first(planner: str, snap: Snapshot, index: int, model: ModelSpec, job: Job, budget: SearchBudget,
           cm: CostModel) -> tuple[Plan | None, Segment]:
    """Plan from nothing: nothing trains while planning."""
    t0 = time.perf_counter()
    dur = snap.duration_s
    try:
        plan, est, res = run_planner(planner, snap.cluster, model, job, cm, budget)
    except NoFeasiblePlanError:
        took = time.perf_counter() - t0
        return None, Segment(index, snap.start_s, snap.end_s, snap.cluster.num_gpus, "none", 0.0, took, 0.0, dur)
    took = res.stats.wall_time_s
    return plan, Segment(index, snap.start_s, snap.end_s, snap.cluster.num_gpus, "plan", est.tokens_per_s, took,
                         0.0, min(took, dur))


def _next(planner: str, old: Plan, snap: Snapshot, index: int, model: ModelSpec, budget: SearchBudget,
          cm: CostModel) -> tuple[Plan | None, Segment]:
    """Re-plan from the running plan (already renamed to ``snap``'s devices)."""
    dur, gpus = snap.duration_s, snap.cluster.num_gpus
    t0 = time.perf_counter()
    try:
        r = replan(old, snap.cluster, budget, planner, cm, model)
    except NoFeasiblePlanError:
        took = time.perf_counter() - t0
        return None, Segment(index, snap.start_s, snap.end_s, gpus, "none", 0.0, took, 0.0, dur)
    mig = 0.0 if r.kept_old else r.migration.seconds
    moved = 0.0 if r.kept_old else r.migration.bytes_moved
    action = "keep" if r.kept_old else "move"
    if r.old_estimate is not None:  # the running plan trains while the planner plans
        overlap = min(r.planning_time_s, dur)
        return r.plan, Segment(index, snap.start_s, snap.end_s, gpus, action, r.estimate.tokens_per_s,
                               r.planning_time_s, mig, min(mig, dur - overlap), overlap,
                               r.old_estimate.tokens_per_s, moved, forced=False)
    return r.plan, Segment(index, snap.start_s, snap.end_s, gpus, action, r.estimate.tokens_per_s,
                           r.planning_time_s, mig, min(r.planning_time_s + mig, dur), 0.0, 0.0, moved)


def follow(planner: str, trace: Trace, model: ModelSpec, job: Job, budget: SearchBudget,
           cost_model: Callable[[Cluster], CostModel] = CostModel,
           on_segment: Callable[[str, Segment], None] | None = None) -> PlannerReplay:
    """One planner over the whole trace. The running plan is carried from snapshot to snapshot by GPU identity."""
    running: Plan | None = None
    prev: Snapshot | None = None
    segments = []
    for i, snap in enumerate(trace.snapshots):
        cm = cost_model(snap.cluster)
        if running is None:
            running, seg = _first(planner, snap, i, model, job, budget, cm)
        else:
            assert prev is not None
            to_id = prev.trace_ids
            to_name = {v: k for k, v in snap.trace_ids.items()}
            carried = rename(running, {d: to_name[to_id[d]] for d in to_id if to_id[d] in to_name})
            running, seg = _next(planner, carried, snap, i, model, budget, cm)
        segments.append(seg)
        prev = snap
        if on_segment:
            on_segment(planner, seg)
    return PlannerReplay(planner, tuple(segments))


def replay(trace: Trace, model: ModelSpec, job: Job, planners: list[str], budget: SearchBudget,
           cost_model: Callable[[Cluster], CostModel] = CostModel,
           on_segment: Callable[[str, Segment], None] | None = None) -> ReplayResult:
    """Every planner over ``trace`` (in the given order); ``on_segment`` is called after each planning call."""
    runs = tuple(follow(p, trace, model, job, budget, cost_model, on_segment) for p in planners)
    return ReplayResult(trace, model.name, job, budget.time_budget_s, runs)
