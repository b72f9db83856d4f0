"""Planners side by side, rendered: a rich table and a bar chart of the rows that
:func:`arachne.planners.harness.run_compare` produced (this module only renders)."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text

from arachne.cost import Estimate
from arachne.plan import Plan
from arachne.planners.harness import CompareRow, best_throughput
from arachne.report.fit import Fit, caption, column, compact_table, text, wide_table
from arachne.report.tables import fmt_bytes, fmt_time, memory_style


def _values(xs: list[int]) -> str:
    lo, hi = min(xs), max(xs)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def structure(plan: Plan, compact: bool = False) -> str:
    """Pipelines x stages, e.g. ``1x4`` or ``3 pipes: 2-5 st.`` (compact: ``3x2-5``)."""
    counts = [len(p.stages) for p in plan.pipelines]
    if len(counts) == 1:
        return f"1x{counts[0]}"
    if len(set(counts)) == 1:
        return f"{len(counts)}x{counts[0]}"
    return f"{len(counts)}x{_values(counts)}" if compact else f"{len(counts)} pipes: {_values(counts)} st."


def degrees(plan: Plan, compact: bool = False) -> str:
    """Ranges of TP / stage-DP / EP over all stages (compact: without spaces)."""
    st = [s for p in plan.pipelines for s in p.stages]
    sep = "/" if compact else " / "
    return sep.join(_values(v) for v in ([s.tp for s in st], [s.dp_size for s in st], [s.ep for s in st]))


def _worst(est: Estimate) -> tuple[float, float, float]:
    """(memory, capacity, share) of the fullest stage."""
    s = max(est.stages, key=lambda s: s.memory_bytes / s.capacity_bytes)
    return s.memory_bytes, s.capacity_bytes, s.memory_bytes / s.capacity_bytes


def worst_memory(est: Estimate) -> Text:
    """Memory of the fullest stage against its capacity, coloured by headroom."""
    mem, cap, ratio = _worst(est)
    return Text(f"{fmt_bytes(mem)} / {fmt_bytes(cap)}", style=memory_style(ratio))


def _planning(r: CompareRow) -> str:
    return fmt_time(r.planning_time_s) + (" (budget)" if r.timed_out else "")


def _failures(rows: list[CompareRow]) -> list[str]:
    """Why each planner without a plan has none, one line each (shown under the table, never in a cell)."""
    out = []
    for r in rows:
        if r.estimate is None or r.plan is None:
            text_ = r.error or "no plan"
            _, found, why = text_.partition(" found no plan that fits in memory")
            out.append(f"{r.planner}: " + ("no plan fits" + why if found else text_))
    return out


def _compare_wide(rows: list[CompareRow], title: str, best: float) -> Table:
    t = wide_table(title)
    for col, just in (("planner", "left"), ("tokens/s", "right"), ("samples/s", "right"), ("MFU", "right"),
                      ("iteration", "right"), ("peak mem / capacity", "right"), ("pipes x stages", "right"),
                      ("TP / DP / EP", "right"), ("GPUs", "right"), ("planning", "right"), ("priced", "right"),
                      ("vs best", "right")):
        column(t, col, just)
    for r in rows:
        if r.estimate is None or r.plan is None:
            t.add_row(text(r.planner), Text("no plan", style="red"), "", "", "", "", "", "", "", _planning(r),
                      str(r.plans_priced), "-")
            continue
        e = r.estimate
        ratio = e.tokens_per_s / best if best else 0.0
        t.add_row(text(r.planner), f"{e.tokens_per_s:,.0f}", f"{e.samples_per_s:,.2f}", f"{e.mfu:.1%}",
                  fmt_time(e.iteration_time_s), worst_memory(e), structure(r.plan), degrees(r.plan),
                  str(len(r.plan.devices)), _planning(r), str(r.plans_priced),
                  Text(f"{ratio:.2f}x", style="bold green" if ratio >= 0.999 else ""))
    return caption(t, ["planning: wall clock on this machine"] + _failures(rows))


def _compare_compact(rows: list[CompareRow], title: str, best: float) -> Table:
    """The headline columns: samples/s, iteration time, GPU count and plans priced are left to ``--json``;
    memory is the fullest stage's share of its GPU; structure and degrees are written without spaces."""
    t = compact_table(title)
    for col, just in (("planner", "left"), ("tokens/s", "right"), ("vs best", "right"), ("MFU", "right"),
                      ("mem", "right"), ("pipes\nx stages", "right"), ("tp/dp/ep", "right")):
        column(t, col, just)
    column(t, "planning", "right")
    for r in rows:
        if r.estimate is None or r.plan is None:
            t.add_row(text(r.planner), Text("no plan", style="red"), "-", "", "", "", "", _planning(r))
            continue
        e = r.estimate
        ratio = e.tokens_per_s / best if best else 0.0
        share = _worst(e)[2]
        t.add_row(text(r.planner), f"{e.tokens_per_s:,.0f}",
                  Text(f"{ratio:.2f}x", style="bold green" if ratio >= 0.999 else ""), f"{e.mfu:.1%}",
                  Text(f"{share:.0%}", style=memory_style(share)), structure(r.plan, compact=True),
                  degrees(r.plan, compact=True), _planning(r))
    return caption(t, ["mem: fullest stage's share of its GPU memory; planning: wall clock on this machine"]
                    + _failures(rows))


def compare_table(rows: list[CompareRow], title: str) -> Fit:
    """One line per planner: throughput, MFU, memory, structure, planning cost, ratio to the best; why a planner
    found no plan is said under the table."""
    best = best_throughput(rows)
    return Fit(lambda: _compare_wide(rows, title, best), lambda: _compare_compact(rows, title, best))


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}"


def plot_compare(rows: list[CompareRow], path: str | Path, title: str) -> None:
    """A bar chart of tokens/s per planner with the ratio to the best on each bar (PNG, SVG or PDF)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    best = best_throughput(rows)
    names = [r.planner for r in rows]
    values = [r.estimate.tokens_per_s if r.estimate is not None else 0.0 for r in rows]
    colors = ["#2b6cb0" if v >= best * 0.999 and v > 0 else "#90a4c8" for v in values]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.2))
    bars = ax.bar(names, values, color=colors, width=0.65)
    top = best or 1.0
    for bar, v, r in zip(bars, values, rows):
        label = f"{_si(v)}\n{v / best:.2f}×" if v > 0 and best else "no fit"
        ax.text(bar.get_x() + bar.get_width() / 2, v + top * 0.02, label, ha="center", va="bottom",
                fontsize=9, color="#222" if v > 0 else "#b33")
    ax.set_ylim(0, top * 1.22)
    ax.set_ylabel("training throughput (tokens/s)")
    ax.set_title(title, fontsize=11)
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: _si(x)))
    ax.spines[["top", "right"]].set_visible(False)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
    plt.setp(ax.get_xticklabels(), rotation=20 if len(rows) > 6 else 0, ha="right" if len(rows) > 6 else "center")
    fig.tight_layout()
    fig.savefig(path, dpi=160)
    plt.close(fig)
