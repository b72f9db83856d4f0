"""A trace replay, rendered: the per-planner table and the tokens/s-over-time figure of a
:class:`arachne.dynamic.replay.ReplayResult` (this module only renders)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from arachne.dynamic.replay import PlannerReplay, ReplayResult
from arachne.report.fit import Fit, caption, column, compact_table, text, wide_table

LEGEND = "re-plans: events at which the running plan could not continue; moves: changes of plan"


def fmt_tokens(x: float) -> str:
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def _seconds(x: float) -> str:
    return f"{x:,.1f} s" if x < 600 else f"{x / 60:,.1f} min"


def _ratio(p: PlannerReplay, ref: float | None) -> Text:
    if not ref:
        return Text("-")
    r = p.tokens / ref
    return Text(f"{r:.3f}x", style="bold green" if r >= 0.9995 else "")


def _notes(result: ReplayResult) -> list[str]:
    lines = ["downtime: planning while nothing trains (measured wall clock) + migration (migration model)"]
    if result.reference is None:
        lines.append("vs arachne: - (arachne was not replayed, or trained nothing)")
    for p in result.planners:
        if p.no_plan:
            lines.append(f"{p.planner}: no plan fits in {p.no_plan} of {len(p.segments)} segments")
    return lines


def _wide(result: ReplayResult, title: str) -> Table:
    t = wide_table(title)
    for col in ("planner", "tokens trained", "vs arachne", "downtime", "planning", "migration", "re-plans",
                "moves"):
        column(t, col, "left" if col == "planner" else "right")
    ref = result.reference
    for p in result.planners:
        t.add_row(text(p.planner), fmt_tokens(p.tokens), _ratio(p, ref), _seconds(p.downtime_s),
                  _seconds(p.planning_s), _seconds(p.migration_s), str(p.replans), str(p.moves))
    return caption(t, [*_notes(result), "planning, migration: totals; " + LEGEND])


def _compact(result: ReplayResult, title: str) -> Table:
    t = compact_table(title)
    for col in ("planner", "tokens", "vs arachne", "downtime", "re-plans", "moves"):
        column(t, col, "left" if col == "planner" else "right")
    ref = result.reference
    for p in result.planners:
        t.add_row(text(p.planner), fmt_tokens(p.tokens), _ratio(p, ref), _seconds(p.downtime_s), str(p.replans),
                  str(p.moves))
    return caption(t, [*_notes(result), LEGEND])


def replay_title(result: ReplayResult) -> str:
    tr = result.trace
    gpus = [s.cluster.num_gpus for s in tr.snapshots]
    span = str(gpus[0]) if min(gpus) == max(gpus) else f"{min(gpus)}-{max(gpus)}"
    events = f"{len(tr.events)} event{'' if len(tr.events) == 1 else 's'}"
    return (f"{tr.name}: {events} over {_seconds(tr.end_s)}, {span} GPUs; {result.model}, "
            f"batch {result.job.global_batch_size} x {result.job.sequence_length}")


def replay_table(result: ReplayResult) -> Fit:
    """One row per planner: tokens trained, ratio to arachne, downtime, re-plans and moves."""
    title = replay_title(result)
    return Fit(lambda: _wide(result, title), lambda: _compact(result, title))


def plot_replay(result: ReplayResult, path: str | Path) -> None:
    """tokens/s over time, one step line per planner, the events marked (PNG, SVG, PDF or JPG by suffix)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from arachne.report.plots import _text

    hours = result.trace.end_s >= 3 * 3600
    scale, unit = (3600.0, "h") if hours else (60.0, "min")
    fig, ax = plt.subplots(figsize=(9.0, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    ref = result.reference
    for k, p in enumerate(result.planners):
        xs: list[float] = []
        ys: list[float] = []
        for seg in p.segments:
            for t0, t1, rate in seg.steps():
                xs += [t0 / scale, t1 / scale]
                ys += [rate, rate]
        share = f", {p.tokens / ref:.3f}x" if ref else ""
        label = _text(f"{p.planner}: {fmt_tokens(p.tokens)} tokens{share}")
        ax.plot(xs, ys, color=colours[k % len(colours)], lw=2.0 if p.planner == "arachne" else 1.3,
                label=label, zorder=3 if p.planner == "arachne" else 2)
    for ev in result.trace.events:
        ax.axvline(ev.t_s / scale, color="#888", ls=":", lw=1, zorder=1)
    ax.set_xlim(0, result.trace.end_s / scale)
    ax.set_ylim(bottom=0)
    ax.set_xlabel(f"time ({unit}); dotted: cluster changes")
    ax.set_ylabel("training throughput (tokens/s)")
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: fmt_tokens(x) if x else "0"))
    ax.set_title(_text(replay_title(result)), fontsize=10)
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=160)
    plt.close(fig)
