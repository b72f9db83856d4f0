"""The cost model's simulated timeline of one iteration, as events a figure can draw.

The cost model (``schedule.simulate``, ``schedule.simulate_interleaved``) only keeps each pipeline's
makespan. This module runs the same simulators with their ``record`` list on, on the per-micro-batch times
the estimate priced (``StageEstimate.fwd_s``, ``bwd_s``, ``send_fwd_s``, ``send_bwd_s``; per chunk for an
interleaved pipeline), and turns what they record into events. It never extrapolates: every micro-batch is
simulated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from arachne.cost.schedule import FWD, simulate, simulate_interleaved

if TYPE_CHECKING:  # pragma: no cover
    from arachne.cost.model import CostModel, Estimate
    from arachne.plan import Plan

KINDS = ("fwd", "bwd", "send")


@dataclass(frozen=True)
class Event:
    """One operation of one stage: ``kind`` is ``fwd``, ``bwd`` or ``send`` (the transfer that follows
    the forward, to the next chunk in model order, or the backward, to the previous one, of ``micro_batch``);
    seconds from the start of the iteration. ``chunk``: the model chunk of an interleaved stage (else 0)."""

    stage: int
    kind: str
    micro_batch: int
    start: float
    end: float
    chunk: int = 0


@dataclass(frozen=True)
class PipelineTimeline:
    """One pipeline's events and its schedule time (the last event's end)."""

    pipeline: int
    micro_batches: int
    events: tuple[Event, ...]
    makespan: float


def _events(record: list, num_stages: int) -> list[Event]:
    """What a simulator recorded, as events grouped by stage (each stage's in time order)."""
    per_stage: list[list[Event]] = [[] for _ in range(num_stages)]
    for s, kind, c, j, t0, t1, t2 in record:
        out = per_stage[s]
        out.append(Event(s, "fwd" if kind == FWD else "bwd", j, t0, t1, c))
        if t2 > t1:
            out.append(Event(s, "send", j, t1, t2, c))
    return [e for stage in per_stage for e in stage]


def pipeline_events(fwd: tuple[float, ...] | list[float], bwd: tuple[float, ...] | list[float],
                    send_fwd: tuple[float, ...] | list[float], send_bwd: tuple[float, ...] | list[float],
                    m: int, schedule: str = "1f1b") -> list[Event]:
    """Every operation of one pipeline of ``len(fwd)`` stages running ``m`` micro-batches, as
    ``schedule.simulate`` runs them (per stage, in time order). Arguments as for ``simulate``."""
    record: list = []
    simulate(tuple(fwd), tuple(bwd), tuple(send_fwd), tuple(send_bwd), m, schedule, record)
    return _events(record, len(fwd))


def interleaved_events(fwd, bwd, send_fwd, send_bwd, m: int) -> list[Event]:
    """:func:`pipeline_events` of an interleaved pipeline: ``fwd[s][c]`` etc. per stage and chunk, as for
    ``schedule.simulate_interleaved``; events carry their chunk."""
    record: list = []
    simulate_interleaved(fwd, bwd, send_fwd, send_bwd, m, record)
    return _events(record, len(fwd))


def interleaved_chunk_times(cm: CostModel, plan: Plan, pi: int) -> tuple:
    """Per stage and chunk of interleaved pipeline ``pi``: (fwd, bwd, send_fwd, send_bwd) per micro-batch,
    as the cost model prices them (``interleaved_chunks``) (the estimate's rows keep only their sums per stage).
    Its stage rows come from the cost model's cache."""
    p = plan.pipelines[pi]
    crows, sf, sb = cm.interleaved_chunks(cm.resolve_model(plan), plan, p, plan.mbs(p))
    return (tuple(tuple(r[0] for r in cr) for cr in crows), tuple(tuple(r[1] for r in cr) for cr in crows), sf, sb)


def plan_timelines(plan: Plan, est: Estimate, pipelines: list[int] | None = None) -> list[PipelineTimeline]:
    """The simulated timeline of each pipeline of ``plan`` (or of the listed ``pipelines``), from the
    per-stage times of its estimate ``est`` (an interleaved pipeline's per-chunk times from the cost model
    that priced ``est``)."""
    rows: dict[int, list] = {}
    for st in est.stages:
        rows.setdefault(st.pipeline, []).append(st)
    wanted = range(len(plan.pipelines)) if pipelines is None else pipelines
    out = []
    for pi in wanted:
        m = plan.pipelines[pi].micro_batches
        if plan.pipelines[pi].virtual_stages > 1:
            if est.pricer is None:
                raise ValueError("an interleaved pipeline's timeline needs the CostModel that priced the estimate")
            events = interleaved_events(*interleaved_chunk_times(est.pricer, plan, pi), m)
        else:
            stages = sorted(rows[pi], key=lambda r: r.stage)
            events = pipeline_events(tuple(r.fwd_s for r in stages), tuple(r.bwd_s for r in stages),
                                     tuple(r.send_fwd_s for r in stages), tuple(r.send_bwd_s for r in stages),
                                     m, plan.schedule)
        out.append(PipelineTimeline(pi, m, tuple(events), max((e.end for e in events), default=0.0)))
    return out


def schedule_time(est: Estimate) -> float:
    """The slowest pipeline's schedule time as the estimate reports it: the iteration time less the
    gradient synchronisation (its exposed part, with overlap: formats v2 section 9) and the optimizer step
    (formats section 5)."""
    return est.iteration_time_s - exposed_sync_time(est) - est.breakdown.get("optimizer_s", 0.0)


def exposed_sync_time(est: Estimate) -> float:
    """The gradient synchronisation the iteration waits for after the pipeline: all of it, or with
    ``overlap_grad_reduce``/``overlap_param_gather`` the part left exposed."""
    b = est.breakdown
    return b.get("dp_sync_exposed_s", b.get("dp_sync_s", 0.0))
