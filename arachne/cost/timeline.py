"""The cost model's simulated timeline of one iteration, as events a figure can draw.

The cost model (``schedule.simulate``) only keeps each pipeline's makespan. This module re-runs the
same simulation -- the same per-stage operation order (``schedule.stage_ops``), the same rules (an
operation starts when its stage is free and its input has arrived; a send occupies the sender) -- on
the per-micro-batch times the estimate reports (``StageEstimate.fwd_s``, ``bwd_s``, ``send_fwd_s``,
``send_bwd_s``), and records every operation. It never extrapolates: every micro-batch is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from arachne.cost.schedule import FWD, stage_ops

if TYPE_CHECKING:  # pragma: no cover
    from arachne.cost.model import Estimate
    from arachne.plan import Plan

KINDS = ("fwd", "bwd", "send")


@dataclass(frozen=True)
class Event:
    """One operation of one stage: ``kind`` is ``fwd``, ``bwd`` or ``send`` (the transfer that follows
    the forward, to stage+1, or the backward, to stage-1, of ``micro_batch``); seconds from the start
    of the iteration."""

    stage: int
    kind: str
    micro_batch: int
    start: float
    end: float


@dataclass(frozen=True)
class PipelineTimeline:
    """One pipeline's events and its schedule time (the last event's end)."""

    pipeline: int
    micro_batches: int
    events: tuple[Event, ...]
    makespan: float


def pipeline_events(fwd: tuple[float, ...] | list[float], bwd: tuple[float, ...] | list[float],
                    send_fwd: tuple[float, ...] | list[float], send_bwd: tuple[float, ...] | list[float],
                    m: int, schedule: str = "1f1b") -> list[Event]:
    """Every operation of one pipeline of ``len(fwd)`` stages running ``m`` micro-batches, in the
    order ``schedule.simulate`` runs them (per stage, in time order). Arguments as for ``simulate``."""
    S = len(fwd)
    ops = stage_ops(S, m, schedule)
    f_done = [[-1.0] * m for _ in range(S)]
    b_done = [[-1.0] * m for _ in range(S)]
    free = [0.0] * S
    ptr = [0] * S
    per_stage: list[list[Event]] = [[] for _ in range(S)]
    remaining = sum(len(o) for o in ops)
    last = S - 1
    while remaining:
        progressed = False
        for s in range(S):
            o = ops[s]
            p = ptr[s]
            t = free[s]
            out = per_stage[s]
            while p < len(o):
                kind, j = o[p]
                if kind == FWD:
                    if s:
                        ready = f_done[s - 1][j]
                        if ready < 0:
                            break
                        t = max(t, ready)
                    out.append(Event(s, "fwd", j, t, t + fwd[s]))
                    t += fwd[s]
                    if send_fwd[s] > 0:
                        out.append(Event(s, "send", j, t, t + send_fwd[s]))
                    t += send_fwd[s]
                    f_done[s][j] = t
                else:
                    if s < last:
                        ready = b_done[s + 1][j]
                        if ready < 0:
                            break
                        t = max(t, ready)
                    out.append(Event(s, "bwd", j, t, t + bwd[s]))
                    t += bwd[s]
                    if send_bwd[s] > 0:
                        out.append(Event(s, "send", j, t, t + send_bwd[s]))
                    t += send_bwd[s]
                    b_done[s][j] = t
                p += 1
            if p != ptr[s]:
                remaining -= p - ptr[s]
                ptr[s] = p
                free[s] = t
                progressed = True
        if not progressed:  # pragma: no cover - the schedules are deadlock-free
            raise RuntimeError("pipeline schedule deadlocked")
    return [e for stage in per_stage for e in stage]


def plan_timelines(plan: Plan, est: Estimate, pipelines: list[int] | None = None) -> list[PipelineTimeline]:
    """The simulated timeline of each pipeline of ``plan`` (or of the listed ``pipelines``), from the
    per-stage times of its estimate ``est``."""
    rows: dict[int, list] = {}
    for st in est.stages:
        rows.setdefault(st.pipeline, []).append(st)
    wanted = range(len(plan.pipelines)) if pipelines is None else pipelines
    out = []
    for pi in wanted:
        stages = sorted(rows[pi], key=lambda r: r.stage)
        m = plan.pipelines[pi].micro_batches
        events = pipeline_events(tuple(r.fwd_s for r in stages), tuple(r.bwd_s for r in stages),
                                 tuple(r.send_fwd_s for r in stages), tuple(r.send_bwd_s for r in stages),
                                 m, plan.schedule)
        out.append(PipelineTimeline(pi, m, tuple(events), max((e.end for e in events), default=0.0)))
    return out


def schedule_time(est: Estimate) -> float:
    """The slowest pipeline's schedule time as the estimate reports it: the iteration time less the
    gradient synchronisation and the optimizer step (formats section 5)."""
    b = est.breakdown
    return est.iteration_time_s - b.get("dp_sync_s", 0.0) - b.get("optimizer_s", 0.0)
