"""``objectives``: the cost objective and the runtime presets on the planners grid (issue 27 items 3-4).

Per grid case: every baseline plans for throughput (as it was built to), arachne plans for throughput and with
``--objective cost``; all plans are priced by the one cost model at the catalog's GPU prices (docs/catalog.md)
and compared on USD per million tokens (and tokens/s, both reported). Then ``--runtime megatron``: arachne
restricted to what Megatron-LM runs vs the better of the two Megatron grid baselines on tokens/s, and
arachne unrestricted vs arachne under Megatron's rules (what the freedom of the arachne runtime is worth).
A case with a GPU the catalog has no price for is reported as such (no cost comparison). Default: 6 of the
grid's cases, about 2 minutes on 2 cores; ``--all`` runs the 25.
"""

from __future__ import annotations

import time
from typing import Any

from rich import box
from rich.table import Table

from arachne.cost import CostModel
from arachne.errors import InputError, NoFeasiblePlanError
from arachne.planners.harness import default_planners, run_planner
from arachne.planners.objective import Objective, usd_per_million_tokens
from arachne.planners.protocol import SearchBudget
from arachne.spec.job import Job
from arachne.spec.model import load_model
from arachne.spec.runtimes import Legality
from benchmarks import common
from benchmarks.common import GridCase

DEFAULT_CASES = ("lab-8/GPT-3-1.3B", "cloud-16/GPT-3-1.3B", "a100-v100-24/OPT-350M", "edge-20/GPT-3-1.3B",
                 "a100-v100-24/LLaMA-2-7B", "t4-a10g-64/GPT-3-1.3B")


def _arm(case: GridCase, arm: str, planner: str, budget: SearchBudget, **kw: Any) -> dict[str, Any]:
    cluster = common.grid_cluster(case.cluster, list(case.groups))
    job = Job(global_batch_size=case.gbs, sequence_length=case.seq)
    t0 = time.perf_counter()
    row: dict[str, Any] = {"case": case.name, "arm": arm, "planner": planner}
    try:
        plan, est, res = run_planner(planner, cluster, load_model(case.model), job, CostModel(cluster), budget, **kw)
    except (NoFeasiblePlanError, InputError) as exc:
        return {**row, "error": str(exc), "wall_s": round(time.perf_counter() - t0, 2)}
    return {**row, "tokens_per_s": est.tokens_per_s, "usd_per_hour": est.cost_per_hour,
            "usd_per_mtok": usd_per_million_tokens(est), "gpus_used": len(plan.devices),
            "gpus": cluster.num_gpus, "wall_s": round(time.perf_counter() - t0, 2), "error": None,
            "megatron_legal": not Legality.of("megatron").errors(plan, cluster),
            "chosen_from": res.stats.notes.get("chosen_from", planner)}


def _case_rows(case: GridCase, budget: SearchBudget) -> list[dict[str, Any]]:
    rows = []
    for name in default_planners(load_model(case.model)):
        if name in ("arachne", "exhaustive"):
            continue
        common.console.print(f"  {case.name}: {name} (throughput)", highlight=False)
        rows.append(_arm(case, "baseline", name, budget))
    common.console.print(f"  {case.name}: arachne (throughput, cost, --runtime megatron)", highlight=False)
    rows.append(_arm(case, "arachne", "arachne", budget))
    rows.append(_arm(case, "arachne-cost", "arachne", budget, objective=Objective("cost")))
    rows.append(_arm(case, "arachne-megatron", "arachne", budget, legality=Legality.of("megatron")))
    return rows


def _summaries(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per case: the cost table's row and the runtime table's row."""
    cost, meg = [], []
    for case in dict.fromkeys(r["case"] for r in rows):
        rs = [r for r in rows if r["case"] == case]
        by = {r["arm"] if r["arm"] != "baseline" else r["planner"]: r for r in rs}
        base = [r for r in rs if r["arm"] == "baseline" and r.get("usd_per_mtok")]
        best = min(base, key=lambda r: r["usd_per_mtok"], default=None)
        c, a = by["arachne-cost"], by["arachne"]
        row: dict[str, Any] = {"case": case, "cost_usd_per_mtok": c.get("usd_per_mtok"),
                               "cost_tokens_per_s": c.get("tokens_per_s"),
                               "cost_gpus": f"{c['gpus_used']}/{c['gpus']}" if c.get("gpus_used") else None,
                               "base_usd_per_mtok": best["usd_per_mtok"] if best else None,
                               "base_tokens_per_s": best["tokens_per_s"] if best else None,
                               "base_planner": best["planner"] if best else None,
                               "throughput_usd_per_mtok": a.get("usd_per_mtok"), "note": c.get("error")}
        row["base_over_cost"] = (row["base_usd_per_mtok"] / row["cost_usd_per_mtok"]
                                 if row["base_usd_per_mtok"] and row["cost_usd_per_mtok"] else None)
        cost.append(row)
        grid = [by[n] for n in ("megatron", "megatron-oblivious") if by.get(n, {}).get("tokens_per_s")]
        m = max(grid, key=lambda r: r["tokens_per_s"], default={})  # the better of Megatron's two grid baselines
        mg = by["arachne-megatron"]
        mt, at, gt = m.get("tokens_per_s"), a.get("tokens_per_s"), mg.get("tokens_per_s")
        meg.append({"case": case, "megatron_planner": m.get("planner"), "megatron_plan_legal": m.get("megatron_legal"),
                    "megatron_tokens_per_s": mt, "arachne_megatron_tokens_per_s": gt,
                    "vs_baseline": gt / mt if gt and mt else None, "arachne_tokens_per_s": at,
                    "freedom": at / gt if at and gt else None, "arachne_megatron_from": mg.get("chosen_from"),
                    "note": mg.get("error")})
    return cost, meg


def _table(title: str, heads: list[str], rows: list[list[Any]]) -> None:
    """A compact table (no vertical rules) that fits 80 columns: the case column folds, numbers never do;
    columns headed ``x ...`` are ratios."""
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))
    for i, h in enumerate(heads):
        if i == 0:
            t.add_column(h, justify="left", overflow="fold", max_width=30)
        else:
            t.add_column(h, justify="right", no_wrap=True, min_width=len(h))
    for r in rows:
        t.add_row(r[0], *[_short(v, h.startswith("x")) for v, h in zip(r[1:], heads[1:])])
    common.console.print(t)


def _short(v: Any, ratio: bool = False) -> str:
    """A number in at most 7 characters: 344.6k, 9.43M, 0.0177; ratios as 1.015."""
    if v is None or isinstance(v, str):
        return "-" if v is None else v
    if ratio:
        return f"{v:.3f}"
    if abs(v) >= 1e6:
        return f"{v / 1e6:.2f}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.1f}k"
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.4g}"


def run(a) -> None:
    cases = common.GRID_CASES if a.all else [c for c in common.GRID_CASES if c.name in DEFAULT_CASES]
    if a.cases:
        cases = [c for c in common.GRID_CASES if any(k in c.name for k in a.cases.split(","))]
    if not cases:
        common.fail(f"--cases {a.cases!r}: no grid case matches")
    budget = SearchBudget(time_budget_s=a.time_budget)
    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for case in cases:
        rows += _case_rows(case, budget)
    cost, meg = _summaries(rows)
    ratios = [r["base_over_cost"] for r in cost if r["base_over_cost"]]
    freedom = [r["freedom"] for r in meg if r["freedom"]]
    vs_meg = [r["vs_baseline"] for r in meg if r["vs_baseline"]]
    summary = {"cases": len(cases), "priced_cases": len(ratios),
               "megatron_runtime_plan_from_the_grid_floor": sum(r["arachne_megatron_from"] not in (None, "arachne")
                                                                for r in meg),
               "cost_beats_every_baseline": sum(x > 1.0 for x in ratios),
               "geomean_best_baseline_usd_over_cost_usd": common.gmean(ratios),
               "megatron_runtime_vs_megatron_baseline_geomean": common.gmean(vs_meg),
               "megatron_runtime_at_least_baseline": sum(x >= 0.999 for x in vs_meg),
               "freedom_geomean": common.gmean(freedom), "wall_s": round(time.perf_counter() - t0, 1)}
    _table("USD per million tokens (M): arachne --objective cost vs the cheapest baseline plan (baselines "
           "plan for throughput); x = baseline $/M over cost $/M", ["case", "cost $/M", "tok/s",
                                                                  "base $/M", "tok/s", "x"],
           [[r["case"], r["cost_usd_per_mtok"] or "no $", r["cost_tokens_per_s"],
             r["base_usd_per_mtok"], r["base_tokens_per_s"], r["base_over_cost"]] for r in cost])
    _table("tokens/s: arachne --runtime megatron vs the better Megatron grid baseline (megatron, "
           "megatron-oblivious), and arachne unrestricted",
           ["case", "megatron", "arach-meg", "x base", "arachne", "x free"],
           [[r["case"], r["megatron_tokens_per_s"], r["arachne_megatron_tokens_per_s"], r["vs_baseline"],
             r["arachne_tokens_per_s"], r["freedom"]] for r in meg])
    common.console.print(summary, highlight=False)
    common.write_result(a.out, "objectives", rows, {**summary, "cost_table": cost, "runtime_table": meg},
                        {"time_budget_s": a.time_budget, "all": a.all, "cases": [c.name for c in cases]})
