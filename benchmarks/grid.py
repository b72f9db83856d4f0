"""``grid``: planners side by side over a grid of clusters a platform engineer meets, on the common cost model.

``grid run``: the grid mixes 2-4 GPU types (V100, T4, A10G, L4, A100-40/80, H100, H200, RTX-3090) in nodes of
1/2/4/8 GPUs with uneven counts per type and several network tiers, from 8 to 512 GPUs: 15 cases with dense
models from 350M to 70B parameters and 10 with five MoE models. Every planner runs in a forked child (cold
caches; one that overruns its budget by far is stopped). Prints per planner the geometric mean of throughput
relative to the best planner of each case (over the cases it solved), the median planning time and the share
of cases where it found no fitting plan. ``grid timing``: planning time of the search baselines at 64, 256
and 512 GPUs. ``grid scale``: every planner on six clusters of 4,096 to 100,000 GPUs (the same children,
ratios and summary as ``grid run``); ``grid nic``: on twelve clusters by node NIC; ``grid starved``: on 15
clusters whose batch leaves GPUs idle at one stage of node-wide tp.
"""

from __future__ import annotations

import math
import multiprocessing
import statistics
import time
from queue import Empty
from typing import Any

from arachne.cost import CostModel
from arachne.errors import InputError
from arachne.planners.harness import CompareRow, default_planners, run_compare
from arachne.planners.protocol import SearchBudget
from arachne.planners.registry import planner_factory
from arachne.spec.cluster import Cluster
from arachne.spec.job import Job
from arachne.spec.model import load_model
from benchmarks import common
from benchmarks.common import GridCase


def planners_for(case: GridCase, chosen: list[str] | None) -> list[str]:
    names = chosen or default_planners(load_model(case.model))
    for n in names:
        planner_factory(n)
    return names


def run_one(case: GridCase, planner: str, budget: SearchBudget, hard_limit_s: float) -> dict[str, Any]:
    common.console.print(f"  {case.name}: {planner} ...", highlight=False)
    mp = multiprocessing.get_context("fork")
    queue = mp.Queue()
    child = mp.Process(target=_child, args=(case, planner, budget, queue))
    t0 = time.perf_counter()
    child.start()
    try:
        rec = queue.get(timeout=hard_limit_s)
    except Empty:
        child.terminate()
        child.join(5)
        if child.is_alive():
            child.kill()
        row = CompareRow(planner, None, None, time.perf_counter() - t0, 0,
                         f"stopped after {hard_limit_s:.0f} s (budget {budget.time_budget_s:g} s not honoured)", True)
        return record(case, common.grid_cluster(case.cluster, list(case.groups)), row)
    child.join()
    return rec


def _child(case: GridCase, planner: str, budget: SearchBudget, queue: Any) -> None:
    cluster = common.grid_cluster(case.cluster, list(case.groups))
    job = Job(global_batch_size=case.gbs, sequence_length=case.seq)
    try:
        (row,) = run_compare(cluster, load_model(case.model), job, [planner], budget, lambda: CostModel(cluster))
    except Exception as exc:  # a crashing planner is a result of the benchmark, not its end
        row = CompareRow(planner, None, None, 0.0, 0, f"crashed: {type(exc).__name__}: {exc}")
    queue.put(record(case, cluster, row))


def record(case: GridCase, cluster: Cluster, r: CompareRow) -> dict[str, Any]:
    e = r.estimate
    return {"case": case.name, "cluster": case.cluster, "gpus": cluster.num_gpus,
            "gpu_types": "+".join(f"{n}x{g[0]}" for g in case.groups for n in [g[1] * g[2]]),
            "model": case.model, "global_batch_size": case.gbs, "sequence_length": case.seq,
            "planner": r.planner, "tokens_per_s": e.tokens_per_s if e else None,
            "samples_per_s": e.samples_per_s if e else None, "mfu": e.mfu if e else None,
            "iteration_time_s": e.iteration_time_s if e else None,
            "gpus_used": len(r.plan.devices) if r.plan else None,
            "planning_time_s": round(r.planning_time_s, 4), "candidates": r.candidates,
            "plans_priced": r.plans_priced, "timed_out": r.timed_out, "error": r.error,
            "notes": "; ".join(f"{k}: {v}" for k, v in r.notes.items())}


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Throughput relative to the best planner of the same case."""
    best: dict[str, float] = {}
    for r in rows:
        if r["tokens_per_s"]:
            best[r["case"]] = max(best.get(r["case"], 0.0), r["tokens_per_s"])
    for r in rows:
        r["ratio_to_best"] = r["tokens_per_s"] / best[r["case"]] if r["tokens_per_s"] else None


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per planner: geomean ratio to the best (solved cases), planning time, failure shares."""
    out = []
    for name in dict.fromkeys(r["planner"] for r in rows):
        mine = [r for r in rows if r["planner"] == name]
        ratios = [r["ratio_to_best"] for r in mine if r["ratio_to_best"]]
        out.append({
            "planner": name, "cases": len(mine),
            "geomean_ratio_to_best": math.exp(statistics.fmean(math.log(x) for x in ratios)) if ratios else None,
            "median_planning_time_s": statistics.median(r["planning_time_s"] for r in mine),
            "max_planning_time_s": max(r["planning_time_s"] for r in mine),
            "no_fit_share": sum(1 for r in mine if (r["error"] or "").startswith("no plan")) / len(mine),
            "failed_share": sum(1 for r in mine if r["error"] and not r["error"].startswith("no plan")) / len(mine),
            "timed_out_share": sum(1 for r in mine if r["timed_out"]) / len(mine),
        })
    return out


SUMMARY_COLUMNS = {"planner": "planner", "cases": "cases", "geomean_ratio_to_best": "vs best",
                   "median_planning_time_s": "median s", "max_planning_time_s": "max s",
                   "no_fit_share": "no fit", "failed_share": "failed", "timed_out_share": "timed out"}


def print_summary(summary: list[dict[str, Any]], title: str) -> None:
    rows = [{label: s[k] for k, label in SUMMARY_COLUMNS.items()} for s in summary]
    common.print_table(title, rows)


def hard_limit(a) -> float:
    return a.hard_limit if a.hard_limit is not None else 3 * a.time_budget + 60


def run_cases(cases: list[GridCase], a) -> tuple[list[dict[str, Any]], float]:
    """Every chosen planner (``a.planners``, default all) on every case, each in a forked child at
    ``a.time_budget``; the rows with their ratios to the best of each case, and the wall time."""
    budget = SearchBudget(time_budget_s=a.time_budget, seed=a.seed)
    chosen = [p.strip() for p in a.planners.split(",")] if a.planners else None
    for name in chosen or []:  # an unknown name: one line and exit 2, before any case runs
        try:
            planner_factory(name)
        except InputError as err:
            common.fail(f"--planners: {err.reason}")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for case in cases:
        rows += [run_one(case, name, budget, hard_limit(a)) for name in planners_for(case, chosen)]
    add_ratios(rows)
    return rows, round(time.perf_counter() - t0, 1)


def chosen_cases(cases: list[GridCase], a, what: str) -> list[GridCase]:
    """``cases`` whose name contains one of ``a.cases`` (comma-separated; all when empty), or exit 2."""
    out = [c for c in cases if not a.cases or any(k in c.name for k in a.cases.split(","))]
    if not out:
        common.fail(f"--cases {a.cases!r}: no {what} case matches (e.g. {', '.join(c.name for c in cases[:4])})")
    return out


def run(a) -> None:
    cases = chosen_cases(common.GRID_QUICK if a.quick else common.GRID_CASES, a, "grid")
    if a.time_budget is None:
        a.time_budget = 10.0 if a.quick else 30.0
    rows, wall = run_cases(cases, a)
    summary = summarise(rows)
    meta = {"time_budget_s": a.time_budget, "seed": a.seed, "quick": a.quick, "cases": len(cases), "wall_s": wall}
    print_summary(summary, f"{len(cases)} cases, budget {a.time_budget:g} s per planner (geomean over solved "
                           "cases of throughput / best of the case)")
    common.write_result(a.out, "grid", rows, summary, meta)


def scale(a) -> None:
    _per_case(a, common.SCALE_CASES, "scale", "large clusters", "grid-scale")


def nic(a) -> None:
    _per_case(a, common.NIC_CASES, "nic", "clusters by node NIC", "grid-nic")


def starved(a) -> None:
    _per_case(a, common.STARVED_CASES, "starved", "clusters past their batch", "grid-starved")


def _per_case(a, all_cases: list[GridCase], name: str, what: str, benchmark: str) -> None:
    """Every planner on ``all_cases`` (those ``--cases`` names), a table per case; ``name``.json."""
    cases = chosen_cases(all_cases, a, name)
    rows, wall = run_cases(cases, a)
    for case in cases:  # one table per cluster: 80 columns
        common.print_table(f"{case.name}: {case.gbs} x {case.seq} tokens",
                           [r for r in rows if r["case"] == case.name],
                           ["planner", "gpus_used", "tokens_per_s", "ratio_to_best", "planning_time_s", "timed_out"])
    summary = summarise(rows)
    print_summary(summary, f"{len(cases)} {what}, budget {a.time_budget:g} s per planner")
    common.write_result(a.out, name, rows, summary, {"time_budget_s": a.time_budget, "seed": a.seed,
                                                     "cases": len(cases), "wall_s": wall}, benchmark=benchmark)


def timing(a) -> None:
    if a.time_budget is None:
        a.time_budget = 60.0
    budget = SearchBudget(time_budget_s=a.time_budget, seed=a.seed)
    planners = [p.strip() for p in a.planners.split(",")] if a.planners else common.TIMING_PLANNERS
    rows = []
    for n, groups in common.TIMING_SIZES.items():
        case = GridCase(f"timing-{n}", groups, a.model, 4 * n, 2048)
        rows += [run_one(case, name, budget, hard_limit(a)) for name in planners_for(case, planners)]
    add_ratios(rows)
    common.print_table("planning time of the search baselines", rows,
                       ["planner", "gpus", "planning_time_s", "plans_priced", "timed_out", "tokens_per_s",
                        "ratio_to_best"])
    common.write_result(a.out, "timing", rows, summarise(rows), {"time_budget_s": a.time_budget, "model": a.model},
                        benchmark="grid-timing")
