"""The cost model's simulated timeline of one iteration, as events a figure can draw.

The cost model (``schedule.simulate``, ``schedule.simulate_interleaved``) only keeps each pipeline's
makespan. This module runs the same simulators with their ``record`` list on, on the per-micro-batch times
the estimate priced (``StageEstimate.fwd_s``, ``bwd_s``, ``send_fwd_s``, ``send_bwd_s``; per chunk for an
interleaved pipeline), and turns what they record into events. A pipeline of up to :data:`MAX_SIMULATED`
micro-batches is simulated micro-batch by micro-batch; a longer one as the cost model prices it, from the
second of its two extrapolation runs (``schedule.periodic_lengths``), with its periodic middle stretched
(:func:`steady_timeline`): the micro-batches not simulated form steady-state spans the timeline reports (its
``steady``). The figure then costs the same for any batch, and its makespan is the estimate's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from arachne.cost.schedule import (
    FWD,
    interleaved_time,
    periodic_lengths,
    pipeline_time,
    simulate,
    simulate_interleaved,
)

if TYPE_CHECKING:  # pragma: no cover
    from arachne.cost.model import CostModel, Estimate
    from arachne.plan import Plan

KINDS = ("fwd", "bwd", "send")
MAX_SIMULATED = 512  # micro-batches a timeline simulates one by one; beyond, the steady state is cut


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
    """One pipeline's events and its schedule time (the last event's end). ``steady``: for a long pipeline
    (:func:`steady_timeline`), the spans (stage, start, end, micro-batches) of its steady state whose events are
    not listed (the stage repeats the pattern either side of each); empty when every micro-batch's are."""

    pipeline: int
    micro_batches: int
    events: tuple[Event, ...]
    makespan: float
    steady: tuple[tuple[int, float, float, int], ...] = ()


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
    return _events(_record(fwd, bwd, send_fwd, send_bwd, m, schedule), len(fwd))


def interleaved_events(fwd, bwd, send_fwd, send_bwd, m: int) -> list[Event]:
    """:func:`pipeline_events` of an interleaved pipeline: ``fwd[s][c]`` etc. per stage and chunk, as for
    ``schedule.simulate_interleaved``; events carry their chunk."""
    return _events(_record(fwd, bwd, send_fwd, send_bwd, m, "interleaved"), len(fwd))


def _record(fwd, bwd, send_fwd, send_bwd, m: int, schedule: str) -> list:
    record: list = []
    if schedule == "interleaved":
        simulate_interleaved(fwd, bwd, send_fwd, send_bwd, m, record)
    else:
        simulate(tuple(fwd), tuple(bwd), tuple(send_fwd), tuple(send_bwd), m, schedule, record)
    return record


def _period(starts: dict, stage: int, kind: int, lo: int, hi: int) -> float:
    """Seconds per micro-batch between the starts of ``stage``'s ``kind`` operations on micro-batches lo and hi."""
    return (starts[stage, kind, hi] - starts[stage, kind, lo]) / (hi - lo)


def steady_timeline(fwd, bwd, send_fwd, send_bwd, m: int, schedule: str = "1f1b",
                    ) -> tuple[list[Event], tuple[tuple[int, float, float, int], ...]]:
    """The events of a pipeline of ``m`` micro-batches with its steady state cut, and the steady spans
    (stage, start, end, micro-batches) whose operations are not listed. ``schedule``: ``1f1b``, ``gpipe`` or
    ``interleaved`` (then ``fwd[s][c]`` etc. per chunk). Up to :data:`MAX_SIMULATED` micro-batches (or the
    cost model's second extrapolation run, if longer) nothing is cut. Else that run is simulated and its
    periodic middle stretched: for 1F1B (plain or interleaved), whose stages keep a fixed distance, every
    operation from the run's middle on moves on by the makespan the cost model extrapolates less the run's,
    its micro-batch by the number not simulated; for GPipe, whose stages each run at their own pace until the
    backward phase, each stage's operations from the middle micro-batch of each phase move on by that stage's
    period in the phase (its backwards first by the last stage's forward period, the phase's later start)."""
    S = len(fwd)
    v = len(fwd[0]) if schedule == "interleaved" else 1
    m_run = periodic_lengths(S, v)[1]
    if m <= max(MAX_SIMULATED, m_run):
        return _events(_record(fwd, bwd, send_fwd, send_bwd, m, schedule), S), ()
    record = _record(fwd, bwd, send_fwd, send_bwd, m_run, schedule)
    k, h = m - m_run, m_run // 2
    out = []
    if schedule == "gpipe":
        starts = {(r[0], r[1], r[3]): r[4] for r in record}
        d_f = [k * _period(starts, s, FWD, h // 2, h) for s in range(S)]
        d_b = [k * _period(starts, s, FWD + 1, h // 2, h) for s in range(S)]
        later = d_f[-1]  # the backward phase starts after the last stage's last forward
        for s, kind, c, j, t0, t1, t2 in record:
            moved = (d_f[s] if j >= h else 0.0) if kind == FWD else later + (d_b[s] if j >= h else 0.0)
            out.append((s, kind, c, j + k if j >= h else j, t0 + moved, t1 + moved, t2 + moved))
        steady = [span for s in range(S) for span in (
            (s, starts[s, FWD, h], starts[s, FWD, h] + d_f[s], k),
            (s, starts[s, FWD + 1, h] + later, starts[s, FWD + 1, h] + later + d_b[s], k))]
        return _events(out, S), tuple(steady)
    end = max(r[6] for r in record)
    span = interleaved_time(fwd, bwd, send_fwd, send_bwd, m) if v > 1 else pipeline_time(
        tuple(fwd), tuple(bwd), tuple(send_fwd), tuple(send_bwd), m, schedule)
    cut, shift = end / 2, span - end
    for s, kind, c, j, t0, t1, t2 in record:
        out.append((s, kind, c, j + k, t0 + shift, t1 + shift, t2 + shift) if t0 >= cut else
                   (s, kind, c, j, t0, t1, t2))
    return _events(out, S), tuple((s, cut, cut + shift, k) for s in range(S))


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
        v = plan.pipelines[pi].virtual_stages
        if v > 1:
            if est.pricer is None:
                raise ValueError("an interleaved pipeline's timeline needs the CostModel that priced the estimate")
            times = interleaved_chunk_times(est.pricer, plan, pi)
        else:
            stages = sorted(rows[pi], key=lambda r: r.stage)
            times = (tuple(r.fwd_s for r in stages), tuple(r.bwd_s for r in stages),
                     tuple(r.send_fwd_s for r in stages), tuple(r.send_bwd_s for r in stages))
        events, steady = steady_timeline(*times, m, "interleaved" if v > 1 else plan.schedule)
        out.append(PipelineTimeline(pi, m, tuple(events), max((e.end for e in events), default=0.0), steady))
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
