"""``replay latency`` and ``replay split-speed``: wall time of arachne on the clusters of stored sweeps.

``replay latency SWEEP...`` re-plans every case where arachne found a plan (the sweep's own command line:
cluster, model, batch, sequence) and times ``run_planner`` on the wall clock, without the CLI's start-up, the
work clock's reading beside it; median and maximum by cluster size. Run it on an idle machine.

``replay split-speed SWEEP...`` plans those cases recording every ``split_layers`` call, then replays all of
them with ``skip_ahead`` on and off: stage fills (the work clock's unit), wall time, microseconds per fill and
the worst ratio of the two bottlenecks. The ratio of microseconds per fill is what the work clock's
``fill_stages`` rate was scaled by (``arachne/data/work_rates.json``). Run it on an idle machine.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator

from arachne.cost import CostModel
from arachne.planners.harness import run_planner
from arachne.planners.protocol import SearchBudget
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common

BANDS = ((1, 63), (64, 255), (256, 1024))


def arachne_cases(refs: list[str]) -> Iterator[tuple[str, str, object, object, Job]]:
    """(sweep, case, cluster, model, job) for each case of stored sweeps where arachne found a plan, once."""
    for sweep in common.load_sweeps(refs, kind="robustness"):
        seen = set()
        for r in sweep.runs:
            if r["planner"] != "arachne" or r["case"] in seen or not r["tokens_per_s"]:
                continue
            seen.add(r["case"])
            opts = dict(zip(r["command"][2::2], r["command"][3::2]))
            job = Job(global_batch_size=int(opts["--global-batch-size"]),
                      sequence_length=int(opts["--sequence-length"]))
            yield sweep.name, r["case"], sweep.cluster(r["case"]), model_catalog().get(opts["--model"]), job


def latency(a) -> None:
    rows = []
    for sweep, case, cl, model, job in arachne_cases(a.sweeps):
        t0 = time.perf_counter()
        _, est, res = run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=5.0))
        rows.append({"sweep": sweep, "case": case, "gpus": len(cl.devices),
                     "wall_s": round(time.perf_counter() - t0, 3), "work_s": res.stats.notes.get("work_s"),
                     "tokens_per_s": round(est.tokens_per_s)})
    if not rows:
        common.fail("no case where arachne found a plan in the given sweeps")
    bands = []
    for lo, hi in BANDS:
        sel = [r["wall_s"] for r in rows if lo <= r["gpus"] <= hi]
        if sel:
            bands.append({"gpus": f"{lo}-{hi}", "cases": len(sel), "median_s": statistics.median(sel),
                          "max_s": max(sel)})
    walls = [r["wall_s"] for r in rows]
    bands.append({"gpus": "all", "cases": len(rows), "median_s": statistics.median(walls), "max_s": max(walls)})
    common.print_table("arachne planning time on the sweeps' clusters (wall, in process)", bands)
    common.write_result(a.out, "latency", rows, bands, {"sweeps": a.sweeps}, benchmark="replay-latency")


def record_splits(refs: list[str]) -> list[tuple]:
    """Every ``split_layers`` call made while planning the sweeps' cases (arguments only)."""
    from arachne.planners.arachne.completion import price, split
    from arachne.planners.arachne.search import refine, rules

    calls: list[tuple] = []
    original = split.split_layers
    users = (price, rules, refine)  # the modules that call split_layers

    def spy(profiles, L, m, work=None, sends=None, skip_ahead=True):
        calls.append((list(profiles), L, m, None if sends is None else list(sends)))
        return original(profiles, L, m, work, sends, skip_ahead)

    for mod in users:
        mod.split_layers = spy
    try:
        for _, _, cl, model, job in arachne_cases(refs):
            run_planner("arachne", cl, model, job, CostModel(cl), SearchBudget(time_budget_s=5.0))
    finally:
        for mod in users:
            mod.split_layers = original
    return calls


def replay_splits(calls: list[tuple], skip_ahead: bool, repeat: int):
    from arachne.planners.arachne.completion import split
    from arachne.planners.arachne.work_clock import Work

    work, results = Work(), []
    t0 = time.perf_counter()
    for i in range(repeat):
        for profiles, L, m, sends in calls:
            r = split.split_layers(profiles, L, m, work, sends, skip_ahead)
            if i == 0:
                results.append(None if r is None else r[1])
    return work, time.perf_counter() - t0, results


def split_speed(a) -> None:
    calls = record_splits(a.sweeps)
    rows, bottlenecks = [], {}
    for mode, skip in (("plain bisection", False), ("skip ahead", True)):
        work, wall, bottlenecks[mode] = replay_splits(calls, skip, a.repeat)
        rows.append({"mode": mode, "calls": len(calls) * a.repeat, "fill_stages": work.fill_stages,
                     "wall_s": round(wall, 3), "us_per_fill_stage": round(wall / max(1, work.fill_stages) * 1e6, 3)})
    worst = max((b / x for x, b in zip(bottlenecks["plain bisection"], bottlenecks["skip ahead"]) if x and b),
                default=1.0)
    ratio = {"mode": "skip / plain", "calls": len(calls) * a.repeat,
             "fill_stages": round(rows[1]["fill_stages"] / max(1, rows[0]["fill_stages"]), 3),
             "wall_s": round(rows[1]["wall_s"] / max(1e-9, rows[0]["wall_s"]), 3),
             "us_per_fill_stage": round(rows[1]["us_per_fill_stage"] / max(1e-9, rows[0]["us_per_fill_stage"]), 3)}
    rows.append(ratio)
    common.print_table(f"layer splits asked for while planning, {len(calls)} calls; worst bottleneck ratio "
                       f"(skip / plain) {worst:.6f}", rows)
    common.write_result(a.out, "split_speed", rows,
                        {"splits": len(calls), "fills_ratio": ratio["fill_stages"], "wall_ratio": ratio["wall_s"],
                         "us_per_fill_skip": rows[1]["us_per_fill_stage"],
                         "us_per_fill_plain": rows[0]["us_per_fill_stage"], "worst_bottleneck_ratio": worst},
                        {"sweeps": a.sweeps, "repeat": a.repeat}, benchmark="replay-split-speed")
