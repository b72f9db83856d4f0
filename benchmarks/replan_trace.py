"""``replan-trace``: re-planning while GPUs come and go: every planner follows a GPU availability trace.

A thin wrapper over the library (``arachne.dynamic.trace`` reads the traces, ``arachne.dynamic.replay``
follows them; ``arachne replay`` is the same as a command, docs/replay.md). Traces:
  spot           Sailor's spot trace (``sailor:spot``): A100 spot VMs of one GPU each, their count following
                 the change points of Sailor's 16-GPU A100 availability trace (16 -> 10 -> 9 -> 8 -> ... over
                 98 minutes; which VMs leave is drawn with ``--seed``), beside four on-demand 4-GPU V100 nodes.
  grow           Sailor's heterogeneous trace (``sailor:grow``): A100-40 in 8-GPU nodes 32 -> 80 -> 128 GPUs
                 and V100-16 in 4-GPU nodes 96 -> 240 -> 384, about two minutes apart.
  spot-churn, steady-growth, rack-failure
                 the synthetic traces shipped in ``examples/traces/``.

At each change every planner re-plans from its own running plan with ``arachne.dynamic.replan`` (keep the
running plan when it still runs and nothing planned is faster; else move, paying the migration time). Downtime:
planning while the running plan cannot continue (measured wall time), plus the migration time of a move. The
table gives per change the GPUs and per planner tokens/s, planning time and migration seconds; the summary gives
tokens trained over the whole trace per planner, relative to arachne.

Usage:  python -m benchmarks replan-trace [--trace spot|grow|spot-churn|steady-growth|rack-failure]
                                         [--model M --gbs N --seq S] [--baselines sailor,metis,megatron]
                                         [--budget 10] [--out DIR]
Writes ``<trace>.json``/``.csv`` under --out (default results/replan_trace).
"""

from __future__ import annotations

from typing import Any

from rich.table import Table

from arachne.dynamic.replay import ReplayResult, replay
from arachne.dynamic.trace import Trace, load_trace, sailor_bundle
from arachne.planners.protocol import SearchBudget
from arachne.report.replay import replay_table
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common

SYNTHETIC = ("spot-churn", "steady-growth", "rack-failure")


def load_traces() -> dict[str, Any]:
    return sailor_bundle()


def trace_ref(name: str) -> str:
    """The ``--trace`` name as ``arachne replay --trace`` takes it."""
    if name in SYNTHETIC:
        return str(common.ROOT / "examples" / "traces" / f"{name}.yaml")
    return f"sailor:{name}"


def _shown(name: str) -> str:
    return f"examples/traces/{name}.yaml" if name in SYNTHETIC else f"sailor:{name}"


def _segments(trace: Trace) -> list[tuple[float, list[dict]]]:
    """(duration s, node entries of one node each) per snapshot."""
    return [(snap.duration_s, snap.cluster.to_spec()["nodes"]) for snap in trace.snapshots]


def spot_segments(seed: int) -> list[tuple[float, list[dict]]]:
    """(duration s, node entries) per change point of Sailor's spot trace (survivors keep their names)."""
    segs = _segments(load_trace("sailor:spot", seed))
    for _, nodes in segs:  # the GPU as the trace names it
        for n in nodes:
            n["gpu"] = "A100-40" if n["gpu"].startswith("A100") else "V100-16"
    return segs


def grow_segments() -> list[tuple[float, list[dict]]]:
    return _segments(load_trace("sailor:grow"))


def rows_and_summary(result: ReplayResult) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The benchmark's rows (one per change, every planner's columns) and summary (one per planner)."""
    rows = []
    for i, snap in enumerate(result.trace.snapshots):
        row: dict[str, Any] = {"change": i, "t_s": snap.start_s, "duration_s": snap.duration_s,
                               "gpus": snap.cluster.num_gpus}
        for p in result.planners:
            s = p.segments[i]
            row.update({f"{p.planner}_tok_s": s.tokens_per_s, f"{p.planner}_plan_s": s.planning_s,
                        f"{p.planner}_migrate_s": s.migration_s, f"{p.planner}_kept": s.action == "keep",
                        f"{p.planner}_action": s.action, f"{p.planner}_downtime_s": s.downtime_s,
                        f"{p.planner}_tokens": s.tokens})
        rows.append(row)
    ref = result.reference
    summary = [{"planner": p.planner, "tokens_trained": p.tokens,
                "vs_arachne": p.tokens / ref if ref else float("nan"), "downtime_s": p.downtime_s,
                "planning_s": p.planning_s, "migration_s": p.migration_s, "replans": p.replans, "moves": p.moves,
                "no_plan": p.no_plan} for p in result.planners]
    return rows, summary


def replan_trace(a) -> None:
    trace = load_trace(trace_ref(a.trace), a.seed)
    model = model_catalog().get(a.model or trace.job.model)
    job = Job(global_batch_size=a.gbs or trace.job.global_batch_size,
              sequence_length=a.seq or trace.job.sequence_length or 2048)
    planners = ["arachne"] + [b for b in a.baselines.split(",") if b and b != "arachne"]

    def progress(planner: str, seg) -> None:
        common.console.print(f"{planner} change {seg.index}: {seg.gpus} GPUs, {seg.action}, "
                             f"{seg.tokens_per_s:,.0f} tok/s, planning {seg.planning_s:.2f} s, "
                             f"downtime {seg.downtime_s:.1f} s", highlight=False)

    result = replay(trace, model, job, planners, SearchBudget(time_budget_s=a.budget, seed=a.seed),
                    on_segment=progress)
    rows, summary = rows_and_summary(result)
    t = Table(title=f"re-planning over the {a.trace} trace: {model.name}, batch {job.global_batch_size} x "
                    f"{job.sequence_length}; tokens/s, planning s, migration s per planner")
    for k in ("change", "duration_s", "gpus"):
        t.add_column(k, justify="right")
    for p in planners:
        t.add_column(p, justify="right")
    for r in rows:
        t.add_row(str(r["change"]), f"{r['duration_s']:.0f}", str(r["gpus"]),
                  *[f"{r[f'{p}_tok_s']:,.0f} / {r[f'{p}_plan_s']:.2f} / "
                    f"{'kept' if r[f'{p}_kept'] else format(r[f'{p}_migrate_s'], '.1f')}" for p in planners])
    common.console.print(t)
    common.console.print(replay_table(result))  # tokens trained over the trace, per planner
    common.write_result(a.out, a.trace, rows, summary, {"trace": a.trace, "trace_source": _shown(a.trace),
                                                        "model": model.name,
                                                        "global_batch_size": job.global_batch_size,
                                                        "sequence_length": job.sequence_length, "budget": a.budget,
                                                        "seed": a.seed, "events_s": trace.event_times},
                        benchmark=f"replan-trace-{a.trace}")
