"""``work-clock``: fit the arachne planner's work-clock rates, and check that the clock keeps to wall time and
makes plans reproducible.

``fit`` runs the planner on the wall clock, and on the work clock with the current rates, over random
production-like problems (the sweep generator, seeds not used by its evaluation) at several targets, in one
process with a fresh cost model per problem (as the CLI has), records the work each run requested and the wall
time it took, and fits non-negative seconds-per-unit rates by relative error, one per field of
:class:`~arachne.planners.arachne.work_clock.Work` (``WORK_FIELDS``: a field added there is fitted here too, e.g.
the modern-knobs pass's ``knob_plans`` and ``knob_stages``). ``--install`` writes them to
``arachne/data/work_rates.json`` (data, never source text), with the command, commit and date of the fit.
Runs on the work clock show where the current rates undercharge, so a second fit after installing converges.

``check`` runs the planner on the shipped work clock over other problems: per problem the work seconds, the
wall seconds and their ratio (median near 1: the latency target holds), and whether a second run, with every
core busy with other work, returned the same plan. It loads every core on purpose: run it alone.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import statistics
import time

from arachne.cost import CostModel
from arachne.planners.arachne.options import DEFAULT_TARGET_S
from arachne.planners.arachne.planner import ArachnePlanner
from arachne.planners.arachne.work_clock import RATES, WORK_FIELDS, Work
from arachne.planners.protocol import SearchBudget
from arachne.spec.cluster import cluster_from_dict
from arachne.spec.job import Job
from arachne.spec.model import model_catalog
from benchmarks import common

RATES_FILE = common.ROOT / "arachne" / "data" / "work_rates.json"


def problems(seeds: list[int], n: int = 30) -> list:
    return [(f"rob{seed}/{rc.name}", cluster_from_dict(rc.doc), rc)
            for seed in seeds for rc in common.random_cases(seed, n) if rc.model_state_fits]


def plan_once(cl, rc, target: float, clock: str):
    """One planning run with a fresh cost model: (work tally, wall seconds, work seconds, best plan JSON); one
    search, without the second in a forked process (its wall time is not the first's work)."""
    model, job = model_catalog().get(rc.model), Job(global_batch_size=rc.gbs, sequence_length=rc.seq)
    t0 = time.perf_counter()
    res = ArachnePlanner(target_s=target, clock=clock, second_look=False).plan(cl, model, job, CostModel(cl),
                                                            SearchBudget(time_budget_s=60))
    wall = time.perf_counter() - t0
    best = res.plans[0].model_dump_json() if res.plans else ""
    return Work(**res.stats.notes["work"]), wall, float(res.stats.notes["work_s"]), best


def fit(a) -> None:
    import numpy as np
    from scipy.optimize import nnls

    probs = problems([int(s) for s in a.seeds.split(",")])[: a.n]
    targets = [float(t) for t in a.targets.split(",")]
    plan_once(*probs[0][1:], 0.3, "wall")  # warm-up: imports and the shipped weights
    X, y, rows = [], [], []
    for name, cl, rc in probs:
        for t in targets:
            for clock in a.clocks.split(","):
                tally, wall, _, _ = plan_once(cl, rc, t, clock)
                X.append(tally.vector())
                y.append(wall)
                rows.append({"case": name, "gpus": cl.num_gpus, "target": t, "clock": clock, "wall_s": round(wall, 4),
                             **{f: getattr(tally, f) for f in WORK_FIELDS}})
                common.console.print(f"{name} {cl.num_gpus} GPUs target {t} ({clock} clock): {wall:.3f} s",
                                     highlight=False)
    X, y = np.array(X), np.array(y)
    X1 = np.hstack([X, np.ones((len(X), 1))])  # a fixed start-up cost per run (a clock offset: not charged)
    scale = X1.max(axis=0)
    scale[scale == 0] = 1.0
    coef, _ = nnls(X1 / scale / y[:, None], np.ones(len(y)))  # relative error: short runs matter as much
    coef = coef / scale
    rates, offset = coef[:-1], coef[-1]
    pred = X1 @ coef
    ratio = y / np.maximum(pred, 1e-9)
    for r, p in zip(rows, pred):
        r["fit_s"] = round(float(p), 4)
    common.print_table("work clock rates (s per unit)",
                       [{"work": f, "rate": float(r), "share of time": float(r * col.sum() / pred.sum())}
                        for f, r, col in zip(WORK_FIELDS, rates, X.T)])
    summary = {"runs": len(y), "median_wall_over_fit": float(np.median(ratio)),
               "p10": float(np.percentile(ratio, 10)), "p90": float(np.percentile(ratio, 90)),
               "r2": float(1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()), "offset_s": float(offset),
               "rates": {f: float(r) for f, r in zip(WORK_FIELDS, rates)}}
    common.console.print(f"fixed start-up per run: {offset * 1e3:.1f} ms; wall / fit: median "
                         f"{summary['median_wall_over_fit']:.3f}, p10 {summary['p10']:.3f}, p90 {summary['p90']:.3f}; "
                         f"R^2 {summary['r2']:.3f}")
    common.write_result(a.out, "fit", rows, summary, {"seeds": a.seeds, "targets": targets, "clocks": a.clocks},
                        benchmark="work-clock-fit")
    (a.out / "fit_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if a.install:
        install(summary, a.rates_file)


def install(summary: dict, path=None) -> None:
    """Write the fitted rates (4 significant digits) to the work clock's data file, with how they were fitted."""
    path = path or RATES_FILE
    rates = {k: float(f"{summary['rates'].get(k, 0.0):.4g}") for k in WORK_FIELDS}
    doc = {"format": "arachne-work-rates/1",
           "unit": "seconds per unit of each arachne.planners.arachne.work_clock.Work field",
           "fitted_by": common.command_line(), "command": common.command_line(), "commit": common.git_commit(),
           "date": common.today(), "machine": common.machine(),
           "notes": [f"{summary['runs']} runs, R^2 {summary['r2']:.3f}, wall / fit median "
                     f"{summary['median_wall_over_fit']:.3f}",
                     "the plans arachne returns depend on these exact values: re-measure after installing"],
           "rates": rates}
    path.write_text(json.dumps(doc, indent=2) + "\n")
    common.console.print(f"installed the rates in {path}", highlight=False)


def _busy(stop) -> None:
    while not stop.is_set():
        sum(i * i for i in range(10000))


def check(a) -> None:
    if not any(RATES.values()):
        common.fail("the work clock has no rates yet: run `work-clock fit --install` first")
    probs = problems([int(s) for s in a.seeds.split(",")])[: a.n]
    target = a.target if a.target is not None else DEFAULT_TARGET_S
    plan_once(*probs[0][1:], 0.3, "work")
    rows = []
    for name, cl, rc in probs:
        _, wall, work, best = plan_once(cl, rc, target, "work")
        stop = multiprocessing.Event()
        hogs = [multiprocessing.Process(target=_busy, args=(stop,)) for _ in range(os.cpu_count() or 2)]
        for h in hogs:
            h.start()
        try:
            _, wall2, work2, best2 = plan_once(cl, rc, target, "work")
        finally:
            stop.set()
            for h in hogs:
                h.join()
        rows.append({"case": name, "gpus": cl.num_gpus, "work_s": work, "wall_s": round(wall, 4),
                     "wall_over_work": round(wall / max(work, 1e-9), 3), "loaded_wall_s": round(wall2, 4),
                     "same_plan_loaded": best == best2 and work == work2})
    common.print_table(f"work clock check (target {target} s of work)", rows)
    ratios = [r["wall_over_work"] for r in rows]
    summary = {"problems": len(rows), "same_plan_loaded": sum(r["same_plan_loaded"] for r in rows),
               "wall_over_work_median": statistics.median(ratios), "wall_over_work_min": min(ratios),
               "wall_over_work_max": max(ratios), "wall_median_s": statistics.median(r["wall_s"] for r in rows)}
    common.console.print(f"wall / work: median {summary['wall_over_work_median']:.3f}, min {min(ratios):.3f}, max "
                         f"{max(ratios):.3f}; wall median {summary['wall_median_s']:.3f} s; same plan under load "
                         f"{summary['same_plan_loaded']}/{len(rows)}")
    common.write_result(a.out, "check", rows, summary, {"seeds": a.seeds, "n": a.n, "target": target},
                        benchmark="work-clock-check")
