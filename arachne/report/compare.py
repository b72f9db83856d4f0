"""Planners side by side on one common cost model: run them, tabulate, plot a bar chart.

The library half of ``arachne compare`` (the CLI only parses and renders): :func:`run_compare`
runs each planner through :func:`arachne.planners.base.run_planner` with a fresh cost model (so a
warm cache does not flatter later planners' planning times), and a planner that finds no fitting
plan becomes a row with an error instead of stopping the comparison.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from rich.table import Table
from rich.text import Text

from arachne.cost import CostModel, Estimate
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.plan import Plan
from arachne.planners.base import PLANNER_MODULES, SearchBudget, get_planner, planner_names, run_planner
from arachne.report.tables import fmt_bytes, fmt_time
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import ModelSpec

# baselines blind to MoE also run with the EP post-pass (baselines.md §11.6)
EP_VARIANTS = {"amp": "amp+ep", "metis": "metis+ep", "flashflex": "flashflex+ep", "sailor": "sailor+ep"}


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


# ---- which planners ---------------------------------------------------------------------------------
def ensure_registered(name: str) -> None:
    """Import the module that registers ``name`` (the ``+ep`` variants live with their base planner)."""
    base = name[:-3] if name.endswith("+ep") else name
    mod = PLANNER_MODULES.get(base)
    if mod is not None and importlib.util.find_spec(mod) is not None:
        importlib.import_module(mod)
    get_planner(name)  # raises InputError for an unknown name


def default_planners(model: ModelSpec) -> list[str]:
    """Every installed planner; the baselines' EP post-pass variants only for MoE models (on a dense
    model they equal their base planner), each right after its base."""
    installed = planner_names()
    names: list[str] = []
    for name in installed:
        if name in EP_VARIANTS.values():
            continue
        names.append(name)
        if model.is_moe and name in EP_VARIANTS:
            names.append(EP_VARIANTS[name])
    return names


def parse_planners(text: str | None, model: ModelSpec) -> list[str]:
    """``a,b,c`` -> names (checked); ``None`` -> :func:`default_planners`."""
    names = default_planners(model) if not text else [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise InputError("", "--planners", "no planner given")
    for n in names:
        try:
            ensure_registered(n)
        except InputError:
            raise InputError("", "--planners", f"unknown planner {n!r} (available: "
                                               f"{', '.join(default_planners(model))})") from None
    return names


# ---- running -----------------------------------------------------------------------------------------
def run_compare(cluster: Cluster, model: ModelSpec, job: Job, planners: list[str], budget: SearchBudget,
                cost_model: Callable[[], CostModel] | None = None,
                on_start: Callable[[str], None] | None = None) -> list[CompareRow]:
    """Run each planner with the same inputs and budget; one row per planner, in the given order."""
    make = cost_model or (lambda: CostModel(cluster))
    rows = []
    for name in planners:
        if on_start:
            on_start(name)
        ensure_registered(name)
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
def _values(xs: list[int]) -> str:
    lo, hi = min(xs), max(xs)
    return str(lo) if lo == hi else f"{lo}-{hi}"


def structure(plan: Plan) -> str:
    """Pipelines x stages, e.g. ``1x4`` or ``3 pipes: 2-5 stages``."""
    counts = [len(p.stages) for p in plan.pipelines]
    if len(counts) == 1:
        return f"1x{counts[0]}"
    return f"{len(counts)}x{counts[0]}" if len(set(counts)) == 1 else f"{len(counts)} pipes: {_values(counts)} st."


def degrees(plan: Plan) -> str:
    """Ranges of TP / stage-DP / EP over all stages."""
    st = [s for p in plan.pipelines for s in p.stages]
    return f"{_values([s.tp for s in st])} / {_values([s.dp_size for s in st])} / {_values([s.ep for s in st])}"


def worst_memory(est: Estimate) -> Text:
    """Memory of the fullest stage against its capacity, coloured by headroom."""
    s = max(est.stages, key=lambda s: s.memory_bytes / s.capacity_bytes)
    ratio = s.memory_bytes / s.capacity_bytes
    style = "red" if ratio > 1 else ("yellow" if ratio > 0.9 else "green")
    return Text(f"{fmt_bytes(s.memory_bytes)} / {fmt_bytes(s.capacity_bytes)}", style=style)


def compare_table(rows: list[CompareRow], title: str) -> Table:
    """One line per planner: throughput, MFU, memory, structure, planning cost, ratio to the best."""
    t = Table(title=title, title_justify="left")
    for col, just in (("planner", "left"), ("tokens/s", "right"), ("samples/s", "right"), ("MFU", "right"),
                      ("iteration", "right"), ("peak mem / capacity", "right"), ("pipes x stages", "right"),
                      ("TP / DP / EP", "right"), ("GPUs", "right"), ("planning", "right"), ("priced", "right"),
                      ("vs best", "right")):
        t.add_column(col, justify=just)
    best = best_throughput(rows)
    for r in rows:
        plan_t = fmt_time(r.planning_time_s) + (" (budget)" if r.timed_out else "")
        if r.estimate is None or r.plan is None:
            t.add_row(r.planner, Text(_short(r.error), style="red"), "", "", "", "", "", "", "", plan_t,
                      str(r.plans_priced), "-")
            continue
        e = r.estimate
        ratio = e.tokens_per_s / best if best else 0.0
        t.add_row(r.planner, f"{e.tokens_per_s:,.0f}", f"{e.samples_per_s:,.2f}", f"{e.mfu:.1%}",
                  fmt_time(e.iteration_time_s), worst_memory(e), structure(r.plan), degrees(r.plan),
                  str(len(r.plan.devices)), plan_t, str(r.plans_priced),
                  Text(f"{ratio:.2f}x", style="bold green" if ratio >= 0.999 else ""))
    return t


def _short(error: str | None, width: int = 60) -> str:
    text = error or "no plan"
    _, found, why = text.partition(" found no plan that fits in memory")
    text = "no fit" + why if found else text
    return text if len(text) <= width else text[:width - 1] + "…"


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
